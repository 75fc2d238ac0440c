"""Pooling: ``aten._adaptive_avg_pool2d`` (any output size; a 1x1 output also gets the reduction
kernels) and ``aten.max_pool2d_with_indices`` (values and int64 indices, eager's NaN and padding
rules), for contiguous and channels-last inputs.

Window kernels take one output per thread, in the output's memory order: ``block`` threads and
``unroll`` outputs per thread. max_pool's ``unrolled`` variant unrolls the window's taps at compile
time and gives each thread ``outputs`` neighbours along the output's innermost dimension (W, or
the channels of a channels-last tensor), stored as vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge.core.gpu import GpuInfo
from kforge.propose.library.cards import Call, Declined, TensorArg, require_float
from kforge.propose.library.families.base import (
    Family,
    Kernel,
    Variant,
    cuda_bool,
    entry_points,
    launch,
    new_output,
    ptr,
)
from kforge.propose.library.families.reduce import (
    ReduceProblem,
    reduce_problem,
    reduce_variants,
    render_reduce,
)
from kforge.propose.library.layout import (
    coords_code,
    index_type,
    linear_code,
    max_offset,
)
from kforge.propose.library.space import (
    Axis,
    Params,
    Space,
    ceil_div,
    pow2_ceil,
    powers_of_two,
)


@dataclass(frozen=True)
class PoolProblem:
    """adaptive average pooling over the last two dimensions; ``global_`` when the output is
    1x1 and the reduction kernels apply."""

    call: Call
    x: TensorArg
    out: TensorArg
    global_: ReduceProblem | None


class AdaptiveAvgPool(Family):
    name = "adaptive_avg_pool2d"
    ops = ("aten._adaptive_avg_pool2d.default",)
    cuda_files = ("reduce.cu", "pool.cu")
    reference = "window"

    def analyze(self, call: Call) -> PoolProblem:
        x, out = pooled_input(call), call.outputs[0]
        require_float(out)
        global_ = None
        if tuple(out.shape[-2:]) == (1, 1):
            global_ = reduce_problem(call, x, out, {x.ndim - 2, x.ndim - 1}, keepdim=True, mean=True)
        return PoolProblem(call, x, out, global_)

    def variants(self, problem: PoolProblem, gpu: GpuInfo) -> list[Variant]:
        window = Variant("window", "one thread per output averages its window (reference)",
                         window_space(problem.out.numel))
        if problem.global_ is None:
            return [window]
        return [*reduce_variants(problem.global_, gpu), window]

    def render(self, problem: PoolProblem, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
        if approach != "window":
            assert problem.global_ is not None
            return render_reduce(problem.global_, approach, params)
        x, out = problem.x, problem.out
        geometry = window_geometry(x, out, OH=out.shape[-2], OW=out.shape[-1])
        return render_window(
            problem.call, "adaptive_avg_pool", geometry, params,
            [f"const {x.ctype}* __restrict__ x", f"{out.ctype}* __restrict__ y"],
            f"adaptive_avg_pool_window<Geometry, {x.ctype}, {params['unroll']}>(x, y)", {"out": out})


def pooled_input(call: Call) -> TensorArg:
    """The input of a 2-d pooling; Declined unless a non-empty 3-d or 4-d float tensor."""
    x = call.float_tensor(0, "the input")
    if x.ndim not in (3, 4):
        raise Declined("the input is not a 3-d or 4-d tensor")
    return x


def window_space(outputs: int) -> Space | None:
    """Threads per block x outputs per thread, for kernels with one thread per output."""
    axes = (Axis("block", powers_of_two(64, 1024)), Axis("unroll", (1, 2, 4)))

    def valid(p: Params) -> bool:
        return p["block"] == 64 or p["block"] * p["unroll"] <= pow2_ceil(outputs)

    return Space.build(axes, valid, {"block": 256, "unroll": 2 if outputs >= 1 << 20 else 1},
                       {"block": 128, "unroll": 1})


def window_geometry(x: TensorArg, out: TensorArg, **constants: int) -> str:
    """A pooling kernel's ``Geometry``: index type, output count, ``split`` from a linear output
    index (in the output's memory order) to the input plane's offset, the output row and column,
    and the output offset; the input's height, width and strides, and ``constants``."""
    split, coords = coords_code(out.shape, out.stride)
    lead = len(out.shape) - 2
    plane = linear_code(coords[:lead], x.stride[:lead])
    body = "".join(f"    {line}\n" for line in split.splitlines())
    index = index_type(max_offset(x), max_offset(out))
    named = ", ".join(f"{name} = {value}" for name, value in constants.items())
    return ("struct Geometry {\n"
            f"  using Index = {index};\n"
            f"  static constexpr Index NUMEL = {out.numel};\n"
            "  static __device__ __forceinline__ void split(Index e, Index& plane, Index& oh, Index& ow,\n"
            "                                               Index& out) {\n"
            f"{body}"
            f"    plane = {plane};\n    oh = {coords[-2]};\n    ow = {coords[-1]};\n"
            f"    out = {linear_code(coords, out.stride)};\n"
            "  }\n"
            f"  static constexpr int H = {x.shape[-2]}, W = {x.shape[-1]};\n"
            f"  static constexpr int {named};\n"
            f"  static constexpr Index XH = {x.stride[-2]}, XW = {x.stride[-1]};\n}};\n")


def render_window(call: Call, name: str, geometry: str, params: Params, signature: list[str],
                  body: str, outputs: dict[str, TensorArg]) -> Kernel:
    """A window kernel (``body`` on one output per thread, ``unroll`` outputs each) and its plan:
    the input, then ``outputs`` (plan name: eager's tensor), the first of which sets the count."""
    first = next(iter(outputs.values()))
    blocks = ceil_div(first.numel, params["block"] * params["unroll"])
    plan = {"outputs": [new_output(output, t) for output, t in outputs.items()],
            "launches": [launch(name, blocks, params["block"],
                                [ptr(call.arg_name(0)), *map(ptr, outputs)])]}
    return Kernel(geometry + "\n" + entry_points(name, 1, params["block"], signature, lambda _: body),
                  plan)


def pair(value: list[int] | int) -> tuple[int, int]:
    """A pooling argument given as one or two ints, as two."""
    values = [value] if isinstance(value, int) else list(value)
    if len(values) not in (1, 2):
        raise Declined(f"{value!r} is not one or two sizes")
    return (values[0], values[-1])


@dataclass(frozen=True)
class MaxPoolProblem:
    call: Call
    x: TensorArg
    out: TensorArg
    indices: TensorArg
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]


