"""Matrix products: ``aten.mm``, ``aten.addmm`` (bias, ``beta``, ``alpha``) and ``aten.bmm`` in
bfloat16 and float16 on tensor cores and in float32 on CUDA cores (exact float32, as eager
computes it without TF32), for any operand layout, with elementwise work fused after the product
(an epilogue: ``fuse_epilogue``).

Variants, the most promising first:

- ``gemv`` (at most 8 rows, both operands contiguous along K): the weight read once with vector
  loads, CUDA cores, a block per ``cols`` output columns. Decode steps.
- ``wgmma`` (sm_90 only, 16-bit, both operands K-major): a producer warpgroup copies tiles with
  cp.async into 128-byte swizzled shared memory; one or two consumer warpgroups run Hopper's
  warpgroup MMA. ``bm`` x ``bn`` tiles, ``stages`` buffers, ``splits`` along K.
- ``mma`` (sm_80 and later, 16-bit, each operand contiguous along K or along M/N): mma.sync
  m16n8k16 tensor cores fed by ldmatrix from a cp.async pipeline. ``bm`` x ``bn`` x ``bk`` tiles,
  ``warps_m`` x ``warps_n`` warps, ``stages``, ``splits``.
- ``simt`` (reference: any dtype, any strides): ``bm`` x ``bn`` tiles, ``tm`` x ``tn`` outputs
  per thread.

Split-K (``splits`` > 1) writes float partials to a scratch buffer and a second launch sums them
in split order (deterministic) and applies the epilogue. Sizes and strides are compile-time
constants; tiles past the matrix edge are zero-filled on load and masked on store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kforge.core.argspec import bind, decode
from kforge.core.gpu import GpuInfo
from kforge.core.opcard import OpCard
from kforge.core.region import is_ref, node_name
from kforge.propose.library.cards import (
    FLOAT_CTYPES,
    Call,
    Declined,
    TensorArg,
    read_call,
    require_float,
)
from kforge.propose.library.families.base import (
    Family,
    Kernel,
    Variant,
    cuda_bool,
    entry_points,
    f32,
    launch,
    new_output,
    ptr,
    sm_count,
    vec_options,
)
from kforge.propose.library.families.elementwise import FORMS
from kforge.propose.library.layout import (
    broadcast_strides,
    index_type,
    linear_code,
    max_offset,
)
from kforge.propose.library.space import Axis, Params, Space, ceil_div, clamp, pow2_ceil
from kforge.runtime.nvrtc import ARCH_SPECIFIC
from kforge.runtime.regions import register_cards

MATMUL_OPS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default")
HALF_DTYPES = ("bfloat16", "float16")
# Shared memory one block may use: H100/H200 (and B200) 227 KiB; elsewhere (sm_80's 163 KiB,
# the 99 KiB of sm_86/89/120/121) the smallest of these.
SHARED_BYTES = {"sm_90": 227 * 1024, "sm_100": 227 * 1024}
SHARED_BYTES_ELSEWHERE = 99 * 1024
GEMV_MAX_ROWS = 8
MAX_SPLITS = 16
MAX_ACCUMULATORS = 128  # floats a thread of the tensor-core variants accumulates in
REDUCE_BLOCK = 256
WGMMA_BK = 64


# ----- epilogue: elementwise ops on the product -----


class _Result:
    """The running value in an epilogue op's arguments: the product, or the previous op's result."""

    def __repr__(self) -> str:
        return "RESULT"


RESULT = _Result()


@dataclass(frozen=True)
class EpilogueInput:
    """A tensor an epilogue op reads: ``name`` is how the launch plan names it (a schema argument
    such as ``self``, or a region input ``x2``), ``strides`` its element strides over the product's
    shape ([M, N], or [B, M, N] for bmm), 0 along broadcast dimensions."""

    name: str
    tensor: TensorArg
    strides: tuple[int, ...]


@dataclass(frozen=True)
class EpilogueOp:
    """One elementwise aten op (a key of the elementwise family's FORMS: ``aten.add.Tensor``,
    ``aten.gelu.default``, ...) applied after the product: ``args`` and ``kwargs`` as the op takes
    them, with RESULT for the running value and EpilogueInput for tensors read from memory."""

    op: str
    args: tuple
    kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class EpilogueStep:
    """A float expression of the running value ``v`` (the epilogue tensors' values ``e0``..,
    scalar parameters ``p0``..), and the dtype its result is rounded to as eager stores it (None:
    kept in float)."""

    expr: str
    rounds_to: str | None = None


@dataclass(frozen=True)
class EpilogueScalar:
    """A float kernel parameter ``p<i>`` and its value in the launch plan (an argument name or a
    number)."""

    value: str | float


@dataclass(frozen=True)
class Epilogue:
    steps: tuple[EpilogueStep, ...] = ()
    tensors: tuple[EpilogueInput, ...] = ()
    scalars: tuple[EpilogueScalar, ...] = ()


# ----- the problem -----


@dataclass(frozen=True)
class MatmulProblem:
    """out[b, m, n] = epilogue(sum_k A[b, m, k] * B[b, k, n]): ``a_strides`` are A's element strides
    along (batch, m, k), ``b_strides`` B's along (batch, k, n); ``out`` is eager's output, of the
    product's shape ([M, N], or [B, M, N] for bmm). Operands are named as the plan names them."""

    a_name: str
    b_name: str
    a: TensorArg
    b: TensorArg
    batch: int
    m: int
    n: int
    k: int
    a_strides: tuple[int, int, int]
    b_strides: tuple[int, int, int]
    out: TensorArg
    epilogue: Epilogue = Epilogue()

    @property
    def dtype(self) -> str:
        return self.a.dtype

    @property
    def itemsize(self) -> int:
        return self.a.itemsize

    @property
    def shape(self) -> tuple[int, ...]:
        """The product's shape, which epilogue strides refer to."""
        return self.out.shape

    @property
    def a_k_major(self) -> bool:
        return self.k == 1 or self.a_strides[2] == 1

    @property
    def a_m_major(self) -> bool:
        return self.m == 1 or self.a_strides[1] == 1

    @property
    def b_k_major(self) -> bool:
        return self.k == 1 or self.b_strides[1] == 1

    @property
    def b_n_major(self) -> bool:
        return self.n == 1 or self.b_strides[2] == 1

    def a_vec(self) -> int:
        """Elements per chunk moving A's tiles: along K when A is K-major, else along M. Each
        chunk starts aligned wherever A does."""
        return max(vec_options(self.itemsize, *self.a_row_strides()))

    def b_vec(self) -> int:
        return max(vec_options(self.itemsize, *self.b_row_strides()))

    def a_row_strides(self) -> list[int]:
        """The strides between A's rows of contiguous elements (along M or K) and its batches."""
        return [s for s in (self.a_strides[0], self.a_strides[1 if self.a_k_major else 2]) if s]

    def b_row_strides(self) -> list[int]:
        return [s for s in (self.b_strides[0], self.b_strides[2 if self.b_k_major else 1]) if s]

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


