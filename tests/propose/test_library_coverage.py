"""The library's coverage of what models run, on the CPU: inference batch_norm, reductions over any
dimensions (sum, mean, amax, amin), cat and clone, rotary pieces, norms and softmax on transposed
inputs, max_pool's unrolled kernel, and group_norm held on chip (one block, a thread-block
cluster, or chained blocks).

Cards are real ones from the tiny models' profiles and hand-made ones at the shapes the full models
reach; every variant renders, compiles with NVRTC for sm_90 and sm_121, and its plan resolves and
runs against a recording backend. The layouts the families compute (reduction loop nests, cat
pieces, columns, channels) are checked against eager by following them element by element in
Python; launch plans with thread-block clusters are checked as data."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kforge.core.argspec import bind
from kforge.core.gpu import GpuInfo
from kforge.core.launch_plan import (
    DeviceLimits,
    PlanError,
    ResolvedPlan,
    parse_plan,
    resolve,
)
from kforge.core.opcard import OpCard
from kforge.propose.library import supports
from kforge.propose.library.cards import read_call
from kforge.propose.library.examples import channels_last, tensor
from kforge.propose.library.families.batch_norm import BatchNorm
from kforge.propose.library.families.cat import Cat
from kforge.propose.library.families.reduce import Reduction
from kforge.propose.library.families.rows import LayerNorm, Softmax
from kforge.propose.library.layout import Iteration
from kforge.propose.library.proposer import build_candidate, make_plan
from kforge.runtime.plan import arg_value

from .test_library import check_outputs, check_plan, run_plan

# An H200 as the driver describes it: clusters, 227 KiB of shared memory per block.
H200 = GpuInfo(name="H200", arch="sm_90", sm_count=132, cluster_launch=True,
               smem_per_block_optin_kb=227.0, smem_per_sm_kb=228.0, max_threads_per_sm=2048)
NO_CLUSTERS = GpuInfo(name="A100", arch="sm_80", sm_count=108, smem_per_block_optin_kb=163.0,
                      smem_per_sm_kb=164.0, max_threads_per_sm=2048)
F16, BF16, F32 = "float16", "bfloat16", "float32"


def card(op: str, *args, **kwargs) -> OpCard:
    return OpCard(op, list(args), kwargs)


def bn(x: dict, channels: int, dtype: str, **kw) -> OpCard:
    params = [tensor([channels], dtype) for _ in range(4)]
    return card("aten.native_batch_norm.default", x, *params, False, 0.1, 1e-5, **kw)


# Cards as the tiny models' profiles record them (kforge profile resnet50-tiny, sd35-tiny,
# gemma4-tiny and qwen35-tiny, decode and prefill), then hand-made ones at full-size shapes.
TINY_MODEL_CARDS = {
    "resnet_bn": (bn(tensor([2, 32, 16, 16], F16), 32, F16), "batch_norm"),
    "resnet_bn_2x2": (bn(tensor([2, 2048, 2, 2], F16), 2048, F16), "batch_norm"),
    "resnet_max_pool": (card("aten.max_pool2d_with_indices.default", tensor([2, 64, 32, 32], F16),
                             [3, 3], [2, 2], [1, 1]), "max_pool2d"),
    "sd35_mean_norm_q": (card("aten.mean.dim", tensor([2, 2, 64, 16], F32, stride=[2048, 16, 32, 1]),
                              [-1], True), "reduce"),
    "sd35_cat_attention": (card("aten.cat.default",
                                [tensor([2, 2, 64, 16], BF16, stride=[2048, 16, 32, 1]),
                                 tensor([2, 2, 16, 16], BF16, stride=[512, 16, 32, 1])], 2), "cat"),
    "sd35_clone": (card("aten.clone.default", tensor([2, 16, 8, 2, 8, 2], BF16,
                                                     stride=[4096, 1, 512, 256, 32, 16]),
                        memory_format={"t": "memory_format", "v": "contiguous_format"}), "cat"),
    "gemma_rotary_cat": (card("aten.cat.default", [tensor([2, 1, 2, 16], BF16),
                                                   tensor([2, 1, 2, 16], BF16, stride=[64, 64, 32, 1])],
                              -1), "cat"),
    "gemma_cache_cat": (card("aten.cat.default", [tensor([0], BF16), tensor([2, 1, 32, 32], BF16)], -2),
                        "cat"),
    "gemma_cos": (card("aten.cos.default", tensor([1, 32, 64], F32)), "elementwise"),
    "gemma_sin": (card("aten.sin.default", tensor([1, 1, 64], F32)), "elementwise"),
    "gemma_embedding_decode": (card("aten.embedding.default", tensor([512, 160], BF16),
                                    tensor([2, 1], "int64"), 0), "embedding"),
    "qwen_cat_conv_state": (card("aten.cat.default", [tensor([2, 128, 4], BF16), tensor([2, 128, 1], BF16)],
                                 -1), "cat"),
    "qwen_sum": (card("aten.sum.dim_IntList", tensor([2, 4, 16, 16], F32), [-2]), "reduce"),
}
FULL_SIZE_CARDS = {
    # A UNet's layer_norm on a [B, C, H*W] activation read as [B, H*W, C].
    "unet_layer_norm": (card("aten.native_layer_norm.default",
                             tensor([2, 2304, 320], F16, stride=[737280, 1, 2304]), [320],
                             tensor([320], F16), tensor([320], F16), 1e-5), "layer_norm"),
    "unet_rms_norm": (card("aten._fused_rms_norm.default",
                           tensor([2, 1024, 640], BF16, stride=[655360, 1, 1024]), [640], None, None),
                      "rms_norm"),
    "softmax_over_channels": (card("aten._softmax.default", tensor([4, 1000, 49], F32), 1, False), "softmax"),
    "gemma_embedding_decode": (card("aten.embedding.default", tensor([262144, 1536], BF16),
                                    tensor([1, 1], "int64"), 0), "embedding"),
    "gemma_per_layer_embedding_decode": (card("aten.embedding.default", tensor([262144, 8960], BF16),
                                              tensor([1, 1], "int64"), 0), "embedding"),
    "resnet_bn_stage1": (bn(tensor([32, 256, 56, 56], F16), 256, F16), "batch_norm"),
    "resnet_bn_stage4": (bn(tensor([32, 2048, 7, 7], F16), 2048, F16), "batch_norm"),
    "bn_channels_last_mixed": (card("aten._native_batch_norm_legit_no_training.default",
                                    channels_last([8, 96, 28, 28], BF16), tensor([96], F32),
                                    tensor([96], F32), tensor([96], F32), tensor([96], F32), 0.1, 1e-3),
                               "batch_norm"),
    "resnet_max_pool": (card("aten.max_pool2d_with_indices.default", tensor([32, 64, 112, 112], F16),
                             [3, 3], [2, 2], [1, 1]), "max_pool2d"),
    "sd35_cat_attention": (card("aten.cat.default",
                                [tensor([2, 24, 4096, 64], BF16, stride=[6291456, 64, 1536, 1]),
                                 tensor([2, 24, 333, 64], BF16, stride=[511488, 64, 1536, 1])], 2), "cat"),
    "sd35_mean_norm_q": (card("aten.mean.dim", tensor([2, 24, 4096, 64], F32,
                                                      stride=[6291456, 64, 1536, 1]), [-1], True), "reduce"),
    "sum_all": (card("aten.sum.default", tensor([4096, 4096], BF16)), "reduce"),
    "amax_logits": (card("aten.amax.default", tensor([8, 262144], F32), [-1], True), "reduce"),
    "vae_group_norm_512": (card("aten.native_group_norm.default", tensor([1, 512, 128, 128], BF16),
                                tensor([512], BF16), tensor([512], BF16), 1, 512, 16384, 32, 1e-6),
                           "group_norm"),
    "vae_group_norm_128": (card("aten.native_group_norm.default", tensor([1, 128, 1024, 1024], BF16),
                                tensor([128], BF16), tensor([128], BF16), 1, 128, 1048576, 32, 1e-6),
                           "group_norm"),
}
ALL_CARDS = {**{f"tiny/{k}": v for k, v in TINY_MODEL_CARDS.items()},
             **{f"full/{k}": v for k, v in FULL_SIZE_CARDS.items()}}


@pytest.mark.parametrize("name", sorted(ALL_CARDS))
def test_model_cards_get_their_family(name):
    op_card, family = ALL_CARDS[name]
    support = supports(op_card)
    assert support.family == family, support.reason


@pytest.mark.parametrize("name", sorted(TINY_MODEL_CARDS))
def test_tiny_model_plans_return_eager_outputs_for_every_variant(name):
    op_card, _ = TINY_MODEL_CARDS[name]
    plan = make_plan(op_card, H200)
    for variant in plan.available:
        for params in (variant.space.default, variant.space.safe):
            candidate = build_candidate(plan, variant, params, H200, op_card, "")
            args, result, launches = run_plan(op_card, candidate)
            check_outputs(op_card, args, result)
            assert launches


@pytest.mark.parametrize("name", sorted(FULL_SIZE_CARDS))
def test_full_size_plans_resolve_under_the_device_limits(name):
    op_card, _ = FULL_SIZE_CARDS[name]
    plan = make_plan(op_card, H200)
    bound = {n: arg_value(spec) for n, spec in bind(op_card.op, op_card.args, op_card.kwargs).items()}
    for variant in plan.available:
        candidate = build_candidate(plan, variant, variant.space.default, H200, op_card, "")
        check_plan(candidate, resolve(parse_plan(candidate.plan), bound, DeviceLimits()))


def test_training_mode_batch_norm_and_promoting_cat_are_declined():
    training = card("aten.native_batch_norm.default", tensor([2, 4, 3, 3], F32), None, None,
                    tensor([4], F32), tensor([4], F32), True, 0.1, 1e-5)
    assert "training-mode" in supports(training).reason
    mixed = card("aten.cat.default", [tensor([2, 3], F32), tensor([2, 3], F16)])
    assert "different dtypes" in supports(mixed).reason


# ----- group_norm on chip -----


def group_norm(shape: list[int], groups: int, dtype: str = BF16) -> OpCard:
    n, c = shape[:2]
    hw = math.prod(shape[2:])
    return card("aten.native_group_norm.default", tensor(shape, dtype), tensor([c], dtype),
                tensor([c], dtype), n, c, hw, groups, 1e-6)


def test_a_group_that_fits_one_block_is_held_there_and_a_larger_one_in_a_cluster():
    small = make_plan(group_norm([2, 64, 16, 16], 8), H200)
    assert [v.approach for v in small.available][:2] == ["resident", "cluster"]
    vae = make_plan(group_norm([1, 512, 128, 128], 32), H200)  # 512 KiB groups
    approaches = [v.approach for v in vae.available]
    assert approaches[0] == "cluster" and "resident" not in approaches
    cluster = vae.variant("cluster")
    candidate = build_candidate(vae, cluster, cluster.space.default, H200, vae_card := group_norm(
        [1, 512, 128, 128], 32), "")
    parts = cluster.space.default["parts"]
    assert f"__cluster_dims__({parts}, 1, 1)" in candidate.source
    (launch,) = candidate.plan["launches"]
    assert launch["cluster"] == [parts] and launch["grid"] == [32 * parts]
    assert launch["shared_mem"] * parts >= 512 * 1024 and launch["shared_mem"] <= 227 * 1024
    bound = {n: arg_value(s) for n, s in bind(vae_card.op, vae_card.args, vae_card.kwargs).items()}
    resolved = resolve(parse_plan(candidate.plan), bound)
    assert resolved.launches[0].cluster == (parts, 1, 1)


def test_without_clusters_the_cluster_variant_says_why_and_chained_blocks_serve():
    plan = make_plan(group_norm([1, 512, 128, 128], 32), NO_CLUSTERS)
    cluster = next(v for v in plan.variants if v.approach == "cluster")
    assert not cluster.available and "no thread-block clusters" in cluster.why_not
    assert plan.available[0].approach == "chained"
    candidate = build_candidate(plan, plan.available[0], plan.available[0].space.default, NO_CLUSTERS,
                                group_norm([1, 512, 128, 128], 32), "")
    assert "__cluster_dims__" not in candidate.source
    sync = next(s for s in candidate.plan["scratch"] if s["name"] == "sync")
    assert sync["zero"] and sync["bytes"] == 4 * (1 + 32)


def test_chained_groups_never_need_more_blocks_than_half_the_gpu_runs_at_once():
    # 8 MiB groups: 64 blocks of 128 KiB, one per SM, fit twice over on 132 SMs; 16 MiB do not.
    vae = make_plan(group_norm([1, 128, 1024, 1024], 32), H200)
    chained = vae.variant("chained")
    assert chained is not None and {"parts": 64, "vec": 8} in [
        {k: p[k] for k in ("parts", "vec")} for p in chained.space.points()]
    for params in chained.space.points():
        nbytes = math.ceil(4 * 1024 * 1024 / params["vec"] / params["parts"]) * params["vec"] * 2
        per_sm = min(2048 // params["block"], 228 * 1024 // (nbytes + 2048))
        assert nbytes <= 227 * 1024 and 2 * params["parts"] <= 132 * per_sm
    larger = make_plan(group_norm([1, 256, 1024, 1024], 32), H200)
    assert larger.variant("chained") is None and larger.variant("split") is not None


# ----- launch plans with clusters -----


def cluster_plan(grid: int, cluster: list) -> dict:
    return {"outputs": [{"name": "out", "like": "self"}],
            "launches": [{"kernel": "k", "grid": [grid], "block": [128], "cluster": cluster,
                          "params": [{"ptr": "self"}, {"ptr": "out"}]}]}


def relu_args() -> dict:
    return {"self": arg_value(tensor([4, 4], F32))}


def test_a_cluster_splits_the_grid_and_survives_a_round_trip():
    plan = parse_plan(cluster_plan(32, [4]))
    assert parse_plan(plan.to_dict()) == plan and plan.to_dict()["launches"][0]["cluster"] == [4]
    resolved = resolve(plan, relu_args())
    assert resolved.launches[0].cluster == (4, 1, 1)
    assert ResolvedPlan.from_dict(resolved.to_dict()) == resolved
    plain = resolve(parse_plan({**cluster_plan(32, [1]), "launches": [
        {"kernel": "k", "grid": [32], "block": [128], "params": [{"ptr": "self"}, {"ptr": "out"}]}]}),
        relu_args())
    assert plain.launches[0].cluster == (1, 1, 1)


@pytest.mark.parametrize("grid, cluster, message", [
    (30, [4], "does not split into clusters of 4"),
    (32, [16], "above the cluster size limit of 8"),
    (32, [0], "must be at least 1"),
    (32, [2, 2, 2, 2], "must have 1 to 3 entries"),
    (32, ["n"], "unknown name"),
])
def test_a_cluster_that_does_not_fit_is_refused_with_its_field(grid, cluster, message):
    with pytest.raises(PlanError) as error:
        resolve(parse_plan(cluster_plan(grid, cluster)), relu_args())
    assert "launches[0].cluster" in str(error.value) and message in str(error.value)


# ----- every new variant compiles -----


def compile_cards() -> list[tuple[str, OpCard]]:
    cards = [(name, c) for name, (c, _) in ALL_CARDS.items()]
    cards += [("group_norm_small", group_norm([2, 64, 16, 16], 8, F32))]
    return cards


@pytest.fixture(scope="module")
def compiler():
    pytest.importorskip("cuda.core", reason="NVRTC through cuda.core is not installed")
    from kforge.runtime.nvrtc import Compiler

    return Compiler()


@pytest.mark.parametrize("arch", ["sm_90", "sm_121"])
def test_every_new_variant_compiles_at_its_default_and_safe_points(compiler, arch):
    failures = []
    for name, op_card in compile_cards():
        plan = make_plan(op_card, H200)
        for variant in plan.available:
            for label, params in (("default", variant.space.default), ("safe", variant.space.safe)):
                candidate = build_candidate(plan, variant, params, H200, op_card, "")
                result = compiler.compile(candidate.source, arch)
                names = set(parse_plan(candidate.plan).kernel_names())
                if not result.ok or not names <= set(result.resources):
                    failures.append(f"{name}/{variant.approach}/{label}: {result.log[:2000]}")
                elif label == "default" and result.spills:
                    failures.append(f"{name}/{variant.approach}/default spills: {result.log[-1500:]}")
    assert not failures, "\n".join(failures)


# ----- the layouts the families compute, followed in Python -----


def offsets(it: Iteration, e: int) -> list[int]:
    """Each operand's element offset of linear index ``e`` of a loop nest (innermost fastest)."""
    coords = []
    for size in reversed(it.sizes):
        coords.append(e % size)
        e //= size
    coords.reverse()
    return [sum(c * s for c, s in zip(coords, strides)) for strides in it.strides]


