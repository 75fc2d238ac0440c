"""The worker pool: framing, timeouts and crashes cost only a worker, work spreads over GPUs.
Workers here are stand-ins (tests.eval.fake_worker) speaking the real protocol."""

from __future__ import annotations

import asyncio
import io
import sys
from pathlib import Path

import pytest

from kforge.core.candidate import Candidate, EvalStatus
from kforge.core.protocols import Evaluator, SearchContext
from kforge.errors import KforgeError
from kforge.eval import make_gpu_evaluator
from kforge.eval.pool import GpuEvaluator
from kforge.eval.protocol import ProtocolError, encode, read_frame, read_frame_async
from tests.eval.candidates import add_card

CARD = add_card([4, 4])


def fake(device: int) -> list[str]:
    return [sys.executable, "-m", "tests.eval.fake_worker", "--device", str(device)]


def candidate(**meta) -> Candidate:
    return Candidate("", "", meta)


async def started(devices=(0,), **kwargs) -> GpuEvaluator:
    evaluator = GpuEvaluator(None, list(devices), command=kwargs.pop("command", fake),
                             start_timeout_s=60, **kwargs)
    await evaluator.start()
    return evaluator


def test_frames_round_trip_and_bad_frames_are_refused():
    message = {"kind": "evaluate", "x": [1, 2.5, None], "nan": float("inf")}
    stream = io.BytesIO(encode(message) + encode({"kind": "ping"}))
    assert read_frame(stream) == message
    assert read_frame(stream) == {"kind": "ping"}
    assert read_frame(stream) is None
    with pytest.raises(ProtocolError):
        read_frame(io.BytesIO(encode(message)[:-3]))
    with pytest.raises(ProtocolError):
        read_frame(io.BytesIO(b"\x00\x00\x00\x02[]"))


async def test_async_reader_reports_a_closed_peer():
    reader = asyncio.StreamReader()
    reader.feed_data(encode({"a": 1}))
    reader.feed_eof()
    assert await read_frame_async(reader) == {"a": 1}
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
        before = (await evaluator.evaluate(CARD, candidate())).extra["pid"]
        hung = await evaluator.evaluate(CARD, candidate(behaviour="hang"))
        assert hung.status is EvalStatus.TIMEOUT and "restarted" in hung.summary
        after = await evaluator.evaluate(CARD, candidate())
        assert after.ok and after.extra["pid"] != before
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


async def test_evaluations_spread_over_gpus():
    evaluator = await started(devices=(0, 1))
    try:
        assert evaluator.capacity == 2
        outcomes = await asyncio.gather(*(evaluator.evaluate(CARD, candidate(delay_s=0.3))
                                          for _ in range(4)))
        assert all(o.ok for o in outcomes)
        assert {o.extra["device"] for o in outcomes} == {0, 1}
    finally:
        await evaluator.close()


async def test_when_no_worker_can_restart_evaluations_fail_clearly():
    starts = iter([False, True, True, True])

    def flaky(device: int) -> list[str]:
        return fake(device) + (["--fail-start"] if next(starts) else [])

    evaluator = await started(command=flaky)
    try:
        assert (await evaluator.evaluate(CARD, candidate(behaviour="die"))).status is EvalStatus.CRASH
        with pytest.raises(KforgeError, match="no evaluation worker is left"):
            await evaluator.evaluate(CARD, candidate())
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