def matrix(value: Any, what: str, ndim: int) -> TensorArg:
    if not isinstance(value, TensorArg):
        raise Declined(f"{what} is not a tensor")
    require_float(value)
    if value.ndim != ndim:
        raise Declined(f"{what} is {value.ndim}-d, not {ndim}-d")
    return value


def product_problem(op: str, args: Sequence[tuple[str, Any]], out: TensorArg) -> MatmulProblem:
    """The product of one ``mm``/``addmm``/``bmm`` call, its arguments given in schema order as
    (name in the plan, value); ``out`` is eager's result. addmm's ``beta * self + alpha * product``
    becomes its epilogue."""
    values = dict(args)
    names = [name for name, _ in args]
    if op == "aten.bmm.default":
        a, b = matrix(args[0][1], "the first batch", 3), matrix(args[1][1], "the second batch", 3)
        (batch, m, k), n = a.shape, b.shape[2]
        a_strides, b_strides = a.stride, b.stride
        a_name, b_name = names[0], names[1]
    else:
        first = 1 if op == "aten.addmm.default" else 0
        a, b = matrix(args[first][1], "the first matrix", 2), matrix(args[first + 1][1], "the second matrix", 2)
        (m, k), n, batch = a.shape, b.shape[1], 1
        a_strides, b_strides = (0, *a.stride), (0, *b.stride)
        a_name, b_name = names[first], names[first + 1]
    if a.dtype != b.dtype or out.dtype != a.dtype:
        raise Declined(f"mixed dtypes ({a.dtype}, {b.dtype} -> {out.dtype}) are not supported")
    if min(batch, m, n) == 0:
        raise Declined("the output is empty")
    if k == 0:
        raise Declined("the product sums over an empty dimension")
    if batch > 65535:
        raise Declined(f"{batch} batches exceed the grid's limit of 65535")
    problem = MatmulProblem(a_name, b_name, a, b, batch, m, n, k, normalize(a_strides, (batch, m, k)),
                            normalize(b_strides, (batch, k, n)), out)
    if op == "aten.addmm.default":
        problem = replace(problem, epilogue=addmm_epilogue(names[0], values[names[0]], values["beta"],
                                                           values["alpha"], out))
    return problem


def normalize(strides: Sequence[int], sizes: Sequence[int]) -> tuple[int, int, int]:
    """Strides with those of size-1 dimensions set to 0: they are never stepped along."""
    return tuple(0 if size == 1 else stride for stride, size in zip(strides, sizes))  # type: ignore[return-value]


