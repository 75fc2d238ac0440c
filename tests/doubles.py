"""Test doubles at the proposer/evaluator boundary: deterministic, instant, no GPU.

Usable in-process and, through ``module:function`` specs, by an engine in a subprocess
(``proposer = "tests.doubles:make_proposer"``). Behaviour is steered by the session settings'
``fake`` section:

- ``delay_s``: seconds each evaluation takes (default 0)
- ``journal``: a file each evaluation appends ``start <digest>`` / ``end <digest>`` to
- ``usd``: what each proposal costs (default 0)
- ``fail_every``: every n-th proposal compiles badly (default 0: never)
"""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import dataclass, replace

from kforge.core.candidate import (
    Baseline,
    Candidate,
    EvalOutcome,
    EvalStatus,
    LlmCall,
    Proposal,
    Timing,
)
from kforge.core.gpu import GpuInfo
from kforge.core.opcard import OpCard
from kforge.core.outcome import Confirmation, HostCost
from kforge.core.protocols import ProposalRequest, SearchContext

FAKE_GPU = GpuInfo(name="Fake GPU", arch="sm_90", sm_count=132, bandwidth_gbs=4300.0)
EAGER_US = 100.0


def timing(us: float) -> Timing:
    return Timing(median_us=us, p10_us=us * 0.98, p90_us=us * 1.02, reps=50)


# What a fake candidate's host side says: one launch of its one kernel.
FAKE_PLAN = {"outputs": [{"name": "out", "like": "self"}],
             "launches": [{"kernel": "k", "grid": [1], "block": [32],
                           "params": [{"ptr": "self"}, {"ptr": "out"}]}]}


@dataclass(frozen=True)
class Hold:
    """Where a double stops and waits: after ``after`` calls in this process, each further call
    waits for as long as the file ``path`` exists (a test removes it to let the search go on).
    It pins a search at a known point, whatever the machine's load."""

    path: str
    after: int

    async def wait(self, calls: int) -> None:
        while calls > self.after and os.path.exists(self.path):
            await asyncio.sleep(0.01)

    @classmethod
    def from_settings(cls, fake: dict, where: str) -> Hold | None:
        hold = fake.get("hold")
        return cls(hold["path"], hold["after"]) if hold and hold["in"] == where else None


class FakeProposer:
    """Writes a 'kernel' whose speed is drawn from its seed; refinements of a good parent are
    usually a little better, repairs usually work."""

    name = "fake"

    def __init__(self, usd: float = 0.0, fail_every: int = 0, empty_every: int = 0,
                 speeds: tuple[float, float] = (0.5, 2.0), hold: Hold | None = None) -> None:
        self.hold = hold
        self.usd = usd
        self.speeds = speeds
        self.fail_every = fail_every
        self.empty_every = empty_every
        self.requests: list[ProposalRequest] = []

    def declines(self, card: OpCard) -> str | None:
        return "no kernels for views" if card.op.startswith("aten.view") else None

    async def propose(self, request: ProposalRequest) -> Proposal:
        self.requests.append(request)
        n = len(self.requests)
        if self.hold is not None:
            await self.hold.wait(n)
        calls = [LlmCall(model="fake", input_tokens=100, output_tokens=50, usd=self.usd,
                         seconds=0.0)] if self.usd else []
        if self.empty_every and n % self.empty_every == 0:
            return Proposal(candidates=[], calls=calls, error="reply had no code block")
        rng = random.Random(request.seed)
        parent_speed = (request.parent.candidate.meta.get("speed", 1.0)
                        if request.parent and request.parent.candidate else 1.0)
        speed = round(max(0.2, parent_speed * rng.uniform(0.85, 1.3)
                          if request.action == "refine" else rng.uniform(*self.speeds)), 4)
        broken = bool(self.fail_every and n % self.fail_every == 0)
        meta = {"approach": f"fake-{request.action}", "speed": speed, "seed": request.seed,
                "broken": broken}
        source = f'extern "C" __global__ void k_{request.seed}(float* x) {{ /* {speed} */ }}'
        return Proposal(candidates=[Candidate(source=source, plan=FAKE_PLAN, meta=meta)], calls=calls)

    async def close(self) -> None:
        pass


# Host time per call of a fake kernel's launch path and of eager's dispatch.
HOST_US, EAGER_HOST_US = 6.0, 5.5


