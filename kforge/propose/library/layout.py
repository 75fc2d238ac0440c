"""Layout arithmetic shared by the families: rows of a tensor, dimensions merged where memory
allows, and generated C++ that turns a linear index into per-tensor element offsets."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kforge.propose.library.cards import Declined, TensorArg

# 32-bit index math while every offset (and a grid-stride loop's next index) stays below 2^31.
INT32_LIMIT = 2**30


@dataclass(frozen=True)
class Rows:
    """A tensor seen as ``rows`` rows of ``cols`` packed elements, row r starting at
    ``r * stride`` elements from the first."""

    rows: int
    cols: int
    stride: int


def row_view(t: TensorArg, inner_dims: int, what: str = "the input") -> Rows:
    """``t`` as rows over its last ``inner_dims`` dimensions, or Declined when the rows are not
    packed or not evenly spaced (a view whose leading dimensions do not merge)."""
    if t.numel == 0:
        raise Declined(f"{what} is empty")
    split = t.ndim - inner_dims
    inner = [(n, s) for n, s in zip(t.shape[split:], t.stride[split:]) if n != 1]
    expected = 1
    for size, step in reversed(inner):
        if step != expected:
            raise Declined(f"{what} is not contiguous along its last {inner_dims} dimension(s) "
                           f"(strides {t.stride})")
        expected *= size
    cols = math.prod(t.shape[split:])
    outer = [(n, s) for n, s in zip(t.shape[:split], t.stride[:split]) if n != 1]
    if not outer:
        return Rows(1, cols, cols)
    row_stride = outer[-1][1]
    expected = row_stride
    for size, step in reversed(outer):
        if step != expected:
            raise Declined(f"the rows of {what} are not evenly spaced in memory (strides {t.stride})")
        expected *= size
    if row_stride < cols:
        raise Declined(f"the rows of {what} overlap (strides {t.stride})")
    return Rows(math.prod(t.shape[:split]), cols, row_stride)


def index_type(*extents: int) -> str:
    """The narrowest C index type that holds every element offset (32-bit math is faster)."""
    return "int32_t" if max(extents, default=0) < INT32_LIMIT else "int64_t"


def max_offset(t: TensorArg) -> int:
    return sum((n - 1) * s for n, s in zip(t.shape, t.stride)) + 1


@dataclass(frozen=True)
class Iteration:
    """A loop nest over an output, after dropping size-1 dimensions, ordering dimensions as the
    output lies in memory and merging neighbours wherever every operand allows.

    ``sizes`` run outermost first; ``strides[i]`` are operand i's element strides over them
    (operand 0 is the output; a broadcast dimension has stride 0)."""

    sizes: tuple[int, ...]
    strides: tuple[tuple[int, ...], ...]

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    def inner(self, operand: int) -> int:
        """The operand's stride along the innermost dimension."""
        return self.strides[operand][-1]


def broadcast_strides(t: TensorArg, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``t``'s strides over ``shape`` under broadcasting (0 along broadcast dimensions)."""
    lead = len(shape) - t.ndim
    if lead < 0:
        raise Declined(f"an operand of shape {t.shape} does not broadcast to {shape}")
    out = []
    for d, size in enumerate(shape):
        if d < lead:
            out.append(0)
            continue
        own = t.shape[d - lead]
        if own == size:
            out.append(t.stride[d - lead] if size != 1 else 0)
        elif own == 1:
            out.append(0)
        else:
            raise Declined(f"an operand of shape {t.shape} does not broadcast to {shape}")
    return tuple(out)


def iteration(shape: tuple[int, ...], strides: list[tuple[int, ...]]) -> Iteration:
    """The merged loop nest over ``shape`` for operands with ``strides`` (operand 0 the output)."""
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    # Outermost first in the output's memory order; ties keep logical order (stable sort).
    dims.sort(key=lambda d: -strides[0][d])
    sizes: list[int] = []
    merged: list[list[int]] = [[] for _ in strides]
    for d in dims:
        if sizes and all(m[-1] == s[d] * shape[d] for m, s in zip(merged, strides)):
            sizes[-1] *= shape[d]
            for m, s in zip(merged, strides):
                m[-1] = s[d]
            continue
        sizes.append(shape[d])
        for m, s in zip(merged, strides):
            m.append(s[d])
    if not sizes:  # a single element
        return Iteration((1,), tuple((0,) for _ in strides))
    return Iteration(tuple(sizes), tuple(tuple(m) for m in merged))


def offsets_code(it: Iteration, names: list[str], index: str = "Index") -> str:
    """C++ statements that split linear index ``e`` (a variable of type ``index``) over the loop
    nest and set ``<name>`` to each operand's element offset. ``e`` is consumed."""
    lines = []
    coords = []
    for d in range(len(it.sizes) - 1, -1, -1):
        c = f"i{d}"
        if d == 0:
            lines.append(f"const {index} {c} = e;")
        else:
            lines.append(f"const {index} {c} = e % {it.sizes[d]}; e /= {it.sizes[d]};")
        coords.append(c)
    coords.reverse()
    for name, strides in zip(names, it.strides):
        terms = [f"{c} * {s}" if s != 1 else c for c, s in zip(coords, strides) if s != 0]
        lines.append(f"{name} = {' + '.join(terms) if terms else '0'};")
    return "\n".join(lines)


def coords_code(shape: tuple[int, ...], order_strides: tuple[int, ...], index: str = "Index"
                ) -> tuple[str, list[str]]:
    """C++ that splits linear index ``e`` into one coordinate per dimension of ``shape``, walking
    the dimensions in the memory order given by ``order_strides`` (an output's strides, so that
    consecutive threads write consecutive elements). Returns the code and, per dimension, the
    expression of its coordinate (``0`` for size-1 dimensions). ``e`` is consumed."""
    dims = sorted((d for d in range(len(shape)) if shape[d] != 1), key=lambda d: -order_strides[d])
    lines = []
    for k, d in enumerate(reversed(dims)):
        if k == len(dims) - 1:
            lines.append(f"const {index} i{d} = e;")
        else:
            lines.append(f"const {index} i{d} = e % {shape[d]}; e /= {shape[d]};")
    coords = [f"i{d}" if shape[d] != 1 else "0" for d in range(len(shape))]
    return "\n".join(lines), coords


def linear_code(coords: list[str], strides: tuple[int, ...]) -> str:
    """``coord * stride + ...`` over the dimensions that move (``0`` if none do)."""
    terms = [c if s == 1 else f"{c} * {s}" for c, s in zip(coords, strides) if c != "0" and s != 0]
    return " + ".join(terms) if terms else "0"
