"""group_norm (``aten.native_group_norm``): returns (y, mean, rstd), the statistics per sample and
group in the input's dtype, as eager does on CUDA.

Parameters: ``block`` (threads), ``vec`` (elements per access; divides H*W so a vector never
straddles two channels), ``unroll``, and for the split variant ``splits`` (blocks per group).
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge.core.gpu import GpuInfo
from kforge.propose.library.cards import Call, Declined, TensorArg, require_float
from kforge.propose.library.families.base import (
    Family,
    Kernel,
    Variant,
    alloc_line,
    choose_kernels,
    cuda_bool,
    expect_line,
    kernel_names,
    sm_count,
    vec_options,
)
from kforge.propose.library.space import (
    Axis,
    Params,
    Space,
    ceil_div,
    clamp,
    pow2_ceil,
    powers_of_two,
)


@dataclass(frozen=True)
class GroupNormProblem:
    call: Call
    x: TensorArg
    weight: TensorArg | None
    bias: TensorArg | None
    n: int
    c: int
    hw: int
    groups: int
    outputs: tuple[TensorArg, ...]

    @property
    def groups_total(self) -> int:
        return self.n * self.groups

    @property
    def group_size(self) -> int:
        return self.c // self.groups * self.hw

    @property
    def wtype(self) -> str:
        affine = self.weight or self.bias
        return affine.ctype if affine else self.x.ctype


class GroupNorm(Family):
    name = "group_norm"
    ops = ("aten.native_group_norm.default",)
    cuda_files = ("group_norm.cu",)
    reference = "block_two_pass"

    def analyze(self, call: Call) -> GroupNormProblem:
        x = call.tensor(0, "the input")
        require_float(x)
        weight, bias = call.value(1), call.value(2)
        n, c, hw, groups = (call.value(i) for i in (3, 4, 5, 6))
        if not x.is_contiguous:
            raise Declined("the input is not contiguous")
        if x.numel == 0:
            raise Declined("the input is empty")
        for t, what in ((weight, "weight"), (bias, "bias")):
            if t is not None:
                require_float(t)
                if not t.is_contiguous or t.numel != c:
                    raise Declined(f"{what} is not a packed vector of {c} channels")
        affine = {t.dtype for t in (weight, bias) if t is not None}
        if len(affine) > 1:
            raise Declined("weight and bias have different dtypes")
        # Eager keeps the statistics in float when a half-precision input meets float weights.
        mixed = affine == {"float32"} and x.dtype != "float32"
        if affine and affine != {x.dtype} and not mixed:
            raise Declined(f"{x.dtype} input with {affine.pop()} weights is not supported")
        if c % groups:
            raise Declined(f"{c} channels do not split into {groups} groups")
        y = call.outputs[0]
        if not y.is_contiguous or y.stride != x.stride:
            raise Declined("eager's output is laid out differently than expected here")
        stats = TensorArg((n, groups), (groups, 1), "float32" if mixed else x.dtype)
        return GroupNormProblem(call, x, weight, bias, n, c, hw, groups, (y, stats, stats))

    def variants(self, problem: GroupNormProblem, gpu: GpuInfo) -> list[Variant]:
        vecs = vec_options(problem.x.itemsize, problem.hw)
        d, total, sms = problem.group_size, problem.groups_total, sm_count(gpu)
        threads = Axis("block", powers_of_two(128, 1024))
        vec_axis = Axis("vec", vecs)
        unroll = Axis("unroll", (1, 2, 4))

        def block_valid(p: Params) -> bool:  # a block should have a vector per thread at least
            return p["block"] * p["vec"] <= max(d, 128 * p["vec"])

        block_default = {"block": clamp(pow2_ceil(ceil_div(d, max(vecs) * 8)), 128, 512),
                         "vec": max(vecs), "unroll": 2}
        block_safe = {"block": 256, "vec": 1, "unroll": 1}
        welford = Space.build((threads, vec_axis, unroll), block_valid, block_default, block_safe)
        two_pass = Space.build((threads, vec_axis), block_valid,
                               {k: block_default[k] for k in ("block", "vec")}, {"block": 256, "vec": 1})

        splits = Axis("splits", powers_of_two(2, 128))

        def split_valid(p: Params) -> bool:
            return ceil_div(d, p["splits"]) >= p["block"] * p["vec"]

        split_default = {"block": 512, "vec": max(vecs), "unroll": 2,
                         "splits": clamp(pow2_ceil(ceil_div(4 * sms, total)), 2, 128)}
        split = Space.build((threads, vec_axis, unroll, splits), split_valid, split_default,
                            {"block": 256, "vec": 1, "unroll": 1, "splits": 2})
        block_variants = [
            Variant("block_welford", "one block per group: Welford statistics, then normalize", welford),
            Variant("block_two_pass", "one block per group: mean, variance, normalize in three "
                                      "passes (reference)", two_pass),
        ]
        split_variant = (
            Variant("split", "several blocks per group: partial Welford states, then merge and "
                             "normalize (two kernels)", split) if split else
            Variant("split", "", why_not=f"groups of {d} elements are too small to split"))
        # Few groups leave SMs idle unless each group is split over several blocks.
        return [split_variant, *block_variants] if total < 2 * sms else [*block_variants, split_variant]

    def render(self, problem: GroupNormProblem, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
        x, wt = problem.x, problem.wtype
        has_w, has_b = problem.weight is not None, problem.bias is not None
        ts = problem.outputs[1].ctype
        shape = f"{problem.c}, {problem.hw}, {problem.groups}"
        block = params["block"]
        affine_c = ([f"const {wt}* __restrict__ w"] if has_w else []) + (
            [f"const {wt}* __restrict__ b"] if has_b else [])
        affine_args = ["w" if has_w else "nullptr", "b" if has_b else "nullptr"]
        outs_c = [f"{x.ctype}* __restrict__ y", f"{ts}* __restrict__ mean", f"{ts}* __restrict__ rstd",
                  "float eps"]
        flags = f"{cuda_bool(has_w)}, {cuda_bool(has_b)}"
        wrappers = []
        if approach == "split":
            for name, vec in kernel_names("group_norm_stats", params["vec"]):
                wrappers.append(
                    f'extern "C" __global__ void __launch_bounds__({block}) {name}(\n'
                    f"    const {x.ctype}* __restrict__ x, kf::Welford* __restrict__ parts) {{\n"
                    f"  group_norm_split_stats<{x.ctype}, {shape}, {params['splits']}, {block}, {vec}, "
                    f"{params['unroll']}>(x, parts);\n}}\n")
            for name, vec in kernel_names("group_norm_apply", params["vec"]):
                wrappers.append(
                    f'extern "C" __global__ void __launch_bounds__({block}) {name}(\n    '
                    + ", ".join([f"const {x.ctype}* __restrict__ x", *affine_c,
                                 "const kf::Welford* __restrict__ parts", *outs_c]) + ") {\n"
                    f"  group_norm_split_apply<{x.ctype}, {wt}, {ts}, {shape}, {params['splits']}, "
                    f"{block}, {vec}, {flags}>(x, {', '.join(affine_args)}, parts, y, mean, rstd, eps);\n}}\n")
        else:
            unroll = f", {params['unroll']}" if approach == "block_welford" else ""
            for name, vec in kernel_names("group_norm", params["vec"]):
                wrappers.append(
                    f'extern "C" __global__ void __launch_bounds__({block}) {name}(\n    '
                    + ", ".join([f"const {x.ctype}* __restrict__ x", *affine_c, *outs_c]) + ") {\n"
                    f"  group_norm_{approach}<{x.ctype}, {wt}, {ts}, {shape}, {block}, {vec}{unroll}, "
                    f"{flags}>(x, {', '.join(affine_args)}, y, mean, rstd, eps);\n}}\n")
        return Kernel("\n".join(wrappers), self.launcher(problem, approach, params))

    def launcher(self, problem: GroupNormProblem, approach: str, params: Params) -> str:
        call, x = problem.call, problem.x
        lines = ["def launch(kernels, *args, **kwargs):\n",
                 f"    x = {call.source(0)}\n", expect_line("x", "input", x)]
        inputs = ["x"]
        for var, t, index in (("weight", problem.weight, 1), ("bias", problem.bias, 2)):
            if t is not None:
                lines += [f"    {var} = {call.source(index)}\n", expect_line(var, var, t)]
                inputs.append(var)
        for var, t in zip(("out", "mean", "rstd"), problem.outputs):
            lines.append(alloc_line(var, t, "x"))
        lines.append(f"    eps = np.float32({call.source(7)})\n")
        itemsize = max(t.itemsize for t in (x, problem.weight, problem.bias) if t is not None)
        block = params["block"]
        if approach == "split":
            blocks = problem.groups_total * params["splits"]
            lines.append(choose_kernels(params["vec"], itemsize, ["x", "out"],
                                        {"stats": "group_norm_stats", "apply": "group_norm_apply"}))
            lines.append(f"    parts = torch.empty(({blocks}, 3), dtype=torch.float32, device=x.device)\n")
            lines.append(f"    stats(({blocks},), ({block},), x, parts)\n")
            lines.append(f"    apply(({blocks},), ({block},), {', '.join(inputs)}, parts, out, mean, "
                         "rstd, eps)\n")
        else:
            lines.append(choose_kernels(params["vec"], itemsize, ["x", "out"], {"kernel": "group_norm"}))
            lines.append(f"    kernel(({problem.groups_total},), ({block},), {', '.join(inputs)}, out, "
                         "mean, rstd, eps)\n")
        lines.append("    return out, mean, rstd\n")
        return "".join(lines)
