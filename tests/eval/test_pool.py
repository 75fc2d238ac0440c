"""The worker pool: framing, timeouts and crashes cost only a worker, work spreads over GPUs.
Workers here are stand-ins (tests.eval.fake_worker) speaking the real protocol."""

from __future__ import annotations

import asyncio
import io
import itertools
import sys
import time
from pathlib import Path

import pytest

from kforge.core.candidate import Baseline, Candidate, EvalOutcome, EvalStatus, Timing
from kforge.core.gpu import GpuInfo
from kforge.core.outcome import Element, FailureEvidence, Mismatch
from kforge.core.protocols import Evaluator, SearchContext
from kforge.errors import KforgeError
from kforge.eval import make_gpu_evaluator
from kforge.eval.process.pool import GpuEvaluator
from kforge.eval.process.protocol import (
    HEADER,
    KINDS,
    BaselineMeasured,
    Evaluate,
    Evaluated,
    Failed,
    Fatal,
    MeasureBaseline,
    Ping,
    Pong,
    ProtocolError,
    Ready,
    Shutdown,
    encode,
    read_frame,
    read_frame_async,
    read_request,
    worker_exits_after,
)
from tests.eval.candidates import add_card
from tests.eval.fake_worker import worker_said

CARD = add_card([4, 4])


def fake(device: int) -> list[str]:
    return [sys.executable, "-m", "tests.eval.fake_worker", "--device", str(device)]


def candidate(**meta) -> Candidate:
    return Candidate("", "", meta)


async def started(devices=(0,), **kwargs) -> GpuEvaluator:
    """An evaluator of stand-in workers, one a GPU unless ``settings`` says otherwise."""
    settings = {"workers": 1, **kwargs.pop("settings", {})}
    evaluator = GpuEvaluator(None, list(devices), command=kwargs.pop("command", fake),
                             start_timeout_s=60, settings=settings, **kwargs)
    await evaluator.start()
    return evaluator


TIMING = Timing(median_us=10.0, p10_us=9.0, p90_us=11.0, reps=20)
MESSAGES = [
    Ready(GpuInfo(name="H200", arch="sm_90", sm_count=132, bandwidth_gbs=4000.0)),
    Fatal("no CUDA GPU"),
    Evaluate(CARD, Candidate("src", plan={"launches": []}, meta={"a": 1}), Path("/s"),
             {"seeds": [1, 2]}, id=7),
    Evaluate(CARD, Candidate("src", "def launch(k, x): pass")),
    MeasureBaseline(CARD, None, {}, id=8),
    Ping(id=9),
    Shutdown(),
    Evaluated(EvalOutcome(EvalStatus.OK, "fine", timing=TIMING, speedup=12.5,
                          failure=FailureEvidence(Mismatch(max_abs="inf", worst=(
                              Element((1, 2), 2.5, "nan"),)))), id=7),
    Evaluated(EvalOutcome(EvalStatus.CRASH, "a kernel crashed", restart=True), restart=True, id=3),
    BaselineMeasured(Baseline(eager=TIMING, compiled=TIMING, floor_us=1.0), id=8),
    Pong(id=9),
    Failed("evaluator error", traceback="Traceback ...", restart=True, id=4),
]


def test_every_kind_of_message_has_an_example():
    assert {type(m) for m in MESSAGES} == set(KINDS.values())


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_a_frame(message):
    stream = io.BytesIO(encode(message) + encode(Ping(id=1)))
    assert read_frame(stream) == message
    assert read_frame(stream) == Ping(id=1)
    assert read_frame(stream) is None


def frame(payload: bytes) -> io.BytesIO:
    return io.BytesIO(HEADER.pack(len(payload)) + payload)


