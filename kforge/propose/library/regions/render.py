"""CUDA for a program (``kforge.propose.library.regions.program``): the generated structs the
drivers in ``cuda/regions.cu`` run.

A program without stages gets one ``Flat`` struct per output: a group of VEC consecutive outputs
along the last dimension is one unit of work; ``load`` finds its coordinates, its piece, and
reads that piece's inputs, ``store`` computes and writes it. A program with stages gets one
``Rows`` struct: per row, the inputs the stages read are loaded (``load``), each stage reduces a
``partial`` per vector, ``finish`` turns a stage's total into the row's statistics, and ``store``
writes the outputs.

Expressions become one ``const float`` per op, in float, rounded through the op's storage type
where it has one (``kf::round_through``), so that results round where eager's do.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from kforge.propose.library.cards import FLOAT_CTYPES, contiguous_strides
from kforge.propose.library.layout import INT32_LIMIT, coords_code, linear_code
from kforge.propose.library.regions.match import POINTWISE
from kforge.propose.library.regions.program import (
    Apply,
    Const,
    Expr,
    Leaf,
    Load,
    Output,
    Program,
    Total,
    is_row_level,
    leaves,
    stages_used,
    walk,
)


def literal(value: float) -> str:
    """``value`` as the float eager computes with: rounded to float32, written exactly."""
    if math.isnan(value):
        return "NAN"
    try:
        single = struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        single = math.copysign(math.inf, value)
    if math.isinf(single):
        return "INFINITY" if single > 0 else "-INFINITY"
    if single == int(single) and abs(single) < 2**24:
        return f"{'-' if math.copysign(1.0, single) < 0 and not single else ''}{int(single)}.f"
    mantissa, exponent = single.hex().split("p")
    return f"{mantissa.rstrip('0').rstrip('.')}p{exponent}f"


class Emitter:
    """Statements that compute expressions, one ``const float`` per op. ``bound`` names the
    expressions that are variables already (loaded values, statistics)."""

    def __init__(self, bound: dict[Expr, str], prefix: str = "t") -> None:
        self.names = dict(bound)
        self.lines: list[str] = []
        self.prefix = prefix

    def term(self, expr: Expr) -> str:
        if expr in self.names:
            return self.names[expr]
        if isinstance(expr, Const):
            return literal(expr.value)
        if not isinstance(expr, Apply):
            raise KeyError(f"{expr} is read before it is loaded")
        args = [self.term(a) for a in expr.args]
        values = [a.value if isinstance(a, Const) else None for a in expr.args]
        named = {k: v if isinstance(v, str) else literal(v) for k, v in expr.named}
        code = POINTWISE[expr.op].expr(args, values, named)
        if expr.rounded:
            code = f"kf::round_through<{FLOAT_CTYPES[expr.dtype]}>({code})"
        name = f"{self.prefix}{len(self.lines)}"
        self.lines.append(f"const float {name} = {code};")
        self.names[expr] = name
        return name

    def block(self, indent: str) -> str:
        return "".join(f"{indent}{line}\n" for line in self.lines)


def index_type(*extents: int) -> str:
    return "int32_t" if max(extents, default=0) < INT32_LIMIT else "int64_t"


def extent(shape: tuple[int, ...], stride: tuple[int, ...], offset: int = 0) -> int:
    """The largest element offset a strided access reaches, in absolute value, plus one."""
    reach = sum((n - 1) * abs(s) for n, s in zip(shape, stride))
    return abs(offset) + reach + 1


def offset_code(offset: int, coords: list[str], stride: tuple[int, ...]) -> str:
    moving = linear_code(coords, stride)
    if offset == 0:
        return moving
    return str(offset) if moving == "0" else f"{offset} + {moving}"


@dataclass(frozen=True)
class Pointers:
    """The kernel's pointer parameters: the inputs read and the outputs written."""

    inputs: tuple[int, ...]
    outputs: tuple[Output, ...]
    program: Program

    def c_params(self) -> list[str]:
        return ([f"const {FLOAT_CTYPES[self.program.inputs[i].dtype]}* __restrict__ x{i}"
                 for i in self.inputs]
                + [f"{FLOAT_CTYPES[o.dtype]}* __restrict__ out{o.index}" for o in self.outputs])

    def fields(self) -> str:
        return "".join(f"    {p.replace(' __restrict__', '')};\n" for p in self.c_params())

    def names(self) -> list[str]:
        """The kernel's parameter names, in order."""
        return [f"x{i}" for i in self.inputs] + [f"out{o.index}" for o in self.outputs]

    def plan_names(self) -> list[str]:
        """The same pointers as the launch plan names them."""
        return ([f"x{i}" for i in self.inputs]
                + [self.program.output_name(o.index) for o in self.outputs])


