"""`kforge.patch` from a stored session, on the CPU: the winners' real library code is compiled to
cubins with NVRTC and their launch plans run inside the model; only the cuda.core module is a
stand-in that records launches instead of running them."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

import kforge
import kforge.integrate.patching as patching
import kforge.runtime.cubin as runtime
from kforge.capture import ModelOptions, load_model
from kforge.errors import KforgeError
from kforge.integrate.patching import build_patch
from kforge.integrate.plan import read_plan
from tests.integrate.helpers import HOST_COSTS, TOY, WINNING_OPS, make_session
from tests.integrate.standins import Launch

pytest.importorskip("cuda.core", reason="NVRTC through cuda.core is not installed")


class RecordingModule:
    """Stands in for KernelModule: knows the cubin's kernels by their symbols, records each
    launch instead of running it."""

    launches: ClassVar[list[Launch]] = []

    def __init__(self, cubin: bytes, device: torch.device) -> None:
        assert cubin[:4] == b"\x7fELF"
        self.cubin = cubin
        self.device = device

    def has_kernel(self, name: str) -> bool:
        return b"\0" + name.encode() + b"\0" in self.cubin

    def param_widths(self, name: str) -> list[int] | None:
        return None  # like a driver that cannot list a kernel's parameters

    def launch(self, name: str, grid: tuple[int, ...], block: tuple[int, ...], shared_mem: int,
               params: Sequence[Any]) -> None:
        assert self.has_kernel(name), name
        RecordingModule.launches.append(Launch(name, grid, block, shared_mem, tuple(params)))


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


def test_the_winners_plans_run_in_the_model(session, fake_gpu):
    db, sid = session
    toy = load_model(TOY, ModelOptions(device="cpu"))
    patch = kforge.patch(sid, db=db, cuda_graphs=True)  # every winner, as for CUDA graphs
    assert {e.op for e in patch.table.entries} == set(WINNING_OPS) and patch.notes == []
    assert patch.projected == pytest.approx(patch.plan.projected)
    measured = HOST_COSTS.extra_us
    assert all(d.host_extra_us == pytest.approx(measured) for d in patch.plan.winners)
    with torch.no_grad(), patch:
        out = toy.model(*toy.args)
    assert out.shape == toy.args[0].shape
    report = patch.report()
    assert {k.op: k.hits for k in report.kernels} == {op: 2 for op in WINNING_OPS}
    assert all(k.fallbacks == 0 and not k.disabled for k in report.kernels)
    assert len(RecordingModule.launches) >= 6
    for launch in RecordingModule.launches:
        assert launch.kernel.isidentifier() and launch.shared_mem >= 0
        assert all(type(d) is int and d > 0 for d in (*launch.grid, *launch.block))
        assert len(launch.grid) == len(launch.block) == 3
        assert all(isinstance(p, (torch.Tensor, np.generic)) for p in launch.params)
        assert any(isinstance(p, torch.Tensor) for p in launch.params)


def with_plan(decision, plan: dict):
    candidate = dataclasses.replace(decision.candidate, plan=plan)
    return dataclasses.replace(decision, candidate=candidate)


def test_a_winner_whose_plan_does_not_fit_its_kernels_stays_on_eager_with_a_note(session,
                                                                                fake_gpu):
    db, sid = session
    plan = read_plan(db, sid)
    first, second, *rest = plan.winners
    missing = {**first.candidate.plan, "launches": [
        {**first.candidate.plan["launches"][0], "kernel": "no_such_kernel"}]}
    broken = {**second.candidate.plan, "requires": ["False"]}
    decisions = [with_plan(first, missing) if d is first else
                 with_plan(second, broken) if d is second else d for d in plan.decisions]
    patch = build_patch(dataclasses.replace(plan, decisions=decisions), torch.device("cpu"))
    assert {e.key for e in patch.table.entries} == {d.card.key for d in rest}
    first_note, second_note = patch.notes
    assert first_note.startswith(f"{patching.card_label(first.card)}: kept on eager, it does not "
                                 "load: PlanError: launches: no kernel named 'no_such_kernel'")
    assert second_note.startswith(f"{patching.card_label(second.card)}: kept on eager, it does "
                                  "not load: PlanNotApplicable: requires[0]")
    assert not patch.loaded(first) and patch.loaded(rest[0])


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
