"""The fence around launchers: static checks, read-only modules, the dispatch guard, the kernels
object and the integrity of timing functions."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from kforge.eval.guard import POISON_A, POISON_B, LauncherGuard
from kforge.eval.kernels import Kernels, LaunchRefused, check_params, launch_dims
from kforge.eval.sandbox import (
    Integrity,
    Launcher,
    LauncherSourceError,
    Violation,
    check_launcher_source,
)

CPU = torch.device("cpu")


@pytest.mark.parametrize("source, needle", [
    ("def launch(k, x):\n    return x.__class__\n", "__class__"),
    ("def launch(k, x):\n    return x._base\n", "_base"),
    ("def launch(k, x):\n    torch.cuda.synchronize = None\n", "assigns attribute"),
    ("import gc\ndef launch(k, x):\n    pass\n", "imports 'gc'"),
    ("from torch import cuda\ndef launch(k, x):\n    pass\n", "from-import"),
    ("class A:\n    pass\ndef launch(k, x):\n    pass\n", "defines class"),
    ("def launch(k, x):\n    global cache\n", "global statement"),
    ("def launch(k, x):\n    return __import__('os')\n", "__import__"),
])
def test_forbidden_constructs_are_found_statically(source, needle):
    errors, violations = check_launcher_source(source)
    assert not errors
    assert any(needle in v for v in violations), violations


def test_source_errors_are_plain_errors():
    assert "line 1" in check_launcher_source("def launch(:\n")[0][0]
    assert "launch" in check_launcher_source("def run(k):\n    pass\n")[0][0]
    with pytest.raises(LauncherSourceError):
        Launcher("x = 1\n")
    with pytest.raises(Violation):
        Launcher("import os\ndef launch(k):\n    pass\n")


def test_launcher_sees_read_only_modules_and_no_state_survives_a_call():
    launcher = Launcher(
        "import numpy as np\n"
        "seen = []\n"
        "def launch(k, x):\n"
        "    seen.append(1)\n"
        "    return len(seen), torch.empty_like(x).shape, np.int32(3), math.ceil(2.5)\n")
    first = launcher.fresh()(None, torch.ones(2))
    second = launcher.fresh()(None, torch.ones(2))
    assert first == second == (1, torch.Size([2]), np.int32(3), 3)
    ns = launcher.namespace
    for name in ("softmax", "cuda"):
        with pytest.raises(Violation):
            getattr(ns.torch, name)
    with pytest.raises(Violation):
        getattr(ns.np, "array")
    with pytest.raises(Violation):
        ns.math.pi = 3
    assert len(ns.violations) == 4


def test_guard_allows_allocations_and_views_and_poisons_fresh_memory():
    x = torch.randn(4, 6)
    with LauncherGuard(POISON_A):
        a = torch.empty_like(x)
        b = x.new_empty((3,), dtype=torch.int32)
        c = torch.zeros(2)
        v = x.t()[1:].unsqueeze(0).view(1, 5, 4)
    assert torch.isnan(a).all()
    assert (b == 0x5A5A5A5A).all()
    assert (c == 0).all()
    assert v.shape == (1, 5, 4)
    with LauncherGuard(POISON_B):
        d = torch.empty(3, dtype=torch.bool)
        e = torch.empty(3, dtype=torch.float16)
    assert not d.any()
    assert (e == torch.tensor(-12345.0, dtype=torch.float16)).all()


@pytest.mark.parametrize("action, kind", [
    (lambda x: x.softmax(-1), "cheat"),
    (lambda x: x @ x.t(), "cheat"),
    (lambda x: x.sum(), "cheat"),
    (lambda x: x.t().contiguous(), "copy"),
    (lambda x: x.clone(), "copy"),
    (lambda x: x[0, 0].item(), "cheat"),
])
def test_guard_refuses_compute_and_copies_even_when_the_error_is_swallowed(action, kind):
    guard = LauncherGuard()
    x = torch.randn(4, 4)
    with guard:
        try:
            action(x)
        except Exception:  # what a launcher might do; the violation is a BaseException
            pass
        except Violation:
            pass
    assert [v.kind for v in guard.violations] == [kind]


def test_launch_dimensions_and_parameters_are_checked():
    assert launch_dims(4, "grid") == (4,)
    assert launch_dims((2, np.int32(3)), "block") == (2, 3)
    for bad in ((), (1, 2, 3, 4), 0, 1.5, (True,)):
        with pytest.raises(LaunchRefused):
            launch_dims(bad, "grid")
    check_params("k", [torch.ones(1), np.int32(1), np.float32(2.0), np.int64(3)], CPU)
    with pytest.raises(LaunchRefused, match="bare Python int"):
        check_params("k", [3], CPU)
    with pytest.raises(LaunchRefused, match="bare Python float"):
        check_params("k", [3.0], CPU)
    with pytest.raises(LaunchRefused, match="on meta"):
        check_params("k", [torch.empty(1, device="meta")], CPU)
    with pytest.raises(LaunchRefused, match="list"):
        check_params("k", [[1]], CPU)


class RecordingBackend:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def launch(self, name, grid, block, shared_mem, params):
        self.calls.append((name, grid, block, shared_mem, len(params)))


def test_kernels_object_counts_launches_and_is_read_only():
    backend = RecordingBackend()
    kernels = Kernels(backend, CPU, lambda: None)
    kernels.scale(8, (128, 2), torch.ones(1), np.int32(1), shared_mem=1024)
    kernels["other"]((1, 1), 32)
    assert backend.calls == [("scale", (8,), (128, 2), 1024, 2), ("other", (1, 1), (32,), 0, 0)]
    assert kernels._launches() == 2
    with pytest.raises(Violation):
        kernels.cache = {}
    assert len(kernels._recorded_violations()) == 1


def test_kernels_refuse_a_stream_that_is_not_the_evaluations():
    kernels = Kernels(RecordingBackend(), CPU, lambda: "stream 0x1, not the evaluation stream")
    with pytest.raises(Violation, match="side|stream"):
        kernels.k(1, 1)
    assert kernels._launches() == 0


def test_integrity_notices_a_replaced_timer(monkeypatch):
    integrity = Integrity()
    assert integrity.tampered() == []
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    assert set(integrity.tampered()) == {"time.perf_counter", "torch.cuda.synchronize"}