class FakeEvaluator:
    """Judges a fake candidate by its meta: broken ones fail to compile, others run at
    ``EAGER_US / speed``."""

    def __init__(self, delay_s: float = 0.0, journal: str | None = None,
                 infra_first: int = 0, hold: Hold | None = None) -> None:
        self.hold = hold
        self.started = 0
        self.gpu = FAKE_GPU
        self.capacity = 1
        self.delay_s = delay_s
        self.journal = journal
        self.infra_left = infra_first
        self.evaluated: list[str] = []
        self.confirmed: list[str] = []
        self.running = 0
        self.max_running = 0
        self.baselines: list[str] = []

    async def start(self) -> None:
        pass

    async def baseline(self, card: OpCard) -> Baseline:
        self.baselines.append(card.key)
        return Baseline(eager=timing(EAGER_US), compiled=timing(EAGER_US * 1.1), compile_s=0.0,
                        floor_us=EAGER_US / 4)

    async def evaluate(self, card: OpCard, candidate: Candidate) -> EvalOutcome:
        self._write(f"start {candidate.digest}")
        self.running += 1
        self.started += 1
        self.max_running = max(self.max_running, self.running)
        try:
            if self.hold is not None:
                await self.hold.wait(self.started)
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        finally:
            self.running -= 1
        if self.infra_left > 0:
            self.infra_left -= 1
            return EvalOutcome(EvalStatus.INFRA, summary="worker restarted")
        self.evaluated.append(candidate.digest)
        self._write(f"end {candidate.digest}")
        if candidate.meta.get("broken"):
            return EvalOutcome(EvalStatus.COMPILE_ERROR, summary="error: expected ';'",
                               compile_log="candidate.cu(3): error: expected a ';'")
        speed = float(candidate.meta.get("speed", 1.0))
        return EvalOutcome(EvalStatus.OK, summary=f"{speed:.2f}x", timing=timing(EAGER_US / speed),
                           eager=timing(EAGER_US), speedup=speed,
                           host=HostCost(HOST_US, EAGER_HOST_US))

    async def confirm(self, card: OpCard, candidate: Candidate,
                      outcome: EvalOutcome) -> EvalOutcome:
        """A candidate's ``confirmed_speed`` (meta) stands for its time on new inputs; one with
        ``racy`` set fails the sanitizer."""
        self.confirmed.append(candidate.digest)
        if candidate.meta.get("racy"):
            return EvalOutcome(EvalStatus.MISMATCH, summary="compute-sanitizer racecheck: race")
        speed = float(candidate.meta.get("confirmed_speed", outcome.speedup or 1.0))
        return replace(outcome.judged_again(EvalStatus.OK, f"{speed:.2f}x"),
                       timing=timing(EAGER_US / speed), eager=timing(EAGER_US), speedup=speed,
                       confirmation=replace(
                           outcome.confirmation or Confirmation(), confirmed=True,
                           first_speedup=outcome.speedup))

    def _write(self, line: str) -> None:
        if self.journal:
            with open(self.journal, "a") as fh:
                fh.write(line + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    async def close(self) -> None:
        pass


def make_proposer(ctx: SearchContext) -> FakeProposer:
    fake = ctx.settings.extra.get("fake", {})
    return FakeProposer(usd=fake.get("usd", 0.0), fail_every=fake.get("fail_every", 0),
                        hold=Hold.from_settings(fake, "propose"))


def make_evaluator(ctx: SearchContext) -> FakeEvaluator:
    fake = ctx.settings.extra.get("fake", {})
    return FakeEvaluator(delay_s=fake.get("delay_s", 0.0), journal=fake.get("journal"),
                         hold=Hold.from_settings(fake, "evaluate"))


def tensor(shape: list[int], dtype: str = "float16") -> dict:
    stride, step = [], 1
    for size in reversed(shape):
        stride.insert(0, step)
        step *= size
    return {"t": "tensor", "shape": shape, "stride": stride, "dtype": dtype, "offset": 0}


def sample_cards() -> list[OpCard]:
    """Three target ops with different shares, and a view that is never a target."""
    return [
        OpCard(op="aten._softmax.default", args=[tensor([8, 1024]), -1, False], calls=12,
               total_us=600.0, share=0.6, eager_us=50.0),  # in-model time, as profiled
        OpCard(op="aten.add.Tensor", args=[tensor([8, 1024]), tensor([8, 1024])], calls=30,
               total_us=300.0, share=0.3),
        OpCard(op="aten.relu.default", args=[tensor([64])], calls=4, total_us=50.0, share=0.05),
        OpCard(op="aten.view.default", args=[tensor([8, 1024]), [8192]], calls=40, total_us=50.0,
               share=0.05, library="view", target=False),
    ]