def strided(shape: list[int], order: list[int], gaps: list[int]) -> list[int]:
    """Strides of a tensor whose dimensions lie in memory in ``order`` (outermost first), each
    ``gaps[d]`` times further apart than packed."""
    strides, step = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = step * gaps[d]
        step = strides[d] * shape[d]
    return strides


@st.composite
def layouts(draw, max_dims: int = 4, dense: bool = False):
    ndim = draw(st.integers(1, max_dims))
    shape = draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim))
    order = draw(st.permutations(range(ndim)))
    gaps = [1] * ndim if dense else draw(st.lists(st.sampled_from([1, 1, 2]), min_size=ndim,
                                                  max_size=ndim))
    return shape, strided(shape, list(order), gaps)


def storage_of(shape: list[int], stride: list[int], generator: torch.Generator) -> torch.Tensor:
    span = 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    return torch.randn(span, generator=generator, dtype=torch.float64)


@settings(max_examples=60, deadline=None)
@given(layouts(), st.data())
def test_reduction_loop_nests_visit_what_eager_reduces(layout, data):
    shape, stride = layout
    dims = data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, unique=True))
    keepdim = data.draw(st.booleans())
    op_card = card("aten.sum.dim_IntList", tensor(shape, F32, stride=stride), dims, keepdim)
    problem = Reduction().analyze(read_call(op_card))
    storage = storage_of(shape, stride, torch.Generator().manual_seed(0))
    x = storage.as_strided(shape, stride)
    out = problem.out
    want = torch.zeros(1 + sum((n - 1) * s for n, s in zip(out.shape, out.stride)), dtype=torch.float64)
    want.as_strided(out.shape, out.stride).copy_(x.sum(dims, keepdim=keepdim))
    g = problem.general
    got = torch.zeros_like(want)
    for o in range(g.outputs):
        x_base, y_off = offsets(g.kept, o)
        got[y_off] = sum(storage[x_base + offsets(g.reduced, r)[0]] for r in range(g.r))
    torch.testing.assert_close(got, want)
    s = problem.shape
    if s is not None:  # the [K1, R, K2] view sees the same sums
        got.zero_()
        for k1, k2 in itertools.product(range(s.k1), range(s.k2)):
            got[k1 * s.out_k1 + k2 * s.out_k2] = sum(
                storage[k1 * s.k1_stride + r * s.r_stride + k2] for r in range(s.r))
        torch.testing.assert_close(got, want)


