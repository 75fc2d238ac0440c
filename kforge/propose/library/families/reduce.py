"""Reductions over any dimensions: ``aten.sum`` and ``aten.mean`` (over dims, or all), which is
also how ResNet's global average pooling reaches the GPU (``pool`` reuses these kernels for a 1x1
``aten._adaptive_avg_pool2d``), and ``aten.amax`` / ``aten.amin`` (NaN propagates, as in eager).

Where memory allows, the input is seen in memory order as [K1, R, K2]: R the reduced elements, K1
and K2 kept. Rows (K2 == 1) are reduced by groups of threads (``threads_per_row``,
``rows_per_block``, ``vec``, ``unroll``), when short and packed staged whole through shared memory
(``tile``), and when few and long split over ``splits`` blocks each; columns (K2 > 1, such as
channels-last pooling) by a block of ``tile_x`` x ``tile_y`` threads. Any other layout (reduced
dimensions between kept ones, outputs in another order than the input's) takes the ``general``
kernel: ``threads_per_row`` threads per output, offsets by index arithmetic.
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
from kforge.propose.library.layout import (
    Iteration,
    Rows,
    index_type,
    iteration,
    max_offset,
    offsets_code,
)
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
# The C++ combination of each reduction, and per op: (combination, divide by R, whether the op
# takes dim and keepdim as arguments 1 and 2; without, it reduces every dimension).
COMBINES = {"sum": "kf::ReduceSum", "max": "kf::ReduceMax", "min": "kf::ReduceMin"}
REDUCTIONS = {
    "aten.sum.dim_IntList": ("sum", False, True),
    "aten.mean.dim": ("sum", True, True),
    "aten.sum.default": ("sum", False, False),
    "aten.mean.default": ("sum", True, False),
    "aten.amax.default": ("max", False, True),
    "aten.amin.default": ("min", False, True),
}
MAX_SPLITS = 256


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
class General:
    """Any reduction's layout: the kept dimensions as a loop nest in the input's memory order
    (strides of the input, then of the output), the reduced ones as another (input strides), and
    whether the input's innermost moving dimension is a reduced one."""

    kept: Iteration
    reduced: Iteration
    inner_reduced: bool

    @property
    def outputs(self) -> int:
        return self.kept.numel

    @property
    def r(self) -> int:
        return self.reduced.numel


@dataclass(frozen=True)
class ReduceProblem:
    call: Call
    x: TensorArg
    out: TensorArg
    mean: bool
    shape: Shape3 | None  # None where the layout is not [K1, R, K2]: the general kernel only
    general: General
    combine: str = "sum"
    why_not_shape: str = ""

    @property
    def is_rows(self) -> bool:
        return self.shape is not None and self.shape.k2 == 1

    @property
    def r(self) -> int:
        return self.general.r


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


def out_dim(d: int, reduced: set[int], keepdim: bool) -> int:
    """The output dimension of the input's kept dimension ``d``."""
    return d if keepdim else d - sum(1 for r in reduced if r < d)


def reduce_shape(x: TensorArg, reduced: set[int], out: TensorArg, keepdim: bool) -> Shape3:
    """``x`` as [K1, R, K2] for a reduction over ``reduced``, or Declined."""
    runs: list[_Run] = []
    for d in sorted((d for d in range(x.ndim) if x.shape[d] != 1), key=lambda d: -x.stride[d]):
        is_reduced = d in reduced
        out_stride = 0 if is_reduced else out.stride[out_dim(d, reduced, keepdim)]
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


def general_layout(x: TensorArg, reduced: set[int], out: TensorArg, keepdim: bool) -> General:
    kept = [d for d in range(x.ndim) if d not in reduced]
    dims = sorted(reduced)
    moving = [d for d in range(x.ndim) if x.shape[d] != 1]
    inner = min(moving, key=lambda d: x.stride[d], default=None)
    return General(
        iteration(tuple(x.shape[d] for d in kept),
                  [tuple(x.stride[d] for d in kept),
                   tuple(out.stride[out_dim(d, reduced, keepdim)] for d in kept)]),
        iteration(tuple(x.shape[d] for d in dims), [tuple(x.stride[d] for d in dims)]),
        inner in reduced)


