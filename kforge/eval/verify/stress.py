"""Stress input sets: values chosen per op family to expose kernels that only work on "nice" inputs.

Samples and random sets that mimic them are what a model feeds an op; they rarely hold the values
where a kernel's shortcuts break. Each stress *kind* is a deterministic function of (card, seed)
and fills every tensor with exactly its geometry (the whole region from the first element to the
last, as random sets do), canaries kept:

- ``large_magnitudes``: softmax logits offset by +-1e4 (+-200 for 16-bit types: exp overflows
  fp32 above 88.7), so a softmax without max subtraction overflows; norm inputs offset by 1e3
  with a small spread (fp32: 1/50 of the offset), so E[x^2] - E[x]^2 cancels; elsewhere
  log-uniform magnitudes up to 1e4 (less where the square would overflow the dtype).
- ``constant``: constant rows along the dims the op reduces (equal logits, zero variance). Norm
  rows use small constants (at most 64 * sqrt(eps)) so that computing the mean as sum * (1/n),
  one rounding off, stays within fp32 tolerance after the 1/sqrt(eps) amplification.
- ``mixed_signs``: exactly half negative, in a pattern that changes per seed, with exact (signed)
  zeros and values at the dtype's smallest normal.
- ``moving_mask``: -inf at positions that change per seed (a sample's +-inf are moved, count kept;
  else a quarter of the elements), never a whole row: each row keeps one finite value. Boolean
  masks get a seed-dependent pattern with both values well represented.
- ``extremes``: a quarter of the elements at the dtype's edges where eager stays finite for the
  family (near max, smallest normal, subnormals, signed zeros); norms get a whole input at the
  scale of the smallest normal, where eps dominates the variance.
- ``full_range``: integer tensors over their whole valid range (indices: 0 .. size - 1, both ends
  present; arithmetic on integers: the dtype's range), booleans half True.
- ``special_values``: eager's contract on NaN, +-inf and -0.0. Softmax, norms, reductions and
  pooling get one special value in a quarter of their rows (a NaN or inf spreads over its row: the
  other rows stay answers; norms get NaN only, whose statistics are NaN however they are taken);
  activations, elementwise and index ops get them at an eighth of the elements, with as many zeros
  of either sign (where eager is exact, ``kforge.eval.verify.compare`` tells -0.0 from 0.0). Matmuls
  and convolutions ("other") do not: where a NaN spreads depends on the algorithm eager picks.

A fusion region's card takes the family of the computation it fuses (``card_family``): a softmax
when it holds one (or normalizes exponentials by their sum), a norm when it scales by a reciprocal
root of a reduction, "other" when it holds a matmul or convolution (overflow at extreme values
depends on the order of their sums), else the first family among its ops in a fixed precedence;
its stressed input
is its largest floating input, and its rows run along the last dim (the region kernels reduce
nothing else).

Floating tensors a family does not stress (norm weights, softmax's other arguments) and integer
tensors outside ``full_range`` get the same values a random set would. ``usable_stress_sets``
drops a kind whose eager result is all NaN, with the reason, so no kernel is asked to match that.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from kforge.core.argspec import bind, checked_op, list_items
from kforge.core.opcard import OpCard
from kforge.errors import KforgeError
from kforge.eval.verify.inputs import (
    POSITIVE_INPUT_OPS,
    Buffer,
    Geometry,
    InputSet,
    ValueModel,
    all_tensor_specs,
    index_bounds,
    random_values,
)
from kforge.eval.verify.ops import flatten_tensors
from kforge.eval.verify.precision import ulp

if TYPE_CHECKING:
    from kforge.eval.verify.inputs import InputFactory

# ----- op families -----

SOFTMAX, NORM, ACTIVATION, ELEMENTWISE, REDUCTION, POOLING, INDEX, GENERIC = (
    "softmax", "norm", "activation", "elementwise", "reduction", "pooling", "index", "generic")

SOFTMAX_OPS = frozenset({"_softmax", "softmax", "_log_softmax", "log_softmax", "_safe_softmax",
                         "_masked_softmax", "logsumexp"})
# Variance reductions share the norms' failure mode (cancellation under a large mean).
MOMENT_OPS = frozenset({"var", "std", "var_mean", "std_mean"})
NORM_PATTERN = re.compile(r"(layer|group|rms|batch|instance)_norm")
ACTIVATION_OPS = frozenset({
    "relu", "relu6", "gelu", "silu", "sigmoid", "tanh", "hardswish", "hardsigmoid", "hardtanh",
    "leaky_relu", "elu", "selu", "celu", "mish", "softplus", "log_sigmoid_forward", "threshold",
    "prelu", "_prelu_kernel", "glu", "rrelu_with_noise"})
ELEMENTWISE_OPS = frozenset({
    "add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow",
    "maximum", "minimum", "where", "masked_fill", "masked_scatter", "lerp", "addcmul", "addcdiv",
    "clamp", "clamp_min", "clamp_max", "neg", "abs", "exp", "exp2", "expm1", "log", "log2",
    "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "erf", "sign", "copy",
    "_to_copy", "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "fill", "square", "hypot", "atan2"})
DIVISION_OPS = frozenset({"div", "true_divide", "floor_divide", "remainder", "fmod", "reciprocal",
                          "addcdiv", "atan2"})
MASKED_OPS = frozenset({"where", "masked_fill", "masked_scatter", "_masked_softmax"})
REDUCTION_OPS = frozenset({
    "sum", "mean", "amax", "amin", "max", "min", "prod", "argmax", "argmin", "cumsum", "cumprod",
    "nansum", "nanmean", "norm", "linalg_vector_norm", "any", "all", "count_nonzero", "aminmax"})
POOL_PATTERN = re.compile(r"pool([123])d")
INDEX_PREFIXES = ("embedding", "index", "_index", "_unsafe_index", "gather", "scatter", "take",
                  "nll_loss", "cross_entropy")


def base_name(op: str) -> str:
    """``aten.add_.Tensor`` -> ``add``: the op without namespace, overload or in-place mark."""
    parts = op.split(".")
    short = parts[1] if len(parts) >= 2 else op
    return short[:-1] if short.endswith("_") and not short.endswith("__") else short


def op_family(op: str) -> str:
    """The family of an aten op name, which decides the stress values it gets."""
    name = base_name(op)
    activation = name.removesuffix("_backward")
    if name in SOFTMAX_OPS:
        return SOFTMAX
    if (NORM_PATTERN.search(name) and "backward" not in name) or name in MOMENT_OPS:
        return NORM
    if name in ACTIVATION_OPS or activation in ACTIVATION_OPS:
        return ACTIVATION
    if name in ELEMENTWISE_OPS:
        return ELEMENTWISE
    if name in REDUCTION_OPS:
        return REDUCTION
    if POOL_PATTERN.search(name) and "backward" not in name:
        return POOLING
    if name.startswith(INDEX_PREFIXES):
        return INDEX
    return GENERIC


# Ops whose every result element eager computes exactly (an input element, its negation or
# absolute value, or a constant): a candidate must give eager's bits, -0.0 apart from 0.0. Ops
# that pick between equal-comparing -0.0 and 0.0 (max, relu, clamp) leave the sign of such a zero
# to the implementation, and are not among them.
EXACT_OPS = frozenset({
    "neg", "abs", "copy", "clone", "where", "masked_fill", "embedding", "index_select", "gather",
    "take", "index", "_unsafe_index", "cat", "stack", "constant_pad_nd", "flip", "roll", "repeat",
    "permute", "transpose", "t", "contiguous", "select", "slice", "narrow", "expand", "view",
    "reshape", "_reshape_alias", "unsqueeze", "squeeze", "tril", "triu", "fill", "zeros_like",
    "ones_like", "full_like"})


def exact_op(card: OpCard) -> bool:
    """Whether eager computes ``card``'s results exactly, so they are compared bit for bit (a
    fusion region never is: it rounds between its ops)."""
    return card.region is None and base_name(card.op) in EXACT_OPS


# A region with several families' ops is stressed as the first of these it holds.
REGION_PRECEDENCE = (SOFTMAX, NORM, POOLING, REDUCTION, INDEX, ACTIVATION, ELEMENTWISE)
SUM_OPS = frozenset({"sum", "mean", "var", "var_mean"})
# Contractions: a sum of products, whose overflow at extreme values depends on the order of the
# sum. A region holding one keeps the values of "other" ops, where every product stays finite.
CONTRACTION_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "addmv", "mv",
                             "dot", "convolution", "_convolution", "conv1d", "conv2d", "conv3d",
                             "cudnn_convolution", "_scaled_mm", "einsum"})


def card_family(card: OpCard) -> str:
    """The family of an op card's op, or of the computation a region card fuses."""
    if card.region is None:
        return op_family(card.op)
    nodes = card.region["nodes"]
    names = {base_name(node["op"]) for node in nodes}
    if names & CONTRACTION_OPS:
        return GENERIC
    if "exp" in names and names & SUM_OPS and names & {"div", "reciprocal", "mul"}:
        return SOFTMAX  # exp(x - max) / sum: a softmax written out
    if names & SUM_OPS and ("rsqrt" in names or any(_negative_power(node) for node in nodes)):
        return NORM  # x * rsqrt(mean(x^2) + eps) and its kin
    families = {op_family(node["op"]) for node in nodes}
    return next((f for f in REGION_PRECEDENCE if f in families), GENERIC)


