"""Python stand-ins for the CUDA kernels of ``tests.eval.candidates`` and ``tests.eval.redteam``,
so the whole evaluation (launch plans, poisoning, comparisons, integrity checks, timing) runs on
the CPU.

``PyLoader`` plays the part of NVRTC + cuda.core: it finds the ``extern "C"`` kernels a source
defines (or compiles it for real with NVRTC, which works without a GPU), and a launch calls the
stand-in registered under the kernel's name with what the plan passes: tensors in place of
pointers, numpy scalars, ``np.uint64(0)`` for a null pointer. A stand-in reads and writes memory
from a pointer on, as a kernel does, not through the tensor's shape. Each load gets fresh module
state, as a freshly loaded cubin gets fresh ``__device__`` globals.

``ModelledRuntime`` times on a ``ModelledClock`` instead of the wall clock: the bytes that eager
ops and stand-in kernels touch advance it, so a timing verdict does not depend on how fast or how
loaded the machine is.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from kforge.core.candidate import Candidate
from kforge.core.gpu import GpuInfo
from kforge.eval.verify.ops import flatten_tensors, traffic_bytes
from kforge.runtime.device import CpuRuntime
from kforge.runtime.nvrtc import Compiler, CompileResult, KernelResources
from tests.eval.standins import strided_tree_sum

CPU_GPU = GpuInfo(name="CPU stand-in", arch="sm_90", sm_count=1, bandwidth_gbs=None, l2_mb=0.0)

aten = torch.ops.aten
# Ops that are not views by their schema, yet touch no data.
NO_DATA_MOVED = frozenset({
    aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
    aten.new_empty.default, aten.new_empty_strided.default, aten._unsafe_view.default,
})


class ModelledClock:
    """The time a device copying ``bandwidth_gbs`` would take for the work charged to it."""

    def __init__(self, bandwidth_gbs: float) -> None:
        self.bytes_per_us = bandwidth_gbs * 1e3
        self.now_us = 0.0

    def charge(self, tensors: list[torch.Tensor]) -> None:
        self.now_us += traffic_bytes(tensors) / self.bytes_per_us


class ChargedWork(TorchDispatchMode):
    """Charges ``clock`` for every op that moves data: each tensor argument read once, each
    result written once. Allocations and views move none and are free."""

    def __init__(self, clock: ModelledClock) -> None:
        super().__init__()
        self.clock = clock

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if not func.is_view and func not in NO_DATA_MOVED:
            self.clock.charge(flatten_tensors([args, kwargs, result]))
        return result


class ModelledRuntime(CpuRuntime):
    """A CPU runtime whose timer reads a ``ModelledClock``. Eager ops run in its scope are
    charged to the clock; stand-in kernels are charged only when their ``PyLoader`` was given
    ``clock=runtime.clock``."""

    def __init__(self, bandwidth_gbs: float) -> None:
        self.clock = ModelledClock(bandwidth_gbs)

    def scope(self) -> contextlib.AbstractContextManager:
        return ChargedWork(self.clock)

    def start(self) -> float:
        return self.clock.now_us

    def stop(self, token: float) -> tuple[float, float]:
        return token, self.clock.now_us

    def elapsed_us(self, token: tuple[float, float]) -> float:
        return token[1] - token[0]


# ----- loading and launching -----

# An ``extern "C"`` kernel definition, with an optional ``__launch_bounds__`` on either side of
# ``void``.
_KERNEL_DEFINITION = re.compile(
    r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+'
    r'(?:__launch_bounds__\s*\([^)]*\)\s*)?([A-Za-z_]\w*)\s*\(')


def kernels_in(source: str) -> list[str]:
    """The ``extern "C"`` kernels ``source`` defines, as a compiled module would list them."""
    return sorted(set(_KERNEL_DEFINITION.findall(source)))


@dataclass
class Launch:
    """One launch as a stand-in sees it: the kernel's name, its geometry and its module's
    ``__device__`` globals."""

    name: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    shared_mem: int
    globals: dict[str, Any]


Standin = Callable[..., None]
STANDINS: dict[str, Standin] = {}


def standin(*names: str) -> Callable[[Standin], Standin]:
    """Register a stand-in under the kernel names it plays."""

    def register(function: Standin) -> Standin:
        for name in names:
            if name in STANDINS:
                raise ValueError(f"two stand-ins for kernel {name!r}")
            STANDINS[name] = function
        return function

    return register


def typed(base: str, dtypes: Sequence[str] = ("f32", "f16", "bf16")) -> list[str]:
    """``softmax`` -> ``softmax_f32``, ``softmax_f16``, ``softmax_bf16``."""
    return [f"{base}_{suffix}" for suffix in dtypes]


class PyBackend:
    """The stand-ins of one loaded module, which defines ``kernels``."""

    def __init__(self, kernels: Sequence[str], clock: ModelledClock | None = None) -> None:
        self.kernels = set(kernels)
        self.globals: dict[str, Any] = {}
        self.launched: list[str] = []
        self.clock = clock

    def has_kernel(self, name: str) -> bool:
        return name in self.kernels

    def param_widths(self, name: str) -> list[int] | None:
        return None  # like a driver that cannot list a kernel's parameters

    def launch(self, name: str, grid: tuple[int, ...], block: tuple[int, ...], shared_mem: int,
               params: Sequence[Any]) -> None:
        if name not in self.kernels:
            raise KeyError(f"no kernel named {name!r} in the module")
        kernel = STANDINS.get(name)
        if kernel is None:
            raise LookupError(f"kernel {name!r} has no Python stand-in in tests.eval.fakes")
        self.launched.append(name)
        # A compiled kernel dispatches no torch ops; a stand-in is charged for what it touches,
        # not for its arguments, so skipped work costs nothing.
        charged = ChargedWork(self.clock) if self.clock else contextlib.nullcontext()
        with _disable_current_modes(), charged:
            kernel(Launch(name, tuple(grid), tuple(block), shared_mem, self.globals), *params)


class PyLoader:
    """Finds a source's kernels (or compiles it with NVRTC when ``nvrtc=True``) and launches their
    stand-ins, charging the work they do to ``clock`` when given one."""

    def __init__(self, nvrtc: bool = False, clock: ModelledClock | None = None) -> None:
        self.compiler = Compiler() if nvrtc else None
        self.clock = clock
        self.backends: list[PyBackend] = []

    def compile(self, candidate: Candidate) -> CompileResult:
        if self.compiler is not None:
            return self.compiler.compile(candidate.source, "sm_90",
                                         candidate.meta.get("nvrtc_options") or [])
        return CompileResult(ok=True, arch="sm_90", log="", resources={
            name: KernelResources() for name in kernels_in(candidate.source)})

    def load(self, compiled: CompileResult) -> PyBackend:
        backend = PyBackend(sorted(compiled.resources), self.clock)
        self.backends.append(backend)
        return backend


# ----- memory as a kernel sees it -----


def elements(pointer: torch.Tensor, count: int, dtype: torch.dtype | None = None
             ) -> torch.Tensor:
    """``count`` elements of memory from ``pointer`` on, whatever the tensor's own shape; of
    ``dtype`` when given (a scratch buffer's bytes read as the kernel's type)."""
    if dtype is None or pointer.dtype == dtype:
        return pointer.as_strided((count,), (1,), pointer.storage_offset())
    start = pointer.storage_offset() * pointer.element_size()
    itemsize = torch.empty((), dtype=dtype).element_size()
    return torch.empty(0, dtype=dtype, device=pointer.device).set_(
        pointer.untyped_storage(), start // itemsize, (count,), (1,))


def rows(pointer: torch.Tensor, count: int, cols: int) -> torch.Tensor:
    return elements(pointer, count * cols).view(count, cols)


def float_at(address: int) -> ctypes.c_float:
    """The float32 at ``address``, for reads and writes outside any tensor's storage."""
    return ctypes.c_float.from_address(address)