@settings(max_examples=60, deadline=None)
@given(st.lists(layouts(max_dims=3), min_size=1, max_size=3), st.data())
def test_cat_pieces_land_where_eager_puts_them(pieces, data):
    rank = len(pieces[0][0])
    dim = data.draw(st.integers(0, rank - 1))
    base = pieces[0][0]
    specs, tensors, generator = [], [], torch.Generator().manual_seed(1)
    for shape, _ in pieces:
        shape = [*base[:dim], shape[0], *base[dim + 1:]]
        order = data.draw(st.permutations(range(rank)))
        stride = strided(shape, list(order), [1] * rank)
        specs.append(tensor(shape, F32, stride=stride))
        tensors.append(storage_of(shape, stride, generator))
    op_card = card("aten.cat.default", specs, dim)
    problem = Cat().analyze(read_call(op_card))
    out = problem.out
    want = torch.cat([t.as_strided(s["shape"], s["stride"]) for t, s in zip(tensors, specs)], dim)
    got = torch.full((1 + sum((n - 1) * s for n, s in zip(out.shape, out.stride)),), math.nan,
                     dtype=torch.float64)
    for piece in problem.pieces:
        source = tensors[piece.position]
        for e in range(piece.tensor.numel):
            o, i = offsets(piece.it, e)
            got[piece.out_offset + o] = source[i]
    torch.testing.assert_close(got.as_strided(out.shape, out.stride), want)