def _negative_power(node: dict) -> bool:
    """``pow(x, -0.5)``: a reciprocal root written as a power."""
    exponent = node["args"][1] if len(node["args"]) > 1 else None
    return (base_name(node["op"]) == "pow" and isinstance(exponent, (int, float))
            and not isinstance(exponent, bool) and exponent < 0)


def main_tensor(card: OpCard, geometries: list[Geometry]) -> int:
    """The tensor whose rows the family reduces: an op's first argument, a region's largest
    floating input (the first of equals)."""
    if card.region is None:
        return 0
    floats = [i for i, g in enumerate(geometries) if is_float(g.dtype)]
    return max(floats, key=lambda i: (math.prod(g.shape) if (g := geometries[i]).shape else 1, -i),
               default=0)


# ----- kinds -----


@dataclass(frozen=True)
class StressKind:
    name: str
    description: str  # for labels
    families: frozenset[str]
    needs: str  # "float": a floating tensor the family stresses; "mask": that or a bool; "int"


ALL_FAMILIES = frozenset({SOFTMAX, NORM, ACTIVATION, ELEMENTWISE, REDUCTION, POOLING, INDEX,
                          GENERIC})
KINDS: dict[str, StressKind] = {k.name: k for k in (
    StressKind("large_magnitudes", "large magnitudes", ALL_FAMILIES, "float"),
    StressKind("constant", "constant rows",
               frozenset({SOFTMAX, NORM, REDUCTION, POOLING, GENERIC}), "float"),
    StressKind("mixed_signs", "mixed signs",
               frozenset({ACTIVATION, ELEMENTWISE, REDUCTION, POOLING, GENERIC}), "float"),
    StressKind("moving_mask", "moving mask", frozenset({SOFTMAX, ELEMENTWISE}), "mask"),
    StressKind("extremes", "extremes and subnormals", ALL_FAMILIES, "float"),
    StressKind("full_range", "full integer range", ALL_FAMILIES, "int"),
    StressKind("special_values", "NaN, inf and signed zeros", ALL_FAMILIES - {GENERIC}, "float"),
)}
# Families whose rows a NaN or inf turns wholly NaN (a softmax, a norm, a reduction, a pooling
# window): only some rows get one. Elsewhere special values are scattered.
ROW_FAMILIES = frozenset({SOFTMAX, NORM, REDUCTION, POOLING})
SPECIALS = (math.inf, math.nan, -math.inf, -0.0)
# A norm's statistics of a row holding an inf are NaN or inf depending on how the mean is taken
# (eager's Welford pass gives NaN, an honest sum gives inf): its rows get NaN only.
NORM_SPECIALS = (math.nan,)


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point and dtype.itemsize > 1  # fp8 formats have no room to stress


