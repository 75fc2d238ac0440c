"""batch_norm in inference: ``aten.native_batch_norm`` with ``training=False`` (how eager
PyTorch runs a BatchNorm layer in eval mode, e.g. every norm of ResNet-50) and
``aten._native_batch_norm_legit_no_training`` (the exported inference form). Returns (y,
save_mean, save_invstd) as eager does on CUDA: y in the input's layout and dtype, the running mean
and 1 / sqrt(running_var + eps) as float per channel.

The input is dense in any dimension order (contiguous, channels-last) and walked as one flat array.
Parameters: ``block`` (threads), ``vec`` (consecutive elements per access), ``unroll`` (groups
per thread, all loaded before any is stored) and, for the table variant, ``blocks_per_sm``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge.core.gpu import GpuInfo
from kforge.propose.library.cards import Call, Declined, TensorArg
from kforge.propose.library.families.base import (
    SHARED_FLOATS,
    Family,
    Kernel,
    Variant,
    affine_tensor,
    cuda_bool,
    entry_points,
    f32,
    launch,
    new_output,
    ptr,
    sm_count,
    vec_options,
)
from kforge.propose.library.families.elementwise import (
    MAX_THREAD_OUTPUTS,
    THREADS_PER_SM,
)
from kforge.propose.library.layout import index_type, iteration
from kforge.propose.library.space import (
    Axis,
    Params,
    Space,
    ceil_div,
    pow2_ceil,
    powers_of_two,
)

# Floats per channel in the shared table: mean, scale, shift.
TABLE_FLOATS = 3
PARAM_NAMES = ("weight", "bias", "running_mean", "running_var")


@dataclass(frozen=True)
class BatchNormProblem:
    call: Call
    x: TensorArg
    params: tuple[TensorArg | None, ...]  # weight, bias, running_mean, running_var
    channels: int
    channel_stride: int  # elements between neighbouring channels; the whole tensor when C is 1
    outputs: tuple[TensorArg, ...]  # y, save_mean, save_invstd
    eps_index: int

    @property
    def param_ctype(self) -> str:
        return next(t for t in self.params if t is not None).ctype

    @property
    def has_weight(self) -> bool:
        return self.params[0] is not None

    @property
    def has_bias(self) -> bool:
        return self.params[1] is not None


class BatchNorm(Family):
    name = "batch_norm"
    ops = ("aten.native_batch_norm.default", "aten._native_batch_norm_legit_no_training.default")
    cuda_files = ("batch_norm.cu",)
    reference = "direct"

    def analyze(self, call: Call) -> BatchNormProblem:
        x = call.float_tensor(0, "the input")
        legit = call.op == "aten._native_batch_norm_legit_no_training.default"
        if not legit and call.value(5):
            raise Declined("training-mode batch_norm (batch statistics, running statistics updated "
                           "in place) is not supported; inference (training=False) is")
        if x.ndim < 2:
            raise Declined("the input has no channel dimension")
        channels = x.shape[1]
        params = tuple(affine_tensor(call.value(i), PARAM_NAMES[i - 1]) for i in range(1, 5))
        if params[2] is None or params[3] is None:
            raise Declined("inference batch_norm needs the running mean and variance")
        present = [t for t in params if t is not None]
        if any(t.numel != channels for t in present):
            raise Declined(f"a parameter is not a vector of {channels} channels")
        if len({t.dtype for t in present}) != 1:
            raise Declined("the weight, bias and running statistics have different dtypes")
        if present[0].dtype not in (x.dtype, "float32"):
            raise Declined(f"{x.dtype} input with {present[0].dtype} parameters is not supported")
        y, save_mean, save_invstd = call.outputs
        for stat in (save_mean, save_invstd):
            if (stat.shape, stat.dtype) != ((channels,), "float32"):
                raise Declined("eager's statistics are laid out differently than expected here")
        # One flat walk serves input and output only when both are dense in the same order.
        it = iteration(x.shape, [y.stride, x.stride])
        if it.numel > 1 and (len(it.sizes) != 1 or it.strides != ((1,), (1,))):
            raise Declined(f"the input is not dense (strides {x.stride}), or eager's output is "
                           "laid out differently")
        channel_stride = x.stride[1] if channels > 1 else x.numel
        return BatchNormProblem(call, x, params, channels, channel_stride, (y, save_mean, save_invstd),
                                6 if legit else 7)

    def variants(self, problem: BatchNormProblem, gpu: GpuInfo) -> list[Variant]:
        x = problem.x
        counts = [x.numel] + ([problem.channels] if problem.channel_stride == 1 else [])
        vecs = vec_options(x.itemsize, *counts)
        groups = x.numel // max(vecs)
        axes = (Axis("block", powers_of_two(64, 1024)), Axis("vec", vecs), Axis("unroll", (1, 2, 4, 8)))

        def valid(p: Params) -> bool:
            return (p["vec"] * p["unroll"] <= MAX_THREAD_OUTPUTS
                    and (p["block"] == 64 or p["block"] <= pow2_ceil(x.numel // p["vec"])))

        waves = groups / (sm_count(gpu) * THREADS_PER_SM)
        default = {"block": 256, "vec": max(vecs), "unroll": 4 if waves >= 4 else 2 if waves >= 2 else 1}
        safe = {"block": 256, "vec": 1, "unroll": 1}
        direct = Variant("direct", "one pass over the data; each group computes its channels' "
                                   "constants from the parameters (reference)",
                         Space.build(axes, valid, default, safe))
        if problem.channels * TABLE_FLOATS > SHARED_FLOATS:
            table = Variant("table", "", why_not=f"{problem.channels} channels' constants do not "
                                                 "fit in shared memory")
        else:
            table = Variant("table", "each block puts every channel's mean, scale and shift in "
                                     "shared memory, then resident blocks loop over the data",
                            Space.build((*axes, Axis("blocks_per_sm", (1, 2, 4, 8))), valid,
                                        {**default, "blocks_per_sm": 2}, {**safe, "blocks_per_sm": 2}))
        return [table, direct]

    def render(self, problem: BatchNormProblem, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
        x, (y, _, _) = problem.x, problem.outputs
        tp = problem.param_ctype
        block, vec, unroll = params["block"], params["vec"], params["unroll"]
        table = approach == "table"
        present = [(name, t) for name, t in zip(("w", "b", "running_mean", "running_var"),
                                                problem.params) if t is not None]
        params_c = ([f"const {x.ctype}* __restrict__ x"]
                    + [f"const {tp}* __restrict__ {name}" for name, _ in present]
                    + [f"{y.ctype}* __restrict__ y", "float* __restrict__ save_mean",
                       "float* __restrict__ save_invstd", "float eps"])
        w = "w" if problem.has_weight else "nullptr"
        b = "b" if problem.has_bias else "nullptr"
        index = index_type(x.numel)
        source = entry_points("batch_norm", vec, block, params_c, lambda v: (
            f"batch_norm_loop<{x.ctype}, {tp}, {index}, {problem.channels}, "
            f"{problem.channel_stride}, {x.numel}, {vec}, {unroll}, {cuda_bool(table)}, "
            f"{cuda_bool(problem.has_weight)}, {cuda_bool(problem.has_bias)}, {cuda_bool(v > 1)}>"
            f"(x, {w}, {b}, running_mean, running_var, y, save_mean, save_invstd, eps)"))
        blocks = ceil_div(x.numel // vec, block * unroll)
        if table:
            blocks = min(blocks, sm_count(gpu) * min(params["blocks_per_sm"], THREADS_PER_SM // block))
        call = problem.call
        pointers = [ptr(call.arg_name(0))] + [ptr(call.arg_name(i)) for i in range(1, 5)
                                              if problem.params[i - 1] is not None]
        plan = {"outputs": [new_output(name, t) for name, t in
                            zip(("out", "save_mean", "save_invstd"), problem.outputs)],
                "launches": [launch("batch_norm", blocks, block,
                                    [*pointers, ptr("out"), ptr("save_mean"), ptr("save_invstd"),
                                     f32(call.arg_name(problem.eps_index))],
                                    vec, x.itemsize)]}
        return Kernel(source, plan)