def test_bad_frames_and_unknown_messages_are_refused():
    with pytest.raises(ProtocolError, match="inside a frame"):
        read_frame(io.BytesIO(encode(Ping(id=1))[:-3]))
    with pytest.raises(ProtocolError, match="not a JSON object"):
        read_frame(frame(b"[]"))
    with pytest.raises(ProtocolError, match="unknown message kind 'explode'"):
        read_frame(frame(b'{"kind": "explode", "id": 1}'))
    with pytest.raises(ProtocolError, match="'ping' lacks its key 'id'"):
        read_frame(frame(b'{"kind": "ping"}'))
    with pytest.raises(ProtocolError, match="Pong is not a request"):
        read_request(io.BytesIO(encode(Pong(id=1))))


def test_only_replies_that_say_so_end_the_worker():
    outcome = EvalOutcome(EvalStatus.OK)
    assert [worker_exits_after(r) for r in (Evaluated(outcome), Evaluated(outcome, restart=True),
                                            Failed("x"), Failed("x", restart=True), Pong())] \
        == [False, True, False, True, False]


async def test_async_reader_reports_a_closed_peer():
    reader = asyncio.StreamReader()
    reader.feed_data(encode(Pong(id=1)))
    reader.feed_eof()
    assert await read_frame_async(reader) == Pong(id=1)
    with pytest.raises(EOFError):
        await read_frame_async(reader)


async def test_evaluations_and_baselines_come_back():
    evaluator = await started()
    try:
        assert isinstance(evaluator, Evaluator)
        assert evaluator.gpu.name == "Fake 0" and evaluator.capacity == 1
        outcome = await evaluator.evaluate(CARD, candidate())
        assert outcome.status is EvalStatus.OK and outcome.speedup == 1.0
        baseline = await evaluator.baseline(CARD)
        assert baseline.eager.median_us == 10.0 and baseline.floor_us == 1.0
        with pytest.raises(KforgeError, match="fails on replayed inputs"):
            await evaluator.baseline(CARD.with_(op="aten.div.Tensor", key=""))
        infra = await evaluator.evaluate(CARD, candidate(behaviour="infra"))
        assert infra.status is EvalStatus.INFRA and "something broke" in infra.summary
    finally:
        await evaluator.close()


async def test_a_hung_evaluation_times_out_and_the_worker_is_replaced():
    evaluator = await started(timeout_s=1.0)
    try:
        before = worker_said(await evaluator.evaluate(CARD, candidate()))["pid"]
        hung = await evaluator.evaluate(CARD, candidate(behaviour="hang"))
        assert hung.status is EvalStatus.TIMEOUT and "restarted" in hung.summary
        after = await evaluator.evaluate(CARD, candidate())
        assert after.ok and worker_said(after)["pid"] != before
        assert evaluator.restarts == 1
    finally:
        await evaluator.close()


async def test_a_dead_worker_is_a_crash_and_the_search_goes_on():
    evaluator = await started()
    try:
        dead = await evaluator.evaluate(CARD, candidate(behaviour="die"))
        assert dead.status is EvalStatus.CRASH
        assert "illegal memory access" in dead.summary
        restarted = await evaluator.evaluate(CARD, candidate(behaviour="restart"))
        assert restarted.status is EvalStatus.CRASH and restarted.summary == "a kernel crashed"
        assert (await evaluator.evaluate(CARD, candidate())).ok
        assert evaluator.restarts == 2
    finally:
        await evaluator.close()


async def test_an_evaluator_failure_that_ends_the_worker_replaces_it_at_once():
    evaluator = await started()
    try:
        before = worker_said(await evaluator.evaluate(CARD, candidate()))["pid"]
        broken = await evaluator.evaluate(CARD, candidate(behaviour="infra_restart"))
        assert broken.status is EvalStatus.INFRA and "something broke" in broken.summary
        after = await evaluator.evaluate(CARD, candidate())
        assert after.ok and worker_said(after)["pid"] != before
        assert evaluator.restarts == 1
    finally:
        await evaluator.close()


