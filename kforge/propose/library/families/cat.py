"""Concatenation (``aten.cat``): every input copied bit for bit into its slice of eager's output, in
one launch, for any dtype and any strides (transposed and sliced views, as rotary embeddings and
attention caches produce them). Inputs eager skips (1-d and empty) take no part. ``aten.clone``
(a strided view made contiguous, or copied in its own layout) is the concatenation of one input.

Parameters: ``block`` (threads), ``vec`` (the widest access, elements; each input uses the widest
its layout allows up to it) and ``unroll`` (groups per thread, all loaded before any is stored).
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge.core.gpu import GpuInfo
from kforge.propose.library.cards import Call, Declined, TensorArg
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
)
from kforge.propose.library.families.elementwise import (
    MAX_THREAD_OUTPUTS,
    THREADS_PER_SM,
)
from kforge.propose.library.layout import Iteration, index_type, iteration, offsets_code
from kforge.propose.library.space import (
    Axis,
    Params,
    Space,
    ceil_div,
    pow2_ceil,
    powers_of_two,
)

# Elements are copied as unsigned integers of their size: any dtype, bit for bit.
BIT_CTYPES = {1: "uint8_t", 2: "uint16_t", 4: "uint32_t", 8: "uint64_t"}
MAX_PIECES = 64


@dataclass(frozen=True)
class CatPiece:
    """One input: its position in the list, its loop nest (strides of the output, then of the
    input) and where its slice of the output starts."""

    position: int
    tensor: TensorArg
    it: Iteration
    out_offset: int

    def widest(self, itemsize: int) -> int:
        """The widest access (elements, 16 bytes at most) the layout allows on both sides: packed
        innermost, every stride and the slice's start a multiple."""
        it = self.it
        if it.strides[0][-1] != 1 or it.strides[1][-1] != 1:
            return 1
        counts = [it.sizes[-1], self.out_offset, *it.strides[0][:-1], *it.strides[1][:-1]]
        return max(v for v in (1, 2, 4, 8, 16) if v * itemsize <= 16 and all(c % v == 0 for c in counts))


@dataclass(frozen=True)
class CatProblem:
    call: Call
    out: TensorArg
    pieces: tuple[CatPiece, ...]

    @property
    def ctype(self) -> str:
        return BIT_CTYPES[self.out.itemsize]


class Cat(Family):
    name = "cat"
    ops = ("aten.cat.default", "aten.clone.default")
    cuda_files = ("cat.cu",)
    reference = "copy"

    def analyze(self, call: Call) -> CatProblem:
        clone = call.op == "aten.clone.default"
        tensors, out = ([call.value(0)] if clone else call.value(0)), call.outputs[0]
        if not all(isinstance(t, TensorArg) for t in tensors):
            raise Declined("an input is not a tensor")
        if any(t.dtype != out.dtype for t in tensors):
            raise Declined("inputs of different dtypes are promoted, which is not supported")
        if out.itemsize not in BIT_CTYPES:
            raise Declined(f"elements of {out.itemsize} bytes are not supported")
        if out.numel == 0:
            raise Declined("the output is empty")
        dim = 0 if clone or out.ndim == 0 else call.value(1) % out.ndim
        pieces, start = [], 0
        for position, t in enumerate(tensors):
            if t.numel == 0:  # eager skips these (and 1-d [0] tensors altogether)
                start += t.shape[dim] if t.ndim == out.ndim else 0
                continue
            it = iteration(t.shape, [out.stride, t.stride])
            pieces.append(CatPiece(position, t, it, start * out.stride[dim] if out.ndim else 0))
            start += t.shape[dim] if t.ndim else 0
        if len(pieces) > MAX_PIECES:
            raise Declined(f"{len(pieces)} inputs are more than the {MAX_PIECES} supported")
        return CatProblem(call, out, tuple(pieces))

    def variants(self, problem: CatProblem, gpu: GpuInfo) -> list[Variant]:
        itemsize = problem.out.itemsize
        widest = max(p.widest(itemsize) for p in problem.pieces)
        vecs = tuple(v for v in (1, 2, 4, 8, 16) if v <= widest)
        numel = problem.out.numel
        axes = (Axis("block", powers_of_two(64, 1024)), Axis("vec", vecs), Axis("unroll", (1, 2, 4, 8)))

        def valid(p: Params) -> bool:
            return (p["vec"] * p["unroll"] <= MAX_THREAD_OUTPUTS
                    and (p["block"] == 64 or p["block"] <= pow2_ceil(numel // p["vec"])))

        waves = numel / widest / (sm_count(gpu) * THREADS_PER_SM)
        default = {"block": 256, "vec": widest, "unroll": 4 if waves >= 4 else 2 if waves >= 2 else 1}
        return [Variant("copy", "every input copied to its slice in one launch, each block within "
                                "one input, vector accesses where both layouts allow (reference)",
                        Space.build(axes, valid, default, {"block": 128, "vec": 1, "unroll": 1}))]

    def render(self, problem: CatProblem, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
        t, out = problem.ctype, problem.out
        block, unroll = params["block"], params["unroll"]
        parts, calls, first, align = [], [], 0, 1
        for n, piece in enumerate(problem.pieces):
            vec = min(params["vec"], piece.widest(out.itemsize))
            align = max(align, vec)
            index = index_type(piece.tensor.numel, *(
                1 + sum((size - 1) * s for size, s in zip(piece.it.sizes, strides))
                for strides in piece.it.strides))
            parts.append(f"struct Piece{n} {{\n  using Index = {index};\n"
                         f"  static constexpr Index NUMEL = {piece.tensor.numel};\n"
                         "  static __device__ __forceinline__ void offsets(Index e, Index& o, Index& i) {\n"
                         + "".join(f"    {line}\n" for line in
                                   offsets_code(piece.it, ["o", "i"], "Index").splitlines())
                         + "  }\n};\n")
            blocks = ceil_div(piece.tensor.numel // vec, block * unroll)
            calls.append(f"  if (b < {first + blocks}) {{\n"
                         f"    cat_piece<Piece{n}, {t}, {vec}, {unroll}, PACKED>(out + {piece.out_offset}, "
                         f"in{n}, b - {first});\n    return;\n  }}\n")
            first += blocks
        inputs_c = [f"const {t}* __restrict__ in{n}" for n in range(len(problem.pieces))]
        body = ("template <bool PACKED>\n__device__ __forceinline__ void cat_body("
                + ", ".join([f"{t}* __restrict__ out", *inputs_c]) + ") {\n"
                "  const int64_t b = blockIdx.x;\n" + "".join(calls) + "}\n")
        args = ", ".join(["out", *(f"in{n}" for n in range(len(problem.pieces)))])
        source = "\n".join(parts) + "\n" + body + "\n" + entry_points(
            "cat", align, block, [f"{t}* __restrict__ out", *inputs_c],
            lambda v: f"cat_body<{cuda_bool(v > 1)}>({args})")
        name = problem.call.arg_name(0)
        pointers = [ptr("out"), *(ptr(f"{name}[{p.position}]") if problem.call.op == "aten.cat.default"
                                  else ptr(name) for p in problem.pieces)]
        plan = {"outputs": [new_output("out", out)],
                "launches": [launch("cat", first, block, pointers, align, out.itemsize)]}
        return Kernel(source, plan)
