"""`kforge.patch` from a stored session, on the CPU: the winners' real library code is compiled to
cubins with NVRTC and their launchers run inside the model; only the cuda.core module is a stand-in
that records launches instead of running them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import kforge
import kforge.integrate.patching as patching
import kforge.runtime.cubin as runtime
from kforge.capture import ModelOptions, load_model
from kforge.errors import KforgeError
from tests.integrate.helpers import TOY, WINNING_OPS, make_session

pytest.importorskip("cuda.core", reason="NVRTC through cuda.core is not installed")


class RecordingModule:
    """Stands in for KernelModule: keeps the cubin, records each launch."""

    launches: list[tuple[str, tuple, tuple, tuple]] = []

    def __init__(self, cubin: bytes, device: torch.device) -> None:
        assert cubin[:4] == b"\x7fELF"
        self.device = device

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, name: str):
        def launch(grid, block, *params, shared_mem=0):
            RecordingModule.launches.append((name, grid, block, params))
        return launch


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(patching, "cuda_device", lambda device, what: torch.device("cpu"))
    monkeypatch.setattr(patching, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(runtime, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(patching, "KernelModule", RecordingModule)
    RecordingModule.launches = []


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> tuple[Path, int]:
    db = tmp_path_factory.mktemp("patching") / "k.db"
    return db, make_session(db)


def test_the_winners_launchers_run_in_the_model(session, fake_gpu):
    db, sid = session
    toy = load_model(TOY, ModelOptions(device="cpu"))
    patch = kforge.patch(sid, db=db, cuda_graphs=True)  # every winner, as for CUDA graphs
    assert {e.op for e in patch.table.entries} == set(WINNING_OPS) and patch.notes == []
    assert patch.projected == pytest.approx(patch.plan.projected)
    with torch.no_grad(), patch:
        out = toy.model(*toy.args)
    assert out.shape == toy.args[0].shape
    report = patch.report()
    assert {k.op: k.hits for k in report.kernels} == {op: 2 for op in WINNING_OPS}
    assert all(k.fallbacks == 0 and not k.disabled for k in report.kernels)
    assert len(RecordingModule.launches) >= 6
    for name, grid, block, params in RecordingModule.launches:
        assert name.isidentifier()
        assert all(isinstance(d, int) and d > 0 for dims in (grid, block)
                   for d in (dims if isinstance(dims, tuple) else (dims,)))
        assert all(isinstance(p, (torch.Tensor, np.generic)) for p in params)
        assert any(isinstance(p, torch.Tensor) for p in params)


def test_a_session_from_another_architecture_is_refused_by_the_api(session, fake_gpu,
                                                                   monkeypatch):
    db, sid = session
    monkeypatch.setattr(patching, "device_arch", lambda device: "sm_121")
    monkeypatch.setattr(runtime, "device_arch", lambda device: "sm_121")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GB10")
    with pytest.raises(KforgeError, match=r"searched on Fake GPU \(sm_90\) but this GPU is "
                                          r"Fake GB10 \(sm_121\)"):
        kforge.patch(sid, db=db)


def test_the_api_needs_a_gpu(session, monkeypatch):
    db, sid = session
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(KforgeError, match="kforge.patch needs a CUDA GPU"):
        kforge.patch(sid, db=db)