def pointers(program: Program, outputs: tuple[Output, ...], read: list[Leaf]) -> Pointers:
    return Pointers(tuple(sorted({leaf.input for leaf in read})), outputs, program)


# ----- programs without stages -----


def flat_struct(name: str, program: Program, output: Output, vec: int) -> tuple[str, Pointers]:
    """The struct ``region_flat`` runs for one output, and the pointers its kernel takes."""
    read = leaves(*(p.expr for p in output.pieces))
    slot = {leaf: i for i, leaf in enumerate(read)}
    ptrs = pointers(program, (output,), read)
    shape = output.shape
    index = index_type(output.numel, extent(shape, output.stride),
                       *(extent(shape, leaf.stride, leaf.offset) for leaf in read))
    coords_text, coords = coords_code(shape, contiguous_strides(shape), "Index")
    load, store = [], []
    for number, piece in enumerate(output.pieces):
        conditions = [f"{coords[d]} >= {lo}" for d, (lo, _) in enumerate(piece.box) if lo > 0]
        conditions += [f"{coords[d]} < {hi}" for d, (_, hi) in enumerate(piece.box)
                       if hi < shape[d]]
        test = " && ".join(conditions)
        gathers = "".join(
            f"      gather<{leaf.inner}, VEC, PACKED>(a.x{leaf.input}, "
            f"{offset_code(leaf.offset, coords, leaf.stride)}, r.v[{slot[leaf]}]);\n"
            for leaf in leaves(piece.expr))
        last = number == len(output.pieces) - 1  # the pieces cover the output
        load.append(("" if last else f"if ({test}) ")
                    + f"{{\n      r.piece = {number};\n{gathers}    }}")
        emitter = Emitter({Load(leaf): f"r.v[{slot[leaf]}][k]" for leaf in read})
        result = emitter.term(piece.expr)
        store.append(("" if last else f"if (r.piece == {number}) ")
                     + "{\n#pragma unroll\n"
                     f"      for (int k = 0; k < VEC; ++k) {{\n{emitter.block('        ')}"
                     f"        o[k] = {result};\n      }}\n    }}")
    source = (
        f"struct {name} {{\n"
        f"  using Index = {index};\n"
        f"  static constexpr int VEC = {vec};\n"
        f"  static constexpr Index GROUPS = {output.numel // vec};\n"
        f"  struct Args {{\n{ptrs.fields()}  }};\n"
        f"  struct Regs {{\n    float v[{max(len(read), 1)}][VEC];\n    Index out;\n"
        "    int piece;\n  };\n"
        "  template <bool PACKED>\n"
        "  static __device__ __forceinline__ void load(const Args& a, Index g, Regs& r) {\n"
        "    Index e = g * VEC;\n"
        + "".join(f"    {line}\n" for line in coords_text.splitlines())
        + f"    r.out = {offset_code(0, coords, output.stride)};\n"
        f"    {' else '.join(load)}\n  }}\n"
        "  template <bool PACKED>\n"
        "  static __device__ __forceinline__ void store(const Args& a, const Regs& r) {\n"
        "    float o[VEC];\n"
        f"    {' else '.join(store)}\n"
        f"    scatter<{output.stride[-1]}, VEC, PACKED>(a.out{output.index}, r.out, o);\n"
        "  }\n};\n")
    return source, ptrs


# ----- programs with stages -----


