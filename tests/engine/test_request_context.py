"""What the engine puts into a proposal request beyond the tree: eager's measured baseline of the
card, with the kernels eager launches, for the prompt's profiler feedback."""

from __future__ import annotations

from kforge.core.candidate import Baseline
from kforge.core.opcard import OpCard
from kforge.store import Store
from tests.doubles import FakeEvaluator, FakeProposer
from tests.engine.test_engine import engine, session

KERNELS = [{"name": "softmax_warp_forward<c10::Half>", "us": 41.5, "calls": 1.0}]


class ProfilingEvaluator(FakeEvaluator):
    async def baseline(self, card: OpCard) -> Baseline:
        base = await super().baseline(card)
        return Baseline(base.eager, base.compiled, base.compile_s, base.floor_us,
                        eager_kernels=KERNELS)


async def test_every_request_carries_the_cards_baseline_with_eagers_kernels(store: Store):
    sid = await session(store)
    proposer = FakeProposer()
    await engine(store, sid, proposer=proposer, evaluator=ProfilingEvaluator(),
                 iterations_per_op=2).run()
    assert proposer.requests
    for request in proposer.requests:
        assert request.baseline is not None and request.baseline.eager_kernels == KERNELS
        assert request.baseline.eager.median_us == request.card.eager_us