def is_integer(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex)


def stressed_tensors(family: str, geometries: list[Geometry], main: int = 0) -> list[int]:
    """Indices of the floating tensors a family fills with stress values: the input of softmax
    and norms (tensor ``main``; their weights, running statistics or saved outputs keep random
    values), every floating tensor elsewhere."""
    floats = [i for i, g in enumerate(geometries) if is_float(g.dtype)]
    if family in (SOFTMAX, NORM):
        return [main] if main in floats else []
    return floats


def stress_kinds(card: OpCard) -> list[str]:
    """The stress kinds that apply to ``card``, in a fixed order."""
    family = card_family(card)
    geometries = [Geometry.from_spec(s) for s in all_tensor_specs(card)]
    main = main_tensor(card, geometries)
    has = {"float": bool(stressed_tensors(family, geometries, main)),
           "int": any(is_integer(g.dtype) for g in geometries)}
    has["mask"] = has["float"] or any(g.dtype == torch.bool for g in geometries)
    masked = base_name(card.op) in MASKED_OPS
    return [k.name for k in KINDS.values()
            if has[k.needs] and (family in k.families or (k.name == "moving_mask" and masked))]


def stress_kind(name: str) -> StressKind:
    if name not in KINDS:
        raise KforgeError(f"unknown stress kind {name!r}: expected one of {', '.join(KINDS)}")
    return KINDS[name]