def addmm_epilogue(bias_name: str, bias: Any, beta: Any, alpha: Any, out: TensorArg) -> Epilogue:
    """``beta * self + alpha * product`` in float, rounded once (as cuBLAS computes addmm); with
    ``beta`` 0 ``self`` is not read at all (eager ignores even its NaNs)."""
    for name, value in (("beta", beta), ("alpha", alpha)):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise Declined(f"{name}={value!r} is not a real number")
    scalars: list[EpilogueScalar] = []
    term = "v"
    if alpha != 1:
        scalars.append(EpilogueScalar("alpha"))
        term = "p0 * v"
    tensors: tuple[EpilogueInput, ...] = ()
    if beta != 0:
        tensor = matrix_bias(bias, out.dtype)
        tensors = (EpilogueInput(bias_name, tensor, broadcast_strides(tensor, out.shape)),)
        if beta != 1:
            scalars.append(EpilogueScalar("beta"))
            term += f" + p{len(scalars) - 1} * e0"
        else:
            term += " + e0"
    return Epilogue((EpilogueStep(term),) if term != "v" else (), tensors, tuple(scalars))


def matrix_bias(value: Any, dtype: str) -> TensorArg:
    if not isinstance(value, TensorArg):
        raise Declined("addmm's self is not a tensor")
    if value.dtype != dtype:
        raise Declined(f"addmm's self is {value.dtype}, the product {dtype}")
    return value


def fuse_epilogue(problem: MatmulProblem, ops: Sequence[EpilogueOp], out: TensorArg) -> MatmulProblem:
    """``problem`` followed by elementwise ``ops``, each on the previous result, writing ``out``
    (eager's result of the last op, of the product's shape). The product is rounded to its dtype
    first, and each op's result to its own, as eager stores every intermediate: this is how a
    fusion region (mm, then add, gelu, ...) becomes one matmul kernel.

    Declined where an op is not elementwise, does not take the running result, or reads a tensor
    of another dtype (eager would promote)."""
    if out.shape != problem.shape:
        raise Declined(f"the fused output {out.describe()} is not of the product's shape {list(problem.shape)}")
    require_float(out)
    epilogue = problem.epilogue
    steps = list(epilogue.steps) or [EpilogueStep("v")]
    steps[-1] = replace(steps[-1], rounds_to=problem.dtype)
    tensors, scalars = list(epilogue.tensors), list(epilogue.scalars)
    for op in ops:
        form = FORMS.get(op.op)
        if form is None or form.inplace or op.op == "aten._to_copy.default":
            raise Declined(f"{op.op} cannot be fused after a matrix product")
        bound = bind(op.op, list(op.args), dict(op.kwargs))
        values = list(bound.values())
        terms: list[str] = []
        raw: list[Any] = []
        for value in values[:form.operands]:
            if value is RESULT:
                terms.append("v")
                raw.append(None)
            elif isinstance(value, EpilogueInput):
                if value.tensor.dtype != problem.dtype:
                    raise Declined(f"{op.op} reads {value.tensor.describe()}, not {problem.dtype}")
                if len(value.strides) != len(problem.shape):
                    raise Declined(f"{value.name}'s strides do not cover the product's dimensions")
                tensors.append(value)
                terms.append(f"e{len(tensors) - 1}")
                raw.append(None)
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                scalars.append(EpilogueScalar(float(value)))
                terms.append(f"p{len(scalars) - 1}")
                raw.append(value)
            else:
                raise Declined(f"{op.op}: argument {value!r} is not the result, a tensor or a number")
        if terms.count("v") != 1:
            raise Declined(f"{op.op} does not take the running result exactly once")
        named: dict[str, str] = {}
        for keyword, position in form.named:
            value = values[position]
            if value != 1:
                scalars.append(EpilogueScalar(float(value)))
                named[keyword] = f"p{len(scalars) - 1}"
        if op.op.startswith("aten.gelu"):
            named["approximate"] = "tanh" if bound.get("approximate") == "tanh" else "erf"
        steps.append(EpilogueStep(form.expr(terms, raw, named), problem.dtype))
    steps[-1] = replace(steps[-1], rounds_to=None)  # the store rounds
    return replace(problem, out=out, epilogue=Epilogue(tuple(steps), tuple(tensors), tuple(scalars)))


def region_problem(card: OpCard) -> MatmulProblem:
    """A fusion region card that is a matrix product followed by elementwise ops, each on the
    previous result (a Linear layer's bias, activation, residual), as one problem: the product of
    region inputs, the ops as its epilogue (``fuse_epilogue``). Declined for any other region."""
    register_cards([card])
    call = read_call(card)
    nodes, inputs = card.region["nodes"], call.bound
    if not nodes or nodes[0]["op"] not in MATMUL_OPS:
        raise Declined("the region does not start with a matrix product")
    if list(card.region["outputs"]) != [node_name(len(nodes) - 1)]:
        raise Declined("the region's only output is not its last op's result")

    def region_input(spec: dict) -> str:
        if spec["v"] not in inputs:
            raise Declined(f"{spec['v']} is used beyond the op that follows it")
        return spec["v"]

    first = nodes[0]
    product = product_problem(first["op"], [
        (region_input(spec), inputs[spec["v"]]) if is_ref(spec) else (name, decode(spec, TensorArg.from_spec))
        for name, spec in bind(first["op"], first["args"], first["kwargs"]).items()], call.outputs[0])

    def argument(spec: Any, running: str) -> Any:
        if not is_ref(spec):
            return decode(spec, TensorArg.from_spec, make_list=list)
        if spec["v"] == running:
            return RESULT
        name = region_input(spec)
        return EpilogueInput(name, inputs[name], broadcast_strides(inputs[name], product.shape))

    ops = [EpilogueOp(node["op"], tuple(argument(a, node_name(i)) for a in node["args"]),
                      {k: argument(v, node_name(i)) for k, v in node["kwargs"].items()})
           for i, node in enumerate(nodes[1:])]
    return fuse_epilogue(product, ops, call.outputs[0])


