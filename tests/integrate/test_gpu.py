"""Real library kernels (softmax, layer_norm, tanh GELU) patched into the toy model on the GPU:
under no_grad, inference_mode and CUDA graph capture, from kforge and from an exported package
in a fresh process, and through `kforge apply --run` and `kforge e2e`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kforge
from kforge.capture import ModelOptions, load_model
from kforge.cli.main import main
from kforge.integrate.export import export_session
from kforge.integrate.plan import read_plan
from kforge.runtime.cubin import device_arch
from tests.integrate.helpers import TOY, TOY_WIDER, WINNING_OPS, make_session

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("cuda.core", reason="cuda-core is not installed")

REPO = Path(__file__).resolve().parents[2]
CALLS_PER_FORWARD = 2  # the toy has two blocks, each calling every winning op once


def gpu() -> dict:
    return {"name": torch.cuda.get_device_name(0), "arch": device_arch(0)}


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> tuple[Path, int]:
    db = tmp_path_factory.mktemp("gpu") / "k.db"
    return db, make_session(db, gpu=gpu(), device="cuda")


@pytest.fixture(scope="module")
def toy():
    return load_model(TOY, ModelOptions(device="cuda"))


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def hits(patch) -> dict[str, int]:
    return {k.op: k.hits for k in patch.report().kernels}


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_kernels_run_in_the_model_and_match_eager(session, toy, mode):
    db, sid = session
    grad_off = torch.no_grad if mode == "no_grad" else torch.inference_mode
    with grad_off():
        expected = toy.model(*toy.args)
        with kforge.patch(sid, db=db, cuda_graphs=True) as patch:  # every winner
            got = toy.model(*toy.args)
    assert patch.notes == []  # each plan fits its cubin's kernels, their names and widths
    assert hits(patch) == {op: CALLS_PER_FORWARD for op in WINNING_OPS}
    assert close(got, expected)


def test_kernels_are_captured_in_a_cuda_graph_and_replay_with_new_inputs(session, toy):
    db, sid = session
    static = toy.args[0].clone()
    patch = kforge.patch(sid, db=db, cuda_graphs=True)
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with patch, torch.cuda.stream(side):
            toy.model(static)
        torch.cuda.current_stream().wait_stream(side)
        patch.table.reset_counts()
        graph = torch.cuda.CUDAGraph()
        with patch, torch.cuda.graph(graph):
            out = toy.model(static)
        assert hits(patch) == {op: CALLS_PER_FORWARD for op in WINNING_OPS}
        for _ in range(2):
            static.copy_(torch.randn_like(static))
            graph.replay()  # the patch is off now: the kernels live in the graph
            assert close(out, toy.model(static))


def test_an_exported_package_patches_the_model_in_a_fresh_process(session, tmp_path):
    db, sid = session
    plan = read_plan(db, sid)
    arch = device_arch(0)
    export_session(plan, tmp_path, name="here")
    other = "sm_121" if arch != "sm_121" else "sm_90"
    export_session(plan, tmp_path, name="elsewhere", archs=[other])
    script = """
import sys
sys.modules["kforge"] = None
import torch, here, elsewhere
from tests.integrate.toy_model import build
model, (x,) = build()
model, x = model.cuda(), x.cuda()
with torch.no_grad():
    expected = model(x)
    with here.patch() as p:
        got = model(x)
    print("here", p.report().hits, torch.allclose(got, expected, rtol=1e-4, atol=1e-5))
    with elsewhere.patch() as p:
        model(x)
    print("elsewhere", p.report().hits, p.notes[0])
    with elsewhere.patch(any_arch=True) as p:  # no cubin for this GPU: NVRTC compiles them
        got = model(x)
    print("any_arch", p.report().hits, torch.allclose(got, expected, rtol=1e-4, atol=1e-5))
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300, env={
                                **os.environ, "PYTHONPATH": os.pathsep.join(
                                    [str(tmp_path), str(REPO), os.environ.get("PYTHONPATH", "")])})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"here {3 * CALLS_PER_FORWARD} True"
    assert lines[1].startswith(f"elsewhere 0 kernels were exported for {other} and this GPU is "
                               f"{arch}: they stay off")
    assert lines[2] == f"any_arch {3 * CALLS_PER_FORWARD} True"


def test_apply_run_and_e2e_on_the_command_line(session, capsys):
    db, sid = session
    assert main(["apply", str(sid), "--run", "--cuda-graphs", "--trust-model", "--db",
                 str(db)]) == 0
    printed = capsys.readouterr().out
    assert "kernel 1.80x" in printed and "output vs eager: max |diff|" in printed
    assert main(["e2e", str(sid), "--reps", "3", "--warmup", "1", "--modes",
                 "eager,graphs,compile", "--trust-model", "--db", str(db)]) == 0
    printed = capsys.readouterr().out
    for name in ("eager + kforge", "CUDA graphs + kforge", "compile + kforge", "projected"):
        assert name in printed, name
    assert "CUDA graph capture failed" not in printed


def test_a_model_that_changed_since_the_session_is_named_plainly(tmp_path, capsys):
    db = tmp_path / "k.db"
    sid = make_session(db, gpu=gpu(), device="cuda", model=TOY_WIDER)
    assert main(["apply", str(sid), "--run", "--cuda-graphs", "--trust-model", "--db",
                 str(db)]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"kforge: none of session {sid}'s kernels ran: the model does not call the op variants "
        "it was profiled with (did the model, its inputs or its settings change since?)")
