"""Row families: softmax, layer_norm and rms_norm, each reducing over the last dimension(s) and
writing a packed output (plus the per-row statistics the norms return).

Shared parameters: ``threads_per_row`` (a part of a warp up to 32 warps), ``rows_per_block``,
``vec`` (elements per access, up to 16 bytes) and, for looping variants, ``unroll`` (accesses in
flight per thread).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kforge.core.gpu import GpuInfo
from kforge.propose.library.cards import Call, Declined, TensorArg, require_float
from kforge.propose.library.families.base import (
    Affine,
    Family,
    Kernel,
    Variant,
    entry_points,
    f32,
    i64,
    launch,
    new_output,
    ptr,
    sm_count,
    vec_options,
)
from kforge.propose.library.layout import Rows, row_view
from kforge.propose.library.space import (
    Axis,
    Params,
    Space,
    ceil_div,
    clamp,
    pow2_ceil,
    powers_of_two,
)

# Values one thread keeps in registers in the *_registers variants, and per block (half of an
# SM's 64K registers), beyond which the compiler would spill.
MAX_THREAD_VALUES = 64
MAX_BLOCK_VALUES = 32768
# eps of aten._fused_rms_norm when none is given: the float epsilon (its math type's).
FLOAT_EPSILON = float(np.finfo(np.float32).eps)


def row_space(rows: Rows, vecs: tuple[int, ...], gpu: GpuInfo, *, resident: bool,
              unrolled: bool) -> Space | None:
    """Threads per row x rows per block x vector width (x unroll) for one row problem.

    ``resident``: the variant keeps its row in registers, so a thread's share must fit there.
    """
    cols = rows.cols
    axes = [Axis("threads_per_row", powers_of_two(1, 1024)), Axis("rows_per_block", powers_of_two(1, 128)),
            Axis("vec", vecs)]
    if unrolled:
        axes.append(Axis("unroll", (1, 2, 4)))

    def valid(p: Params) -> bool:
        tpr, rpb, vec = p["threads_per_row"], p["rows_per_block"], p["vec"]
        block = tpr * rpb
        if not 32 <= block <= 1024 or tpr > pow2_ceil(ceil_div(cols, vec)):
            return False
        if resident:
            per_thread = ceil_div(cols, tpr * vec) * vec
            if per_thread > MAX_THREAD_VALUES or per_thread * block > MAX_BLOCK_VALUES:
                return False
        return not (unrolled and p["unroll"] > 1 and tpr * vec * p["unroll"] > cols)

    vec = max(vecs)
    # About four vectors per thread: enough bytes in flight, few idle threads at the row's end.
    tpr = clamp(pow2_ceil(ceil_div(ceil_div(cols, vec), 4)), 1, 1024)
    rpb = clamp(256 // tpr, 1, 128)
    while rpb > 1 and ceil_div(rows.rows, rpb) < 2 * sm_count(gpu) and tpr * rpb > 32:
        rpb //= 2  # few rows: smaller blocks so every SM gets work
    default = {"threads_per_row": tpr, "rows_per_block": max(rpb, ceil_div(32, tpr)), "vec": vec}
    safe_tpr = clamp(pow2_ceil(cols), 1, 32) if not resident else clamp(
        pow2_ceil(ceil_div(cols, MAX_THREAD_VALUES)), 32, 1024)
    safe = {"threads_per_row": safe_tpr, "rows_per_block": max(1, 128 // safe_tpr), "vec": 1}
    if unrolled:
        default["unroll"] = 2 if cols >= 2 * tpr * vec else 1
        safe["unroll"] = 1
    return Space.build(tuple(axes), valid, default, safe)


def row_vecs(rows: Rows, *tensors: TensorArg) -> tuple[int, ...]:
    """Vector widths for rows of these tensors: at most 16 bytes of the widest."""
    return vec_options(max(t.itemsize for t in tensors), rows.cols, rows.stride)


def launch_geometry(rows: Rows, p: Params) -> tuple[int, int]:
    """(grid, block) of a row kernel."""
    return ceil_div(rows.rows, p["rows_per_block"]), p["threads_per_row"] * p["rows_per_block"]


def template_args(rows: Rows, p: Params, vec: int, unrolled: bool) -> str:
    args = [rows.cols, rows.stride, p["threads_per_row"], p["rows_per_block"], vec]
    if unrolled:
        args.append(p["unroll"])
    return ", ".join(str(a) for a in args)


def resident_variant(rows: Rows, vecs: tuple[int, ...], gpu: GpuInfo, approach: str,
                     summary: str) -> Variant:
    space = row_space(rows, vecs, gpu, resident=True, unrolled=False)
    if space is None:
        return Variant(approach, summary, why_not=f"rows of {rows.cols} elements do not fit in "
                                                  "registers")
    return Variant(approach, summary, space)


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SoftmaxProblem:
    call: Call
    x: TensorArg
    out: TensorArg
    rows: Rows


class Softmax(Family):
    name = "softmax"
    ops = ("aten._softmax.default",)
    cuda_files = ("rows.cu",)
    reference = "two_pass"

    def analyze(self, call: Call) -> SoftmaxProblem:
        x = call.float_tensor(0, "the input")
        dim, out = call.value(1), call.outputs[0]
        if x.ndim == 0:
            raise Declined("softmax of a 0-d tensor")
        require_float(out)
        dim %= x.ndim
        if any(n != 1 for n in x.shape[dim + 1:]):
            raise Declined(f"softmax over dimension {dim} of {x.describe()}, not the innermost, "
                           "is not supported")
        if not out.is_contiguous:
            raise Declined("eager's output is not contiguous here")
        return SoftmaxProblem(call, x, out, row_view(x, x.ndim - dim))

    def variants(self, problem: SoftmaxProblem, gpu: GpuInfo) -> list[Variant]:
        rows, vecs = problem.rows, row_vecs(problem.rows, problem.x, problem.out)
        loop = row_space(rows, vecs, gpu, resident=False, unrolled=True)
        two_pass = row_space(rows, vecs, gpu, resident=False, unrolled=False)
        return [
            resident_variant(rows, vecs, gpu, "registers",
                             "row held in registers: one read, max and sum by shuffles"),
            Variant("online", "one pass of running max and rescaled sum, then a second read "
                              "to write", loop),
            Variant("two_pass", "max, sum of exp and write in three passes over the row (reference)",
                    two_pass),
        ]

    def render(self, problem: SoftmaxProblem, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
        x, out, rows = problem.x, problem.out, problem.rows
        grid, block = launch_geometry(rows, params)
        source = entry_points(
            "softmax", params["vec"], block,
            [f"const {x.ctype}* __restrict__ x", f"{out.ctype}* __restrict__ y", "int64_t rows"],
            lambda vec: f"softmax_{approach}<{x.ctype}, {out.ctype}, "
                        f"{template_args(rows, params, vec, approach == 'online')}>(x, y, rows)")
        plan = {"outputs": [new_output("out", out)],
                "launches": [launch("softmax", grid, block,
                                    [ptr(problem.call.arg_name(0)), ptr("out"), i64(rows.rows)],
                                    params["vec"], max(x.itemsize, out.itemsize))]}
        return Kernel(source, plan)


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NormProblem:
    """layer_norm or rms_norm over the last dimensions of ``x``."""

    call: Call
    x: TensorArg
    affine: Affine
    rows: Rows
    outputs: tuple[TensorArg, ...]  # y, then the statistics eager returns


def analyze_norm(call: Call, shape_index: int, weight_index: int, bias_index: int | None) -> NormProblem:
    x = call.float_tensor(0, "the input")
    normalized = list(call.value(shape_index))
    affine = Affine.read(call, weight_index, bias_index)
    y = call.outputs[0]
    if not y.is_contiguous or not all(s.is_contiguous and s.dtype == "float32" for s in call.outputs[1:]):
        raise Declined("eager's outputs are laid out differently than expected here")
    return NormProblem(call, x, affine, row_view(x, len(normalized)), call.outputs)


def norm_vecs(problem: NormProblem) -> tuple[int, ...]:
    return row_vecs(problem.rows, problem.x, *problem.affine.present)


def render_norm(problem: NormProblem, name: str, approach: str, params: Params, unrolled: bool,
                stats: tuple[str, ...], eps: float | str) -> Kernel:
    """A norm's kernels (template ``<name>_<approach>``) and plan: one launch over the rows,
    taking the input, the weight and bias present, eager's outputs (y, then the float statistics
    ``stats``), rows and ``eps``."""
    x, affine, rows = problem.x, problem.affine, problem.rows
    grid, block = launch_geometry(rows, params)
    params_c = [f"const {x.ctype}* __restrict__ x", *affine.c_params(affine.ctype(x)),
                f"{x.ctype}* __restrict__ y", *(f"float* __restrict__ {s}" for s in stats),
                "int64_t rows", "float eps"]
    args = ", ".join(["x", affine.c_args(), "y", *stats, "rows", "eps"])
    source = entry_points(name, params["vec"], block, params_c, lambda vec: (
        f"{name}_{approach}<{x.ctype}, {affine.ctype(x)}, "
        f"{template_args(rows, params, vec, unrolled)}, {affine.flags()}>({args})"))
    outputs = ("out", *stats)
    plan = {"outputs": [new_output(n, t) for n, t in zip(outputs, problem.outputs)],
            "launches": [launch(name, grid, block,
                                [ptr(problem.call.arg_name(0)), *affine.pointers(),
                                 *map(ptr, outputs), i64(rows.rows), f32(eps)],
                                params["vec"], max(t.itemsize for t in [x, *affine.present]))]}
    return Kernel(source, plan)


class LayerNorm(Family):
    name = "layer_norm"
    ops = ("aten.native_layer_norm.default",)
    cuda_files = ("rows.cu",)
    reference = "two_pass"

    def analyze(self, call: Call) -> NormProblem:
        return analyze_norm(call, 1, 2, 3)

    def variants(self, problem: NormProblem, gpu: GpuInfo) -> list[Variant]:
        rows, vecs = problem.rows, norm_vecs(problem)
        return [
            resident_variant(rows, vecs, gpu, "registers",
                             "row held in registers: exact two-pass mean and variance, one read"),
            Variant("welford", "Welford statistics in one pass, a second read to normalize",
                    row_space(rows, vecs, gpu, resident=False, unrolled=True)),
            Variant("two_pass", "mean, variance and normalize in three passes (reference)",
                    row_space(rows, vecs, gpu, resident=False, unrolled=False)),
        ]

    def render(self, problem: NormProblem, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
        return render_norm(problem, "layer_norm", approach, params, approach == "welford",
                           ("mean", "rstd"), problem.call.arg_name(4))


class RmsNorm(Family):
    name = "rms_norm"
    ops = ("aten._fused_rms_norm.default",)
    cuda_files = ("rows.cu",)
    reference = "loop"

    def analyze(self, call: Call) -> NormProblem:
        return analyze_norm(call, 1, 2, None)

    def variants(self, problem: NormProblem, gpu: GpuInfo) -> list[Variant]:
        rows, vecs = problem.rows, norm_vecs(problem)
        return [
            resident_variant(rows, vecs, gpu, "registers",
                             "row held in registers: one read, sum of squares by shuffles"),
            Variant("loop", "sum of squares in one pass, a second read to scale (reference)",
                    row_space(rows, vecs, gpu, resident=False, unrolled=True)),
        ]

    def render(self, problem: NormProblem, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
        eps = FLOAT_EPSILON if problem.call.value(3) is None else problem.call.arg_name(3)
        return render_norm(problem, "rms_norm", approach, params, approach == "loop", ("rstd",), eps)