# ----- variants and their spaces -----


def shared_limit(gpu: GpuInfo) -> int:
    return SHARED_BYTES.get(gpu.arch, SHARED_BYTES_ELSEWHERE)


def tiles(problem: MatmulProblem, bm: int, bn: int) -> int:
    return ceil_div(problem.m, bm) * ceil_div(problem.n, bn) * problem.batch


def split_ok(problem: MatmulProblem, bm: int, bn: int, bk: int, splits: int, gpu: GpuInfo) -> bool:
    """Split K only where the tiles alone leave SMs idle, into parts of at least two K steps."""
    if splits == 1:
        return True
    return tiles(problem, bm, bn) < sm_count(gpu) and ceil_div(problem.k, bk) >= 2 * splits


def default_splits(problem: MatmulProblem, bm: int, bn: int, bk: int, gpu: GpuInfo) -> int:
    """Enough splits to give every SM a block, as far as K allows."""
    splits = 1
    while (splits < MAX_SPLITS and tiles(problem, bm, bn) * splits * 2 <= sm_count(gpu)
           and split_ok(problem, bm, bn, bk, splits * 2, gpu)):
        splits *= 2
    return splits


def fits(size: int, tile: int, smallest: int) -> bool:
    """No tile wider than the problem needs (beyond the smallest tile)."""
    return tile <= max(smallest, pow2_ceil(size))


# Tiles the tensor-core variants start from, with their throughput relative to the largest
# (bigger tiles reuse each loaded element more often): a rough cost model for default points.
WGMMA_TILES = {(128, 256): 1.0, (128, 128): 0.9, (64, 256): 0.85, (64, 128): 0.75, (64, 64): 0.55}
MMA_TILES = {(128, 128): 1.0, (128, 64): 0.85, (64, 128): 0.85, (64, 64): 0.7}


def cheapest_tile(problem: MatmulProblem, options: dict[tuple[int, int], float], smallest: int,
                  gpu: GpuInfo) -> tuple[int, int]:
    """The tile that finishes first by waves of one block per SM: whole waves times each tile's
    work over its relative throughput. Tiles wider than the problem are left out (all of them
    left out, the space snaps the smallest to its nearest point)."""
    fitting = {(bm, bn): rate for (bm, bn), rate in options.items()
               if fits(problem.m, bm, smallest) and fits(problem.n, bn, smallest)}
    fitting = fitting or {min(options, key=lambda tile: tile[0] * tile[1]): 1.0}
    return min(fitting, key=lambda tile: ceil_div(tiles(problem, *tile), sm_count(gpu))
               * tile[0] * tile[1] / fitting[tile])


SPLIT_AXIS = Axis("splits", (1, 2, 4, 8, 16))


def gemv_space(problem: MatmulProblem, vec: int, gpu: GpuInfo) -> Space | None:
    chunks = problem.k // vec
    axes = (Axis("cols", (1, 2, 4, 8)), Axis("threads", (64, 128, 256, 512)), Axis("unroll", (1, 2, 4)))

    def valid(p: Params) -> bool:
        return (problem.m * p["cols"] <= 32 and p["unroll"] * p["cols"] <= 16
                and p["threads"] <= max(64, chunks) and p["cols"] <= max(1, pow2_ceil(problem.n)))

    threads = clamp(pow2_ceil(ceil_div(chunks, 8)), 64, 256)
    cols = 4
    while cols > 1 and ceil_div(problem.n, cols) * problem.batch < 4 * sm_count(gpu):
        cols //= 2
    default = {"cols": cols, "threads": threads, "unroll": 2 if chunks >= 4 * threads else 1}
    return Space.build(axes, valid, default, {"cols": 1, "threads": 128, "unroll": 1})


def wgmma_smem(p: Params) -> int:
    """Dynamic shared memory of a wgmma block: the buffers, 1024 bytes to align them, barriers."""
    return p["stages"] * (p["bm"] + p["bn"]) * WGMMA_BK * 2 + 1024 + 16 * p["stages"]


