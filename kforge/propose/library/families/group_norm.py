"""group_norm (``aten.native_group_norm``): returns (y, mean, rstd), the statistics per sample and
group in the input's dtype, as eager does on CUDA.

Parameters: ``block`` (threads), ``vec`` (elements per access; divides H*W so a vector never
straddles two channels), ``unroll``, and for the split variant ``splits`` (blocks per group).
"""

from __future__ import annotations

from dataclasses import dataclass

from kforge.core.gpu import GpuInfo
from kforge.propose.library.cards import Call, Declined, TensorArg
from kforge.propose.library.families.base import (
    Affine,
    Family,
    Kernel,
    Variant,
    entry_points,
    f32,
    launch,
    new_output,
    ptr,
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

# A partial Welford state (kf::Welford: count, mean, m2 as floats), one per block of a split.
WELFORD_BYTES = 12


@dataclass(frozen=True)
class GroupNormProblem:
    call: Call
    x: TensorArg
    affine: Affine
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


class GroupNorm(Family):
    name = "group_norm"
    ops = ("aten.native_group_norm.default",)
    cuda_files = ("group_norm.cu",)
    reference = "block_two_pass"

    def analyze(self, call: Call) -> GroupNormProblem:
        x = call.float_tensor(0, "the input")
        n, c, hw, groups = (call.value(i) for i in (3, 4, 5, 6))
        if not x.is_contiguous:
            raise Declined("the input is not contiguous")
        affine = Affine.read(call, 1, 2)
        if any(t.numel != c for t in affine.present):
            raise Declined(f"the weight or bias is not a vector of {c} channels")
        dtype = affine.present[0].dtype if affine.present else x.dtype
        # Eager keeps the statistics in float when a half-precision input meets float weights.
        mixed = dtype == "float32" and x.dtype != "float32"
        if dtype != x.dtype and not mixed:
            raise Declined(f"{x.dtype} input with {dtype} weights is not supported")
        if c % groups:
            raise Declined(f"{c} channels do not split into {groups} groups")
        y = call.outputs[0]
        if not y.is_contiguous or y.stride != x.stride:
            raise Declined("eager's output is laid out differently than expected here")
        stats = TensorArg((n, groups), (groups, 1), "float32" if mixed else x.dtype)
        return GroupNormProblem(call, x, affine, n, c, hw, groups, (y, stats, stats))

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
        x, affine = problem.x, problem.affine
        wt, ts = affine.ctype(x), problem.outputs[1].ctype
        shape = f"{problem.c}, {problem.hw}, {problem.groups}"
        block, vec = params["block"], params["vec"]
        x_c = f"const {x.ctype}* __restrict__ x"
        outs_c = [f"{x.ctype}* __restrict__ y", f"{ts}* __restrict__ mean",
                  f"{ts}* __restrict__ rstd", "float eps"]
        x_ptr = ptr(problem.call.arg_name(0))
        outs = [ptr("out"), ptr("mean"), ptr("rstd"), f32(problem.call.arg_name(7))]
        itemsize = max(t.itemsize for t in [x, *affine.present])
        plan: dict = {"outputs": [new_output(name, t) for name, t in
                                  zip(("out", "mean", "rstd"), problem.outputs)]}
        if approach == "split":
            splits, blocks = params["splits"], problem.groups_total * params["splits"]
            source = entry_points(
                "group_norm_stats", vec, block, [x_c, "kf::Welford* __restrict__ parts"],
                lambda v: f"group_norm_split_stats<{x.ctype}, {shape}, {splits}, {block}, {v}, "
                          f"{params['unroll']}>(x, parts)")
            source += "\n" + entry_points(
                "group_norm_apply", vec, block,
                [x_c, *affine.c_params(wt), "const kf::Welford* __restrict__ parts", *outs_c],
                lambda v: f"group_norm_split_apply<{x.ctype}, {wt}, {ts}, {shape}, {splits}, {block}, "
                          f"{v}, {affine.flags()}>(x, {affine.c_args()}, parts, y, mean, rstd, eps)")
            plan["scratch"] = [{"name": "parts", "bytes": blocks * WELFORD_BYTES}]
            plan["launches"] = [
                launch("group_norm_stats", blocks, block, [x_ptr, ptr("parts")], vec, itemsize),
                launch("group_norm_apply", blocks, block,
                       [x_ptr, *affine.pointers(), ptr("parts"), *outs], vec, itemsize)]
        else:
            unroll = f", {params['unroll']}" if approach == "block_welford" else ""
            source = entry_points(
                "group_norm", vec, block, [x_c, *affine.c_params(wt), *outs_c],
                lambda v: f"group_norm_{approach}<{x.ctype}, {wt}, {ts}, {shape}, {block}, {v}{unroll}, "
                          f"{affine.flags()}>(x, {affine.c_args()}, y, mean, rstd, eps)")
            plan["launches"] = [launch("group_norm", problem.groups_total, block,
                                       [x_ptr, *affine.pointers(), *outs], vec, itemsize)]
        return Kernel(source, plan)
