"""The timing protocol and the physical floor, on the CPU runtime."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import pytest
import torch

from kforge.core.argspec import resolve_op
from kforge.errors import KforgeError
from kforge.eval.verify.ops import (
    beats_floor,
    flop_count,
    hard_floor_us,
    memory_floor_us,
    mutated_args,
    unique_bytes,
)
from kforge.runtime.device import CpuRuntime
from kforge.runtime.timing import (
    WALL_ROUND,
    Subject,
    TimingPlan,
    drawn_reps,
    reps_for,
    summarize,
    time_interleaved,
    timing_stage,
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
    plan = TimingPlan(warmup=1, min_reps=4, max_reps=4, budget_s=0.0, wall_calls=0)
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
    assert seen == [(r, r) for r in range(5)] + [(WALL_ROUND, WALL_ROUND)]


class QueueRuntime(CpuRuntime):
    """A model of a GPU stream on the CPU: work is queued and runs in order, starting no earlier
    than the host queues it, except behind a hold, where it runs back to back once released.
    ``kernel(us)`` queues ``us`` of device time; events read the device clock."""

    def __init__(self, timeout_after: int = 0) -> None:
        self.free_at = 0.0  # device clock (us of host time) when the stream runs dry
        self.queue: list | None = None  # while held: what was queued behind the hold
        self.holds = 0
        self.timeouts_left = timeout_after  # holds that time out before their release

    def host_now(self) -> float:
        return time.perf_counter() * 1e6

    def _do(self, item: list) -> None:
        if self.queue is not None:
            self.queue.append(item)
            return
        start = max(self.free_at, self.host_now()) if item[0] != "held" else self.free_at
        if item[0] == "kernel":
            self.free_at = start + item[1]
        else:
            item[1] = start if item[0] == "event" else None

    def kernel(self, us: float) -> None:
        self._do(["kernel", us])

    def start(self) -> list:
        event = ["event", None]
        self._do(event)
        return event

    def stop(self, token: list) -> tuple[list, list]:
        return token, self.start()

    def elapsed_us(self, token: tuple[list, list]) -> float:
        return token[1][1] - token[0][1]

    def hold(self, timeout_s: float) -> None:
        self.holds += 1
        self.queue = []

    def release(self) -> bool:
        queued, self.queue = self.queue or [], None
        timed_out = self.timeouts_left > 0
        self.timeouts_left -= 1
        clock = max(self.free_at, self.host_now())
        for item in queued:  # back to back from the release
            if item[0] == "kernel":
                clock += item[1]
            else:
                item[1] = clock
        self.free_at = clock
        return not timed_out


def test_the_held_stream_times_the_device_not_a_slow_host():
    runtime = QueueRuntime()

    def slow_host_call(r: int) -> None:
        time.sleep(0.002)  # 2000 us to issue a 50 us kernel
        runtime.kernel(50.0)

    plan = TimingPlan(warmup=1, min_reps=6, max_reps=6, budget_s=0.0, hold_rounds=3,
                      wall_calls=4)
    timing = time_interleaved({"x": slow_host_call}, runtime, plan).timings["x"]
    assert timing.device_us == pytest.approx(50.0)
    assert timing.host_us >= 2000.0 and timing.wall_us >= 2000.0
    assert runtime.holds == 2  # 6 rounds, 3 behind each hold
    unheld = time_interleaved({"x": slow_host_call}, QueueRuntime(),
                              replace(plan, hold_rounds=0)).timings["x"]
    assert unheld.device_us >= 2000.0  # without the hold the window holds the host's time


def test_a_hold_that_times_out_is_retried_with_fewer_rounds_then_dropped():
    runtime = QueueRuntime(timeout_after=4)
    plan = TimingPlan(warmup=0, min_reps=8, max_reps=8, budget_s=0.0, hold_rounds=8,
                      wall_calls=0)
    run = time_interleaved({"x": lambda r: runtime.kernel(5.0)}, runtime, plan)
    assert run.timings["x"].reps == 8  # every round timed once, none from a timed-out batch
    assert runtime.holds == 4  # 8, 4, 2 and 1 rounds timed out; the rest ran unheld
    assert any("without a hold" in note for note in run.notes)


def test_the_number_of_timed_calls_follows_the_pacing_subjects_alone():
    plan = TimingPlan(warmup=2, min_reps=4, max_reps=40, budget_s=0.02, wall_calls=0)
    counts: dict[str, int] = {"slow": 0}

    def slow_in_warmup(r: int) -> None:  # a candidate dragging its warm-ups out
        if r < plan.warmup:
            time.sleep(0.02)
        else:
            counts["slow"] += 1

    run = time_interleaved({"candidate": Subject(slow_in_warmup, paces=False),
                            "eager": lambda r: None}, CpuRuntime(), plan)
    assert counts["slow"] >= 30  # 40 rounds fit eager's budget, less up to a quarter
    assert run.timings["candidate"].reps == counts["slow"]
    drawn = {drawn_reps(0.0, plan, random.Random(seed)) for seed in range(40)}
    assert min(drawn) >= 30 and len(drawn) > 1  # a count a subject cannot predict


def test_floors():
    assert memory_floor_us(2_000_000, 2_000_000, 4000.0) == pytest.approx(1.0)
    assert memory_floor_us(1, 1, None) is None
    # Outputs that fit in L2 need not reach DRAM within the timed call.
    assert hard_floor_us(1_000_000, 1_000_000, 1000.0, l2_bytes=2_000_000) == pytest.approx(0.8)
    assert hard_floor_us(1_000_000, 3_000_000, 1000.0, l2_bytes=2_000_000) == pytest.approx(1.6)
    # a copy rate measured at half speed (other work on the GPU) does not raise the floor past
    # what the memory's peak allows
    assert hard_floor_us(1_000_000, 0, 500.0, l2_bytes=0, peak_gbs=1250.0) == pytest.approx(0.8)
    assert hard_floor_us(1_000_000, 0, None, l2_bytes=0, peak_gbs=1000.0) == pytest.approx(1.0)


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
    assert outcome.work.read_bytes == indices
    assert outcome.work.write_bytes == R.TOKENS * R.EMBED_DIM * 4


def test_a_call_that_fails_releases_the_hold_before_the_error_goes_on():
    runtime = QueueRuntime()
    releases: list[bool] = []
    release = runtime.release
    runtime.release = lambda: releases.append(True) or release()  # type: ignore[method-assign]

    def fails_when_timed(r: int) -> None:
        if r >= 1:
            raise RuntimeError("launch refused")

    with pytest.raises(RuntimeError, match="launch refused"):
        time_interleaved({"x": fails_when_timed}, runtime,
                         TimingPlan(warmup=1, min_reps=4, max_reps=4, budget_s=0.0))
    assert runtime.holds == 1 and releases == [True] and runtime.queue is None


def test_the_hold_kernel_compiles_with_nvrtc():
    from kforge.runtime.device import HOLD_KERNEL, HOLD_SOURCE
    from kforge.runtime.nvrtc import Compiler, cuda_include_dirs

    try:
        cuda_include_dirs()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    compiled = Compiler().compile(HOLD_SOURCE, "sm_90")
    assert compiled.ok, compiled.log
    assert list(compiled.resources) == [HOLD_KERNEL]


@pytest.mark.parametrize("fails_at, stage", [
    (0, "warm-up round 0, a"), (2, "timed rounds 1..4 behind a hold"),
    (WALL_ROUND, "3 wall-time calls of a back to back")])
def test_an_error_inside_the_loop_says_which_calls_were_in_flight(fails_at, stage):
    plan = TimingPlan(warmup=1, min_reps=4, max_reps=4, budget_s=0.0, wall_calls=3)

    def call(r: int) -> None:
        if r == fails_at:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError) as caught:
        time_interleaved({"a": call, "b": lambda r: None}, CpuRuntime(), plan)
    assert timing_stage(caught.value) == stage
    assert timing_stage(RuntimeError("elsewhere")) == "timing"


def test_the_wall_time_calls_follow_one_prepare():
    prepared: list[int] = []
    ran: list[int] = []
    plan = TimingPlan(warmup=1, min_reps=2, max_reps=2, budget_s=0.0, wall_calls=5)
    time_interleaved({"a": Subject(ran.append, prepared.append)}, CpuRuntime(), plan)
    assert prepared.count(WALL_ROUND) == 1 and ran.count(WALL_ROUND) == 5


def test_a_checked_timed_call_keeps_no_copy_of_its_inputs(tmp_path, monkeypatch):
    """A checked timed call keeps the values it was given and what it returned: no copy of its
    input buffers (an embedding's table can take gigabytes), nor of its outputs' memory beside
    the returned values' own copies."""
    from kforge.eval.verify import pipeline

    kept: list = []
    keep = pipeline.Evaluation.keep_timed_call
    monkeypatch.setattr(pipeline.Evaluation, "keep_timed_call",
                        lambda self, *a: kept.append(keep(self, *a)) or kept[-1])
    control = next(c for c in R.CONTROLS if c.name == "embedding")
    outcome = evaluate(control.card(), control.candidate("cpu"), sample=control.sample,
                       samples_dir=tmp_path)
    assert outcome.ok, outcome.summary
    assert kept
    for check in kept:
        assert all(flag.numel() == 1 for pair in check.differences for flag in pair)
        assert all(f.raw.numel() <= 2048 for f in check.fences.fences.fences)
        assert not check.fences.outputs and not check.fences.scratch
        assert [s.numel() for s in check.inputs.snapshot] == [b.base.numel()
                                                             for b in check.inputs.buffers]
