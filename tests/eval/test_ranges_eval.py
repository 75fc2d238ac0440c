"""Evaluating a candidate for a range card on the CPU (stand-in kernels): a shape-generic kernel
passes at the profiled point, both ends and random interior points; a kernel that holds only at
the profiled point is rejected, naming the point where it failed."""

from __future__ import annotations

import random

import pytest

from kforge.core.candidate import Candidate, EvalStatus
from kforge.core.laws import Law, Ranges, Symbol
from kforge.core.opcard import OpCard
from kforge.core.ranges import range_card
from kforge.eval.process.protocol import Evaluate, decode, encode
from kforge.eval.verify.evaluate import evaluate_candidate
from kforge.eval.verify.ranges import INTERIOR_POINTS, evaluate_range
from kforge.runtime.device import CpuRuntime
from tests.eval import candidates as C
from tests.eval.fakes import CPU_GPU, PyLoader
from tests.eval.redteam import FAST

AT = 48


def rows_card(lo: int = 1, hi: int = 200, at: int = AT) -> OpCard:
    """``relu`` of an ``[L, 64]`` float32 tensor for L in lo..hi."""
    ranges = Ranges((Symbol("L", lo, hi, at),), (Law(("args", 0, "shape", 0), "L", 1, 0),))
    return range_card(C.relu_card([at, 64]), ranges)


def run(card: OpCard, candidate: Candidate, seed: int = 0):
    return evaluate_range(card, candidate, runtime=CpuRuntime(), loader=PyLoader(), gpu=CPU_GPU,
                          settings=FAST, chance=random.Random(seed))


def test_a_shape_generic_kernel_passes_over_the_whole_range():
    card = rows_card()
    outcome = run(card, C.relu())
    assert outcome.status is EvalStatus.OK, outcome.summary
    points = [figure.point["L"] for figure in outcome.ranges.points]
    assert points[:3] == [AT, 1, 200] and len(set(points)) == 3 + INTERIOR_POINTS
    assert all(1 <= p <= 200 for p in points)
    eager = sum(f.eager_us for f in outcome.ranges.points)
    kernel = sum(f.median_us for f in outcome.ranges.points)
    assert outcome.speedup == pytest.approx(eager / kernel)
    assert "over L=1..200 at 6 points" in outcome.summary
    assert outcome.correctness.sets  # the profiled point's full verdict is kept


def test_the_pipeline_hands_a_range_card_to_the_range_evaluation():
    outcome = evaluate_candidate(rows_card(), C.relu(), runtime=CpuRuntime(), loader=PyLoader(),
                                 gpu=CPU_GPU, settings=FAST)
    assert outcome.ok and len(outcome.ranges.points) == 3 + INTERIOR_POINTS


def test_a_kernel_sized_for_the_profiled_point_is_rejected_for_the_range():
    plan = C.unary_plan(C.kernel_name("relu", "float32"))
    plan["let"] = {"n": str(AT * 64)}  # the element count baked in
    fixed = Candidate(C.ELEMENTWISE_SOURCE, plan=plan)
    assert run(rows_card(AT, AT + 1), fixed).status is not EvalStatus.OK
    outcome = run(rows_card(), fixed)
    assert outcome.status is not EvalStatus.OK
    assert outcome.summary.startswith("at L=1: ")
    assert outcome.ranges.failed_at == {"L": 1}


def test_a_plan_that_covers_only_the_profiled_point_is_rejected():
    plan = C.unary_plan(C.kernel_name("relu", "float32"))
    plan["requires"] = [*plan["requires"], f"self.shape[0] == {AT}"]
    outcome = run(rows_card(), Candidate(C.ELEMENTWISE_SOURCE, plan=plan))
    assert outcome.status is EvalStatus.LAUNCH_ERROR
    assert outcome.summary.startswith("at L=1: the launch plan does not cover")


def test_a_range_card_travels_to_the_worker_with_its_ranges():
    card = rows_card()
    back = decode(encode(Evaluate(card, C.relu()))[4:])  # the payload after its length
    assert back.card == card and back.card.ranges == card.ranges