def stats_of(program: Program) -> dict[Expr, int]:
    """The row statistics a rows kernel keeps: every stage's total, then each row-level
    expression an element-level one uses or an output returns, numbered in order."""
    found: dict[Expr, int] = {Total(s): s for s in range(len(program.stages))}

    def keep(expr: Expr) -> None:
        if is_row_level(expr) and stages_used(expr) and expr not in found:
            found[expr] = len(found)

    exprs = [s.expr for s in program.stages] + [p.expr for o in program.outputs for p in o.pieces]
    for expr in exprs:
        for e in walk(expr):
            if isinstance(e, Apply) and not is_row_level(e):
                for arg in e.args:
                    keep(arg)
    for output in program.outputs:
        if program.per_row(output):
            keep(output.pieces[0].expr)
    return found


def ready_stage(expr: Expr) -> int:
    """The last stage whose total ``expr`` needs."""
    return max(stages_used(expr))


def column_code(program: Program, accesses: list[tuple[str, tuple[int, ...]]]) -> tuple[str, list[str]]:
    """C++ that splits column ``c`` of a row into the coordinates of the dimensions a row spans,
    and each access's offset there (``accesses``: its row base and strides over those dims)."""
    span = program.shape[-program.reduced:]
    text, coords = coords_code(span, contiguous_strides(span), "Index")
    text = "Index e = c;\n" + text
    return text, [f"{base} + {linear_code(coords, stride)}" for base, stride in accesses]