def softmax_rows(x: torch.Tensor, out: torch.Tensor, count: int, cols: int,
                 logits: Callable[[torch.Tensor], torch.Tensor] = lambda v: v) -> None:
    """Softmax of ``count`` rows of ``cols`` in fp32, ``logits`` applied to each row first."""
    values = logits(rows(x, count, cols).float())
    rows(out, count, cols).copy_(torch.softmax(values, -1))


# ----- reference kernels (tests.eval.candidates) -----


@standin(*typed("softmax"), "softmax_smem")
def softmax(k: Launch, x, out, cols):
    softmax_rows(x, out, k.grid[0], int(cols))


def layer_norm_rows(x: torch.Tensor, count: int, cols: int, eps: float
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Normalized fp32 rows, their mean and their rstd (two passes, as the reference kernel)."""
    values = rows(x, count, cols).float()
    mean = values.mean(-1, keepdim=True)
    rstd = torch.rsqrt(((values - mean) ** 2).mean(-1, keepdim=True) + eps)
    return (values - mean) * rstd, mean, rstd


STATS_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def stats_dtype(kernel: str) -> torch.dtype:
    """The statistics' type of a layer norm kernel: ``..._stats_bf16`` or float32."""
    _, marker, suffix = kernel.rpartition("_stats_")
    return STATS_DTYPES[suffix] if marker else torch.float32


def weighted(normalized: torch.Tensor, w, b, cols: int, affine) -> torch.Tensor:
    if int(affine) & 1:
        normalized = normalized * elements(w, cols).float()
    if int(affine) & 2:
        normalized = normalized + elements(b, cols).float()
    return normalized


def write_layer_norm(k: Launch, normalized, mean, rstd, w, b, out, mean_out, rstd_out, cols,
                     affine) -> None:
    count, dtype = k.grid[0], stats_dtype(k.name)
    rows(out, count, cols).copy_(weighted(normalized, w, b, cols, affine))
    elements(mean_out, count, dtype).copy_(mean.view(-1))
    elements(rstd_out, count, dtype).copy_(rstd.view(-1))


@standin(*typed("layer_norm"), "layer_norm_f16_stats_f16", "layer_norm_bf16_stats_bf16")
def layer_norm(k: Launch, x, w, b, out, mean, rstd, cols, eps, affine):
    normalized, mu, r = layer_norm_rows(x, k.grid[0], int(cols), float(eps))
    write_layer_norm(k, normalized, mu, r, w, b, out, mean, rstd, int(cols), affine)


@standin(*typed("add"))
def add(k: Launch, x, y, out, n, alpha):
    n = int(n)
    elements(out, n).copy_(elements(x, n).float() + float(alpha) * elements(y, n).float())


@standin(*typed("relu"), "relu_via_helper", "kforge_warm_up")
def relu(k: Launch, x, out, n):
    elements(out, int(n)).copy_(torch.relu(elements(x, int(n))))


# ----- cheats (tests.eval.candidates) -----


@standin("noop")
def noop(k: Launch, out):
    pass


@standin("zeros")
def zeros(k: Launch, out, n):
    elements(out, int(n)).zero_()


@standin("nans")
def nans(k: Launch, out, n):
    elements(out, int(n)).fill_(float("nan"))


def bf16_rounded(values: torch.Tensor) -> torch.Tensor:
    return values.bfloat16().float()


@standin("low_precision")
def low_precision(k: Launch, x, out, cols):
    softmax_rows(x, out, k.grid[0], int(cols), logits=bf16_rounded)


@standin("scribble")
def scribble(k: Launch, x, out, cols):
    softmax_rows(x, out, k.grid[0], int(cols))
    rows(x, k.grid[0], int(cols))[:, 0] = 0.0


@standin("relu_oob")
def relu_oob(k: Launch, x, out, n):
    n = int(n)
    beyond = elements(x, n + 1)[n]  # the canary after the input
    elements(out, n).copy_(torch.relu(elements(x, n)))
    elements(out, n)[n - 1] += 0.0 * beyond


@standin("relu_oob_write")
def relu_oob_write(k: Launch, x, out, n):
    elements(out, int(n)).copy_(torch.relu(elements(x, int(n))))
    float_at(x.data_ptr() - 4).value = 1.0


@standin("check_address")
def check_address(k: Launch, x, hit):
    elements(hit, 1, torch.int32).fill_(int(k.globals.get("last_input") == x.data_ptr()))
    k.globals["last_input"] = x.data_ptr()


@standin("replay")
def replay(k: Launch, x, out, cols, hit):
    count, cols = k.grid[0], int(cols)
    cached = k.globals.get("cache")
    if int(elements(hit, 1, torch.int32)[0]) and cached is not None:
        rows(out, count, cols).copy_(cached)
        return
    softmax_rows(x, out, count, cols)
    k.globals["cache"] = rows(out, count, cols).clone()


@standin("count_call")
def count_call(k: Launch, honest):
    calls = k.globals.get("calls", 0)
    k.globals["skip"] = calls >= int(honest)
    k.globals["calls"] = calls + 1


@standin("maybe_softmax")
def maybe_softmax(k: Launch, x, out, cols):
    if not k.globals["skip"]:
        softmax_rows(x, out, k.grid[0], int(cols))


@standin("wild")
def wild(k: Launch, out):
    raise RuntimeError("CUDA error: an illegal memory access was encountered (stand-in)")


# ----- red team (tests.eval.redteam) -----


@standin("softmax_replay_scratch")
def softmax_replay_scratch(k: Launch, x, out, cols, stash):
    count, cols = k.grid[0], int(cols)
    header = elements(stash, 1, torch.int32)
    payload = elements(stash, 4 + count * cols, torch.float32)[4:].view(count, cols)
    if int(header[0]) != 0:
        rows(out, count, cols).copy_(payload)
        return
    softmax_rows(x, out, count, cols)
    payload.copy_(rows(out, count, cols))
    header[0] = 1


@standin("softmax_to_half")
def softmax_to_half(k: Launch, x, out, cols):
    softmax_rows(x, out, k.grid[0], int(cols))


def softmax_rows_where(x, out, cols: int, count: int, compute: torch.Tensor) -> None:
    """Softmax of the rows where ``compute`` (one bool a row) holds; the others untouched."""
    result = torch.softmax(rows(x, count, cols).float(), -1)
    target = rows(out, count, cols)
    target[compute] = result[compute].to(target.dtype)


@standin("softmax_if_nan_poison")
def softmax_if_nan_poison(k: Launch, x, out, cols):
    count, cols = k.grid[0], int(cols)
    seen = rows(out, count, cols)[:, 0].float()
    softmax_rows_where(x, out, cols, count, seen.isnan())


@standin("softmax_if_known_poison")
def softmax_if_known_poison(k: Launch, x, out, cols):
    count, cols = k.grid[0], int(cols)
    seen = rows(out, count, cols)[:, 0].float()
    softmax_rows_where(x, out, cols, count, seen.isnan() | (seen == -12345.0))


@standin("fingerprint")
def fingerprint(k: Launch, x, hit, at):
    at = int(at)
    bits = int(elements(x, at + 1)[at:].view(torch.int32)[0])
    seen = (k.globals.get("seen_input"), k.globals.get("seen_bits"))
    elements(hit, 1, torch.int32).fill_(int(seen == (x.data_ptr(), bits)))
    k.globals.update(seen_input=x.data_ptr(), seen_bits=bits)


@standin("watch_rotation")
def watch_rotation(k: Launch, x, rows_to_do, count, timed_rows, honest_timed):
    recent = k.globals.setdefault("recent", [None, None, None])
    timed = x.data_ptr() != recent[0] and x.data_ptr() == recent[2]
    recent[:] = [x.data_ptr(), recent[0], recent[1]]
    if timed:
        k.globals["timed_calls"] = k.globals.get("timed_calls", 0) + 1
    cheating = timed and k.globals["timed_calls"] > int(honest_timed)
    elements(rows_to_do, 1, torch.int32).fill_(int(timed_rows if cheating else count))


@standin("softmax_some_rows")
def softmax_some_rows(k: Launch, x, out, cols, rows_to_do):
    count = min(k.grid[0], int(elements(rows_to_do, 1, torch.int32)[0]))
    softmax_rows(x, out, count, int(cols))



@standin("softmax_ticketed")
def softmax_ticketed(k: Launch, x, out, tickets, cols):
    count, cols = k.grid[0], int(cols)
    counter = elements(tickets, 1, torch.int32)
    first = int(counter[0])
    counter[0] = first + count  # every block takes one
    if first != 0:  # rows first .. first + count - 1: past the end of x and out
        raise RuntimeError("CUDA error: an illegal memory access was encountered (stand-in: "
                           f"tickets {first}.. of {count} rows)")
    softmax_rows(x, out, count, cols)

@standin("softmax_no_max")
def softmax_no_max(k: Launch, x, out, cols):
    values = torch.exp(rows(x, k.grid[0], int(cols)).float())
    rows(out, k.grid[0], int(cols)).copy_(values / values.sum(-1, keepdim=True))


@standin("softmax_fixed_max")
def softmax_fixed_max(k: Launch, x, out, cols, m):
    values = torch.exp(rows(x, k.grid[0], int(cols)).float() - float(m))
    rows(out, k.grid[0], int(cols)).copy_(values / values.sum(-1, keepdim=True))


@standin("softmax_fixed_mask")
def softmax_fixed_mask(k: Launch, x, out, cols, valid):
    count, cols, valid = k.grid[0], int(cols), int(valid)
    target = rows(out, count, cols)
    target[:, :valid] = torch.softmax(rows(x, count, cols)[:, :valid].float(), -1)
    target[:, valid:] = 0.0


@standin("relu_where_sample_positive")
def relu_where_sample_positive(k: Launch, x, out, n):
    from tests.eval.redteam import (
        relu_sample,  # the sample the kernel's mask was taken from
    )

    positive = relu_sample().args[0].reshape(-1) > 0
    n = int(n)
    values = elements(x, n)
    elements(out, n).copy_(torch.where(positive[:n], values, torch.zeros_like(values)))


@standin("relu_identity")
def relu_identity(k: Launch, x, out, n):
    elements(out, int(n)).copy_(elements(x, int(n)))


def layer_norm_statistics(values: torch.Tensor, kernel: str, eps: float
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and rstd as the shortcut kernels of ``tests.eval.redteam`` compute them."""
    if kernel == "layer_norm_no_mean":
        mean = torch.zeros(values.shape[0], 1)
        return mean, torch.rsqrt((values * values).mean(-1, keepdim=True) + eps)
    mean = values.mean(-1, keepdim=True)
    if kernel == "layer_norm_one_pass":
        variance = (values * values).mean(-1, keepdim=True) - mean * mean
        return mean, torch.rsqrt(variance + eps)
    return mean, torch.rsqrt(((values - mean) ** 2).mean(-1, keepdim=True))  # no eps


@standin("layer_norm_no_mean", "layer_norm_one_pass", "layer_norm_no_eps")
def layer_norm_shortcut(k: Launch, x, w, b, out, mean, rstd, cols, eps, affine):
    cols = int(cols)
    values = rows(x, k.grid[0], cols).float()
    mu, r = layer_norm_statistics(values, k.name, float(eps))
    write_layer_norm(k, (values - mu) * r, mu, r, w, b, out, mean, rstd, cols, affine)


@standin("softmax_bf16_steps")
def softmax_bf16_steps(k: Launch, x, out, cols):
    count, cols = k.grid[0], int(cols)
    values = rows(x, count, cols).float()
    exps = bf16_rounded(torch.exp(bf16_rounded(values - values.amax(-1, keepdim=True))))
    inverse = bf16_rounded(1.0 / exps.sum(-1, keepdim=True))
    rows(out, count, cols).copy_(exps * inverse)


@standin("layer_norm_bf16_steps", "layer_norm_bf16_steps_stats_bf16")
def layer_norm_bf16_steps(k: Launch, x, w, b, out, mean, rstd, cols, eps, affine):
    count, cols = k.grid[0], int(cols)
    values = rows(x, count, cols).float()
    mu = values.mean(-1, keepdim=True)
    r = torch.rsqrt(((values - mu) ** 2).mean(-1, keepdim=True) + float(eps))
    normalized = bf16_rounded(bf16_rounded(values - mu) * r)
    if int(affine) & 1:
        normalized = bf16_rounded(normalized * elements(w, cols).float())
    if int(affine) & 2:
        normalized = normalized + elements(b, cols).float()
    rows(out, count, cols).copy_(normalized)
    elements(mean, count, stats_dtype(k.name)).copy_(mu.view(-1))
    elements(rstd, count, stats_dtype(k.name)).copy_(r.view(-1))


@standin("add_bf16_other")
def add_bf16_other(k: Launch, x, y, out, n, alpha):
    n = int(n)
    elements(out, n).copy_(elements(x, n) + float(alpha) * bf16_rounded(elements(y, n)))


@standin("softmax_racy")
def softmax_racy(k: Launch, x, out, cols):
    """A race that moves one element by most of fp32's tolerance, one way or the other on
    alternate calls: each run alone is close enough to eager, the two runs are not."""
    count, cols = k.grid[0], int(cols)
    softmax_rows(x, out, count, cols)
    k.globals["calls"] = calls = k.globals.get("calls", 0) + 1
    result = rows(out, count, cols)
    slack = 0.8e-4 * (float(result.pow(2).mean().sqrt()) + float(result[0, 0].abs()))
    result[0, 0] += slack if calls % 2 else -slack


@standin("add_vec4_tail")
def add_vec4_tail(k: Launch, x, y, out, n, alpha):
    n = int(n)
    whole = -(-n // 4) * 4
    values = elements(x, n) + float(alpha) * elements(y, n)
    elements(out, whole).copy_(torch.cat([values, values.new_zeros(whole - n)]))


@standin("row_stats")
def row_stats(k: Launch, x, stats, cols):
    count, cols = k.grid[0], int(cols)
    values = rows(x, count, cols).float()
    m = values.amax(-1)
    total = torch.exp(values - m[:, None]).sum(-1)
    elements(stats, 2 * count, torch.float32).view(count, 2).copy_(torch.stack([m, 1 / total], 1))


@standin("normalize_rows")
def normalize_rows(k: Launch, x, stats, out, cols):
    count, cols = k.grid[0], int(cols)
    m, inverse = elements(stats, 2 * count, torch.float32).view(count, 2).unbind(1)
    values = rows(x, count, cols).float()
    rows(out, count, cols).copy_(torch.exp(values - m[:, None]) * inverse[:, None])


@standin("relu_vec4", "relu_scalar")
def relu_any_alignment(k: Launch, x, out, n):
    relu(k, x, out, n)


@standin("layer_norm_welford")
def layer_norm_welford(k: Launch, x, w, b, out, mean, rstd, cols, eps, affine):
    layer_norm(k, x, w, b, out, mean, rstd, cols, eps, affine)


@standin("amax_rows", "amax_from_zero")
def amax_rows(k: Launch, x, out, cols):
    count = k.grid[0]
    values = rows(x, count, int(cols)).amax(-1)
    if k.name == "amax_from_zero":
        values = values.clamp_min(0.0)
    elements(out, count).copy_(values)


@standin("sum_rows_f16", "sum_rows_half_accumulator")
def sum_rows(k: Launch, x, out, cols):
    count, cols, threads = k.grid[0], int(cols), k.block[0]
    values = rows(x, count, cols)
    if k.name == "sum_rows_half_accumulator":  # each thread's strided elements added in half
        strided = values.view(count, cols // threads, threads)
        partial = torch.zeros(count, threads, dtype=torch.float16)
        for j in range(strided.shape[1]):
            partial = partial + strided[:, j]
        total = partial.float().sum(-1)
    else:
        total = values.float().sum(-1)
    elements(out, count).copy_(total.half())


@standin("sum_slices", "sum_slices_bf16")
def sum_slices(k: Launch, x, parts, n):
    slices, n = k.grid[0], int(n)
    per = -(-n // slices)
    padded = torch.nn.functional.pad(elements(x, n), (0, per * slices - n))
    sums = padded.view(slices, per).sum(1)
    if k.name == "sum_slices_bf16":
        sums = bf16_rounded(sums)
    elements(parts, slices, torch.float32).copy_(sums)


@standin("sum_parts")
def sum_parts(k: Launch, parts, out, count):
    elements(out, 1).copy_(elements(parts, int(count), torch.float32).sum().reshape(1))


@standin("where_select", "where_always_self")
def where_select(k: Launch, condition, a, b, out, n):
    n = int(n)
    picked = elements(condition, n) if k.name == "where_select" else torch.ones(n, dtype=torch.bool)
    elements(out, n).copy_(torch.where(picked, elements(a, n), elements(b, n)))


@standin("embedding_rows", "embedding_rows_seen")
def embedding_rows(k: Launch, weight, indices, out, dim):
    count, dim = k.grid[0], int(dim)
    ids = elements(indices, count)
    if k.name == "embedding_rows_seen":
        ids = ids & 1023
    table = weight.as_strided((weight.shape[0], dim), (dim, 1), weight.storage_offset())
    rows(out, count, dim).copy_(table[ids])


def tf32(values: torch.Tensor) -> torch.Tensor:
    """fp32 rounded to tf32's 10-bit mantissa, to nearest with ties away from zero."""
    bits = values.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


@standin("mm_f32", "mm_tf32")
def mm_tiles(k: Launch, a, b, out, m, n, depth):
    m, n, depth = int(m), int(n), int(depth)
    left, right = rows(a, m, depth), rows(b, depth, n)
    if k.name == "mm_tf32":
        left, right = tf32(left), tf32(right)
    rows(out, m, n).copy_(left @ right)


@standin("rms_norm_rows", "rms_norm_eps_after_root")
def rms_norm_rows(k: Launch, x, w, out, cols, eps):
    count, cols, eps = k.grid[0], int(cols), float(eps)
    values = rows(x, count, cols)
    mean_square = values.pow(2).mean(-1, keepdim=True)
    scale = (1 / (mean_square.sqrt() + eps) if k.name == "rms_norm_eps_after_root"
             else torch.rsqrt(mean_square + eps))
    rows(out, count, cols).copy_(elements(w, cols) * (values * scale))


@standin("relu_off_by_one")
def relu_off_by_one(k: Launch, x, out, n):
    n = int(n) + 1  # `i <= n`: one element past the input read, and past the output written
    elements(out, n).copy_(torch.relu(elements(x, n)))


# ----- red team, issue classes: placement, every checked call, special values, content caches,
# lowered intermediates, races between blocks (tests.eval.redteam) -----


class Contention:
    """The CPU's stand-in for work competing for the GPU (``kforge.eval.verify.contention``): while one
    is entered, ``busy`` holds, and stand-ins of racy kernels read what a block scheduled late
    would leave."""

    busy = False

    def __enter__(self) -> Contention:
        Contention.busy = True
        return self

    def __exit__(self, *exc: object) -> None:
        Contention.busy = False


class ContendedCpuRuntime(CpuRuntime):
    """A CPU runtime whose contended calls run under ``Contention``."""

    def contention(self) -> Contention:
        return Contention()


class ContendedModelledRuntime(ModelledRuntime):
    def contention(self) -> Contention:
        return Contention()


@standin("softmax_at_256", "softmax_out_at_256")
def softmax_where_watched(k: Launch, x, out, cols):
    """All rows where the watched pointer sits 256 bytes past a 512-byte boundary, the first
    three quarters elsewhere."""
    watched = (x if k.name == "softmax_at_256" else out).data_ptr() % 512 == 256
    count = k.grid[0]
    softmax_rows(x, out, count if watched else count - count // 4, int(cols))


@standin("relu_copy", "relu_checked", "relu_checked_wide")
def relu_by_path(k: Launch, x, out, n):
    if k.name == "relu_copy":
        relu_identity(k, x, out, n)
    else:
        relu(k, x, out, n)


@standin("add_aligned", "add_fallback_drops_other")
def add_by_path(k: Launch, x, y, out, n, alpha):
    if k.name == "add_fallback_drops_other":
        elements(out, int(n)).copy_(elements(x, int(n)))
    else:
        add(k, x, y, out, n, alpha)


@standin("softmax_picks_by_pointer")
def softmax_picks_by_pointer(k: Launch, x, out, cols):
    softmax(k, x, out, cols)


@standin("tick_even", "tick_seen", "tick_timed")
def tick_calls(k: Launch, x, cols):
    k.globals["calls"] = k.globals.get("calls", 0) + 1
    seen = k.globals.setdefault("seen", [])
    k.globals["repeat"] = x.data_ptr() in seen
    seen.append(x.data_ptr())
    recent = k.globals.setdefault("recent", [None, None, None])
    k.globals["timed"] = x.data_ptr() != recent[0] and x.data_ptr() == recent[2]
    recent[:] = [x.data_ptr(), recent[0], recent[1]]


LOWERED_WHEN = {"softmax_bf16_on_even_calls": lambda g: g["calls"] % 2 == 0,
                "softmax_bf16_on_seen_addresses": lambda g: g["repeat"],
                "softmax_bf16_when_timed": lambda g: g["timed"],
                "softmax_two_orders": lambda g: False}


@standin(*LOWERED_WHEN)
def softmax_lowered_when(k: Launch, x, out, cols):
    count, cols = k.grid[0], int(cols)
    if k.name == "softmax_two_orders":  # honest: two reduction orders, by call parity
        total = strided_tree_sum if k.globals["calls"] % 2 else sequential_rows_sum
        values = rows(x, count, cols).float()
        e = torch.exp(values - values.amax(-1, keepdim=True))
        rows(out, count, cols).copy_(e / total(e))
        return
    lowered = LOWERED_WHEN[k.name](k.globals)
    softmax_rows(x, out, count, cols, logits=bf16_rounded if lowered else lambda v: v)


def sequential_rows_sum(e: torch.Tensor) -> torch.Tensor:
    return e.cumsum(-1)[:, -1:]




@standin("relu_fmaxf")
def relu_fmaxf(k: Launch, x, out, n):
    values = elements(x, int(n))
    elements(out, int(n)).copy_(torch.fmax(values, torch.zeros_like(values)))


@standin("amax_fmaxf")
def amax_fmaxf(k: Launch, x, out, cols):
    values = rows(x, k.grid[0], int(cols))
    elements(out, k.grid[0]).copy_(torch.where(values.isnan(), -math.inf, values).amax(-1))


@standin("neg_as_difference", "neg_honest", "abs_by_comparison", "abs_honest")
def sign_ops(k: Launch, x, out, n):
    values = elements(x, int(n))
    result = {"neg_as_difference": lambda v: 0.0 - v, "neg_honest": torch.neg,
              "abs_by_comparison": lambda v: torch.where(v < 0, -v, v),
              "abs_honest": torch.abs}[k.name](values)
    elements(out, int(n)).copy_(result)


@standin("softmax_clamped_logits")
def softmax_clamped_logits(k: Launch, x, out, cols):
    top = torch.finfo(torch.float32).max
    softmax_rows(x, out, k.grid[0], int(cols), logits=lambda v: torch.where(
        v.isnan(), top, v.clamp(-top, top)))


@standin("fingerprint_sampled", "memo_path")
def fingerprint_sampled(k: Launch, x, hit, n, samples):
    n, samples = int(n), int(samples)
    values = elements(x, n)
    at = [j * (n - 1) // max(samples - 1, 1) for j in range(samples)]
    key = (x.data_ptr(), tuple(int(b) for b in values[at].view(torch.int32)))
    if k.name == "memo_path":  # honest: remembers a choice per address, never a result
        k.globals.setdefault("paths", {})[x.data_ptr()] = samples
        elements(hit, 1, torch.int32).fill_(0)
        return
    elements(hit, 1, torch.int32).fill_(int(k.globals.get("key") == key))
    k.globals["key"] = key


@standin("fingerprint_first_sum")
def fingerprint_first_sum(k: Launch, x, hit, n, samples):
    head = elements(x, int(samples)).double().sum().item()
    key = (x.data_ptr(), head)
    elements(hit, 1, torch.int32).fill_(int(k.globals.get("key") == key))
    k.globals["key"] = key


def bf16_softmax_rows(x, out, count: int, cols: int, step: str) -> None:
    values = rows(x, count, cols).float()
    e = torch.exp(values - values.amax(-1, keepdim=True))
    if step == "exp":
        e = bf16_rounded(e)
        result = e / e.sum(-1, keepdim=True)
    else:
        result = e * bf16_rounded(1.0 / e.sum(-1, keepdim=True))
    rows(out, count, cols).copy_(result)


@standin("softmax_bf16_exp", "softmax_bf16_inverse")
def softmax_bf16_step(k: Launch, x, out, cols):
    bf16_softmax_rows(x, out, k.grid[0], int(cols), "exp" if k.name.endswith("exp") else "inv")


@standin("silu_bf16_sigmoid", "silu_bf16")
def silu_bf16(k: Launch, x, out, n):
    values = elements(x, int(n)).float()
    sigmoid = torch.sigmoid(values)
    if k.name == "silu_bf16_sigmoid":
        sigmoid = bf16_rounded(sigmoid)
    elements(out, int(n)).copy_(values * sigmoid)


def slice_sums(x, n: int, slices: int) -> torch.Tensor:
    per = -(-n // slices)
    return torch.nn.functional.pad(elements(x, n), (0, per * slices - n)).view(slices, per).sum(1)


@standin("sum_last_block_unfenced", "sum_last_block_done")
def sum_last_block(k: Launch, x, parts, out, counter, n):
    """Each block's slice sum into ``parts``, then one block adds them. Unfenced: block 0 adds
    at once, and under contention block 1 has not written its part yet."""
    slices, n = k.grid[0], int(n)
    sums = slice_sums(x, n, slices)
    stored = elements(parts, slices, torch.float32)
    late = Contention.busy and k.name == "sum_last_block_unfenced"
    written = torch.ones(slices, dtype=torch.bool)
    written[1] = not late
    stored[written] = sums[written]
    elements(out, 1).copy_(stored.sum().reshape(1))
    stored.copy_(sums)


@standin("amax_split_unfenced")
def amax_split_unfenced(k: Launch, x, partial, out, cols):
    """Two blocks a row, each the max of one half; the first reads the second's from global
    memory without waiting (under contention: what the scratch held)."""
    count, cols = k.grid[0] // 2, int(cols)
    values = rows(x, count, cols)
    half = cols // 2
    halves = elements(partial, count, torch.float32)
    if not Contention.busy:
        halves.copy_(values[:, half:].amax(-1))
    elements(out, count).copy_(torch.maximum(values[:, :half].amax(-1), halves))
    halves.copy_(values[:, half:].amax(-1))


@standin("softmax_split_unfenced")
def softmax_split_unfenced(k: Launch, x, partial, out, cols):
    """Two blocks a row exchange their halves' sums of exponentials through global memory, with
    no fence or wait: under contention one reads what the scratch held."""
    count, cols = k.grid[0] // 2, int(cols)
    values = rows(x, count, cols).float()
    e = torch.exp(values - values.amax(-1, keepdim=True))
    half = cols // 2
    sums = elements(partial, 2 * count, torch.float32).view(count, 2)
    fresh = torch.stack([e[:, :half].sum(-1), e[:, half:].sum(-1)], 1)
    if not Contention.busy:
        sums.copy_(fresh)
    total = fresh[:, :1] + sums[:, 1:]
    rows(out, count, cols).copy_(e / total)
    sums.copy_(fresh)


# ----- red team, deferred work across timed calls (tests.eval.redteam, issue 30 class 1) -----


@standin("defer_step")
def defer_step(k: Launch, out, honest, slow, deferred):
    g = k.globals
    c = g.get("defer_calls", 0)
    g["defer_calls"] = c + 1
    g["defer_fill"], g["defer_last"], g["defer_mode"] = g.get("defer_last"), None, 0
    honest, slow, deferred = int(honest), int(slow), int(deferred)
    if honest <= c < honest + slow:
        g["defer_mode"] = 2
    elif honest + slow <= c and c + 1 < honest + slow + deferred:
        g["defer_mode"], g["defer_last"] = 1, out


@standin("defer_softmax")
def defer_softmax(k: Launch, x, out, cols, rows_now):
    g, count, cols, now = k.globals, k.grid[0], int(cols), int(rows_now)
    if g["defer_fill"] is not None:
        rows(g["defer_fill"], count, cols)[now:] = torch.softmax(g["defer_stash"][now:], -1)
    if g["defer_mode"] == 1:
        g["defer_stash"] = rows(x, count, cols).float().clone()
        softmax_rows(x, out, now, cols)
        return
    if g["defer_mode"] == 2:
        time.sleep(0.02)
    softmax_rows(x, out, count, cols)
