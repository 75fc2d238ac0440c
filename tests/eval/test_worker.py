"""The evaluation worker's start: what it prepares before it reports ready, so that no candidate's
time limit pays for it."""

from __future__ import annotations

import io
from types import SimpleNamespace

from kforge.core.gpu import GpuInfo
from kforge.eval.process import local, worker
from kforge.eval.process.protocol import Ready, read_frame
from kforge.runtime import native
from kforge.runtime.native import NativeUnavailable

GPU = GpuInfo(name="H200", arch="sm_90", sm_count=132)


def fake_device(monkeypatch) -> list[str]:
    compiled: list[str] = []
    compiler = SimpleNamespace(compile=lambda source, arch: compiled.append(arch))
    device = SimpleNamespace(gpu=GPU, loader=SimpleNamespace(compiler=compiler),
                             runtime=SimpleNamespace(alive=lambda: True))
    monkeypatch.setattr(local, "device_context", lambda index: device)
    return compiled


def test_the_native_guard_is_built_before_the_worker_reports_ready(monkeypatch):
    compiled = fake_device(monkeypatch)
    replies = io.BytesIO()
    built: list[bytes] = []
    monkeypatch.setattr(native, "library", lambda: built.append(replies.getvalue()))
    assert worker.serve(0, io.BytesIO(), replies) == 0
    assert compiled == ["sm_90"]  # NVRTC warmed up too
    assert built == [b""]  # built once, before any frame was written
    replies.seek(0)
    assert isinstance(read_frame(replies), Ready)


def test_a_worker_whose_native_guard_cannot_be_built_still_serves(monkeypatch):
    fake_device(monkeypatch)

    def unavailable():
        raise NativeUnavailable("no C++ compiler (c++ or g++, or $CXX) to build it with")

    monkeypatch.setattr(native, "library", unavailable)
    replies = io.BytesIO()
    assert worker.serve(0, io.BytesIO(), replies) == 0
    replies.seek(0)
    assert isinstance(read_frame(replies), Ready)