async def test_evaluations_spread_over_gpus():
    evaluator = await started(devices=(0, 1))
    try:
        assert evaluator.capacity == 2
        outcomes = await asyncio.gather(*(evaluator.evaluate(CARD, candidate(delay_s=0.3))
                                          for _ in range(4)))
        assert all(o.ok for o in outcomes)
        assert {o.placement.device for o in outcomes} == {"cuda:0", "cuda:1"}
    finally:
        await evaluator.close()


async def test_when_no_worker_can_restart_evaluations_fail_clearly():
    starts = itertools.chain([False], itertools.repeat(True))  # the first starts, no other

    def flaky(device: int) -> list[str]:
        return fake(device) + (["--fail-start"] if next(starts) else [])

    evaluator = await started(command=flaky)
    try:
        dead = await evaluator.evaluate(CARD, candidate(behaviour="die"))
        assert dead.status is EvalStatus.CRASH
        with pytest.raises(KforgeError, match="no evaluation worker is left"):
            await evaluator.evaluate(CARD, candidate())
    finally:
        await evaluator.close()


async def test_workers_of_one_gpu_evaluate_side_by_side():
    evaluator = await started(settings={"workers": 2})
    try:
        assert evaluator.capacity == 2
        began = time.monotonic()
        outcomes = await asyncio.gather(*(evaluator.evaluate(CARD, candidate(delay_s=1.0))
                                          for _ in range(2)))
        assert time.monotonic() - began < 1.9  # not one after the other
        assert all(o.ok and o.placement.device == "cuda:0" for o in outcomes)
        assert len({worker_said(o)["pid"] for o in outcomes}) == 2
    finally:
        await evaluator.close()


async def test_a_worker_is_replaced_by_the_spare_started_ahead_of_need():
    evaluator = await started(command=lambda d: fake(d) + ["--start-delay", "0.5"])
    try:
        first = await evaluator.evaluate(CARD, candidate())
        await asyncio.sleep(1.5)  # the spare has started meanwhile
        asked = time.time()
        dead = await evaluator.evaluate(CARD, candidate(behaviour="die"))
        assert dead.status is EvalStatus.CRASH
        after = await evaluator.evaluate(CARD, candidate())
        assert after.ok and worker_said(after)["pid"] != worker_said(first)["pid"]
        assert worker_said(after)["started_at"] < asked  # ready before it was needed
    finally:
        await evaluator.close()


async def test_a_worker_that_cannot_start_says_why():
    evaluator = GpuEvaluator(None, [0], command=lambda d: fake(d) + ["--fail-start"])
    with pytest.raises(KforgeError, match="no GPU here"):
        await evaluator.start()


async def test_close_stops_the_workers():
    evaluator = await started(devices=(0, 1))
    processes = [w.process for w in list(evaluator._idle._queue) if w is not None]
    await evaluator.close()
    assert all(p.returncode is not None for p in processes)


def _no_gpu() -> bool:
    import torch

    return not torch.cuda.is_available()


@pytest.mark.skipif(not _no_gpu(), reason="checks the no-GPU path")
async def test_the_real_worker_explains_that_there_is_no_gpu():
    evaluator = GpuEvaluator(None, [0], start_timeout_s=120)
    with pytest.raises(KforgeError, match="no CUDA GPU"):
        await evaluator.start()


@pytest.mark.skipif(not _no_gpu(), reason="checks the no-GPU path")
def test_the_factory_refuses_without_a_gpu():
    with pytest.raises(KforgeError, match="no CUDA GPU"):
        make_gpu_evaluator(SearchContext(session_id=1, samples_dir=Path(".")))


async def test_a_worker_is_replaced_after_serving_its_share():
    evaluator = await started(settings={"recycle_after": 2})
    try:
        pids = [worker_said(await evaluator.evaluate(CARD, candidate()))["pid"]
                for _ in range(5)]
    finally:
        await evaluator.close()
    assert pids[0] == pids[1] and pids[2] == pids[3] and len(set(pids)) == 3
    assert evaluator.restarts >= 2


