"""Kernel families for region cards: one kernel computes a whole fusion region.

A region card is matched by its structure (``match.match_region``): the program it yields picks
the family. Regions without row reductions (gated activations, bias plus activation, rotary
embeddings, any chain of pointwise ops, views and ``cat``) run as ``region_flat`` kernels, one
launch per output; regions that reduce over the last dimension (RMS and layer norms, softmax)
run as ``region_rows_*`` kernels, one launch. The family's name says what the region computes
(``region_rms_norm``, ``region_rotary``, ...); kernels and parameters are shared by kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kforge.core.gpu import GpuInfo
from kforge.core.opcard import OpCard
from kforge.propose.library.cards import Declined
from kforge.propose.library.families.base import (
    Family,
    Kernel,
    Variant,
    cuda_bool,
    entry_points,
    launch,
    new_output,
    ptr,
    sm_count,
    vec_options,
)
from kforge.propose.library.families.elementwise import THREADS_PER_SM
from kforge.propose.library.families.rows import launch_geometry, row_space
from kforge.propose.library.layout import Rows
from kforge.propose.library.regions.match import match_region
from kforge.propose.library.regions.program import (
    Apply,
    Const,
    Expr,
    Leaf,
    Load,
    Program,
    Total,
    leaves,
    ops,
    walk,
)
from kforge.propose.library.regions.render import flat_struct, rows_struct
from kforge.propose.library.space import (
    Axis,
    Params,
    Space,
    ceil_div,
    pow2_ceil,
    powers_of_two,
)

CUDA_FILES = ("elementwise.cu", "rows.cu", "regions.cu")
# Values a thread of a flat kernel holds between its loads and its stores (per group: a vector
# per input read), and a rows kernel's thread keeps of its row, beyond which registers spill.
MAX_FLAT_VALUES = 64
MAX_ROW_VALUES = 64
ACTIVATIONS = ("aten.silu.default", "aten.gelu.default", "aten.relu.default",
               "aten.sigmoid.default", "aten.tanh.default")


@dataclass(frozen=True)
class RegionProblem:
    """A region card as its program, and the vector widths every access of it allows."""

    program: Program
    vecs: tuple[int, ...]

    @property
    def itemsize(self) -> int:
        return max([t.itemsize for t in self.program.inputs] +
                   [o.itemsize for o in self.program.outputs])


class RegionFamily(Family):
    """A family serving region cards of one kind, named for it (``region_rms_norm``): no op maps
    to it, ``analyze_region`` makes it for the card, and ``analyze`` takes the matched problem."""

    ops = ()
    cuda_files = CUDA_FILES

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.name = f"region_{kind}"  # type: ignore[misc]  # one name per kind, not per class

    def analyze(self, call: Any) -> RegionProblem:
        if not isinstance(call, RegionProblem):
            raise Declined(f"{self.name} serves region cards only")
        return call


class RegionFlat(RegionFamily):
    reference = "one_shot"

    def variants(self, problem: RegionProblem, gpu: GpuInfo) -> list[Variant]:
        program, vecs = problem.program, problem.vecs
        numel = max(o.numel for o in program.outputs)
        reads = max(len(leaves(*(p.expr for p in o.pieces))) for o in program.outputs)
        axes = (Axis("block", powers_of_two(64, 1024)), Axis("vec", vecs),
                Axis("unroll", (1, 2, 4, 8)))

        def valid(p: Params) -> bool:  # registers, and no block much larger than the work
            return (max(reads, 1) * p["vec"] * p["unroll"] <= MAX_FLAT_VALUES
                    and (p["block"] == 64 or p["block"] <= pow2_ceil(numel // p["vec"])))

        vec = max(vecs)
        waves = numel / vec / (sm_count(gpu) * THREADS_PER_SM)
        default = {"block": 256, "vec": vec, "unroll": 4 if waves >= 4 else 2 if waves >= 2 else 1}
        space = Space.build(axes, valid, default, {"block": 256, "vec": 1, "unroll": 1})
        return [
            Variant("one_shot", "each thread takes `unroll` groups of `vec` outputs once, as many "
                                "blocks as the data needs (reference)", space),
            Variant("grid_stride", "resident blocks (a full GPU's worth) loop over the data", space),
        ]

    def render(self, problem: RegionProblem, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
        program, vec, block = problem.program, params["vec"], params["block"]
        parts, launches = [], []
        for output in program.outputs:
            struct, ptrs = flat_struct(f"Flat{output.index}", program, output, vec)
            kernel = f"region_out{output.index}"
            args = f"Flat{output.index}::Args{{{', '.join(ptrs.names())}}}"
            parts.append(struct + "\n" + entry_points(
                kernel, vec, block, ptrs.c_params(),
                lambda v, i=output.index, args=args: (
                    f"region_flat<Flat{i}, {params['unroll']}, "
                    f"{cuda_bool(approach == 'grid_stride')}, {cuda_bool(v > 1)}>({args})")))
            blocks = ceil_div(output.numel // vec, block * params["unroll"])
            if approach == "grid_stride":
                blocks = min(blocks, sm_count(gpu) * (THREADS_PER_SM // block))
            launches.append(launch(kernel, blocks, block, [ptr(p) for p in ptrs.plan_names()],
                                   vec, problem.itemsize))
        return Kernel("\n".join(parts), {"outputs": plan_outputs(program), "launches": launches})


class RegionRows(RegionFamily):
    reference = "loop"

    def variants(self, problem: RegionProblem, gpu: GpuInfo) -> list[Variant]:
        program, vecs = problem.program, problem.vecs
        rows = Rows(program.rows, program.cols, program.cols)
        cached = len(leaves(*(s.expr for s in program.stages)))
        registers = row_space(rows, vecs, gpu, resident=True, unrolled=False)
        if registers is not None:
            base = registers

            def fits(p: Params) -> bool:
                held = ceil_div(rows.cols, p["threads_per_row"] * p["vec"]) * p["vec"] * cached
                return base.valid(p) and held <= MAX_ROW_VALUES
            registers = Space.build(base.axes, fits, base.default, base.safe)
        resident = (Variant("registers", "the row's values held in registers: one read, "
                                         "statistics by shuffles", registers) if registers else
                    Variant("registers", "", why_not=f"rows of {rows.cols} elements do not fit "
                                                     "in registers"))
        loop = row_space(rows, vecs, gpu, resident=False, unrolled=False)
        return [resident, Variant("loop", "one read of the row per reduction, then one to write "
                                          "(reference)", loop)]

    def render(self, problem: RegionProblem, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
        program, vec = problem.program, params["vec"]
        rows = Rows(program.rows, program.cols, program.cols)
        grid, block = launch_geometry(rows, params)
        struct, ptrs = rows_struct(program, vec)
        args = f"Rows::Args{{{', '.join(ptrs.names())}}}"
        source = struct + "\n" + entry_points(
            "region_rows", vec, block, ptrs.c_params(),
            lambda v: f"region_rows_{approach}<Rows, {params['threads_per_row']}, "
                      f"{params['rows_per_block']}, {cuda_bool(v > 1)}>({args})")
        plan = {"outputs": plan_outputs(program),
                "launches": [launch("region_rows", grid, block,
                                    [ptr(p) for p in ptrs.plan_names()], vec,
                                    problem.itemsize)]}
        return Kernel(source, plan)


def plan_outputs(program: Program) -> list[dict]:
    """New outputs with eager's layouts, in the region's order."""
    return [new_output(program.output_name(o.index), o.eager) for o in program.outputs]


def analyze_region(card: OpCard) -> tuple[RegionFamily, RegionProblem]:
    """The family and problem for a region card; Declined with the reason when none fits."""
    if card.region is None:
        raise Declined(f"{card.op} is not a region card")
    try:
        program = match_region(card.region, card.args)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise Declined(f"the region could not be read ({type(exc).__name__}: {exc})") from None
    if program.stages:
        if any(len(o.pieces) != 1 for o in program.outputs):
            raise Declined("an output of a row reduction is joined from pieces")
        if not leaves(*(s.expr for s in program.stages)):
            raise Declined("a row reduction reads no input")
        family: RegionFamily = RegionRows(rows_kind(program))
    else:
        family = RegionFlat(flat_kind(program))
    return family, RegionProblem(program, region_vecs(program))


def region_vecs(program: Program) -> tuple[int, ...]:
    """Vector widths every access allows: vectors stay inside the last dimension and inside one
    piece, and every vector access starts aligned where its tensor is aligned."""
    counts: list[int] = []
    itemsizes = [1]
    for output in program.outputs:
        counts.append(output.shape[-1])
        counts += [edge for p in output.pieces for edge in p.box[-1]]
        if output.stride[-1] == 1:
            itemsizes.append(output.itemsize)
            counts += list(output.stride[:-1])
    reads: list[Leaf] = leaves(*(s.expr for s in program.stages),
                               *(p.expr for o in program.outputs for p in o.pieces))
    for leaf in reads:
        if leaf.inner == 1:
            itemsizes.append(leaf.itemsize)
            counts += [*leaf.stride[:-1], leaf.offset]
    return vec_options(max(itemsizes), *(c for c in counts if c))


# ----- what a region computes, for names and notes -----


def rows_kind(program: Program) -> str:
    kinds = [s.kind for s in program.stages]
    if program.reduced == 2:
        return "group_norm"
    if kinds == ["max", "sum"]:
        return "softmax"
    if kinds == ["sum"] and is_square(program.stages[0].expr):
        return "rms_norm"
    if kinds == ["sum", "sum"] and Total(0) in set(walk(program.stages[1].expr)):
        return "layer_norm"
    return "rows"


def flat_kind(program: Program) -> str:
    if any(len(o.pieces) > 1 for o in program.outputs):
        return "rotary" if "aten.neg.default" in ops(program) else "cat"
    core = strip_casts(program.outputs[0].pieces[0].expr)
    if isinstance(core, Apply) and core.op == "aten.mul.Tensor" and len(program.outputs) == 1:
        sides = [has_activation(a) for a in core.args]
        if sides.count(True) == 1 and not isinstance(core.args[sides.index(False)], Const):
            return "gated_activation"
    if isinstance(core, Apply) and core.op in ACTIVATIONS:
        inner = strip_casts(core.args[0])
        if isinstance(inner, Apply) and inner.op == "aten.add.Tensor" and all(
                isinstance(strip_casts(a), Load) for a in inner.args):
            return "bias_activation"
    return "elementwise"


def strip_casts(expr: Expr) -> Expr:
    while isinstance(expr, Apply) and expr.op == "aten._to_copy.default":
        expr = expr.args[0]
    return expr


def has_activation(expr: Expr) -> bool:
    return any(isinstance(e, Apply) and e.op in ACTIVATIONS for e in walk(expr))


def is_square(expr: Expr) -> bool:
    expr = strip_casts(expr)
    if not isinstance(expr, Apply):
        return False
    if expr.op == "aten.pow.Tensor_Scalar":
        return expr.args[1] == Const(2.0)
    return expr.op == "aten.mul.Tensor" and expr.args[0] == expr.args[1]

