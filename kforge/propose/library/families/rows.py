"""Row families: softmax, layer_norm and rms_norm, each reducing over the last dimension(s) and
writing a packed output (plus the per-row statistics the norms return).

Shared parameters: ``threads_per_row`` (a part of a warp up to 32 warps), ``rows_per_block``,
``vec`` (elements per access, up to 16 bytes) and, for looping variants, ``unroll`` (accesses in
flight per thread).

Where the normalized dimension is not packed but a kept one is (a transposed view, softmax over a
middle dimension), the input is seen as [K1, R, K2] and the ``columns`` kernel normalizes columns:
``cols`` (columns per block, staged in shared memory), ``vec`` (along K2), ``out_vec`` (along R
for outputs that pack it) and ``block`` (threads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kforge.core.gpu import GpuInfo
from kforge.propose.library.cards import Call, Declined, TensorArg, require_float
from kforge.propose.library.families.base import (
    SHARED_FLOATS,
    Affine,
    Family,
    Kernel,
    Variant,
    cuda_bool,
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
GRID_Y_LIMIT = 65535
# A columns kernel's kind (KIND_* in rows.cu).
COLUMN_KINDS = {"layer_norm": "KIND_LAYER_NORM", "rms_norm": "KIND_RMS_NORM", "softmax": "KIND_SOFTMAX"}


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
class Columns:
    """A tensor seen as [K1, R, K2], K2 packed: rows to normalize are columns (R elements ``x_r``
    apart). Strides of the input (K1, R), of the output (K1, K2, R) and of the statistics (K1,
    K2)."""

    k1: int
    r: int
    k2: int
    x_k1: int
    x_r: int
    out_k1: int
    out_k2: int
    out_r: int
    stats_k1: int = 0
    stats_k2: int = 0


def merged_run(x: TensorArg, dims: list[int], tensors: list[TensorArg]) -> tuple[int, list[int]] | None:
    """``dims`` (outermost first) as one dimension in every tensor: its size and each tensor's
    stride; None where a tensor's strides do not merge."""
    for outer, inner in zip(dims, dims[1:]):
        if any(t.stride[outer] != t.stride[inner] * x.shape[inner] for t in tensors):
            return None
    if not dims:
        return 1, [0] * len(tensors)
    return math.prod(x.shape[d] for d in dims), [t.stride[dims[-1]] for t in tensors]


def column_view(x: TensorArg, normalized: list[int], out: TensorArg,
                stats: TensorArg | None = None) -> Columns:
    """``x`` as columns to normalize over the dimensions ``normalized`` (merged in order, as eager
    flattens them), with ``out`` and ``stats`` (of x's shape, 1 over ``normalized``) addressed
    alike; Declined unless a kept dimension is packed and the rest merge into K1 and K2."""
    tensors = [x, out] + ([stats] if stats is not None else [])
    moving = [d for d in range(x.ndim) if x.shape[d] != 1]
    reduced = [d for d in normalized if x.shape[d] != 1]
    run = merged_run(x, reduced, [x, out])
    if not reduced or run is None:
        raise Declined(f"the normalized dimensions of the input do not merge (strides {x.stride})")
    r, (x_r, out_r) = run
    kept = [d for d in moving if d not in normalized]
    inner = sorted((d for d in kept if x.stride[d] < x_r), key=lambda d: -x.stride[d])
    outer = sorted((d for d in kept if x.stride[d] > x_r), key=lambda d: -x.stride[d])
    k2_run, k1_run = merged_run(x, inner, tensors), merged_run(x, outer, tensors)
    if (len(inner) + len(outer) != len(kept) or not inner or k2_run is None or k1_run is None
            or k2_run[1][0] != 1):
        raise Declined(f"the input is not contiguous along its normalized dimensions nor along a "
                       f"kept one (strides {x.stride})")
    (k2, k2_strides), (k1, k1_strides) = k2_run, k1_run
    if out_r != 1 and k2_strides[1] != 1:
        raise Declined("eager's output packs neither the normalized nor the kept dimension")
    if k1 > GRID_Y_LIMIT:
        raise Declined(f"{k1} outer slices exceed the grid")
    stats_strides = (k1_strides[2], k2_strides[2]) if stats is not None else (0, 0)
    return Columns(k1, r, k2, k1_strides[0], x_r, k1_strides[1], k2_strides[1], out_r, *stats_strides)