def rows_struct(program: Program, vec: int) -> tuple[str, Pointers]:
    """The struct ``region_rows_*`` run, and the pointers its kernels take."""
    shape, rows, cols, reduced = program.shape, program.rows, program.cols, program.reduced
    cached = leaves(*(s.expr for s in program.stages))
    others = [leaf for leaf in leaves(*(p.expr for o in program.outputs for p in o.pieces))
              if leaf not in cached]
    all_leaves = cached + others
    ptrs = pointers(program, program.outputs, all_leaves)
    stats = stats_of(program)
    whole = [o for o in program.outputs if not program.per_row(o)]
    once = [o for o in program.outputs if program.per_row(o)]
    index = index_type(rows, *(extent(shape, o.stride) for o in program.outputs),
                       *(extent(shape, leaf.stride, leaf.offset) for leaf in all_leaves))
    lead = shape[:-reduced]
    coords_text, coords = coords_code(lead, contiguous_strides(lead), "Index")
    bases = [f"b.l{i} = {offset_code(leaf.offset, coords, leaf.stride[:-reduced])};"
             for i, leaf in enumerate(all_leaves)]
    bases += [f"b.o{o.index} = {offset_code(0, coords, o.stride[:-reduced])};"
              for o in program.outputs]
    fields = [f"l{i}" for i in range(len(all_leaves))] + [f"o{o.index}" for o in program.outputs]
    load_cols, load_at = column_code(program, [(f"b.l{i}", leaf.stride[-reduced:])
                                               for i, leaf in enumerate(cached)])
    loads = "".join(f"    gather<{leaf.inner}, VEC, PACKED>(a.x{leaf.input}, {at}, v[{i}]);\n"
                    for i, (leaf, at) in enumerate(zip(cached, load_at)))
    stat_names = {expr: f"st[{slot}]" for expr, slot in stats.items()}
    cached_names = {Load(leaf): f"v[{i}][k]" for i, leaf in enumerate(cached)}
    partials, finishes, reduces = [], [], []
    for s, stage in enumerate(program.stages):
        emitter = Emitter({**cached_names, **stat_names})
        value = emitter.term(stage.expr)
        update = f"fmaxf(p, {value})" if stage.kind == "max" else f"p + {value}"
        partials.append(
            f"if constexpr (S == {s}) {{\n      float p = {identity(stage.kind)};\n"
            f"#pragma unroll\n      for (int k = 0; k < VEC; ++k) {{\n"
            f"{emitter.block('        ')}        p = {update};\n      }}\n      return p;\n    }}")
        finish = Emitter({Total(s): "total", **{e: n for e, n in stat_names.items()
                                                 if isinstance(e, Total) and e.stage < s}})
        body = [f"st[{s}] = total;"]
        for expr, slot in stats.items():
            if not isinstance(expr, Total) and ready_stage(expr) == s:
                value = finish.term(expr)
                body.append(f"st[{slot}] = {value};")
        finishes.append(f"if constexpr (S == {s}) {{\n{finish.block('      ')}"
                        + "".join(f"      {line}\n" for line in body) + "    }")
        reduces.append(f"if constexpr (S == {s}) return kf::row_allreduce<TPR>(p, scratch, "
                       f"kf::{'Max' if stage.kind == 'max' else 'Sum'}());")
    store_emitter = Emitter({**cached_names, **stat_names,
                             **{Load(leaf): f"u{i}[k]" for i, leaf in enumerate(others)}})
    store_cols, store_at = column_code(
        program, [(f"b.l{len(cached) + i}", leaf.stride[-reduced:]) for i, leaf in enumerate(others)]
        + [(f"b.o{o.index}", o.stride[-reduced:]) for o in whole])
    gathers = "".join(f"    float u{i}[VEC];\n    gather<{leaf.inner}, VEC, PACKED>(a.x{leaf.input}, "
                      f"{at}, u{i});\n" for i, (leaf, at) in enumerate(zip(others, store_at)))
    writes = "".join(f"      o{o.index}[k] = {store_emitter.term(o.pieces[0].expr)};\n"
                     for o in whole)
    scatters = "".join(f"    scatter<{o.stride[-1]}, VEC, PACKED>(a.out{o.index}, {at}, o{o.index});\n"
                       for o, at in zip(whole, store_at[len(others):]))
    row_values = Emitter(stat_names)
    stores_once = "".join(
        f"      a.out{o.index}[b.o{o.index}] = kf::from_float<{FLOAT_CTYPES[o.dtype]}>("
        f"{row_values.term(o.pieces[0].expr)});\n" for o in once)
    if once:
        stores_once = f"    if (c == 0) {{\n{row_values.block('      ')}{stores_once}    }}\n"
    kinds = ", ".join("true" if s.kind == "max" else "false" for s in program.stages)
    source = (
        "struct Rows {\n"
        f"  using Index = {index};\n"
        f"  static constexpr Index ROWS = {rows};\n"
        f"  static constexpr int COLS = {cols}, VEC = {vec}, CACHED = {len(cached)}, "
        f"STATS = {len(stats)}, STAGES = {len(program.stages)};\n"
        f"  static constexpr bool IS_MAX[STAGES] = {{{kinds}}};\n"
        f"  struct Args {{\n{ptrs.fields()}  }};\n"
        f"  struct Row {{\n    Index {', '.join(fields)};\n  }};\n"
        "  static __device__ __forceinline__ void row(Index r, Row& b) {\n"
        "    Index e = r;\n"
        + indent(coords_text, 4) + indent("\n".join(bases), 4) + "  }\n"
        "  template <bool PACKED>\n"
        "  static __device__ __forceinline__ void load(const Args& a, const Row& b, int c,\n"
        "                                              float (&v)[CACHED][VEC]) {\n"
        + indent(load_cols, 4) + f"{loads}  }}\n"
        "  template <int S>\n"
        "  static __device__ __forceinline__ float partial(const float (&v)[CACHED][VEC],\n"
        "                                                  const float (&st)[STATS]) {\n"
        f"    {' else '.join(partials)}\n  }}\n"
        "  template <int S, int TPR>\n"
        "  static __device__ __forceinline__ float allreduce(float p, float* scratch) {\n"
        + indent("\n".join(reduces), 4) + "  }\n"
        "  template <int S>\n"
        "  static __device__ __forceinline__ void finish(float total, float (&st)[STATS]) {\n"
        f"    {' else '.join(finishes)}\n  }}\n"
        "  template <bool PACKED>\n"
        "  static __device__ __forceinline__ void store(const Args& a, const Row& b, int c,\n"
        "                                               const float (&v)[CACHED][VEC],\n"
        "                                               const float (&st)[STATS]) {\n"
        + indent(store_cols, 4) + gathers
        + "".join(f"    float o{o.index}[VEC];\n" for o in whole)
        + "#pragma unroll\n    for (int k = 0; k < VEC; ++k) {\n"
        f"{store_emitter.block('      ')}{writes}    }}\n{scatters}{stores_once}  }}\n}};\n")
    return source, ptrs


def indent(text: str, spaces: int) -> str:
    return "".join(f"{' ' * spaces}{line}\n" for line in text.splitlines())


def identity(kind: str) -> str:
    return "-INFINITY" if kind == "max" else "0.f"