def wgmma_space(problem: MatmulProblem, gpu: GpuInfo) -> Space | None:
    axes = (Axis("bm", (64, 128)), Axis("bn", (64, 128, 256)), Axis("stages", (2, 3, 4, 5, 6)), SPLIT_AXIS)
    limit = shared_limit(gpu)

    def valid(p: Params) -> bool:
        return (fits(problem.m, p["bm"], 64) and fits(problem.n, p["bn"], 64) and wgmma_smem(p) <= limit
                and split_ok(problem, p["bm"], p["bn"], WGMMA_BK, p["splits"], gpu))

    bm, bn = cheapest_tile(problem, WGMMA_TILES, 64, gpu)
    stages = 4 if (bm + bn) * WGMMA_BK * 2 * 4 + 2048 <= limit else 3
    default = {"bm": bm, "bn": bn, "stages": stages,
               "splits": default_splits(problem, bm, bn, WGMMA_BK, gpu)}
    return Space.build(axes, valid, default, {"bm": 64, "bn": 64, "stages": 4, "splits": 1})


def mma_smem(problem: MatmulProblem, p: Params) -> int:
    a = p["bm"] * (p["bk"] + 8) if problem.a_k_major else p["bk"] * (p["bm"] + 8)
    b = p["bn"] * (p["bk"] + 8) if problem.b_k_major else p["bk"] * (p["bn"] + 8)
    return p["stages"] * (a + b) * problem.itemsize


