"""The timing protocol and the physical floor, on the CPU runtime."""

from __future__ import annotations

import pytest
import torch

from kforge.core.argspec import resolve_op
from kforge.errors import KforgeError
from kforge.eval.device import CpuRuntime
from kforge.eval.ops import (
    beats_floor,
    flop_count,
    hard_floor_us,
    memory_floor_us,
    mutated_args,
    unique_bytes,
)
from kforge.eval.timing import (
    Subject,
    TimingPlan,
    reps_for,
    summarize,
    time_interleaved,
)
from tests.eval import redteam as R
from tests.eval.test_redteam_cpu import evaluate


def test_summary_gives_median_and_spread():
    t = summarize([float(v) for v in range(1, 101)])
    assert t.median_us == pytest.approx(50.5)
    assert t.p10_us == pytest.approx(10.9)
    assert t.p90_us == pytest.approx(90.1)
    assert t.reps == 100
    with pytest.raises(ValueError):
        summarize([])


def test_repetitions_follow_the_call_time_within_bounds():
    plan = TimingPlan(min_reps=20, max_reps=200, budget_s=0.1)
    assert reps_for(1e-5, plan) == 200
    assert reps_for(0.001, plan) == 100
    assert reps_for(1.0, plan) == 20


def test_subjects_are_interleaved_with_alternating_order():
    calls: list[tuple[str, int]] = []
    plan = TimingPlan(warmup=1, min_reps=4, max_reps=4, budget_s=0.0)
    run = time_interleaved({"a": lambda r: calls.append(("a", r)) or f"a{r}",
                            "b": lambda r: calls.append(("b", r)) or f"b{r}"}, CpuRuntime(), plan)
    assert calls == [("a", 0), ("b", 0),  # warm-up
                     ("b", 1), ("a", 1), ("a", 2), ("b", 2), ("b", 3), ("a", 3), ("a", 4), ("b", 4)]
    assert run.timings["a"].reps == run.timings["b"].reps == 4
    assert run.last == {"a": (4, "a4"), "b": (4, "b4")}


class StepRuntime(CpuRuntime):
    """A CPU runtime whose clock advances only when a call ``tick``s it."""

    def __init__(self) -> None:
        self.now = 0.0

    def tick(self, us: float) -> None:
        self.now += us

    def start(self) -> float:
        return self.now

    def stop(self, token: float) -> tuple[float, float]:
        return token, self.now

    def elapsed_us(self, token: tuple[float, float]) -> float:
        return token[1] - token[0]


def test_preparing_and_looking_at_a_call_stay_outside_its_timed_window():
    runtime = StepRuntime()
    seen: list[tuple[int, object]] = []
    subject = Subject(run=lambda r: runtime.tick(1.0) or r,
                      prepare=lambda r: runtime.tick(100.0),
                      after=lambda r, result: seen.append((r, result)) or runtime.tick(100.0))
    run = time_interleaved({"x": subject}, runtime,
                           TimingPlan(warmup=2, min_reps=3, max_reps=3, budget_s=0.0))
    assert run.timings["x"].median_us == 1.0 and run.timings["x"].reps == 3
    assert seen == [(r, r) for r in range(5)]


def test_floors():
    assert memory_floor_us(2_000_000, 2_000_000, 4000.0) == pytest.approx(1.0)
    assert memory_floor_us(1, 1, None) is None
    # Outputs that fit in L2 need not reach DRAM within the timed call.
    assert hard_floor_us(1_000_000, 1_000_000, 1000.0, l2_bytes=2_000_000) == pytest.approx(0.8)
    assert hard_floor_us(1_000_000, 3_000_000, 1000.0, l2_bytes=2_000_000) == pytest.approx(1.6)


def test_beating_the_floor_counts_only_where_eager_respects_it():
    assert beats_floor(candidate_us=10, eager_us=100, floor_us=50)
    assert not beats_floor(candidate_us=60, eager_us=100, floor_us=50)
    assert not beats_floor(candidate_us=10, eager_us=40, floor_us=50)  # an embedding-like op
    assert not beats_floor(candidate_us=10, eager_us=100, floor_us=None)


def test_bytes_count_broadcast_storage_once():
    assert unique_bytes(torch.empty(4, 8)) == 128
    assert unique_bytes(torch.empty(8).expand(4, 8)) == 32


def test_flops_for_matmuls_and_none_elsewhere():
    a, b = torch.empty(8, 16), torch.empty(16, 4)
    assert flop_count("aten.mm.default", [a, b], [torch.empty(8, 4)]) == 2 * 8 * 4 * 16
    assert flop_count("aten.addmm.default", [torch.empty(4), a, b], [torch.empty(8, 4)]) == 1024
    assert flop_count("aten.relu.default", [a], [a]) is None


def test_ops_resolve_and_report_what_they_write():
    assert resolve_op("aten._softmax.default") is torch.ops.aten._softmax.default
    assert [m.name for m in mutated_args("aten.add_.Tensor")] == ["self"]
    assert [(m.position, m.name) for m in mutated_args("aten.add.out")] == [(None, "out")]
    assert mutated_args("aten.add.Tensor") == ()
    with pytest.raises(KforgeError):
        resolve_op("aten.no_such_op.default")
    with pytest.raises(KforgeError):
        resolve_op("softmax")


def test_an_embedding_lookup_is_not_charged_for_the_rows_it_does_not_read(tmp_path):
    # Decoding looks up one token's row of a large table: a kernel that reads that row alone
    # beats a floor that counts the whole table, honestly.
    control = next(c for c in R.CONTROLS if c.name == "embedding")
    outcome = evaluate(control.card(), control.candidate("cpu"), sample=control.sample,
                       samples_dir=tmp_path)
    assert outcome.ok, outcome.summary
    indices = R.TOKENS * 8
    assert outcome.extra["read_bytes"] == indices
    assert outcome.extra["write_bytes"] == R.TOKENS * R.EMBED_DIM * 4