def tile_pitch(cols: int, itemsize: int) -> int:
    """Elements per row of a columns kernel's tile: ``cols`` and padding to an odd number of
    4-byte words, so that a column's elements fall in different shared-memory banks."""
    return next((p for p in range(cols + 1, cols + 9)
                 if (p * itemsize) % 4 == 0 and (p * itemsize // 4) % 2 == 1), cols + 1)


def column_space(c: Columns, x: TensorArg, out: TensorArg, gpu: GpuInfo) -> Space | None:
    """Columns per block x vector width along K2 x output vector along R x threads."""
    k1_strides = (c.x_k1, c.out_k1) if c.k1 > 1 else (1, 1)
    if c.out_r == 1:  # loads along K2, stores along R
        vecs = vec_options(x.itemsize, c.k2, c.x_r, k1_strides[0])
        out_vecs = vec_options(out.itemsize, c.r, c.out_k2, k1_strides[1])
    else:  # loads and stores along K2
        vecs = vec_options(max(x.itemsize, out.itemsize), c.k2, c.x_r, c.out_r, *k1_strides)
        out_vecs = (1,)
    axes = (Axis("cols", powers_of_two(1, 128)), Axis("vec", vecs), Axis("out_vec", out_vecs),
            Axis("block", powers_of_two(32, 1024)))

    def valid(p: Params) -> bool:
        cols, block = p["cols"], p["block"]
        tile = c.r * tile_pitch(cols, x.itemsize) * x.itemsize + 8 * cols
        return (cols % p["vec"] == 0 and block % cols == 0 and block // cols <= 32
                and cols <= max(pow2_ceil(c.k2), p["vec"]) and tile <= 4 * SHARED_FLOATS)

    vec = max(vecs)
    cols = 64
    while cols > vec and c.r * tile_pitch(cols, x.itemsize) * x.itemsize + 8 * cols > 4 * SHARED_FLOATS:
        cols //= 2
    while cols > max(8, vec) and ceil_div(c.k2, cols) * c.k1 < 2 * sm_count(gpu):
        cols //= 2  # fewer columns per block, more blocks, until every SM has two
    default = {"cols": cols, "vec": vec, "out_vec": max(out_vecs), "block": 256}
    return Space.build(axes, valid, default, {"cols": 8, "vec": 1, "out_vec": 1, "block": 128})


def render_columns(call: Call, name: str, x: TensorArg, out: TensorArg, affine: Affine | None,
                   c: Columns, params: Params, stats: tuple[str, ...], eps: float | str) -> Kernel:
    """A columns kernel (``norm_columns`` of kind ``name``) and its plan: the input, the weight
    and bias present, eager's outputs (``out``, then the float statistics ``stats``), ``eps``."""
    cols, vec, out_vec, block = params["cols"], params["vec"], params["out_vec"], params["block"]
    tw = affine.ctype(x) if affine is not None else "float"
    params_c = [f"const {x.ctype}* __restrict__ x", *(affine.c_params(tw) if affine else []),
                f"{out.ctype}* __restrict__ y", *(f"float* __restrict__ {s}" for s in stats),
                "float eps"]
    weight, bias = (affine.weight, affine.bias) if affine is not None else (None, None)
    weights = f"{'w' if weight else 'nullptr'}, {'b' if bias else 'nullptr'}"
    flags = f"{cuda_bool(weight is not None)}, {cuda_bool(bias is not None)}"
    stat_args = ", ".join([*stats, *["nullptr"] * (2 - len(stats))])
    access = max(vec, out_vec)
    source = entry_points(name, access, block, params_c, lambda v: (
        f"norm_columns<{COLUMN_KINDS[name]}, {x.ctype}, {out.ctype}, {tw}, {c.r}, {c.k2}, {c.x_k1}, "
        f"{c.x_r}, {c.out_k1}, {c.out_k2}, {c.out_r}, {c.stats_k1}, {c.stats_k2}, {cols}, "
        f"{tile_pitch(cols, x.itemsize)}, {vec}, {out_vec}, {block}, {flags}, {cuda_bool(v > 1)}>"
        f"(x, {weights}, y, {stat_args}, eps)"))
    outputs = ("out", *stats)
    plan = {"outputs": [new_output(n, t) for n, t in zip(outputs, call.outputs)],
            "launches": [launch(name, (ceil_div(c.k2, cols), c.k1), block,
                                [ptr(call.arg_name(0)), *(affine.pointers() if affine else []),
                                 *map(ptr, outputs), f32(eps)],
                                access, max(x.itemsize, out.itemsize))]}
    return Kernel(source, plan)


def columns_variant(c: Columns, x: TensorArg, out: TensorArg, gpu: GpuInfo) -> Variant:
    return Variant("columns", "columns of a transposed layout staged in shared memory with "
                              "coalesced loads, statistics there, outputs written in their own "
                              "layout (reference)", column_space(c, x, out, gpu))


@dataclass(frozen=True)
class SoftmaxProblem:
    call: Call
    x: TensorArg
    out: TensorArg
    rows: Rows | None
    columns: Columns | None = None


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
        if not out.is_contiguous:
            raise Declined("eager's output is not contiguous here")
        try:
            if any(n != 1 for n in x.shape[dim + 1:]):
                raise Declined(f"softmax over dimension {dim} of {x.describe()} is not over the "
                               "innermost")
            return SoftmaxProblem(call, x, out, row_view(x, x.ndim - dim))
        except Declined as not_rows:
            try:
                return SoftmaxProblem(call, x, out, None, column_view(x, [dim], out))
            except Declined as not_columns:
                raise Declined(f"{not_rows}; as columns: {not_columns}") from None

    def variants(self, problem: SoftmaxProblem, gpu: GpuInfo) -> list[Variant]:
        if problem.columns is not None:
            return [columns_variant(problem.columns, problem.x, problem.out, gpu)]
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
        if approach == "columns":
            return render_columns(problem.call, "softmax", problem.x, problem.out, None,
                                  problem.columns, params, (), 0.0)
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
    rows: Rows | None
    outputs: tuple[TensorArg, ...]  # y, then the statistics eager returns
    columns: Columns | None = None


def analyze_norm(call: Call, shape_index: int, weight_index: int, bias_index: int | None) -> NormProblem:
    x = call.float_tensor(0, "the input")
    normalized = list(call.value(shape_index))
    affine = Affine.read(call, weight_index, bias_index)
    y = call.outputs[0]
    if not y.is_contiguous or not all(s.is_contiguous and s.dtype == "float32" for s in call.outputs[1:]):
        raise Declined("eager's outputs are laid out differently than expected here")
    try:
        return NormProblem(call, x, affine, row_view(x, len(normalized)), call.outputs)
    except Declined as not_rows:
        dims = list(range(x.ndim - len(normalized), x.ndim))
        try:
            columns = column_view(x, dims, y, call.outputs[1])
        except Declined as not_columns:
            raise Declined(f"{not_rows}; as columns: {not_columns}") from None
        return NormProblem(call, x, affine, None, call.outputs, columns)


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
        if problem.columns is not None:
            return [columns_variant(problem.columns, problem.x, problem.outputs[0], gpu)]
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
        if approach == "columns":
            return render_columns(problem.call, "layer_norm", problem.x, problem.outputs[0],
                                  problem.affine, problem.columns, params, ("mean", "rstd"),
                                  problem.call.arg_name(4))
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
        if problem.columns is not None:
            return [columns_variant(problem.columns, problem.x, problem.outputs[0], gpu)]
        rows, vecs = problem.rows, norm_vecs(problem)
        return [
            resident_variant(rows, vecs, gpu, "registers",
                             "row held in registers: one read, sum of squares by shuffles"),
            Variant("loop", "sum of squares in one pass, a second read to scale (reference)",
                    row_space(rows, vecs, gpu, resident=False, unrolled=True)),
        ]

    def render(self, problem: NormProblem, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
        eps = FLOAT_EPSILON if problem.call.value(3) is None else problem.call.arg_name(3)
        if approach == "columns":
            return render_columns(problem.call, "rms_norm", problem.x, problem.outputs[0],
                                  problem.affine, problem.columns, params, ("rstd",), eps)
        return render_norm(problem, "rms_norm", approach, params, approach == "loop", ("rstd",), eps)
