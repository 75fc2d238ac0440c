"""The evaluation worker's start: what it prepares before it reports ready, so that no candidate's
time limit pays for it."""

from __future__ import annotations

import contextlib
import io
import os
import time
from types import SimpleNamespace

from kforge.core.candidate import EvalStatus
from kforge.eval.process import local, worker
from kforge.eval.process.protocol import Ready, read_frame
from kforge.runtime import native
from kforge.runtime.device import CpuRuntime
from kforge.runtime.native import NativeUnavailable
from kforge.runtime.nvrtc import Compiler
from tests.eval.fakes import CPU_GPU, PyLoader


def fake_device(monkeypatch, loader=None) -> list:
    """The worker's device: the CPU runtime, kernels run by their Python stand-ins; the
    loader's compiles are recorded."""
    loader = loader or PyLoader()
    compiled: list = []
    compile = loader.compile
    loader.compile = lambda candidate: compiled.append(candidate.meta) or compile(candidate)
    device = SimpleNamespace(gpu=CPU_GPU, loader=loader, runtime=CpuRuntime())
    monkeypatch.setattr(local, "device_context", lambda index: device)
    return compiled


def test_the_native_guard_and_a_warm_up_run_before_the_worker_reports_ready(monkeypatch):
    compiled = fake_device(monkeypatch)
    replies = io.BytesIO()
    built: list[bytes] = []
    monkeypatch.setattr(native, "library", lambda: built.append(replies.getvalue()))
    assert worker.serve(0, io.BytesIO(), replies) == 0
    assert compiled == [{"family": "warm-up"}]  # kforge's own kernel, evaluated once
    assert built == [b""]  # built once, before any frame was written
    replies.seek(0)
    assert isinstance(read_frame(replies), Ready)


def test_the_starts_compile_holds_no_gpu(monkeypatch):
    held: list[bool] = []

    class Holding(CpuRuntime):
        holding = False

        @contextlib.contextmanager
        def _set(self, value):
            before, self.holding = self.holding, value
            try:
                yield
            finally:
                self.holding = before

        def shared(self):
            return self._set(True)

        exclusive = shared

        def idle(self):
            return self._set(False)

    runtime = Holding()
    loader = PyLoader()
    compile = loader.compile
    loader.compile = lambda candidate: held.append(runtime.holding) or compile(candidate)
    device = SimpleNamespace(gpu=CPU_GPU, loader=loader, runtime=runtime)
    monkeypatch.setattr(local, "device_context", lambda index: device)
    monkeypatch.setattr(native, "library", lambda: None)
    worker.Worker(0)
    # a spare starts beside timed sections: each waits for what the spare holds the GPU for
    assert held == [False]


def test_the_warm_up_is_an_honest_evaluation_of_kforges_own_kernel(monkeypatch):
    fake_device(monkeypatch)
    monkeypatch.setattr(native, "library", lambda: None)
    outcome = worker.Worker(0).warm_up()
    assert outcome is not None and outcome.status is EvalStatus.OK, outcome.summary
    assert outcome.timing is not None and outcome.correctness.sets


def test_an_evaluation_says_which_worker_ran_it_when_and_how_long_it_waited_for_the_gpu(
        monkeypatch):
    fake_device(monkeypatch)
    monkeypatch.setattr(native, "library", lambda: None)
    before = time.time()
    where = worker.Worker(0).warm_up().placement
    assert where.worker == os.getpid()
    assert before - 0.01 <= where.started_at <= time.time()
    assert where.gpu_wait_s == 0.0  # the CPU runtime has no lock to wait for


def test_the_warm_up_kernel_compiles_with_nvrtc():
    result = Compiler().compile(worker.WARM_UP_SOURCE, "sm_90")
    assert result.ok, result.log
    assert set(result.resources) == {"kforge_warm_up"}


def test_a_worker_whose_native_guard_cannot_be_built_still_serves(monkeypatch):
    fake_device(monkeypatch)

    def unavailable():
        raise NativeUnavailable("no C++ compiler (c++ or g++, or $CXX) to build it with")

    monkeypatch.setattr(native, "library", unavailable)
    replies = io.BytesIO()
    assert worker.serve(0, io.BytesIO(), replies) == 0
    replies.seek(0)
    assert isinstance(read_frame(replies), Ready)
