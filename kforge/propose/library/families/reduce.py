"""Reductions: sum and mean over dimensions (``aten.sum.dim_IntList``, ``aten.mean.dim``, which is
also how ResNet's global average pooling reaches the GPU; ``pool`` reuses these kernels for a 1x1
``aten._adaptive_avg_pool2d``).

The input is seen in memory order as [K1, R, K2]: R the reduced elements, K1 and K2 kept. Rows
(K2 == 1) are summed by groups of threads (``threads_per_row``, ``rows_per_block``, ``vec``,
``unroll``), or, when short and packed, staged whole through shared memory (``tile``); columns
(K2 > 1, such as channels-last pooling) by a block of ``tile_x`` x ``tile_y`` threads.
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge.core.gpu import GpuInfo
from kforge.propose.library.cards import Call, Declined, TensorArg, require_float
from kforge.propose.library.families.base import (
    SHARED_FLOATS,
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
from kforge.propose.library.families.rows import row_space
from kforge.propose.library.layout import Rows
from kforge.propose.library.space import (
    Axis,
    Params,
    Space,
    ceil_div,
    clamp,
    pow2_ceil,
    powers_of_two,
)

GRID_Y_LIMIT = 65535


@dataclass(frozen=True)
class Shape3:
    """The input as [K1, R, K2] in memory order, with strides, and the output's strides for K1
    and K2."""

    k1: int
    r: int
    k2: int
    k1_stride: int
    r_stride: int
    out_k1: int
    out_k2: int

    @property
    def rows(self) -> Rows:
        return Rows(self.k1, self.r, self.k1_stride)


@dataclass(frozen=True)
class ReduceProblem:
    call: Call
    x: TensorArg
    out: TensorArg
    mean: bool
    shape: Shape3

    @property
    def is_rows(self) -> bool:
        return self.shape.k2 == 1


@dataclass
class _Run:
    """Neighbouring dimensions (in memory order), all reduced or all kept, merged into one."""

    reduced: bool
    size: int
    stride: int  # the innermost dimension's
    out_stride: int  # the output's, for kept runs

    def takes(self, reduced: bool, size: int, stride: int, out_stride: int) -> bool:
        """Whether the next inner dimension merges into this run (for input and output alike)."""
        return (self.reduced == reduced and self.stride == stride * size
                and (reduced or self.out_stride == out_stride * size))


def reduce_shape(x: TensorArg, reduced: set[int], out: TensorArg, keepdim: bool) -> Shape3:
    """``x`` as [K1, R, K2] for a reduction over ``reduced``, or Declined."""
    runs: list[_Run] = []
    for d in sorted((d for d in range(x.ndim) if x.shape[d] != 1), key=lambda d: -x.stride[d]):
        is_reduced = d in reduced
        out_dim = d if keepdim else d - sum(1 for r in reduced if r < d)
        out_stride = 0 if is_reduced else out.stride[out_dim]
        if runs and runs[-1].takes(is_reduced, x.shape[d], x.stride[d], out_stride):
            runs[-1].size *= x.shape[d]
            runs[-1].stride, runs[-1].out_stride = x.stride[d], out_stride
        else:
            runs.append(_Run(is_reduced, x.shape[d], x.stride[d], out_stride))
    pattern = "".join("R" if run.reduced else "K" for run in runs)
    if "R" not in pattern:
        raise Declined("no dimension of more than one element is reduced")
    if pattern not in ("R", "KR", "RK", "KRK"):
        raise Declined(f"the reduced dimensions interleave with kept ones in memory (strides {x.stride})")
    r = runs[pattern.index("R")]
    k1 = runs[0] if pattern[0] == "K" else _Run(False, 1, r.size * r.stride, 0)
    k2 = runs[-1] if pattern[-1] == "K" else _Run(False, 1, 1, 0)
    if k2.stride != 1 or (k2.size == 1 and r.stride != 1):
        raise Declined(f"the input's innermost elements are not packed (strides {x.stride})")
    return Shape3(k1.size, r.size, k2.size, k1.stride, r.stride, k1.out_stride, k2.out_stride)


def reduce_variants(problem: ReduceProblem, gpu: GpuInfo) -> list[Variant]:
    s, itemsize = problem.shape, problem.x.itemsize
    if problem.is_rows:
        rows = s.rows
        looped = Variant("rows", "threads of a row sum it with vector loads (reference)",
                         row_space(rows, vec_options(itemsize, rows.cols, rows.stride), gpu,
                                   resident=False, unrolled=True))
        tile = tile_space(s, itemsize) if rows.stride == rows.cols and rows.cols <= 1024 else None
        if tile is None:
            return [looped, Variant("tile", "", why_not="rows are not short and packed")]
        tiled = Variant("tile", "whole rows staged through shared memory with full-width loads, "
                                "summed there", tile)
        # Rows whose length is no multiple of a vector cannot use vector loads on their own.
        return [tiled, looped] if rows.cols % 8 else [looped, tiled]
    if s.k1 > GRID_Y_LIMIT:
        return [Variant("columns", "", why_not=f"{s.k1} outer slices exceed the grid")]
    return [Variant("columns", "threads along the kept packed dimension, vector loads, partial sums "
                               "over the reduced one meet in shared memory (reference)",
                    columns_space(s, itemsize, gpu))]


def tile_space(s: Shape3, itemsize: int) -> Space | None:
    cols = s.r
    axes = (Axis("threads_per_row", powers_of_two(1, 32)), Axis("rows_per_block", powers_of_two(1, 512)),
            Axis("vec", vec_options(itemsize)))

    def valid(p: Params) -> bool:
        tpr, rpb = p["threads_per_row"], p["rows_per_block"]
        return (32 <= tpr * rpb <= 1024 and tpr <= pow2_ceil(cols) and rpb * cols <= SHARED_FLOATS
                and (rpb * cols) % p["vec"] == 0)

    tpr = clamp(pow2_ceil(ceil_div(cols, 4)), 1, 32)
    default = {"threads_per_row": tpr, "rows_per_block": clamp(256 // tpr, 1, 512), "vec": 16 // itemsize}
    return Space.build(axes, valid, default, {"threads_per_row": tpr, "rows_per_block": 128 // tpr, "vec": 1})


def columns_space(s: Shape3, itemsize: int, gpu: GpuInfo) -> Space | None:
    vecs = vec_options(itemsize, s.k2, s.r_stride, s.k1_stride if s.k1 > 1 else s.k2)
    axes = (Axis("tile_x", powers_of_two(1, 1024)), Axis("tile_y", powers_of_two(1, 1024)), Axis("vec", vecs))

    def valid(p: Params) -> bool:
        tx, ty, vec = p["tile_x"], p["tile_y"], p["vec"]
        return (32 <= tx * ty <= 1024 and tx <= pow2_ceil(ceil_div(s.k2, vec))
                and ty <= pow2_ceil(s.r) and tx * ty * vec <= SHARED_FLOATS)

    vec = max(vecs)
    tx = clamp(pow2_ceil(ceil_div(s.k2, vec)), 1, 64)
    while tx > 8 and ceil_div(s.k2, tx * vec) * s.k1 < 2 * sm_count(gpu):
        tx //= 2  # narrower blocks, more of them, until every SM has two
    default = {"tile_x": tx, "tile_y": clamp(256 // tx, 1, pow2_ceil(s.r)), "vec": vec}
    return Space.build(axes, valid, default, {"tile_x": 32, "tile_y": 4, "vec": 1})


def render_reduce(problem: ReduceProblem, approach: str, params: Params) -> Kernel:
    x, out, s = problem.x, problem.out, problem.shape
    head = [f"const {x.ctype}* __restrict__ x", f"{out.ctype}* __restrict__ y"]
    pointers = [ptr(problem.call.arg_name(0)), ptr("out")]
    if approach == "columns":
        block = params["tile_x"] * params["tile_y"]
        grid = (ceil_div(s.k2, params["tile_x"] * params["vec"]), s.k1)
        source = entry_points("reduce", params["vec"], block, [*head, "float scale"], lambda vec: (
            f"reduce_columns<{x.ctype}, {out.ctype}, {s.k2}, {s.r}, {s.k1_stride}, {s.r_stride}, "
            f"{s.out_k1}, {s.out_k2}, {params['tile_x']}, {params['tile_y']}, {params['vec']}, "
            f"{cuda_bool(vec > 1)}>(x, y, scale)"))
        kernel_params = [*pointers, f32(scale(problem))]
    else:
        rows = s.rows
        block = params["threads_per_row"] * params["rows_per_block"]
        grid = (ceil_div(rows.rows, params["rows_per_block"]),)

        def body(vec: int) -> str:
            if approach == "tile":
                return (f"reduce_rows_tile<{x.ctype}, {out.ctype}, {rows.cols}, {s.out_k1}, "
                        f"{params['threads_per_row']}, {params['rows_per_block']}, {vec}>")
            return (f"reduce_rows<{x.ctype}, {out.ctype}, {rows.cols}, {rows.stride}, {s.out_k1}, "
                    f"{params['threads_per_row']}, {params['rows_per_block']}, {vec}, "
                    f"{params['unroll']}>")

        source = entry_points("reduce", params["vec"], block, [*head, "int64_t rows", "float scale"],
                              lambda vec: f"{body(vec)}(x, y, rows, scale)")
        kernel_params = [*pointers, i64(rows.rows), f32(scale(problem))]
    plan = {"outputs": [new_output("out", out)],
            "launches": [launch("reduce", grid, block, kernel_params, params["vec"], x.itemsize)]}
    return Kernel(source, plan)


def scale(problem: ReduceProblem) -> float:
    return 1.0 / problem.shape.r if problem.mean else 1.0


class Reduction(Family):
    name = "reduce"
    ops = ("aten.sum.dim_IntList", "aten.mean.dim")
    cuda_files = ("reduce.cu",)
    reference = "rows"

    def analyze(self, call: Call) -> ReduceProblem:
        x, out = call.float_tensor(0, "the input"), call.outputs[0]
        require_float(out)
        dims = call.value(1)
        reduced = set(range(x.ndim)) if not dims else {d % max(x.ndim, 1) for d in dims}
        shape = reduce_shape(x, reduced, out, bool(call.value(2)))
        return ReduceProblem(call, x, out, call.op == "aten.mean.dim", shape)

    def variants(self, problem: ReduceProblem, gpu: GpuInfo) -> list[Variant]:
        return reduce_variants(problem, gpu)

    def render(self, problem: ReduceProblem, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
        return render_reduce(problem, approach, params)