def stress_label(kind: str, seed: int) -> str:
    return f"stress: {stress_kind(kind).description} (seed {seed})"


def kind_seed(kind: str, seed: int) -> int:
    """A generator seed per (kind, seed), stable across processes."""
    return (seed * 1_000_003 + zlib.crc32(kind.encode())) % (1 << 62)


# ----- what the card says about its rows -----


def plain(spec: Any) -> Any:
    """An arg spec's Python value for ints and lists (list specs and tuples -> lists)."""
    items = list_items(spec)
    if items is None and isinstance(spec, (list, tuple)):
        items = spec
    return spec if items is None else [plain(item) for item in items]


def schema_value(card: OpCard, name: str) -> Any:
    """The value ``card`` passes for the schema argument ``name`` (its default when not passed;
    None when the op has no such argument or the card does not fit the op)."""
    try:
        return plain(bind(card.op, card.args, card.kwargs).get(name))
    except KforgeError:
        return None


def row_dims(card: OpCard, family: str, ndim: int) -> tuple[int, ...]:
    """The dims of the op's first input along which it reduces or normalizes ("rows")."""
    if ndim == 0:
        return ()
    name = base_name(card.op)
    every = tuple(range(ndim))
    if family in (SOFTMAX, REDUCTION) or name in MOMENT_OPS:
        dim = schema_value(card, "dim")
        if isinstance(dim, int) and not isinstance(dim, bool):
            return (dim % ndim,)
        if isinstance(dim, list) and dim:
            return tuple(sorted({d % ndim for d in dim}))
        return every if family != SOFTMAX else (ndim - 1,)
    if family == NORM:
        if "group_norm" in name:
            return every[1:]
        if "batch_norm" in name:
            return tuple(d for d in every if d != 1)
        if "instance_norm" in name:
            return every[2:]
        shape = schema_value(card, "normalized_shape")
        count = len(shape) if isinstance(shape, list) and shape else 1
        return every[-count:]
    if family == POOLING:
        match = POOL_PATTERN.search(name)
        return every[-int(match.group(1)):] if match else every[-2:]
    return (ndim - 1,)