async def test_a_new_best_is_confirmed_by_a_fresh_worker_on_new_inputs(monkeypatch):
    import kforge.eval.process.sanitize as sanitize

    seen = []
    monkeypatch.setattr(sanitize, "sanitize_candidate", lambda card, cand, **kw: (
        seen.append(kw) or sanitize.SanitizerReport(True, "memcheck,racecheck")))
    evaluator = await started(settings={"seeds": [1, 2]})
    try:
        first = await evaluator.evaluate(CARD, candidate())
        confirmed = await evaluator.confirm(CARD, candidate(), first)
    finally:
        await evaluator.close()
    assert confirmed.ok and confirmed.confirmed
    # a worker of its own: the spare
    assert worker_said(confirmed)["pid"] != worker_said(first)["pid"]
    assert confirmed.confirmation.sanitizer.ok is True and seen


async def test_the_sanitizer_and_the_fresh_evaluation_run_at_once(monkeypatch):
    """A confirmation takes the longer of its two checks, not their sum: the fresh worker's
    evaluation ends while the sanitizer is still running."""
    import threading

    import kforge.eval.process.sanitize as sanitize
    from kforge.eval.process.pool import GpuEvaluator

    evaluated, overlapped = threading.Event(), []
    fresh_evaluation = GpuEvaluator._fresh_evaluation

    async def watched(self, *args):
        try:
            return await fresh_evaluation(self, *args)
        finally:
            evaluated.set()

    def waits_for_the_rerun(card, cand, **kw):
        overlapped.append(evaluated.wait(30))
        return sanitize.SanitizerReport(True, "memcheck")

    monkeypatch.setattr(GpuEvaluator, "_fresh_evaluation", watched)
    monkeypatch.setattr(sanitize, "sanitize_candidate", waits_for_the_rerun)
    evaluator = await started()
    try:
        confirmed = await evaluator.confirm(CARD, candidate(), await evaluator.evaluate(
            CARD, candidate()))
    finally:
        await evaluator.close()
    assert overlapped == [True]
    assert confirmed.ok and confirmed.confirmed and confirmed.confirmation.sanitizer.ok


async def test_two_confirmations_at_once_each_find_a_spare_started_ahead(monkeypatch):
    """``spares`` workers per GPU start with the pool: two confirmations at once each re-time on
    a worker that was started (and warmed up) before they began, none waiting for a process."""
    import kforge.eval.process.sanitize as sanitize
    from kforge.eval.process.pool import WorkerProcess

    monkeypatch.setattr(sanitize, "sanitize_candidate",
                        lambda card, cand, **kw: sanitize.SanitizerReport(True, "memcheck"))
    started_pids: list[int] = []
    start = WorkerProcess.start

    async def recording(self, timeout_s):
        info = await start(self, timeout_s)
        started_pids.append(self.process.pid)
        return info

    monkeypatch.setattr(WorkerProcess, "start", recording)
    evaluator = await started(settings={"spares": 2})
    try:
        first = await evaluator.evaluate(CARD, candidate())
        for _ in range(200):  # the spares start in the background
            if len(started_pids) == 3:
                break
            await asyncio.sleep(0.05)
        ahead = list(started_pids)
        confirmed = await asyncio.gather(evaluator.confirm(CARD, candidate(), first),
                                         evaluator.confirm(CARD, candidate(), first))
    finally:
        await evaluator.close()
    assert len(ahead) == 3  # one worker and two spares
    pids = [worker_said(c)["pid"] for c in confirmed]
    assert len(set(pids)) == 2 and set(pids) <= set(ahead[1:])
    assert all(c.confirmed for c in confirmed)


