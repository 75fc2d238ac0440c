"""What the CUDA graph and measured-selection paths decide without a GPU: the device check that
names the first tensor off the GPU, and the choice of kernels by whole-forward timings (the
timing itself replaced by a fake that runs each forward once and charges its kernels)."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch

import kforge
from kforge.capture import ModelOptions, load_model
from kforge.cli.main import main
from kforge.core.candidate import Timing
from kforge.errors import KforgeError
from kforge.integrate import decide, measure, patching
from kforge.integrate.graphs import cuda_device_of
from kforge.runtime import cubin as runtime
from kforge.runtime.guard import Patch
from kforge.runtime.table import Entry, KernelTable
from tests.integrate.helpers import (
    TOY,
    TOY_WIDER,
    WINNING_OPS,
    make_session,
    profile_toy,
)
from tests.integrate.standins import Counting
from tests.integrate.test_patching import RecordingModule


def test_accelerate_needs_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(KforgeError, match="CUDA graphs need a CUDA GPU and this torch sees none"):
        kforge.accelerate(torch.nn.Linear(2, 2), torch.randn(1, 2))


def test_the_first_tensor_off_the_gpu_is_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    x = torch.randn(2, 3)
    with pytest.raises(KforgeError, match=r"^input 0 is a float32\[2, 3\] on cpu: a CUDA graph "
                                          r"replays GPU work only \(move the model and its inputs "
                                          r"to the GPU\)$"):
        cuda_device_of(None, (x,), {})
    with pytest.raises(KforgeError, match=r"^input 1\[0\] is a float16\[4\] on cpu"):
        cuda_device_of(None, (3, [torch.zeros(4, dtype=torch.float16)]), {})
    with pytest.raises(KforgeError, match=r"^argument 'mask' is a bool\[2\] on cpu"):
        cuda_device_of(None, (), {"mask": torch.ones(2, dtype=torch.bool)})
    with pytest.raises(KforgeError, match=r"^parameter 'weight' is a float32\[2, 2\] on cpu"):
        cuda_device_of(torch.nn.Linear(2, 2), (), {})


# What each kernel does to the fake forward time: softmax and layer_norm help, gelu hurts.
EFFECT_US = {"aten._softmax.default": -100.0, "aten.native_layer_norm.default": -60.0,
             "aten.gelu.default": +40.0}


def test_kernels_are_chosen_by_the_whole_forwards_they_time(monkeypatch):
    _, result = profile_toy("cpu")
    calls: Counter = Counter()
    table = KernelTable(Entry(op=c.op, args=c.args, kwargs=c.kwargs, device=torch.device("cpu"),
                              runner=Counting(c.op, calls), label=c.short_op, key=c.key)
                        for c in result.cards if c.op in WINNING_OPS)
    toy = load_model(TOY, ModelOptions(device="cpu"))

    def fake_time_forwards(loaded, subjects, reps, warmup):
        (subject,) = subjects
        calls.clear()
        with subject.scope():
            subject.step()
        us = 1000.0 + sum(EFFECT_US[op] for op in calls)
        return {subject.name: Timing(us, us * 0.99, us * 1.01, reps)}

    monkeypatch.setattr(decide, "time_forwards", fake_time_forwards)
    by_op = {e.op: e for e in table.entries}
    order = [by_op[op] for op in ("aten.gelu.default", "aten._softmax.default",
                                  "aten.native_layer_norm.default")]
    kept, selection = decide.choose(toy, Patch(table), cuda_graphs=False, order=order)
    assert {e.op for e in kept.entries} == {"aten._softmax.default",
                                            "aten.native_layer_norm.default"}
    assert [t.winner.op for t in selection.dropped] == ["aten.gelu.default"]
    assert selection.baseline.median_us == 1000.0 and selection.final.median_us == 840.0


def test_patch_with_a_model_keeps_the_winners_its_forwards_favour(tmp_path, monkeypatch):
    db = tmp_path / "k.db"
    sid = make_session(db)
    monkeypatch.setattr(patching, "cuda_device", lambda device, what: torch.device("cpu"))
    monkeypatch.setattr(patching, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(runtime, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(patching, "KernelModule", RecordingModule)
    monkeypatch.setattr(measure, "cuda_device_of", lambda model, args, kwargs: torch.device("cpu"))
    toy = load_model(TOY, ModelOptions(device="cpu"))

    def fake_time_forwards(loaded, subjects, reps, warmup):
        (subject,) = subjects
        with subject.scope() as trial:
            subject.step()
        us = 1000.0 + sum(EFFECT_US[k.op] for k in trial.report().kernels if k.hits)
        return {subject.name: Timing(us, us * 0.99, us * 1.01, reps)}

    monkeypatch.setattr(decide, "time_forwards", fake_time_forwards)
    with pytest.raises(KforgeError, match=r"patch\(model=...\) needs example_inputs= too"):
        kforge.patch(sid, db=db, model=toy.model)
    chosen = kforge.patch(sid, db=db, model=toy.model, example_inputs=toy.args)
    assert {e.op for e in chosen.table.entries} == {"aten._softmax.default",
                                                    "aten.native_layer_norm.default"}
    (note,) = chosen.notes
    assert re.fullmatch(r"#\d+ gelu\(.*\): kept on eager, the model is slower with it "
                        r"\(0\.9\d\dx\)", note)
    saving = {d.card.op: d.card.share * (1 - 1 / d.speedup) for d in chosen.plan.winners}
    tried = [t.winner.op for t in chosen.selection.trials]
    assert tried == sorted(WINNING_OPS, key=lambda op: -saving[op])  # largest saving first
    assert chosen.projected < chosen.plan.projected
    assert all(k.hits == 0 for k in chosen.report().kernels)  # the trials' counts are gone


@pytest.fixture
def cpu_as_gpu(monkeypatch):
    """Sessions' kernels "launch" on the CPU (recorded, not run); forwards are timed by a fake
    that runs each subject once and adds 40 us per kernel that ran: every kernel hurts."""
    monkeypatch.setattr(patching, "cuda_device", lambda device, what: torch.device("cpu"))
    monkeypatch.setattr(patching, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(runtime, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(patching, "KernelModule", RecordingModule)
    timed: list[str] = []

    def fake_time_forwards(loaded, subjects, reps, warmup):
        timings = {}
        for subject in subjects:
            with subject.scope() as scope:
                subject.step()
            ran = [k for k in scope.report().kernels if k.hits] if scope is not None else []
            us = 1000.0 + 40.0 * len(ran)
            timings[subject.name] = Timing(us, us * 0.99, us * 1.01, reps)
            timed.append(subject.name)
        return timings

    monkeypatch.setattr(decide, "time_forwards", fake_time_forwards)
    monkeypatch.setattr(measure, "time_subjects", lambda *a, **k: {
        name: (timing, None) for name, timing in fake_time_forwards(*a[:4]).items()})
    return timed


def test_e2e_where_every_kernel_slows_the_model_keeps_none_and_says_why(tmp_path, cpu_as_gpu,
                                                                       capsys):
    db = tmp_path / "k.db"
    sid = make_session(db)
    assert main(["e2e", str(sid), "--modes", "eager", "--reps", "3", "--trust-model", "--db",
                 str(db)]) == 0
    printed = capsys.readouterr().out
    assert "eager + kforge" in printed
    assert len(re.findall(r"kept on eager, the model is slower with it", printed)) == len(
        WINNING_OPS)
    assert cpu_as_gpu, "nothing was timed"


def test_e2e_of_a_model_that_changed_stops_before_timing(tmp_path, cpu_as_gpu, capsys):
    db = tmp_path / "k.db"
    sid = make_session(db, model=TOY_WIDER)
    assert main(["e2e", str(sid), "--modes", "eager", "--reps", "3", "--trust-model", "--db",
                 str(db)]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"kforge: none of session {sid}'s kernels ran: the model does not call the op variants "
        "it was profiled with (did the model, its inputs or its settings change since?)")
    assert cpu_as_gpu == []


def test_a_model_file_the_database_names_is_imported_only_once_confirmed(tmp_path, capsys):
    from kforge.integrate.plan import read_plan

    db = tmp_path / "k.db"
    sid = make_session(db)
    session = read_plan(db, sid).session
    with pytest.raises(KforgeError, match=f"session {sid} names the model .*--trust-model"):
        measure.rebuild_model(session, torch.device("cpu"))
    assert measure.rebuild_model(session, torch.device("cpu"), trust_model=True).model is not None