@dataclass(frozen=True)
class ElementRows:
    """Where each logical element of a tensor lives in its region, and its row's first element."""

    positions: torch.Tensor  # long, the tensor's shape
    anchors: torch.Tensor  # long, size 1 along the row dims
    dims: tuple[int, ...]

    @classmethod
    def of(cls, geometry: Geometry, dims: tuple[int, ...], device: torch.device) -> ElementRows:
        positions = torch.arange(geometry.span, device=device).as_strided(geometry.shape,
                                                                          geometry.stride)
        anchors = positions
        for d in dims:
            anchors = anchors.narrow(d, 0, 1)
        return cls(positions, anchors, dims)

    def spread(self, per_position: torch.Tensor) -> torch.Tensor:
        """Region values where each row repeats the value at its first element's position (rows
        that share memory share that position, so aliased elements agree)."""
        out = per_position.clone()
        out[self.positions.reshape(-1)] = per_position[
            self.anchors.expand(self.positions.shape).reshape(-1)]
        return out

    def by_row(self) -> torch.Tensor:
        """Region positions as a (rows, elements of a row) grid."""
        others = [d for d in range(self.positions.dim()) if d not in self.dims]
        grid = self.positions.permute(*others, *self.dims)
        length = math.prod(self.positions.shape[d] for d in self.dims)
        return grid.reshape(-1, length) if length else grid.reshape(-1, 1)

    def keep_one_per_row(self, masked: torch.Tensor) -> None:
        """Unmask each row's first element where a whole row of ``masked`` (per position) is."""
        if not self.dims:
            masked.zero_()
            return
        whole = masked[self.positions]
        for d in sorted(self.dims, reverse=True):
            whole = whole.all(dim=d, keepdim=True)
        masked[self.anchors[whole]] = False


# ----- values -----


@dataclass(frozen=True)
class StressPlan:
    """What stress filling needs to know about one card, once."""

    card: OpCard
    family: str
    stressed: tuple[int, ...]
    index_bounds: dict[int, int]
    rows: tuple[tuple[int, ...], ...]  # per tensor
    eps: float

    @classmethod
    def of(cls, card: OpCard, geometries: list[Geometry]) -> StressPlan:
        family = card_family(card)
        main = main_tensor(card, geometries)
        stressed = stressed_tensors(family, geometries, main)
        rows = tuple(row_dims(card, family, len(g.shape)) if i == main
                     else ((len(g.shape) - 1,) if g.shape else ())
                     for i, g in enumerate(geometries))
        eps = schema_value(card, "eps")
        return cls(card, family, tuple(stressed), index_bounds(card.short_op, card.args), rows,
                   float(eps) if isinstance(eps, (int, float)) else 1e-5)