def reduce_problem(call: Call, x: TensorArg, out: TensorArg, reduced: set[int], keepdim: bool,
                   mean: bool, combine: str = "sum") -> ReduceProblem:
    """A reduction of ``x`` over the dimensions ``reduced`` into eager's ``out``."""
    try:
        shape, why_not = reduce_shape(x, reduced, out, keepdim), ""
    except Declined as exc:
        shape, why_not = None, str(exc)
    return ReduceProblem(call, x, out, mean, shape, general_layout(x, reduced, out, keepdim),
                         combine, why_not)


def reduce_variants(problem: ReduceProblem, gpu: GpuInfo) -> list[Variant]:
    general = Variant("general", "threads of an output walk its reduced elements by index "
                                 "arithmetic: any layout", general_space(problem.general, gpu))
    s, itemsize = problem.shape, problem.x.itemsize
    if s is None:
        return [general]
    if problem.is_rows:
        rows = s.rows
        vecs = vec_options(itemsize, rows.cols, rows.stride)
        looped = Variant("rows", "threads of a row reduce it with vector loads (reference)",
                         row_space(rows, vecs, gpu, resident=False, unrolled=True))
        split = split_space(rows, vecs, gpu)
        split_variant = (Variant("split", "several blocks per row each reduce a slice, a second "
                                          "kernel combines the slices", split) if split else
                         Variant("split", "", why_not=f"rows of {rows.cols} are too short to split"))
        tile = tile_space(s, itemsize) if rows.stride == rows.cols and rows.cols <= 1024 else None
        tiled = (Variant("tile", "whole rows staged through shared memory with full-width loads, "
                                 "reduced there", tile) if tile else
                 Variant("tile", "", why_not="rows are not short and packed"))
        # Rows whose length is no multiple of a vector cannot use vector loads on their own.
        ordered = [tiled, looped] if rows.cols % 8 else [looped, tiled]
        few = rows.rows < sm_count(gpu)
        return ([split_variant] + ordered if few else ordered + [split_variant]) + [general]
    if s.k1 > GRID_Y_LIMIT:
        return [Variant("columns", "", why_not=f"{s.k1} outer slices exceed the grid"), general]
    return [Variant("columns", "threads along the kept packed dimension, vector loads, partial "
                               "results over the reduced one meet in shared memory (reference)",
                    columns_space(s, itemsize, gpu)), general]


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


def split_space(rows: Rows, vecs: tuple[int, ...], gpu: GpuInfo) -> Space | None:
    axes = (Axis("block", powers_of_two(128, 1024)), Axis("vec", vecs), Axis("unroll", (1, 2, 4)),
            Axis("splits", powers_of_two(2, MAX_SPLITS)))

    def valid(p: Params) -> bool:  # every block has a vector per thread at least
        return ceil_div(rows.cols, p["splits"]) >= p["block"] * p["vec"]

    splits = clamp(pow2_ceil(ceil_div(4 * sm_count(gpu), rows.rows)), 2, MAX_SPLITS)
    return Space.build(axes, valid, {"block": 512, "vec": max(vecs), "unroll": 2, "splits": splits},
                       {"block": 256, "vec": 1, "unroll": 1, "splits": 2})


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


