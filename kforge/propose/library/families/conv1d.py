"""Depthwise 1-d convolution: ``aten.convolution`` with ``groups`` equal to the channels and one
filter per channel (the short causal convolutions of linear-attention layers), for inputs laid
out as [N, C, L] or channels-fastest (a transposed [N, L, C] view).

Parameters: ``direct`` takes ``block`` and ``unroll`` (outputs per thread); ``tiled`` takes
``tile_c`` x ``tile_l`` outputs per block and ``block`` threads.
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge.core.gpu import GpuInfo
from kforge.propose.library.cards import Call, Declined, TensorArg
from kforge.propose.library.families.base import (
    SHARED_FLOATS,
    Affine,
    Family,
    Kernel,
    Variant,
    cuda_bool,
    entry_points,
    launch,
    new_output,
    ptr,
)
from kforge.propose.library.families.pool import window_space
from kforge.propose.library.layout import (
    coords_code,
    index_type,
    linear_code,
    max_offset,
)
from kforge.propose.library.space import Axis, Params, Space, ceil_div, powers_of_two

GRID_LIMIT_YZ = 65535


@dataclass(frozen=True)
class ConvProblem:
    call: Call
    x: TensorArg
    weight: TensorArg
    bias: TensorArg | None
    out: TensorArg
    stride: int
    padding: int
    dilation: int

    @property
    def taps(self) -> int:
        return self.weight.shape[-1]

    def span(self, tile_l: int) -> int:
        """Input elements a tile of ``tile_l`` outputs reads."""
        return (tile_l - 1) * self.stride + (self.taps - 1) * self.dilation + 1


def single(value: list[int], what: str) -> int:
    if len(value) != 1:
        raise Declined(f"{what} {value} is not one-dimensional")
    return value[0]


class DepthwiseConv1d(Family):
    name = "depthwise_conv1d"
    ops = ("aten.convolution.default",)
    cuda_files = ("conv1d.cu",)
    reference = "direct"

    def analyze(self, call: Call) -> ConvProblem:
        x, weight = call.float_tensor(0, "the input"), call.float_tensor(1, "the weight")
        if call.value(6):
            raise Declined("transposed convolutions are not supported")
        if x.ndim != 3 or weight.ndim != 3:
            raise Declined("only 1-d convolutions over [N, C, L] inputs are supported")
        channels, groups = x.shape[1], call.value(8)
        if groups != channels or weight.shape[:2] != (channels, 1):
            raise Declined(f"not a depthwise convolution (groups {groups}, {channels} channels, "
                           f"weight {weight.shape})")
        bias = Affine.read(call, 1, 2).bias  # a packed weight, and bias of its dtype
        out = call.outputs[0]
        if out.numel == 0:
            raise Declined("the output is empty")
        if any(p != 0 for p in call.value(7) or []):
            raise Declined("output padding is not supported")
        return ConvProblem(call, x, weight, bias, out, single(call.value(3), "stride"),
                           single(call.value(4), "padding"), single(call.value(5), "dilation"))

    def variants(self, problem: ConvProblem, gpu: GpuInfo) -> list[Variant]:
        direct = Variant("direct", "one output per thread in the output's memory order (reference)",
                         window_space(problem.out.numel))
        n, channels = problem.out.shape[:2]
        axes = (Axis("tile_c", powers_of_two(4, 64)), Axis("tile_l", powers_of_two(16, 256)),
                Axis("block", powers_of_two(64, 512)))

        def valid(p: Params) -> bool:
            return (p["tile_c"] * (problem.span(p["tile_l"]) | 1) <= SHARED_FLOATS
                    and p["block"] <= p["tile_c"] * p["tile_l"]
                    and ceil_div(channels, p["tile_c"]) <= GRID_LIMIT_YZ)

        tiled_space = Space.build(axes, valid, {"tile_c": 64, "tile_l": 64, "block": 256},
                                  {"tile_c": 16, "tile_l": 64, "block": 128})
        if n > GRID_LIMIT_YZ or tiled_space is None:
            return [direct, Variant("tiled", "", why_not="the batch or tile does not fit the grid")]
        tiled = Variant("tiled", "input tile staged in shared memory: loads and stores both along "
                                 "packed dimensions", tiled_space)
        channels_fastest = problem.x.stride[1] < problem.x.stride[2]
        return [tiled, direct] if channels_fastest else [direct, tiled]

    def render(self, problem: ConvProblem, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
        x, w, out = problem.x, problem.weight, problem.out
        has_bias = problem.bias is not None
        split, coords = coords_code(out.shape, out.stride)
        index = index_type(max_offset(x), max_offset(out))
        geometry = (
            "struct Geometry {\n"
            f"  using Index = {index};\n"
            f"  static constexpr Index NUMEL = {out.numel};\n"
            f"  static constexpr int C = {x.shape[1]}, L = {x.shape[2]}, LOUT = {out.shape[2]}, "
            f"K = {problem.taps}, S = {problem.stride}, P = {problem.padding}, DIL = {problem.dilation};\n"
            f"  static constexpr Index XN = {x.stride[0]}, XC = {x.stride[1]}, XL = {x.stride[2]};\n"
            f"  static constexpr Index YN = {out.stride[0]}, YC = {out.stride[1]}, YL = {out.stride[2]};\n"
            f"  static constexpr bool IN_C_FASTEST = {cuda_bool(x.stride[1] < x.stride[2])}, "
            f"OUT_C_FASTEST = {cuda_bool(out.stride[1] < out.stride[2])};\n"
            "  static __device__ __forceinline__ void split(Index e, Index& n, Index& c, Index& l,\n"
            "                                               Index& out) {\n"
            + "".join(f"    {line}\n" for line in split.splitlines())
            + f"    n = {coords[0]};\n    c = {coords[1]};\n    l = {coords[2]};\n"
            f"    out = {linear_code(coords, out.stride)};\n  }}\n}};\n\n")
        wt = w.ctype
        signature = [f"const {x.ctype}* __restrict__ x", f"const {wt}* __restrict__ w",
                     *([f"const {wt}* __restrict__ bias"] if has_bias else []),
                     f"{out.ctype}* __restrict__ y"]
        args = f"x, w, {'bias' if has_bias else 'nullptr'}, y"
        if approach == "tiled":
            tc, tl, block = params["tile_c"], params["tile_l"], params["block"]
            body = (f"conv1d_tiled<Geometry, {x.ctype}, {wt}, {cuda_bool(has_bias)}, {tc}, {tl}, "
                    f"{block}>({args})")
            grid = (ceil_div(out.shape[2], tl), ceil_div(out.shape[1], tc), out.shape[0])
        else:
            block = params["block"]
            body = f"conv1d_direct<Geometry, {x.ctype}, {wt}, {cuda_bool(has_bias)}, {params['unroll']}>({args})"
            grid = (ceil_div(out.numel, block * params["unroll"]),)
        call = problem.call
        tensors = [call.arg_name(0), call.arg_name(1)] + ([call.arg_name(2)] if has_bias else [])
        plan = {"outputs": [new_output("out", out)],
                "launches": [launch("conv1d", grid, block, [*map(ptr, tensors), ptr("out")])]}
        return Kernel(geometry + entry_points("conv1d", 1, block, signature, lambda _: body), plan)
