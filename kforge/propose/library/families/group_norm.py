"""group_norm (``aten.native_group_norm``): returns (y, mean, rstd), the statistics per sample and
group in the input's dtype, as eager does on CUDA.

Parameters: ``block`` (threads), ``vec`` (elements per access; divides H*W so a vector never
straddles two channels), ``unroll``, for the split variant ``splits`` (blocks per group), and for
the single-pass variants ``parts`` (blocks holding one group in their shared memory).

The single-pass variants read the input once: a group is held on chip, in the dynamic shared
memory of one block (``resident``), of a thread-block cluster (``cluster``, where the GPU has
clusters), or of blocks that hand their statistics over through global memory (``chained``, for
groups larger than a cluster holds).
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
    cuda_bool,
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
    pow2_floor,
    powers_of_two,
)

# A partial Welford state (kf::Welford: count, mean, m2 as floats), one per block of a split.
WELFORD_BYTES = 12
# Dynamic shared memory a block may use where the GPU's opt-in limit is unknown (no opt-in), and
# what a kernel keeps besides: static scratch and the room the driver reserves per block.
DEFAULT_DYNAMIC_SHARED = 48 * 1024
STATIC_SHARED = 2 * 1024
CLUSTER_SIZES = (2, 4, 8)


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
    cuda_files = ("cluster.cuh", "group_norm.cu")
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

        # About four blocks of 256 threads per SM, each thread on eight vectors or more. On an
        # H200, 256 threads x 16 splits came within 2% of the best of 12 points for each of four
        # group norms of 32 groups (512@128x128 to 128@1024x1024); 512 x 32 took up to twice as
        # long (512@128x128: 42 us against 22).
        splits_default = clamp(pow2_floor(ceil_div(4 * sms, total)), 2, 128)
        split_default = {"block": clamp(pow2_floor(ceil_div(d, splits_default) // (max(vecs) * 8)),
                                        128, 256),
                         "vec": max(vecs), "unroll": 2, "splits": splits_default}
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
        two_pass = ([split_variant, *block_variants] if total < 2 * sms
                    else [*block_variants, split_variant])
        return [*on_chip_variants(problem, gpu, vecs), *two_pass]

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
        if approach in ON_CHIP:
            return render_on_chip(problem, approach, params, gpu)
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


# ----- single pass: the group held on chip -----

ON_CHIP = ("resident", "cluster", "chained")


def dynamic_shared_limit(gpu: GpuInfo) -> int:
    """Bytes of dynamic shared memory one block may hold on this GPU."""
    optin = int(gpu.smem_per_block_optin_kb * 1024)
    return (optin - STATIC_SHARED) if optin else DEFAULT_DYNAMIC_SHARED


def part_bytes(problem: GroupNormProblem, parts: int, vec: int) -> int:
    """Shared memory of one of ``parts`` blocks holding a group: whole vectors, rounded up."""
    return ceil_div(problem.group_size // vec, parts) * vec * problem.x.itemsize


def resident_blocks(gpu: GpuInfo, nbytes: int, block: int) -> int:
    """Blocks of ``block`` threads holding ``nbytes`` of shared memory each that the GPU runs at
    once: per SM, as many as its shared memory and threads allow; one where those are unknown."""
    if not gpu.smem_per_sm_kb:
        return sm_count(gpu)
    per_sm = min((gpu.max_threads_per_sm or 2048) // block,
                 int(gpu.smem_per_sm_kb * 1024) // (nbytes + STATIC_SHARED))
    return sm_count(gpu) * max(per_sm, 1)


def on_chip_space(problem: GroupNormProblem, gpu: GpuInfo, vecs: tuple[int, ...],
                  parts_values: tuple[int, ...], chained: bool) -> Space | None:
    limit, d = dynamic_shared_limit(gpu), problem.group_size
    axes = [Axis("block", powers_of_two(128, 1024)), Axis("vec", vecs), Axis("unroll", (1, 2, 4))]
    if len(parts_values) > 1:
        axes.append(Axis("parts", parts_values))

    def valid(p: Params) -> bool:
        parts, vec = p.get("parts", parts_values[0]), p["vec"]
        chunk = ceil_div(d // vec, parts) * vec
        nbytes = chunk * problem.x.itemsize
        if nbytes > limit or (parts - 1) * chunk >= d or p["block"] * vec > max(chunk, 128 * vec):
            return False
        # A chained group waits for all its blocks: they must run at once, with room to spare.
        return not chained or 2 * parts <= resident_blocks(gpu, nbytes, p["block"])

    # The fewest parts whose share leaves room for two blocks per SM (loads of one overlap the
    # other's writes), else the fewest that fit at all.
    fitting = [n for n in parts_values if part_bytes(problem, n, max(vecs)) <= limit]
    roomy = [n for n in fitting if 2 * part_bytes(problem, n, max(vecs)) <= limit]
    parts = (roomy or fitting or parts_values[-1:])[0]
    if len(parts_values) > 1:
        # Blocks sharing a group: each thread on sixteen vectors or more. On an H200, group norm
        # [1,512,128,128] in 8 parts took 28 us so (256 threads) and 36 us with 1024 threads.
        block = clamp(pow2_floor(part_bytes(problem, parts, max(vecs)) // problem.x.itemsize
                                 // (max(vecs) * 16)), 128, 1024)
    else:
        block = 1024 if d >= 1024 * max(vecs) * 4 else 256
    default = {"block": block, "vec": max(vecs), "unroll": 4}
    safe = {"block": 256, "vec": 1, "unroll": 1}
    if len(parts_values) > 1:
        default["parts"] = safe["parts"] = parts
    return Space.build(tuple(axes), valid, default, safe)


def on_chip_variants(problem: GroupNormProblem, gpu: GpuInfo, vecs: tuple[int, ...]) -> list[Variant]:
    resident = on_chip_space(problem, gpu, vecs, (1,), chained=False)
    cluster = (on_chip_space(problem, gpu, vecs, CLUSTER_SIZES, chained=False)
               if gpu.cluster_launch else None)
    chained = on_chip_space(problem, gpu, vecs, powers_of_two(2, 128), chained=True)
    size = f"groups of {problem.group_size * problem.x.itemsize} bytes"
    return [
        Variant("resident", "one block holds its group in shared memory: one read, statistics "
                            "there, normalize from there", resident)
        if resident else Variant("resident", "", why_not=f"{size} do not fit in one block"),
        Variant("cluster", "a thread-block cluster holds its group in shared memory; the blocks "
                           "merge their statistics through distributed shared memory", cluster)
        if cluster else Variant("cluster", "", why_not=(
            f"{size} do not fit in a cluster of {CLUSTER_SIZES[-1]}" if gpu.cluster_launch
            else "this GPU launches no thread-block clusters")),
        Variant("chained", "blocks hold parts of a group in shared memory and hand their "
                           "statistics to one another through global memory", chained)
        if chained else Variant("chained", "", why_not=f"{size} need more blocks at once than "
                                                      "the GPU runs"),
    ]


def render_on_chip(problem: GroupNormProblem, approach: str, params: Params, gpu: GpuInfo) -> Kernel:
    x, affine = problem.x, problem.affine
    wt, ts = affine.ctype(x), problem.outputs[1].ctype
    block, vec, unroll = params["block"], params["vec"], params["unroll"]
    parts = params.get("parts", 1)
    nbytes = part_bytes(problem, parts, vec)
    def template(v: int) -> str:
        return (f"<{x.ctype}, {wt}, {ts}, {problem.c}, {problem.hw}, {problem.groups}, {parts}, "
                f"{block}, {vec}, {unroll}, {affine.flags()}, {cuda_bool(v > 1)}>")

    head = [f"const {x.ctype}* __restrict__ x", *affine.c_params(wt), f"{x.ctype}* __restrict__ y",
            f"{ts}* __restrict__ mean", f"{ts}* __restrict__ rstd"]
    pointers = [ptr(problem.call.arg_name(0)), *affine.pointers(), ptr("out"), ptr("mean"), ptr("rstd")]
    eps = f32(problem.call.arg_name(7))
    plan: dict = {"outputs": [new_output(name, t) for name, t in
                              zip(("out", "mean", "rstd"), problem.outputs)]}
    blocks = problem.groups_total * parts
    itemsize = max(t.itemsize for t in [x, *affine.present])
    if approach == "chained":
        source = entry_points(
            "group_norm", vec, block, [*head, "unsigned* __restrict__ sync",
                                       "kf::Welford* __restrict__ parts", "float eps"],
            lambda v: f"group_norm_chained{template(v)}(x, {affine.c_args()}, y, mean, rstd, "
                      "sync, parts, eps)")
        plan["scratch"] = [{"name": "sync", "bytes": 4 * (1 + problem.groups_total), "zero": True},
                           {"name": "parts", "bytes": blocks * WELFORD_BYTES}]
        plan["launches"] = [launch("group_norm", blocks, block,
                                   [*pointers, ptr("sync"), ptr("parts"), eps], vec, itemsize,
                                   shared_mem=nbytes)]
    else:
        source = entry_points(
            "group_norm", vec, block, [*head, "float eps"],
            lambda v: f"group_norm_cluster{template(v)}(x, {affine.c_args()}, y, mean, rstd, eps)",
            cluster=parts)
        plan["launches"] = [launch("group_norm", blocks, block, [*pointers, eps], vec, itemsize,
                                   shared_mem=nbytes, cluster=parts)]
    return Kernel(source, plan)