def general_space(g: General, gpu: GpuInfo) -> Space | None:
    axes = (Axis("threads_per_row", powers_of_two(1, 1024)),
            Axis("rows_per_block", powers_of_two(1, 1024)), Axis("unroll", (1, 2, 4, 8)))

    def valid(p: Params) -> bool:
        tpr, rpb = p["threads_per_row"], p["rows_per_block"]
        block = tpr * rpb
        return (32 <= block <= 1024 and tpr <= pow2_ceil(g.r)
                and (block == 32 or rpb <= pow2_ceil(g.outputs))
                and (p["unroll"] == 1 or tpr * p["unroll"] <= g.r))

    # Consecutive threads read consecutive elements: along the reduced dimension when it is the
    # innermost, else one thread per output, neighbouring outputs side by side.
    tpr = clamp(pow2_ceil(ceil_div(g.r, 4)), 1, 256) if g.inner_reduced else 1
    rpb = clamp(256 // tpr, 1, 1024)
    while rpb > 1 and ceil_div(g.outputs, rpb) < 2 * sm_count(gpu) and tpr * rpb > 32:
        rpb //= 2
    unroll = 4 if g.r >= 4 * tpr else 1
    # The safe point keeps each thread's sequential sum short (about 64 elements, up to 1024
    # threads an output): a thread adding thousands of fp32 values one after another drifts below
    # eager's precision on a whole-tensor sum.
    safe_tpr = clamp(pow2_ceil(ceil_div(g.r, 64)), 1, 1024)
    safe = {"threads_per_row": safe_tpr, "rows_per_block": max(1, 32 // safe_tpr), "unroll": 1}
    if not g.inner_reduced and safe_tpr == 1:
        safe["rows_per_block"] = 128  # one thread an output, neighbouring outputs side by side
    return Space.build(axes, valid, {"threads_per_row": tpr, "rows_per_block": rpb, "unroll": unroll},
                       safe)


def general_geometry(g: General, x: TensorArg, out: TensorArg) -> str:
    """The ``Geometry`` of ``reduce_general``: output and reduced-index counts, the input's base
    offset and the output's offset of an output index, the input offset of a reduced index."""
    index = index_type(x.numel, max_offset(x), max_offset(out), g.outputs, g.r)
    kept = offsets_code(g.kept, ["x_base", "y_off"], "Index")
    reduced = offsets_code(g.reduced, ["Index r_off"], "Index")
    return ("struct Geometry {\n"
            f"  using Index = {index};\n"
            f"  static constexpr Index OUTPUTS = {g.outputs}, R = {g.r};\n"
            "  static __device__ __forceinline__ void kept(Index e, Index& x_base, Index& y_off) {\n"
            + "".join(f"    {line}\n" for line in kept.splitlines())
            + "  }\n"
            "  static __device__ __forceinline__ Index reduced(Index e) {\n"
            + "".join(f"    {line}\n" for line in reduced.splitlines())
            + "    return r_off;\n  }\n};\n")


def render_reduce(problem: ReduceProblem, approach: str, params: Params) -> Kernel:
    x, out, s = problem.x, problem.out, problem.shape
    op = COMBINES[problem.combine]
    head = [f"const {x.ctype}* __restrict__ x", f"{out.ctype}* __restrict__ y"]
    pointers = [ptr(problem.call.arg_name(0)), ptr("out")]
    plan: dict = {"outputs": [new_output("out", out)]}
    if approach == "general":
        g = problem.general
        block = params["threads_per_row"] * params["rows_per_block"]
        source = general_geometry(g, x, out) + "\n" + entry_points(
            "reduce", 1, block, [*head, "float scale"], lambda vec: (
                f"reduce_general<{op}, Geometry, {x.ctype}, {out.ctype}, {params['threads_per_row']}, "
                f"{params['rows_per_block']}, {params['unroll']}>(x, y, scale)"))
        plan["launches"] = [launch("reduce", ceil_div(g.outputs, params["rows_per_block"]), block,
                                   [*pointers, f32(scale(problem))])]
        return Kernel(source, plan)
    assert s is not None
    if approach == "columns":
        block = params["tile_x"] * params["tile_y"]
        grid = (ceil_div(s.k2, params["tile_x"] * params["vec"]), s.k1)
        source = entry_points("reduce", params["vec"], block, [*head, "float scale"], lambda vec: (
            f"reduce_columns<{op}, {x.ctype}, {out.ctype}, {s.k2}, {s.r}, {s.k1_stride}, "
            f"{s.r_stride}, {s.out_k1}, {s.out_k2}, {params['tile_x']}, {params['tile_y']}, "
            f"{params['vec']}, {cuda_bool(vec > 1)}>(x, y, scale)"))
        plan["launches"] = [launch("reduce", grid, block, [*pointers, f32(scale(problem))],
                                   params["vec"], x.itemsize)]
        return Kernel(source, plan)
    rows = s.rows
    if approach == "split":
        return render_split(problem, rows, params)
    block = params["threads_per_row"] * params["rows_per_block"]
    grid = (ceil_div(rows.rows, params["rows_per_block"]),)

    def body(vec: int) -> str:
        if approach == "tile":
            return (f"reduce_rows_tile<{op}, {x.ctype}, {out.ctype}, {rows.cols}, {s.out_k1}, "
                    f"{params['threads_per_row']}, {params['rows_per_block']}, {vec}>")
        return (f"reduce_rows<{op}, {x.ctype}, {out.ctype}, {rows.cols}, {rows.stride}, {s.out_k1}, "
                f"{params['threads_per_row']}, {params['rows_per_block']}, {vec}, "
                f"{params['unroll']}>")

    source = entry_points("reduce", params["vec"], block, [*head, "int64_t rows", "float scale"],
                          lambda vec: f"{body(vec)}(x, y, rows, scale)")
    plan["launches"] = [launch("reduce", grid, block, [*pointers, i64(rows.rows), f32(scale(problem))],
                               params["vec"], x.itemsize)]
    return Kernel(source, plan)


def render_split(problem: ReduceProblem, rows: Rows, params: Params) -> Kernel:
    """Two launches: ``splits`` blocks per row reduce slices into ``parts`` (float), then rows of
    ``splits`` parts are combined as a row reduction of their own."""
    x, out, s = problem.x, problem.out, problem.shape
    assert s is not None
    op = COMBINES[problem.combine]
    block, vec, splits = params["block"], params["vec"], params["splits"]
    source = entry_points(
        "reduce_split", vec, block, [f"const {x.ctype}* __restrict__ x", "float* __restrict__ parts"],
        lambda v: f"reduce_rows_split<{op}, {x.ctype}, {rows.cols}, {rows.stride}, {splits}, {block}, "
                  f"{v}, {params['unroll']}>(x, parts)")
    finish_tpr = min(splits, 32)
    finish_rpb = max(1, 128 // finish_tpr)
    source += "\n" + entry_points(
        "reduce_finish", 1, finish_tpr * finish_rpb,
        ["const float* __restrict__ parts", f"{out.ctype}* __restrict__ y", "int64_t rows", "float scale"],
        lambda v: f"reduce_rows<{op}, float, {out.ctype}, {splits}, {splits}, {s.out_k1}, {finish_tpr}, "
                  f"{finish_rpb}, 1, 1>(parts, y, rows, scale)")
    plan = {"outputs": [new_output("out", out)],
            "scratch": [{"name": "parts", "bytes": rows.rows * splits * 4}],
            "launches": [
                launch("reduce_split", rows.rows * splits, block,
                       [ptr(problem.call.arg_name(0)), ptr("parts")], vec, x.itemsize),
                launch("reduce_finish", ceil_div(rows.rows, finish_rpb), finish_tpr * finish_rpb,
                       [ptr("parts"), ptr("out"), i64(rows.rows), f32(scale(problem))])]}
    return Kernel(source, plan)


def scale(problem: ReduceProblem) -> float:
    return 1.0 / problem.r if problem.mean else 1.0


class Reduction(Family):
    name = "reduce"
    ops = tuple(REDUCTIONS)
    cuda_files = ("reduce.cu",)
    reference = "general"

    def analyze(self, call: Call) -> ReduceProblem:
        x, out = call.float_tensor(0, "the input"), call.outputs[0]
        require_float(out)
        combine, mean, takes_dims = REDUCTIONS[call.op]
        dims = call.value(1) if takes_dims else None
        keepdim = bool(call.value(2)) if takes_dims else False
        reduced = set(range(x.ndim)) if not dims else {d % max(x.ndim, 1) for d in dims}
        return reduce_problem(call, x, out, reduced, keepdim, mean, combine)

    def variants(self, problem: ReduceProblem, gpu: GpuInfo) -> list[Variant]:
        return reduce_variants(problem, gpu)

    def render(self, problem: ReduceProblem, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
        return render_reduce(problem, approach, params)