@settings(max_examples=40, deadline=None)
@given(layouts(dense=True), st.data())
def test_a_dense_elements_channel_follows_from_its_offset(layout, data):
    shape, stride = layout
    if len(shape) < 2:
        shape, stride = [shape[0], 3], [3, 1]
    op_card = bn(tensor(shape, F32, stride=stride), shape[1], F32)
    problem = BatchNorm().analyze(read_call(op_card))
    channel = torch.arange(shape[1], dtype=torch.float64).view(1, -1, *[1] * (len(shape) - 2))
    laid_out = torch.empty_strided(shape, stride, dtype=torch.float64)
    laid_out.copy_(channel.expand(shape))
    flat = laid_out.as_strided((laid_out.numel(),), (1,))
    for e in range(laid_out.numel()):
        assert flat[e] == (e // problem.channel_stride) % problem.channels


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(2, 6), st.integers(2, 5), st.booleans())
def test_columns_normalize_what_eager_normalizes(batch, channels, tokens, softmax):
    # [B, C, T] storage read as [B, T, C]: norms over C; or softmax over C of [B, C, T].
    shape, stride = ([batch, channels, tokens], [channels * tokens, tokens, 1]) if softmax else (
        [batch, tokens, channels], [channels * tokens, 1, tokens])
    storage = storage_of(shape, stride, torch.Generator().manual_seed(2))
    x = storage.as_strided(shape, stride)
    if softmax:
        op_card = card("aten._softmax.default", tensor(shape, F32, stride=stride), 1, False)
        problem = Softmax().analyze(read_call(op_card))
        want = [torch.softmax(x, 1)]
    else:
        op_card = card("aten.native_layer_norm.default", tensor(shape, F32, stride=stride), [channels],
                       None, None, 1e-5)
        problem = LayerNorm().analyze(read_call(op_card))
        y, mean, rstd = torch.native_layer_norm(x, [channels], None, None, 1e-5)
        want = [y, mean]
    c = problem.columns
    assert c is not None and problem.rows is None
    outs = [torch.full((w.numel(),), math.nan, dtype=torch.float64) for w in want]
    for k1, k2 in itertools.product(range(c.k1), range(c.k2)):
        column = torch.stack([storage[k1 * c.x_k1 + r * c.x_r + k2] for r in range(c.r)])
        values = torch.softmax(column, 0) if softmax else (column - column.mean()) / torch.sqrt(
            column.var(unbiased=False) + 1e-5)
        for r in range(c.r):
            outs[0][k1 * c.out_k1 + k2 * c.out_k2 + r * c.out_r] = values[r]
        if not softmax:
            outs[1][k1 * c.stats_k1 + k2 * c.stats_k2] = column.mean()
    for got, expected in zip(outs, want):
        torch.testing.assert_close(got.as_strided(expected.shape, expected.stride()), expected)