class Draw:
    """Seeded draws of one stress set on one device."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def normal(self, n: int, work: torch.dtype) -> torch.Tensor:
        return torch.randn(n, generator=self.generator, device=self.device, dtype=work)

    def uniform(self, n: int, work: torch.dtype) -> torch.Tensor:
        return torch.rand(n, generator=self.generator, device=self.device, dtype=work)

    def integers(self, low: int, high: int, n: int, dtype: torch.dtype = torch.int64
                 ) -> torch.Tensor:
        return torch.randint(low, high, (n,), generator=self.generator, device=self.device,
                             dtype=dtype)

    def permutation(self, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=self.generator, device=self.device)

    def half_negative(self, n: int, work: torch.dtype) -> torch.Tensor:
        """+-1 with exactly n // 2 negatives at seed-dependent places."""
        signs = torch.ones(n, dtype=work, device=self.device)
        signs[self.permutation(n)[:n // 2]] = -1
        return signs

    def sign(self) -> float:
        return 1.0 if int(self.integers(0, 2, 1).item()) else -1.0

    def log_uniform(self, n: int, low: float, high: float, work: torch.dtype) -> torch.Tensor:
        return torch.exp(math.log(low) + self.uniform(n, work) * (math.log(high) - math.log(low)))

    def pick(self, pool: list[float], n: int, work: torch.dtype) -> torch.Tensor:
        values = torch.tensor(pool, dtype=work, device=self.device)
        return values[self.integers(0, len(pool), n)]


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def large_offset(dtype: torch.dtype, family: str) -> float:
    info = torch.finfo(dtype)
    if family == SOFTMAX:
        return 1e4 if info.bits >= 32 else 200.0
    return min(1e3, info.max / 4)


# Offset over spread of the norms' large-magnitude input. At fp32 and ratio 100, honest kernels
# that sum a 1536-element row sequentially already differ from eager beyond fp32's tolerance;
# E[x^2] - E[x]^2 fails from about 30. 16-bit inputs are computed in fp32, where cancellation
# shows only from about 1000.
OFFSET_OVER_SPREAD = {torch.float64: 1e5, torch.float32: 50.0}
HALF_OFFSET_OVER_SPREAD = 1e3


def large_magnitudes(draw: Draw, plan: StressPlan, dtype: torch.dtype, n: int) -> torch.Tensor:
    work = work_dtype(dtype)
    if plan.family == SOFTMAX:
        return draw.sign() * large_offset(dtype, SOFTMAX) + 4 * draw.normal(n, work)
    if plan.family == NORM:
        offset = large_offset(dtype, NORM)
        ratio = OFFSET_OVER_SPREAD.get(dtype, HALF_OFFSET_OVER_SPREAD)
        spread = max(offset / ratio, 2 * ulp(offset, dtype))
        return draw.sign() * offset + spread * draw.normal(n, work)
    high = min(1e4, math.sqrt(torch.finfo(dtype).max) / 2)
    return draw.half_negative(n, work) * draw.log_uniform(n, 1.0, high, work)


def row_constants(draw: Draw, plan: StressPlan, dtype: torch.dtype, n: int) -> torch.Tensor:
    """One candidate constant per region position (rows take their first element's)."""
    work = work_dtype(dtype)
    eighths = draw.integers(-16, 17, n).to(work) / 8
    if plan.family == NORM:
        limit = min(1.0, 64 * math.sqrt(plan.eps))
        return eighths / 2 * 2.0 ** math.floor(math.log2(limit))
    if plan.family == SOFTMAX:
        big = large_offset(dtype, SOFTMAX)
        return draw.pick([0.0, big, -big, 1.0], n, work) * (draw.uniform(n, work) < 0.5) + eighths
    return eighths


def mixed_signs(draw: Draw, dtype: torch.dtype, n: int) -> torch.Tensor:
    work = work_dtype(dtype)
    magnitudes = draw.log_uniform(n, 1e-3, 10.0, work)
    order = draw.permutation(n)
    magnitudes[order[:n // 16]] = 0.0
    magnitudes[order[n // 16:n // 8]] = torch.finfo(dtype).smallest_normal * (
        1 + 3 * draw.uniform(n // 8 - n // 16, work))
    return draw.half_negative(n, work) * magnitudes


def extreme_pool(plan: StressPlan, dtype: torch.dtype, numel: int) -> list[float]:
    """Edge values where eager stays finite for the family."""
    info = torch.finfo(dtype)
    subnormals = [info.smallest_normal / 2, info.smallest_normal * info.eps * 4,
                  info.smallest_normal * info.eps]
    small = [info.smallest_normal, *subnormals]
    if plan.family == ELEMENTWISE:
        # Squares and quotients of these stay finite; dividing by a subnormal may not.
        edges = [math.sqrt(info.max) / 2, 2 * math.sqrt(info.smallest_normal), 1.0]
        if base_name(plan.card.op) not in DIVISION_OPS:
            edges += subnormals
    elif plan.family in (ACTIVATION, SOFTMAX, INDEX):
        edges = [info.max / 16, *small, 0.0]
    elif plan.family == POOLING:
        edges = [info.max / 1024, *small, 0.0]
    elif plan.family == REDUCTION:
        edges = [info.max / (2 * max(numel, 1)), *small]  # any sum of them stays finite
    else:
        edges = [*small, 0.0, 1.0]
    return edges + [-e for e in edges]


def extremes(draw: Draw, plan: StressPlan, model: ValueModel, dtype: torch.dtype, n: int,
             numel: int) -> torch.Tensor:
    work = work_dtype(dtype)
    if plan.family == NORM:
        return draw.normal(n, work) * torch.finfo(dtype).smallest_normal * 4
    values = random_values(model, dtype, n, draw.generator, draw.device).to(work)
    chosen = draw.permutation(n)[:max(1, n // 4)]
    values[chosen] = draw.pick(extreme_pool(plan, dtype, numel), chosen.numel(), work)
    return values


def special_values(draw: Draw, plan: StressPlan, model: ValueModel, dtype: torch.dtype, n: int,
                   rows: ElementRows) -> torch.Tensor:
    """Random values with +inf, NaN, -inf and -0.0 (in turn; norms: NaN) at seed-dependent
    places: one in each of a quarter of the rows where the family spreads them over a row (the
    first is +inf, so a single row stays an answer: a sum or max of it is inf), an eighth of the
    elements elsewhere, with as many exact zeros of either sign."""
    work = work_dtype(dtype)
    values = random_values(replace(model, template=None), dtype, n, draw.generator,
                           draw.device).to(work)
    if plan.family in ROW_FAMILIES:
        grid = rows.by_row()
        chosen = draw.permutation(grid.shape[0])[:max(1, grid.shape[0] // 4)]
        spots = grid[chosen, draw.integers(0, max(grid.shape[1], 1), chosen.numel())]
    else:
        order = draw.permutation(n)
        spots = order[:max(1, n // 8)]
        zeros = order[n // 8:n // 4]
        values[zeros] = 0.0 * draw.half_negative(zeros.numel(), work)
    specials = torch.tensor(NORM_SPECIALS if plan.family == NORM else SPECIALS, dtype=work,
                            device=draw.device)
    values[spots] = specials[torch.arange(spots.numel(), device=draw.device) % specials.numel()]
    return values


def moving_mask(draw: Draw, model: ValueModel, dtype: torch.dtype, n: int,
                rows: ElementRows) -> torch.Tensor:
    work = work_dtype(dtype)
    values = random_values(replace(model, template=None), dtype, n, draw.generator,
                           draw.device).to(work)
    if model.template is not None:
        infs = model.template.to(work)
        infs = infs[torch.isinf(infs)]
    else:
        infs = torch.full((n // 4,), -math.inf, dtype=work, device=draw.device)
    masked = torch.zeros(n, dtype=torch.bool, device=draw.device)
    masked[draw.permutation(n)[:infs.numel()]] = True
    rows.keep_one_per_row(masked)
    spots = torch.nonzero(masked).reshape(-1)
    values[spots] = infs[draw.permutation(infs.numel())[:spots.numel()]]
    return values


def full_range(draw: Draw, plan: StressPlan, index: int, model: ValueModel, dtype: torch.dtype,
               n: int) -> torch.Tensor:
    """Integers over their whole valid range, both ends present; booleans half True."""
    if dtype == torch.bool:
        values = torch.zeros(n, dtype=torch.bool, device=draw.device)
        values[draw.permutation(n)[:(n + 1) // 2]] = True
        return values
    info = torch.iinfo(dtype)
    if index in plan.index_bounds:
        low, last = 0, max(0, plan.index_bounds[index] - 1)
    elif plan.family in (ELEMENTWISE, ACTIVATION, REDUCTION):
        low, last = info.min, info.max
    else:
        low, last = max(int(model.low), info.min), min(int(model.high) - 1, info.max)
    last = max(low, last)
    if last == low:
        return torch.full((n,), low, dtype=dtype, device=draw.device)
    values = draw.integers(low, last, n, dtype)
    ends = draw.permutation(n)[:2]
    values[ends[0]] = low
    if n > 1:
        values[ends[1]] = last
    return values


def stress_filler(factory: InputFactory, kind: str, seed: int
                  ) -> Callable[[int, Buffer], None]:
    """A fill function for ``InputFactory._build`` writing ``kind``'s values."""
    stress_kind(kind)
    plan = StressPlan.of(factory.card, factory.geometries)
    draw = Draw(kind_seed(kind, seed), factory.device)
    positive = base_name(factory.card.op) in POSITIVE_INPUT_OPS

    def fill(i: int, buf: Buffer) -> None:
        g, model = factory.geometries[i], factory.models[i]
        buf.region().copy_(clamp_finite(values_for(i, g, model), g.dtype))

    def values_for(i: int, g: Geometry, model: ValueModel) -> torch.Tensor:
        n = g.span
        if kind == "full_range" and is_integer(g.dtype):
            return full_range(draw, plan, i, model, g.dtype, n)
        if kind == "moving_mask" and g.dtype == torch.bool:
            fraction = min(max(model.true_fraction, 0.25), 0.75)
            return draw.uniform(n, torch.float32) < fraction
        if i not in plan.stressed or kind == "full_range":
            return random_values(model, g.dtype, n, draw.generator, factory.device)
        if kind == "large_magnitudes":
            values = large_magnitudes(draw, plan, g.dtype, n)
        elif kind == "constant":
            rows = ElementRows.of(g, plan.rows[i], factory.device)
            values = rows.spread(row_constants(draw, plan, g.dtype, n))
        elif kind == "mixed_signs":
            return mixed_signs(draw, g.dtype, n)  # signs are the point, even for log's input
        elif kind == "special_values":
            values = special_values(draw, plan, model, g.dtype, n,
                                    ElementRows.of(g, plan.rows[i], factory.device))
            return values if not positive else torch.where(values.isnan(), values, values.abs())
        elif kind == "moving_mask":
            values = moving_mask(draw, model, g.dtype, n, ElementRows.of(g, plan.rows[i],
                                                                   factory.device))
        else:
            values = extremes(draw, plan, model, g.dtype, n, math.prod(g.shape))
        return values.abs() if positive else values

    return fill


def clamp_finite(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Finite values kept within ``dtype``'s range, so casting never makes an inf by itself."""
    if not is_float(dtype):
        return values
    limit = torch.finfo(dtype).max
    return torch.where(torch.isfinite(values), values.clamp(-limit, limit), values)


# ----- keeping only sets eager can answer -----


def eager_problem(op_name: str, inputs: InputSet) -> str | None:
    """Why eager's result on ``inputs`` is no reference (it fails, or a result is all NaN)."""
    copy = inputs.fresh_copy()
    try:
        result = checked_op(op_name)(*copy.args, **copy.kwargs)
    except Exception as exc:  # eager cannot run these values: the kind is not for this card
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"eager {op_name} fails on it: {first_line}"
    for i, t in enumerate(flatten_tensors(result)):
        if (t.dtype.is_floating_point or t.dtype.is_complex) and t.numel() and bool(
                torch.isnan(t).all()):
            return f"eager's result {i} is all NaN"
    return None


def stress_set(factory: InputFactory, kind: str, seed: int) -> InputSet:
    """A set of ``factory``'s card whose values stress the op's semantics as ``kind`` says."""
    return factory.build(stress_label(kind, seed), stress_filler(factory, kind, seed))


def usable_stress_sets(factory: InputFactory, seed: int
                       ) -> tuple[list[InputSet], dict[str, str]]:
    """One set per stress kind of the card for ``seed``, less those eager cannot answer
    (all-NaN results or errors), and ``{kind: why it was dropped}``."""
    sets, dropped = [], {}
    for kind in stress_kinds(factory.card):
        inputs = stress_set(factory, kind, seed)
        if problem := eager_problem(factory.card.op, inputs):
            dropped[kind] = f"{inputs.label}: {problem}"
        else:
            sets.append(inputs)
    return sets, dropped