def mma_space(problem: MatmulProblem, gpu: GpuInfo) -> Space | None:
    axes = (Axis("bm", (16, 32, 64, 128, 256)), Axis("bn", (32, 64, 128, 256)), Axis("bk", (32, 64)),
            Axis("warps_m", (1, 2, 4)), Axis("warps_n", (1, 2, 4)), Axis("stages", (2, 3, 4)), SPLIT_AXIS)
    limit = shared_limit(gpu)

    def valid(p: Params) -> bool:
        wm, wn = p["bm"] // p["warps_m"], p["bn"] // p["warps_n"]
        return (wm >= 16 and wm % 16 == 0 and wn >= 16 and wn % 16 == 0
                and (wm // 16) * (wn // 8) * 4 <= MAX_ACCUMULATORS
                and fits(problem.m, p["bm"], 16) and fits(problem.n, p["bn"], 32)
                and mma_smem(problem, p) <= limit
                and split_ok(problem, p["bm"], p["bn"], p["bk"], p["splits"], gpu))

    if problem.m >= 64:
        bm, bn = cheapest_tile(problem, MMA_TILES, 32, gpu)
        default = {"bm": bm, "bn": bn, "bk": 32, "warps_m": 2, "warps_n": 2, "stages": 4}
    else:
        bm = max(16, pow2_ceil(problem.m))
        default = {"bm": bm, "bn": 128 if problem.n >= 128 else 64, "bk": 64, "warps_m": 1,
                   "warps_n": 4, "stages": 4}
    default["splits"] = default_splits(problem, default["bm"], default["bn"], default["bk"], gpu)
    safe = {"bm": 64, "bn": 64, "bk": 32, "warps_m": 2, "warps_n": 2, "stages": 2, "splits": 1}
    return Space.build(axes, valid, default, safe)


def simt_space(problem: MatmulProblem) -> Space | None:
    axes = (Axis("bm", (16, 32, 64, 128)), Axis("bn", (16, 32, 64, 128)), Axis("tm", (1, 2, 4, 8)),
            Axis("tn", (2, 4, 8)))

    def valid(p: Params) -> bool:
        threads = (p["bm"] // p["tm"]) * (p["bn"] // p["tn"])
        return (p["tm"] <= p["bm"] and p["tn"] <= p["bn"] and 32 <= threads <= 256 and threads % 32 == 0
                and fits(problem.m, p["bm"], 16) and fits(problem.n, p["bn"], 16))

    default = {"bm": clamp(pow2_ceil(problem.m), 16, 64), "bn": 64, "tm": 4, "tn": 4}
    return Space.build(axes, valid, default, {"bm": 32, "bn": 32, "tm": 2, "tn": 2})


# ----- rendering -----


def problem_struct(problem: MatmulProblem, splits: int) -> str:
    p = problem
    index = index_type(max_offset(p.a), max_offset(p.b), splits * p.batch * p.m * p.n)
    return (
        "struct Problem {\n"
        f"  using Index = {index};\n"
        f"  static constexpr int BATCH = {p.batch}, M = {p.m}, N = {p.n}, K = {p.k};\n"
        f"  static constexpr Index A_B = {p.a_strides[0]}, A_M = {p.a_strides[1]}, A_K = {p.a_strides[2]};\n"
        f"  static constexpr Index B_B = {p.b_strides[0]}, B_K = {p.b_strides[1]}, B_N = {p.b_strides[2]};\n"
        f"  static constexpr bool A_K_MAJOR = {cuda_bool(p.a_k_major)}, B_K_MAJOR = {cuda_bool(p.b_k_major)};\n"
        "};\n")


def pair_bytes(problem: MatmulProblem) -> int:
    """Bytes of the two neighbouring outputs ``store2`` writes as one access where the output's
    layout keeps every even column at an even element offset (0: it never does)."""
    p, out = problem, problem.out
    paired = len(p.shape) == len(out.stride) and out.stride[-1] == 1 and all(
        size == 1 or stride % 2 == 0 for size, stride in zip(out.shape[:-1], out.stride[:-1]))
    return 2 * out.itemsize if paired else 0


def epilogue_struct(problem: MatmulProblem) -> str:
    """``Epilogue<PAIRED>``: the output pointer, the tensors and scalars the fused steps read,
    and store/store2 of a float result at (b, m, n) of the product. ``store2`` writes its two
    outputs as one access only where ``PAIRED`` (the output pointer aligned to the pair: a
    kernel's scalar twin, for misaligned pointers, stores them one by one)."""
    p, ep, out = problem, problem.epilogue, problem.out
    coords = ["b", "m", "n"] if len(p.shape) == 3 else ["m", "n"]
    index = index_type(max_offset(out), *(max_offset(t.tensor) for t in ep.tensors))
    lines = [f"    const float e{j} = kf::to_float(t{j}[{linear_code(coords, t.strides)}]);"
             for j, t in enumerate(ep.tensors)]
    for step in ep.steps:
        if step.expr != "v":
            lines.append(f"    v = {step.expr};")
        if step.rounds_to in ("bfloat16", "float16"):
            lines.append(f"    v = kf::round_through<{FLOAT_CTYPES[step.rounds_to]}>(v);")
    paired = pair_bytes(problem) > 0
    store2 = ("    if (m >= Problem::M || n >= Problem::N) return;\n"
              "    if (PAIRED && n + 1 < Problem::N) {\n"
              f"      kf::Pack<{out.ctype}, 2> pack;\n"
              f"      pack.v[0] = kf::from_float<{out.ctype}>(apply(v0, b, m, n));\n"
              f"      pack.v[1] = kf::from_float<{out.ctype}>(apply(v1, b, m, n + 1));\n"
              f"      *reinterpret_cast<kf::Pack<{out.ctype}, 2>*>(out + offset(b, m, n)) = pack;\n"
              "    } else if (n + 1 < Problem::N) {\n"
              "      const Index at = offset(b, m, n);\n"
              f"      out[at] = kf::from_float<{out.ctype}>(apply(v0, b, m, n));\n"
              f"      out[at + 1] = kf::from_float<{out.ctype}>(apply(v1, b, m, n + 1));\n"
              "    } else {\n"
              "      store(b, m, n, v0);\n"
              "    }\n") if paired else "    store(b, m, n, v0);\n    store(b, m, n + 1, v1);\n"
    return (
        "template <bool PAIRED>\nstruct Epilogue {\n"
        f"  using Index = {index};\n"
        f"  {out.ctype}* __restrict__ out;\n"
        + "".join(f"  const {t.tensor.ctype}* __restrict__ t{j};\n" for j, t in enumerate(ep.tensors))
        + "".join(f"  float p{i};\n" for i in range(len(ep.scalars)))
        + "  __device__ __forceinline__ Index offset(int b, int m, int n) const {\n"
        f"    return {linear_code(coords, out.stride)};\n  }}\n"
        "  __device__ __forceinline__ float apply(float v, int b, int m, int n) const {\n"
        + "".join(f"{line}\n" for line in lines)
        + "    return v;\n  }\n"
        "  __device__ __forceinline__ void store(int b, int m, int n, float v) const {\n"
        "    if (m < Problem::M && n < Problem::N)\n"
        f"      out[offset(b, m, n)] = kf::from_float<{out.ctype}>(apply(v, b, m, n));\n  }}\n"
        "  __device__ __forceinline__ void store2(int b, int m, int n, float v0, float v1) const {\n"
        + store2 + "  }\n};\n")


def wgmma_struct(bn: int, ctype: str) -> str:
    """``Mma::mma``: one m64n<bn>k16 wgmma of K-major shared tiles into bn / 2 float registers."""
    count = bn // 2
    kind = {"__nv_bfloat16": "bf16", "__half": "f16"}[ctype]
    regs = ", ".join(f"%{i}" for i in range(count))
    outputs = ", ".join(f'"+f"(d[{i}])' for i in range(count))
    return (
        "struct Mma {\n"
        f"  static __device__ __forceinline__ void mma(float (&d)[{count}], uint64_t desc_a, uint64_t desc_b) {{\n"
        '    asm volatile("{\\n .reg .pred p;\\n setp.ne.b32 p, %' f"{count + 2}" ', 0;\\n"\n'
        f'                 " wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{kind}.{kind} "\n'
        f'                 "{{{regs}}}, %{count}, %{count + 1}, p, 1, 1, 0, 0;\\n}}\\n"\n'
        f"                 : {outputs}\n"
        '                 : "l"(desc_a), "l"(desc_b), "n"(1));\n'
        "  }\n};\n")


@dataclass(frozen=True)
class MatmulLaunch:
    """What a variant's main kernel needs from the plan: grid, block, dynamic shared memory, the
    template call (given whether copies may be asynchronous) and the alignment its vector copies
    need (0: none)."""

    grid: tuple[int, int, int]
    block: int
    shared: int
    call: Any
    align: int


class Matmul(Family):
    name = "matmul"
    ops = MATMUL_OPS
    cuda_files = ("elementwise.cu", "matmul_smem.cuh", "matmul.cu", "matmul_sm90.cu")
    reference = "simt"

    def analyze(self, call: Call) -> MatmulProblem:
        return product_problem(call.op, list(call.bound.items()), call.outputs[0])

    def variants(self, problem: MatmulProblem, gpu: GpuInfo) -> list[Variant]:
        half = problem.dtype in HALF_DTYPES
        variants = [self.gemv(problem, gpu)]
        if not half:
            why = f"{problem.dtype} is computed exactly on CUDA cores (no TF32), as eager does"
            variants += [Variant("wgmma", "", why_not=why), Variant("mma", "", why_not=why)]
        else:
            variants += [self.wgmma(problem, gpu), self.mma(problem, gpu)]
        variants.append(Variant("simt", "CUDA-core tiles through shared memory, any dtype and "
                                        "layout (reference)", simt_space(problem)))
        return variants

    def gemv(self, problem: MatmulProblem, gpu: GpuInfo) -> Variant:
        if problem.m > GEMV_MAX_ROWS:
            return Variant("gemv", "", why_not=f"{problem.m} rows: more than {GEMV_MAX_ROWS}")
        if not (problem.a_k_major and problem.b_k_major):
            return Variant("gemv", "", why_not="an operand is not contiguous along K")
        vec = self.gemv_vec(problem)
        return Variant("gemv", "the weight read once with vector loads, a few rows per block "
                               "(decode)", gemv_space(problem, vec, gpu))

    @staticmethod
    def gemv_vec(problem: MatmulProblem) -> int:
        """Elements per load: a whole number of them per row of K, each starting aligned."""
        counts = [problem.k, *problem.a_row_strides(), *problem.b_row_strides()]
        return max(vec_options(problem.itemsize, *counts))

    def wgmma(self, problem: MatmulProblem, gpu: GpuInfo) -> Variant:
        if gpu.arch != "sm_90":
            return Variant("wgmma", "", why_not=f"wgmma needs an sm_90 GPU, not {gpu.arch}")
        if not (problem.a_k_major and problem.b_k_major):
            return Variant("wgmma", "", why_not="an operand is not K-major")
        return Variant("wgmma", "Hopper warpgroup MMA on swizzled shared tiles, a producer "
                                "warpgroup copying with cp.async", wgmma_space(problem, gpu))

    def mma(self, problem: MatmulProblem, gpu: GpuInfo) -> Variant:
        if not ((problem.a_k_major or problem.a_m_major) and (problem.b_k_major or problem.b_n_major)):
            return Variant("mma", "", why_not="an operand is contiguous along neither of its dimensions")
        return Variant("mma", "mma.sync tensor cores, ldmatrix from a cp.async pipeline",
                       mma_space(problem, gpu))

    def render(self, problem: MatmulProblem, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
        p, ep, out = problem, problem.epilogue, problem.out
        splits = params.get("splits", 1)
        main = {"gemv": self._gemv, "wgmma": self._wgmma, "mma": self._mma, "simt": self._simt}[approach]
        spec = main(problem, params)
        t = p.a.ctype
        operands = [f"const {t}* __restrict__ a", f"const {t}* __restrict__ b"]
        tensors_c = [f"const {e.tensor.ctype}* __restrict__ t{j}" for j, e in enumerate(ep.tensors)]
        scalars_c = [f"float p{i}" for i in range(len(ep.scalars))]
        members = ", ".join(["out", *(f"t{j}" for j in range(len(ep.tensors))),
                             *(f"p{i}" for i in range(len(ep.scalars)))])

        def epilogue(paired: bool) -> str:
            return f"Epilogue<{cuda_bool(paired)}>{{{members}}}"

        tensor_params = [ptr(e.name) for e in ep.tensors]
        scalar_params = [f32(s.value) for s in ep.scalars]
        source = problem_struct(p, splits) + epilogue_struct(p)
        if approach == "wgmma":
            source += wgmma_struct(params["bn"], t)
        twin = 2 if spec.align else 1  # entry_points writes a scalar twin for widths above 1
        if splits == 1:
            params_c = [*operands, *tensors_c, f"{out.ctype}* __restrict__ out", *scalars_c]
            # A kernel with a twin runs where every pointer is aligned to its copies and to
            # store2's pairs, the twin elsewhere (pairs stored one by one); one without a twin
            # sees production's placement, 16 bytes at least.
            source += entry_points("mm", twin, spec.block, params_c,
                                   lambda width: spec.call(width > 1,
                                                           epilogue(width > 1 or not spec.align)))
            launches = [self._launch("mm", spec, [ptr(p.a_name), ptr(p.b_name), *tensor_params,
                                                  ptr("out"), *scalar_params],
                                     max(spec.align, pair_bytes(p)) if spec.align else 0)]
            scratch = []
        else:
            partials = ("kf::mm::Partials<Problem>{ws + int64_t(blockIdx.y) * Problem::BATCH * "
                        "Problem::M * Problem::N}")
            source += entry_points("mm", twin, spec.block, [*operands, "float* __restrict__ ws"],
                                   lambda width: spec.call(width > 1, partials))
            total = p.batch * p.m * p.n
            source += entry_points(
                "mm_reduce", 1, REDUCE_BLOCK,
                ["const float* __restrict__ ws", *tensors_c, f"{out.ctype}* __restrict__ out", *scalars_c],
                lambda _: f"kf::mm::mm_reduce<Problem, {splits}>(ws, {epilogue(False)})")
            launches = [self._launch("mm", spec, [ptr(p.a_name), ptr(p.b_name), ptr("partials")]),
                        launch("mm_reduce", ceil_div(total, REDUCE_BLOCK), REDUCE_BLOCK,
                               [ptr("partials"), *tensor_params, ptr("out"), *scalar_params])]
            scratch = [{"name": "partials", "bytes": splits * total * 4, "zero": False}]
        plan: dict = {"outputs": [new_output("out", out)], "launches": launches}
        if scratch:
            plan["scratch"] = scratch
        options = (ARCH_SPECIFIC,) if approach == "wgmma" else ()
        return Kernel(source, plan, nvrtc_options=options)

    @staticmethod
    def _launch(name: str, spec: MatmulLaunch, params: list[dict],
                align: int | None = None) -> dict:
        """The main kernel's launch, its twin taking pointers that miss ``align`` (by default
        what its copies need; 0: no twin)."""
        align = spec.align if align is None else align
        # launch() asks for the alignment as a vector width times an item size.
        entry = launch(name, spec.grid, spec.block, params, 2 if align else 1, align // 2)
        if spec.shared:
            entry["shared_mem"] = spec.shared
        return entry

    def _gemv(self, p: MatmulProblem, params: Params) -> MatmulLaunch:
        vec = self.gemv_vec(p)
        cols, threads, unroll = params["cols"], params["threads"], params["unroll"]
        head = f"kf::mm::mm_gemv<Problem, {cols}, {threads}, {vec}, {unroll}"
        return MatmulLaunch((ceil_div(p.n, cols), 1, p.batch), threads, 0,
                      lambda packed, sink: f"{head}, {cuda_bool(packed)}>(a, b, {sink})",
                      vec * p.itemsize if vec > 1 else 0)

    def _simt(self, p: MatmulProblem, params: Params) -> MatmulLaunch:
        bm, bn, tm, tn = params["bm"], params["bn"], params["tm"], params["tn"]
        return MatmulLaunch((ceil_div(p.m, bm) * ceil_div(p.n, bn), 1, p.batch),
                            (bm // tm) * (bn // tn), 0,
                            lambda _, sink: f"kf::mm::mm_simt<Problem, {bm}, {bn}, {tm}, {tn}>"
                                            f"(a, b, {sink})", 0)

    def _mma(self, p: MatmulProblem, params: Params) -> MatmulLaunch:
        bm, bn = params["bm"], params["bn"]
        va, vb = p.a_vec(), p.b_vec()
        head = (f"kf::mm::mm_mma<Problem, {bm}, {bn}, {params['bk']}, {params['warps_m']}, "
                f"{params['warps_n']}, {params['stages']}, {params['splits']}, {va}, {vb}")
        return MatmulLaunch((ceil_div(p.m, bm) * ceil_div(p.n, bn), params["splits"], p.batch),
                      32 * params["warps_m"] * params["warps_n"], mma_smem(p, params),
                      lambda copies, sink: f"{head}, {cuda_bool(copies)}>(a, b, {sink})",
                      self._copy_align(p, va, vb))

    def _wgmma(self, p: MatmulProblem, params: Params) -> MatmulLaunch:
        bm, bn = params["bm"], params["bn"]
        va, vb = p.a_vec(), p.b_vec()
        head = (f"kf::mm::mm_wgmma<Problem, Mma, {bn}, {bm // 64}, {params['stages']}, "
                f"{params['splits']}, {va}, {vb}")
        return MatmulLaunch((ceil_div(p.m, bm) * ceil_div(p.n, bn), params["splits"], p.batch),
                      128 * (1 + bm // 64), wgmma_smem(params),
                      lambda copies, sink: f"{head}, {cuda_bool(copies)}>(a, b, {sink})",
                      self._copy_align(p, va, vb))

    @staticmethod
    def _copy_align(p: MatmulProblem, va: int, vb: int) -> int:
        """Bytes every pointer must be aligned to for the widest asynchronous copy (0: none)."""
        widest = max(v * p.itemsize for v in (va, vb))
        return widest if widest >= 4 else 0

