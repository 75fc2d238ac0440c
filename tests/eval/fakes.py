"""Python stand-ins for the CUDA kernels of ``tests.eval.candidates``, so the whole evaluation
(launchers, guard, poisoning, comparisons, integrity checks, timing) runs on the CPU.

``PyLoader`` plays the part of NVRTC + cuda.core: it optionally compiles the source for real
(NVRTC works without a GPU) and then "launches" a kernel by calling the Python function of the
same name with tensors in place of pointers. Each load gets fresh module state, as a freshly
loaded cubin gets fresh ``__device__`` globals.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from kforge.core.candidate import Candidate
from kforge.core.gpu import GpuInfo
from kforge.eval.kernels import LaunchRefused
from kforge.eval.nvrtc import Compiler, CompileResult, KernelResources

CPU_GPU = GpuInfo(name="CPU stand-in", arch="sm_90", sm_count=1, bandwidth_gbs=None, l2_mb=0.0)


def _softmax(x: torch.Tensor, out: torch.Tensor, cols: int, rows: int | None = None) -> None:
    flat_x = x.reshape(-1, cols)
    flat_out = out.view(-1, cols)
    rows = flat_x.shape[0] if rows is None else rows
    flat_out[:rows] = torch.softmax(flat_x[:rows].float(), -1).to(out.dtype)


def _float_at(address: int) -> ctypes.c_float:
    return ctypes.c_float.from_address(address)


class PyModule:
    """The kernels of one loaded candidate, with module state (device globals) of its own."""

    def __init__(self) -> None:
        self.last_input: int | None = None
        self.cache: torch.Tensor | None = None
        self.calls = 0
        self.skip = False

    # ----- reference kernels -----

    def softmax(self, grid, block, x, out, cols):
        _softmax(x, out, int(cols), rows=int(grid))

    def softmax_smem(self, grid, block, x, out, cols):
        _softmax(x, out, int(cols), rows=int(grid))

    def layer_norm(self, grid, block, x, w, b, out, mean, rstd, cols, eps, affine):
        cols, affine = int(cols), int(affine)
        rows = x.reshape(-1, cols).float()
        mu = rows.mean(-1, keepdim=True)
        r = torch.rsqrt(((rows - mu) ** 2).mean(-1, keepdim=True) + float(eps))
        y = (rows - mu) * r
        if affine & 1:
            y = y * w.float()
        if affine & 2:
            y = y + b.float()
        out.view(-1, cols).copy_(y.to(out.dtype))
        mean.view(-1).copy_(mu.view(-1))
        rstd.view(-1).copy_(r.view(-1))

    def add(self, grid, block, x, y, out, n, alpha):
        out.view(-1).copy_((x.reshape(-1).float() + float(alpha) * y.reshape(-1).float()).to(out.dtype))

    def relu(self, grid, block, x, out, n):
        out.view(-1).copy_(torch.relu(x.reshape(-1)))

    # ----- cheats -----

    def noop(self, grid, block, out):
        pass

    def first_row(self, grid, block, x, out, cols):
        _softmax(x, out, int(cols), rows=1)

    def zeros(self, grid, block, out, n):
        out.view(-1).zero_()

    def nans(self, grid, block, out, n):
        out.view(-1).fill_(float("nan"))

    def low_precision(self, grid, block, x, out, cols):
        _softmax(x.to(torch.bfloat16).float(), out, int(cols))

    def scribble(self, grid, block, x, out, cols):
        _softmax(x, out, int(cols))
        x.view(-1, int(cols))[:, 0] = 0.0

    def relu_oob(self, grid, block, x, out, n):
        beyond = _float_at(x.data_ptr() + int(n) * 4).value
        out.view(-1).copy_(torch.relu(x.reshape(-1)))
        out.view(-1)[-1] += 0.0 * beyond

    def relu_oob_write(self, grid, block, x, out, n):
        out.view(-1).copy_(torch.relu(x.reshape(-1)))
        _float_at(x.data_ptr() - 4).value = 1.0

    def check_address(self, grid, block, x, hit):
        hit.fill_(int(self.last_input == x.data_ptr()))
        self.last_input = x.data_ptr()

    def replay(self, grid, block, x, out, cols, hit):
        if int(hit.item()) and self.cache is not None:
            out.copy_(self.cache)
            return
        _softmax(x, out, int(cols))
        self.cache = out.clone()

    def count_call(self, grid, block, honest):
        self.skip = self.calls >= int(honest)
        self.calls += 1

    def maybe_softmax(self, grid, block, x, out, cols):
        if not self.skip:
            _softmax(x, out, int(cols))

    # Escapes no compiled kernel could make; they stand for a launcher that got out of its fence.
    def start_thread(self, grid, block, out):
        threading.Thread(target=time.sleep, args=(0.5,), daemon=True).start()

    def patch_clock(self, grid, block, out):
        time.perf_counter = lambda: 0.0  # restored by the test


def _by_name(module: PyModule, name: str) -> Callable[..., None] | None:
    for prefix in ("softmax_smem", "softmax", "layer_norm", "add", "relu_oob_write", "relu_oob",
                   "relu"):
        if name == prefix or name.startswith(prefix + "_") and name.rsplit("_", 1)[1] in (
                "f32", "f16", "bf16"):
            return getattr(module, prefix)
    return getattr(module, name, None)


class PyBackend:
    def __init__(self) -> None:
        self.module = PyModule()
        self.launched: list[str] = []

    def launch(self, name: str, grid: tuple[int, ...], block: tuple[int, ...], shared_mem: int,
               params: Sequence[Any]) -> None:
        kernel = _by_name(self.module, name)
        if kernel is None:
            raise LaunchRefused(f"no kernel named {name!r} in the source")
        self.launched.append(name)
        with _disable_current_modes():  # a compiled kernel dispatches no torch ops
            kernel(grid[0], block[0], *params)


class PyLoader:
    """Compiles with NVRTC when asked (``nvrtc=True``), launches Python stand-ins."""

    def __init__(self, nvrtc: bool = False) -> None:
        self.compiler = Compiler() if nvrtc else None
        self.backends: list[PyBackend] = []

    def compile(self, candidate: Candidate) -> CompileResult:
        if self.compiler is not None:
            return self.compiler.compile(candidate.source, "sm_90",
                                         candidate.meta.get("nvrtc_options") or [])
        return CompileResult(ok=True, arch="sm_90", log="", resources={"stand-in": KernelResources()})

    def load(self, compiled: CompileResult) -> PyBackend:
        backend = PyBackend()
        self.backends.append(backend)
        return backend
