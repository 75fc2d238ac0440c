"""A card's bookkeeping under parallel results, and LLM spend that survives the engine's end."""

from __future__ import annotations

import asyncio
import math
import random
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kforge.core.candidate import Candidate, EvalOutcome, LlmCall, Proposal
from kforge.core.opcard import OpCard
from kforge.core.protocols import ProposalRequest
from kforge.core.reward import significant_win
from kforge.core.schedule import Best
from kforge.core.settings import SearchSettings
from kforge.engine.engine import Engine
from kforge.store import NodeStatus, Store
from tests.doubles import FakeEvaluator, FakeProposer, sample_cards


class JitteryEvaluator(FakeEvaluator):
    """Several evaluations at once, each taking its own random time, so results finish in an
    order unlike the one they started in."""

    def __init__(self, capacity: int, max_delay_s: float, seed: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.max_delay_s = max_delay_s
        self.rng = random.Random(seed)

    async def evaluate(self, card: OpCard, candidate: Candidate) -> EvalOutcome:
        await asyncio.sleep(self.rng.uniform(0.0, self.max_delay_s))
        return await super().evaluate(card, candidate)


class JitteryProposer(FakeProposer):
    """Proposals that take a random time; some bring no candidate."""

    def __init__(self, max_delay_s: float, seed: int, empty_every: int) -> None:
        super().__init__(empty_every=empty_every)
        self.max_delay_s = max_delay_s
        self.rng = random.Random(seed)

    async def propose(self, request: ProposalRequest) -> Proposal:
        await asyncio.sleep(self.rng.uniform(0.0, self.max_delay_s))
        return await super().propose(request)


async def search_once(db: Path, parallel: int, capacity: int, seed: int, empty_every: int,
                      max_delay_s: float) -> None:
    async with await Store.open(db) as store:
        sid = await store.create_profiled_session("toy", {}, {"name": "Fake GPU"}, sample_cards())
        settings = SearchSettings.from_dict({"iterations_per_op": 8, "parallel": parallel,
                                             "patience": 100, "seed": seed})
        engine = Engine(store, sid, JitteryProposer(max_delay_s, seed, empty_every),
                        JitteryEvaluator(capacity, max_delay_s, seed + 1), settings)
        await engine.run()
        nodes = await store.list_nodes(sid)
        for row in await store.list_cards(sid):
            mine = [n for n in nodes if n.card_id == row.id]
            finished = [n for n in mine if not n.in_flight]
            assert len(finished) == len(mine)  # the search ran to its end
            assert not any(n.confirming for n in mine)  # ...and its confirmations too
            # the best is the fastest confirmed node, and no unconfirmed node is faster than it
            # beyond the timing noise (4% spreads: one within it is never confirmed)
            fastest = max((n.speedup for n in finished if n.confirmed), default=None)
            assert all(not significant_win(n.speedup / fastest, math.hypot(0.04, 0.04))
                       or n.speedup <= 1.0
                       for n in finished if n.speedup is not None and fastest is not None)
            assert row.spent == len(finished)
            assert row.best_speedup == fastest
            if fastest is None:
                assert row.best_node is None
            else:
                best = next(n for n in finished if n.id == row.best_node)
                assert best.speedup == fastest
            kept = engine.schedule.cards[row.id]
            assert (kept.spent, kept.best) == (row.spent, Best(row.best_node, row.best_speedup))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parallel=st.integers(2, 6), capacity=st.integers(1, 4), seed=st.integers(0, 10_000),
       empty_every=st.sampled_from([0, 3, 5]), max_delay_s=st.sampled_from([0.0, 0.002, 0.01]))
def test_parallel_results_each_count_once_and_the_best_is_the_fastest_node(
        parallel, capacity, seed, empty_every, max_delay_s):
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(search_once(Path(folder) / "k.db", parallel, capacity, seed, empty_every,
                                max_delay_s))


class PaidProposer(FakeProposer):
    """Each reply costs ``usd``; the engine is cancelled as soon as the first reply is in."""

    def __init__(self, usd: float, empty: bool) -> None:
        super().__init__(empty_every=1 if empty else 0)
        self.paid = usd
        self.engine_task: asyncio.Task | None = None

    async def propose(self, request: ProposalRequest) -> Proposal:
        proposal = await super().propose(request)
        assert self.engine_task is not None
        asyncio.get_running_loop().call_soon(self.engine_task.cancel)
        call = LlmCall(model="paid", input_tokens=900, output_tokens=300, usd=self.paid,
                       seconds=1.0, prompt="p", reply="r")
        return Proposal(proposal.candidates, [call], proposal.error)


async def cancel_after_first_reply(tmp_path: Path, empty: bool) -> tuple[Store, int, list]:
    store = await Store.open(tmp_path / "k.db")
    sid = await store.create_profiled_session("toy", {}, {"name": "Fake GPU"}, sample_cards())
    proposer, evaluator = PaidProposer(0.25, empty), FakeEvaluator()
    engine = Engine(store, sid, proposer, evaluator,
                    SearchSettings.from_dict({"iterations_per_op": 4, "parallel": 1}))
    proposer.engine_task = asyncio.create_task(engine.run())
    try:
        await proposer.engine_task
    except asyncio.CancelledError:
        pass
    return store, sid, evaluator.evaluated


async def test_a_reply_is_paid_for_even_when_the_engine_ends_before_its_evaluation(
        tmp_path: Path):
    store, sid, evaluated = await cancel_after_first_reply(tmp_path, empty=False)
    try:
        assert evaluated == []
        assert (await store.get_session(sid)).usd_spent == 0.25
        [node] = await store.list_nodes(sid)
        assert node.status == NodeStatus.EVALUATING and node.usd == 0.25  # redone on resume
        assert [c["usd"] for c in (await store.get_node(node.id)).llm_calls] == [0.25]
    finally:
        await store.close()


async def test_a_reply_without_a_kernel_is_paid_for_when_the_engine_ends(tmp_path: Path):
    store, sid, _ = await cancel_after_first_reply(tmp_path, empty=True)
    try:
        assert (await store.get_session(sid)).usd_spent == 0.25
        [node] = await store.list_nodes(sid)
        assert node.status == NodeStatus.NO_CANDIDATE
        card = await store.get_card(node.card_id)
        assert card.spent == 1
    finally:
        await store.close()
