"""A fusion region as the region kernels compute it: a *program* of float expressions over the
region's inputs, read at the coordinates of each output, with row reductions (*stages*) where
the region reduces over its last dimension.

Pure data. ``kforge.propose.library.regions.match`` builds a program from a region's nodes,
``render`` writes its CUDA, ``reference`` evaluates it with torch (the semantics the kernels
implement, checked against the region's own operator).

Every expression yields a float. ``Apply`` computes one aten op in float and rounds the result to
the op's dtype (bfloat16 and float16 results are rounded, float32 ones are not), as eager computes
a pointwise op: in float, stored in its result's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from kforge.core.opcard import DTYPE_BYTES
from kforge.propose.library.cards import TensorArg

ROUNDED_DTYPES = ("bfloat16", "float16")
Box = tuple[tuple[int, int], ...]  # per dimension, the half-open range [start, end)


@dataclass(frozen=True)
class Leaf:
    """Input ``input`` read at the program's coordinates: the element at ``offset + sum(coord[d] *
    stride[d])`` from the input's first element."""

    input: int
    stride: tuple[int, ...]
    offset: int
    dtype: str

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def inner(self) -> int:
        """The stride along the last dimension (the one kernels vectorize)."""
        return self.stride[-1]


@dataclass(frozen=True)
class Load:
    leaf: Leaf


@dataclass(frozen=True)
class Const:
    value: float


@dataclass(frozen=True)
class Total:
    """The result of stage ``stage`` for the current row: a sum or a maximum over the row."""

    stage: int


@dataclass(frozen=True)
class Apply:
    """aten op ``op`` on ``args`` (its tensor and number operands, in schema order), with named
    scalars such as ``alpha`` or ``approximate``, its result rounded to ``dtype``."""

    op: str
    args: tuple[Expr, ...]
    dtype: str
    named: tuple[tuple[str, float | str], ...] = ()
    # Hashed once: expressions share sub-expressions, which would otherwise be hashed again
    # for every parent.
    digest: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "digest", hash((self.op, self.args, self.dtype, self.named)))

    def __hash__(self) -> int:
        return self.digest

    @property
    def rounded(self) -> bool:
        return self.dtype in ROUNDED_DTYPES


Expr = Load | Const | Total | Apply


@dataclass(frozen=True)
class Stage:
    """A reduction over the last dimension of every row: ``kind`` "sum" or "max" of ``expr``,
    which may use the totals of earlier stages."""

    kind: str
    expr: Expr


@dataclass(frozen=True)
class Piece:
    """Where ``expr`` gives an output's values: the coordinates in ``box``."""

    box: Box
    expr: Expr


@dataclass(frozen=True)
class Output:
    """One result of the region. The kernel writes element ``coord`` of ``shape`` (the program's
    coordinates) at ``sum(coord[d] * stride[d])``; ``eager`` is the tensor eager returns over the
    same memory (the same, or a view that covers it exactly, such as a transpose). A statistic of
    each row (a mean, an rstd) has stride 0 along the dimensions a row spans."""

    index: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    pieces: tuple[Piece, ...]
    eager: TensorArg

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Program:
    """The region's inputs (the card's variant), its stages and its outputs. A program with
    stages has one shape for all its outputs: a row spans its last ``reduced`` dimensions (the
    last one, or for a group norm a group's channels and positions), the stages reduce over it."""

    inputs: tuple[TensorArg, ...]
    stages: tuple[Stage, ...]
    outputs: tuple[Output, ...]
    reduced: int = 1

    @property
    def shape(self) -> tuple[int, ...]:
        return self.outputs[0].shape

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-self.reduced])

    @property
    def cols(self) -> int:
        return math.prod(self.shape[-self.reduced:])

    def per_row(self, output: Output) -> bool:
        """Whether ``output`` holds one value per row (a statistic)."""
        return all(s == 0 for s in output.stride[-self.reduced:])

    def output_name(self, index: int) -> str:
        """How a launch plan names output ``index``: ``out`` when it is the only one."""
        return "out" if len(self.outputs) == 1 else f"out{index}"


def children(expr: Expr) -> tuple[Expr, ...]:
    return expr.args if isinstance(expr, Apply) else ()


def walk(expr: Expr) -> Iterator[Expr]:
    """Every sub-expression of ``expr`` once, children before parents."""
    seen: set[Expr] = set()

    def visit(e: Expr) -> Iterator[Expr]:
        if e in seen:
            return
        seen.add(e)
        for child in children(e):
            yield from visit(child)
        yield e

    yield from visit(expr)


def leaves(*exprs: Expr) -> list[Leaf]:
    """The leaves the expressions read, each once, in a stable order."""
    found: dict[Leaf, None] = {}
    for expr in exprs:
        for e in walk(expr):
            if isinstance(e, Load):
                found.setdefault(e.leaf)
    return list(found)


def stages_used(expr: Expr) -> set[int]:
    return {e.stage for e in walk(expr) if isinstance(e, Total)}


def is_row_level(expr: Expr) -> bool:
    """Whether ``expr`` is the same for a whole row: it reads no element, only stage totals."""
    return not any(isinstance(e, Load) for e in walk(expr))


def ops(program: Program) -> list[str]:
    """The aten ops a program applies, each once, in a stable order."""
    found: dict[str, None] = {}
    exprs = [s.expr for s in program.stages] + [p.expr for o in program.outputs for p in o.pieces]
    for expr in exprs:
        for e in walk(expr):
            if isinstance(e, Apply):
                found.setdefault(e.op)
    return list(found)
