"""`kforge apply`, `kforge export` and `kforge e2e` on the command line: what they print, and one
clear line on stderr with exit status 1 for every bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import kforge.integrate.patching as patching
import kforge.runtime.cubin as runtime
from kforge.cli.main import main
from kforge.integrate.patching import SessionPatch, unused_message
from kforge.integrate.plan import read_plan
from kforge.runtime.table import Entry, KernelTable, Report
from tests.integrate.helpers import make_session


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cli") / "k.db"


@pytest.fixture(scope="module")
def sid(db) -> int:
    return make_session(db)


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("kforge: ")
    return lines[0]


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def gb10(monkeypatch):
    """Pretend this machine has a GB10 (sm_121) as its current GPU."""
    monkeypatch.setattr(patching, "cuda_device", lambda device, what: torch.device("cuda", 0))
    monkeypatch.setattr(patching, "device_arch", lambda device: "sm_121")
    monkeypatch.setattr(runtime, "device_arch", lambda device: "sm_121")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GB10")


def test_export_prints_each_cards_fate_and_writes_the_package(db, sid, tmp_path, capsys):
    pytest.importorskip("cuda.core", reason="NVRTC through cuda.core is not installed")
    assert main(["export", str(sid), "--db", str(db), "-o", str(tmp_path), "--name", "k"]) == 0
    printed = capsys.readouterr().out
    assert "kernel 1.80x" in printed and "1.80x faster than eager" in printed
    assert "not searched yet" in printed and "views and copies stay on eager" in printed
    assert "3 of" in printed and "projected speedup" in printed
    assert f"wrote {tmp_path / 'k'}" in printed and "with k.patch(): model(x)" in printed
    assert (tmp_path / "k" / "manifest.json").exists()


def test_export_of_a_session_without_winners_says_so(db, tmp_path, capsys):
    empty = make_session(db, winners={})
    capsys.readouterr()
    assert main(["export", str(empty), "--db", str(db), "-o", str(tmp_path)]) == 1
    assert error_line(capsys) == (
        f"kforge: session {empty} has nothing to export: no op card has a verified kernel that "
        f"beats eager beyond the timing noise (see `kforge apply {empty}` or `kforge show`)")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("option, said", [
    (["--name", "os"], "'os' is the name of a module Python or kforge imports: `import os` would "
                       "find that one; choose another --name"),
    (["--name", "my-kernels"], "'my-kernels' cannot be a Python package name: use letters, "
                               "digits and _ (not a Python keyword)"),
    (["--arch", "sm_90", "--arch", "hopper"], "'hopper' is not a GPU architecture: use the form "
                                              "sm_90 or sm_121"),
    (["--name", "taken"], "{output}/taken already exists: remove it or pass --force"),
], ids=["a module's name", "no identifier", "no architecture", "a folder already there"])
def test_a_bad_export_argument_is_its_one_line_before_the_table(db, sid, tmp_path, capsys,
                                                                 option, said):
    output = tmp_path / "out"
    (output / "taken").mkdir(parents=True)
    assert main(["export", str(sid), "--db", str(db), "-o", str(output), *option]) == 1
    printed = capsys.readouterr()
    assert printed.out == ""
    assert printed.err == f"kforge: {said.format(output=output)}\n"
    assert [path.name for path in output.iterdir()] == ["taken"]


@pytest.mark.parametrize("command", [["apply", "--run"], ["e2e"]])
def test_apply_run_and_e2e_need_a_gpu(db, sid, no_gpu, capsys, command):
    assert main([*command, str(sid), "--db", str(db)]) == 1
    assert error_line(capsys) == (f"kforge: kforge {command[0]} needs a CUDA GPU and this torch "
                                  "sees none (`kforge export` packages the kernels without one)")


def test_apply_without_a_gpu_prints_the_decisions(db, sid, no_gpu, capsys):
    assert main(["apply", str(sid), "--cuda-graphs", "--db", str(db)]) == 0
    printed = capsys.readouterr().out
    assert "kernel 1.80x" in printed and "not searched yet" in printed
    assert "nothing was compiled or loaded (no CUDA GPU" in printed
    assert "the GPU the session was searched on (sm_90)" in printed


@pytest.mark.parametrize("command", ["apply", "e2e"])
def test_a_session_from_another_gpu_architecture_is_refused(db, sid, gb10, capsys, command):
    assert main([command, str(sid), "--db", str(db)]) == 1
    assert error_line(capsys) == (
        f"kforge: session {sid} was searched on Fake GPU (sm_90) but this GPU is Fake GB10 "
        "(sm_121): its kernels are verified there only; search the model again here, or "
        f"`kforge export {sid} --arch sm_121` to take them along unverified")


def test_a_session_profiled_without_a_gpu_has_nothing_to_apply(db, gb10, capsys):
    cpu_session = make_session(db, gpu={"name": "no GPU", "arch": "none"})
    assert main(["apply", str(cpu_session), "--run", "--db", str(db)]) == 1
    assert "was profiled without a GPU: it has no verified kernels" in error_line(capsys)
    assert main(["apply", str(cpu_session), "--db", str(db)]) == 0
    assert f"session {cpu_session} was profiled without a GPU: a search on a GPU finds its " \
           "kernels" in capsys.readouterr().out


@pytest.mark.parametrize("command", [["export"], ["apply", "--run"], ["e2e"]])
def test_an_unknown_session_or_database_is_one_line_before_the_gpu(db, sid, no_gpu, tmp_path,
                                                                    capsys, command):
    assert main([*command, "99", "--db", str(db)]) == 1
    assert error_line(capsys).startswith("kforge: no session 99 in ")
    missing = tmp_path / "none.db"
    assert main([*command, str(sid), "--db", str(missing)]) == 1
    assert error_line(capsys).startswith(f"kforge: no kforge database at {missing} ")
    assert not missing.exists()


def test_a_model_that_runs_none_of_the_kernels_is_named_plainly(db, sid):
    plan = read_plan(db, sid)
    x = torch.randn(2, 2)
    entry = Entry("aten._softmax.default", [{"t": "tensor", "shape": [2, 2], "stride": [2, 1],
                                             "dtype": "float32", "offset": 0}, -1, False], {},
                  lambda args, kwargs: args[0], x.device)
    patch = SessionPatch(plan, KernelTable([entry]), [])
    assert unused_message(patch, patch.report()) == (
        f"none of session {sid}'s kernels ran: the model does not call the op variants it was "
        "profiled with (did the model, its inputs or its settings change since?)")
    entry.hits = 1
    assert unused_message(patch, patch.report()) is None
    assert unused_message(SessionPatch(plan, KernelTable(), []), Report([], {})) is None