class MaxPool2d(Family):
    name = "max_pool2d"
    ops = ("aten.max_pool2d_with_indices.default",)
    cuda_files = ("pool.cu",)
    reference = "window"

    def analyze(self, call: Call) -> MaxPoolProblem:
        x = pooled_input(call)
        out, indices = call.outputs
        if indices.stride != out.stride:
            raise Declined("eager's values and indices are laid out differently here")
        kernel = pair(call.value(1))
        stride = pair(call.value(2)) if call.value(2) else kernel
        return MaxPoolProblem(call, x, out, indices, kernel, stride, pair(call.value(3)),
                              pair(call.value(4)))

    def variants(self, problem: MaxPoolProblem, gpu: GpuInfo) -> list[Variant]:
        out = problem.out
        _, inner_size = innermost_output(out)
        counts = (inner_size,)
        outputs = tuple(v for v in (1, 2, 4, 8) if v * out.itemsize <= 16 and all(c % v == 0 for c in counts))
        axes = (Axis("block", powers_of_two(64, 1024)), Axis("outputs", outputs), Axis("unroll", (1, 2, 4)))

        def valid(p: Params) -> bool:
            groups = out.numel // p["outputs"]
            return p["block"] == 64 or p["block"] * p["unroll"] <= pow2_ceil(groups)

        most = max(v for v in outputs if v <= 4)
        unrolled = Space.build(axes, valid, {"block": 256, "outputs": most, "unroll": 1},
                               {"block": 128, "outputs": 1, "unroll": 1})
        return [Variant("unrolled", "the window's taps unrolled and loaded together, neighbouring "
                                    "outputs per thread stored as vectors", unrolled),
                Variant("window", "one thread per output scans its window, in the output's "
                                  "memory order (reference)", window_space(out.numel))]

    def render(self, problem: MaxPoolProblem, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
        x, out = problem.x, problem.out
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = (problem.kernel, problem.stride, problem.padding,
                                                  problem.dilation)
        if approach == "unrolled":
            inner, _ = innermost_output(out)
            geometry = window_geometry(x, out, KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh,
                                       DW=dw, C_INNER=int(inner == out.ndim - 3),
                                       XC=x.stride[-3] if x.ndim >= 3 else 0)
            return render_unrolled(problem, geometry, params)
        geometry = window_geometry(x, out, KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw)
        return render_window(
            problem.call, "max_pool", geometry, params,
            [f"const {x.ctype}* __restrict__ x", f"{out.ctype}* __restrict__ y",
             "int64_t* __restrict__ indices"],
            f"max_pool_window<Geometry, {x.ctype}, {params['unroll']}>(x, y, indices)",
            {"out": out, "indices": problem.indices})


def innermost_output(out: TensorArg) -> tuple[int, int]:
    """The output's innermost moving dimension, and the size of it along which neighbouring
    outputs of a group may lie (1 unless that dimension is W or the channels)."""
    moving = [d for d in range(out.ndim) if out.shape[d] != 1]
    inner = min(moving, key=lambda d: out.stride[d], default=out.ndim - 1)
    along = out.shape[inner] if inner in (out.ndim - 1, out.ndim - 3) and out.stride[inner] == 1 else 1
    return inner, along


def render_unrolled(problem: MaxPoolProblem, geometry: str, params: Params) -> Kernel:
    x, out, call = problem.x, problem.out, problem.call
    block, outputs, unroll = params["block"], params["outputs"], params["unroll"]
    signature = [f"const {x.ctype}* __restrict__ x", f"{out.ctype}* __restrict__ y",
                 "int64_t* __restrict__ indices"]
    source = geometry + "\n" + entry_points("max_pool", outputs, block, signature, lambda v: (
        f"max_pool_unrolled<Geometry, {x.ctype}, {outputs}, {unroll}, {cuda_bool(v > 1)}>"
        "(x, y, indices)"))
    blocks = ceil_div(out.numel // outputs, block * unroll)
    plan = {"outputs": [new_output("out", out), new_output("indices", problem.indices)],
            "launches": [launch("max_pool", blocks, block,
                                [ptr(call.arg_name(0)), ptr("out"), ptr("indices")], outputs, 8)]}
    return Kernel(source, plan)