async def test_a_confirmations_worker_takes_the_place_of_the_next_retiring_worker(monkeypatch):
    """A confirmation's worker whose candidate passed replaces the next search worker to retire,
    so that replacement starts no process (a start holds the GPU while the search times)."""
    import kforge.eval.process.sanitize as sanitize
    from kforge.eval.process.pool import WorkerProcess

    monkeypatch.setattr(sanitize, "sanitize_candidate",
                        lambda card, cand, **kw: sanitize.SanitizerReport(True, "memcheck"))
    evaluator = await started(settings={"recycle_after": 3, "spares": 1})
    starts = []
    start = WorkerProcess.start

    async def counted(self, timeout_s):
        starts.append(self)
        return await start(self, timeout_s)

    try:
        first = await evaluator.evaluate(CARD, candidate())
        confirmed = await evaluator.confirm(CARD, candidate(), first)
        await asyncio.sleep(0.5)  # the spare taken for the confirmation is replaced
        monkeypatch.setattr(WorkerProcess, "start", counted)
        await evaluator.evaluate(CARD, candidate())
        third = await evaluator.evaluate(CARD, candidate())  # its worker retires here
        after = await evaluator.evaluate(CARD, candidate())
        await asyncio.sleep(0.3)
    finally:
        await evaluator.close()
    assert worker_said(third)["pid"] == worker_said(first)["pid"]
    assert worker_said(after)["pid"] == worker_said(confirmed)["pid"]
    assert starts == []  # no process started for the replacement


async def test_a_rejected_confirmations_worker_is_ended(monkeypatch):
    import kforge.eval.process.sanitize as sanitize

    monkeypatch.setattr(sanitize, "sanitize_candidate", lambda card, cand, stop, **kw: (
        stop.wait(0.5), sanitize.SanitizerReport(False, "memcheck", "Invalid __global__ write"))[1])
    evaluator = await started(settings={"recycle_after": 1})
    try:
        first = await evaluator.evaluate(CARD, candidate())
        outcome = await evaluator.confirm(CARD, candidate(), first)
        assert outcome.status is EvalStatus.MISMATCH
        assert evaluator._successors == {}
        after = await evaluator.evaluate(CARD, candidate())
    finally:
        await evaluator.close()
    assert after.ok and worker_said(after)["pid"] != worker_said(first)["pid"]


async def test_a_sanitizer_report_rejects_the_new_best(monkeypatch):
    import kforge.eval.process.sanitize as sanitize

    monkeypatch.setattr(sanitize, "sanitize_candidate", lambda card, cand, **kw: (
        sanitize.SanitizerReport(False, "racecheck", "compute-sanitizer racecheck: Error: Race "
                                 "reported between Write access at k+0x10")))
    evaluator = await started()
    try:
        outcome = await evaluator.confirm(CARD, candidate(), await evaluator.evaluate(
            CARD, candidate()))
    finally:
        await evaluator.close()
    assert outcome.status is EvalStatus.MISMATCH and "racecheck" in outcome.summary


async def test_a_cancelled_confirmation_stops_its_sanitizer_run(monkeypatch):
    """A confirmation superseded by a faster node's is cancelled: its sanitizer run (in a thread)
    is told to stop, and its fresh worker goes."""
    import threading

    import kforge.eval.process.sanitize as sanitize

    began, stopped = threading.Event(), threading.Event()

    def slow(card, cand, stop, **kw):
        began.set()
        if stop.wait(30):
            stopped.set()
        return sanitize.SanitizerReport(True, ran=False)

    monkeypatch.setattr(sanitize, "sanitize_candidate", slow)
    evaluator = await started()
    try:
        first = await evaluator.evaluate(CARD, candidate())
        task = asyncio.create_task(evaluator.confirm(CARD, candidate(), first))
        await asyncio.to_thread(began.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(stopped.wait, 5)
    finally:
        await evaluator.close()


def test_confirmation_runs_use_other_seeds():
    from kforge.eval.process.pool import confirmation_settings

    again = confirmation_settings({"seeds": [1, 2, 3], "stress_seed": 11, "warmup": 2})
    assert set(again["seeds"]).isdisjoint({1, 2, 3}) and again["stress_seed"] != 11
    assert again["warmup"] == 2
