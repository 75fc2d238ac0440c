"""The matmul family on the CPU: which cards and layouts each variant takes, launch plans resolved
and run by kforge's plan runner (against a recording backend) for the built-in models' real
mm/addmm/bmm cards and decode shapes, every variant compiled by NVRTC for sm_90 and sm_121 (with
its compile time), fused epilogues from an op list and from a fusion region, the NVRTC option
wgmma needs, and the shared-memory layouts, descriptors and register fragments of the tensor-core
kernels checked against CuTe's definitions (where nvcc and the CUTLASS headers are installed)."""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kforge.core.gpu import GpuInfo
from kforge.core.launch_plan import parse_plan
from kforge.core.opcard import OpCard
from kforge.core.region import Region
from kforge.propose.library import supports
from kforge.propose.library.cards import Declined, TensorArg
from kforge.propose.library.examples import tensor
from kforge.propose.library.families.matmul import (
    RESULT,
    EpilogueInput,
    EpilogueOp,
    Matmul,
    fuse_epilogue,
    region_problem,
    wgmma_smem,
)
from kforge.propose.library.proposer import Plan, build_candidate, make_plan
from tests.propose.test_library import check_outputs, check_plan, resolved, run_plan

H200 = GpuInfo(name="H200", arch="sm_90", sm_count=132)
GB10 = GpuInfo(name="GB10", arch="sm_121", sm_count=48)
BF16, F16, F32 = "bfloat16", "float16", "float32"


def t(shape: list[int], dtype: str = BF16, **kw) -> dict:
    return tensor(shape, dtype, **kw)


def weight_t(k: int, n: int, dtype: str = BF16) -> dict:
    """nn.Linear's [n, k] weight as mm's second operand: a transposed view, K-major."""
    return t([k, n], dtype, stride=[1, k])


def mm(m: int, k: int, n: int, dtype: str = BF16) -> OpCard:
    return OpCard("aten.mm.default", [t([m, k], dtype), weight_t(k, n, dtype)])


# mm/addmm/bmm cards of the tiny models as `kforge profile gemma4-tiny|sd35-tiny|qwen35-tiny`
# records them (shapes, strides, offsets), then full-size shapes: prefill and decode.
REAL_CARDS = {
    "gemma_tiny_q_proj": mm(64, 64, 64),
    "gemma_tiny_gate": OpCard("aten.mm.default", [t([64, 64]), weight_t(64, 256)]),
    "gemma_tiny_down": OpCard("aten.mm.default", [t([64, 256]), weight_t(256, 64)]),
    "gemma_tiny_per_layer": OpCard("aten.mm.default", [t([64, 16]), weight_t(16, 64)]),
    "gemma_tiny_lm_head": OpCard("aten.mm.default", [t([2, 64], stride=[2048, 1], offset=1984),
                                                     weight_t(64, 512)]),
    "gemma_tiny_rotary": OpCard("aten.bmm.default", [t([1, 16, 1], F32), t([1, 1, 32], F32)]),
    "sd35_tiny_addmm": OpCard("aten.addmm.default", [t([32]), t([128, 128]), weight_t(128, 32)]),
    "sd35_tiny_time_embed": OpCard("aten.addmm.default", [t([288]), t([2, 32]), weight_t(32, 288)]),
    "sd35_tiny_transposed_a": OpCard("aten.mm.default", [t([256, 64], stride=[1, 256]),
                                                         t([64, 64], stride=[1, 64])]),
    "qwen_tiny_n1": OpCard("aten.mm.default", [t([64, 64]), weight_t(64, 1)]),
    "qwen_tiny_n4": OpCard("aten.mm.default", [t([64, 64]), weight_t(64, 4)]),
    "qwen_tiny_bmm_kt": OpCard("aten.bmm.default", [t([8, 64, 16], F32), t([8, 16, 64], F32,
                                                                          stride=[1024, 1, 16])]),
    "qwen_tiny_bmm_nmajor": OpCard("aten.bmm.default", [t([8, 64, 16], F32), t([8, 16, 16], F32)]),
    "qwen_tiny_bmm_broadcast": OpCard("aten.bmm.default", [t([6, 4, 1], F32, stride=[0, 1, 1]),
                                                           t([6, 1, 32], F32)]),
    "gemma_gate_prefill": mm(2048, 1536, 12288),
    "gemma_down_prefill": mm(2048, 12288, 1536),
    "sd35_to_q": OpCard("aten.addmm.default", [t([1536]), t([8192, 1536]), weight_t(1536, 1536)]),
    "sd35_ff": OpCard("aten.addmm.default", [t([6144]), t([8192, 1536]), weight_t(1536, 6144)]),
    "qwen_bmm_prefill": OpCard("aten.bmm.default", [t([1024, 64, 128], F32),
                                                    t([1024, 128, 64], F32, stride=[8192, 1, 128])]),
    "llama_q_prefill512": mm(512, 2048, 2048),
    "llama_up_prefill512": mm(512, 2048, 8192),
    "llama_down_prefill512": mm(512, 8192, 2048),
    "gemma_gate_decode": mm(1, 1536, 12288),
    "gemma_down_decode": mm(1, 12288, 1536),
    "gemma_lm_head_decode": mm(1, 1536, 262144),
    "qwen_in_proj_b_decode": mm(1, 2048, 32),
    "llama_q_decode": mm(1, 2048, 2048),
    "decode_batch8": mm(8, 2048, 8192),
    "decode_batch16": mm(16, 2048, 2048),
    "fp16_decode": mm(4, 1024, 1000, F16),
}

# Cards whose tensors are quick to materialize on the CPU (a plan run allocates them).
SMALL = [name for name, card in REAL_CARDS.items() if card.io_bytes <= 1 << 21]


def points(plan: Plan, rng: random.Random, sampled: int = 2) -> list[tuple]:
    """Every variant at its default and safe points, and a few sampled ones."""
    found = []
    for variant in plan.available:
        picks = [variant.space.default, variant.space.safe]
        picks += rng.sample(variant.space.points(), min(sampled, len(variant.space.points())))
        found += [(variant, p) for p in picks]
    return found


# ----- which variants take which cards -----


def approaches(card: OpCard, gpu: GpuInfo = H200) -> list[str]:
    return [v.approach for v in make_plan(card, gpu).available]


def test_every_real_card_is_taken_by_the_matmul_family():
    for name, card in REAL_CARDS.items():
        support = supports(card)
        assert support.family == "matmul", f"{name}: {support.reason}"
        assert make_plan(card, H200).reference.approach == "simt"


def test_variants_follow_dtype_layout_rows_and_architecture():
    assert approaches(REAL_CARDS["gemma_gate_prefill"]) == ["wgmma", "mma", "simt"]
    assert approaches(REAL_CARDS["gemma_gate_prefill"], GB10) == ["mma", "simt"]
    assert approaches(REAL_CARDS["gemma_gate_decode"]) == ["gemv", "wgmma", "mma", "simt"]
    assert approaches(REAL_CARDS["decode_batch16"]) == ["wgmma", "mma", "simt"]  # 16 rows
    # float32 stays exact: CUDA cores only, as eager computes it without TF32.
    assert approaches(REAL_CARDS["qwen_bmm_prefill"]) == ["simt"]
    assert approaches(REAL_CARDS["gemma_tiny_rotary"]) == ["simt"]  # 16 rows, K = 1
    # A transposed A (M-major): mma reads it with ldmatrix.trans; wgmma takes K-major only.
    plan = make_plan(REAL_CARDS["sd35_tiny_transposed_a"], H200)
    assert [v.approach for v in plan.available] == ["mma", "simt"]
    assert "not K-major" in next(v for v in plan.variants if v.approach == "wgmma").why_not


def test_an_operand_contiguous_along_neither_dimension_leaves_only_the_reference():
    card = OpCard("aten.mm.default", [t([32, 40], stride=[80, 2]), t([40, 24])])
    plan = make_plan(card, H200)
    assert [v.approach for v in plan.available] == ["simt"]
    assert "neither" in next(v for v in plan.variants if v.approach == "mma").why_not


@pytest.mark.parametrize("card, reason", [
    (OpCard("aten.mm.default", [t([4, 8]), t([8, 4], F16)]), "mixed dtypes"),
    (OpCard("aten.mm.default", [t([4, 0]), t([0, 4])]), "empty dimension"),
    (OpCard("aten.mm.default", [t([0, 8]), t([8, 4])]), "empty"),
    (OpCard("aten.mm.default", [tensor([4, 8], "int64"), tensor([8, 4], "int64")]), "int64"),
    (OpCard("aten.bmm.default", [t([70000, 2, 2]), t([70000, 2, 2])]), "grid"),
])
def test_declines_say_why(card, reason):
    support = supports(card)
    assert not support and reason in support.reason


def test_skinny_products_split_k_until_every_sm_has_a_block():
    plan = make_plan(REAL_CARDS["decode_batch16"], H200)  # 1 x 16 tiles of 16 x 128
    mma = plan.variant("mma").space.default
    tiles = -(-16 // mma["bm"]) * -(-2048 // mma["bn"])
    assert mma["splits"] > 1 and tiles * mma["splits"] <= 132 < tiles * mma["splits"] * 2
    big = make_plan(REAL_CARDS["gemma_gate_prefill"], H200)
    assert big.variant("wgmma").space.default == {"bm": 128, "bn": 256, "stages": 4, "splits": 1}
    assert all(p["splits"] == 1 for p in big.variant("mma").space.points())  # no SM left idle


def test_spaces_hold_only_points_that_fit_the_gpu():
    for card in REAL_CARDS.values():
        for gpu in (H200, GB10):
            plan = make_plan(card, gpu)
            for variant in plan.available:
                space = variant.space
                assert space.contains(space.default) and space.contains(space.safe)
                if variant.approach == "wgmma":
                    assert all(wgmma_smem(p) <= 227 * 1024 for p in space.points())


# ----- launch plans -----


@pytest.mark.parametrize("name", SMALL)
def test_plans_resolve_and_run_for_real_cards(name):
    card = REAL_CARDS[name]
    plan = make_plan(card, H200)
    for variant, params in points(plan, random.Random(name)):
        candidate = build_candidate(plan, variant, params, H200, card, "")
        check_plan(candidate, resolved(card, candidate))
        args, result, launches = run_plan(card, candidate)
        check_outputs(card, args, result)
        assert launches and all(all(p is not None for p in params) for _, _, _, params in launches)


def test_full_size_plans_resolve_under_the_default_device_limits():
    for name, card in REAL_CARDS.items():
        plan = make_plan(card, H200)
        for variant, params in points(plan, random.Random(name), sampled=1):
            candidate = build_candidate(plan, variant, params, H200, card, "")
            check_plan(candidate, resolved(card, candidate))


def test_a_grid_covers_every_output_tile_and_split():
    card = REAL_CARDS["llama_down_prefill512"]
    plan = make_plan(card, H200)
    params = {"bm": 128, "bn": 256, "stages": 4, "splits": 4}
    candidate = build_candidate(plan, plan.variant("wgmma"), params, H200, card, "")
    main, reduce = resolved(card, candidate).launches
    assert main.grid == (4 * 8, 4, 1) and main.block == (384, 1, 1)
    assert main.shared_mem == 4 * (128 + 256) * 64 * 2 + 1024 + 64
    assert reduce.kernel == "mm_reduce" and reduce.grid[0] * reduce.block[0] >= 512 * 2048
    assert candidate.plan["scratch"] == [{"name": "partials", "bytes": 4 * 512 * 2048 * 4, "zero": False}]


def test_misaligned_operands_run_the_element_by_element_twin():
    card = OpCard("aten.mm.default", [t([40, 72], offset=1), weight_t(72, 48)])
    plan = make_plan(card, H200)
    for approach in ("wgmma", "mma", "gemv"):
        variant = plan.variant(approach)
        if variant is None:
            continue
        candidate = build_candidate(plan, variant, variant.space.default, H200, card, "")
        _, _, launches = run_plan(card, candidate)
        assert launches[0][0] == "mm_scalar"
    aligned = build_candidate(plan, plan.variant("mma"), plan.variant("mma").space.default,
                              H200, REAL_CARDS["gemma_tiny_q_proj"], "")
    assert run_plan(REAL_CARDS["gemma_tiny_q_proj"], aligned)[2][0][0] == "mm"


def test_wgmma_candidates_ask_for_the_architecture_specific_target():
    card = REAL_CARDS["llama_q_prefill512"]
    plan = make_plan(card, H200)
    for variant in plan.available:
        candidate = build_candidate(plan, variant, variant.space.default, H200, card, "")
        expected = ["--arch-specific"] if variant.approach == "wgmma" else None
        assert candidate.meta.get("nvrtc_options") == expected


def test_nvrtc_takes_the_architecture_specific_option():
    pytest.importorskip("cuda.core", reason="NVRTC through cuda.core is not installed")
    from kforge.runtime.nvrtc import check_options, nvrtc_options

    assert nvrtc_options("sm_90", ["--arch-specific"], []).arch == "sm_90a"
    assert nvrtc_options("sm_90a", ["--arch-specific"], []).arch == "sm_90a"
    assert nvrtc_options("sm_90", [], []).arch == "sm_90"
    with pytest.raises(ValueError, match="not allowed"):
        check_options(["-arch=sm_90a"])


# ----- fused epilogues -----


def test_addmm_scales_and_adds_its_bias_once_and_skips_it_when_beta_is_zero():
    card = OpCard("aten.addmm.default", [t([48]), t([33, 64]), weight_t(64, 48)],
                  {"beta": 0.5, "alpha": 2.0})
    problem = make_plan(card, H200).problem
    assert [s.expr for s in problem.epilogue.steps] == ["p0 * v + p1 * e0"]
    assert [s.value for s in problem.epilogue.scalars] == ["alpha", "beta"]
    ignored = OpCard("aten.addmm.default", [t([48]), t([33, 64]), weight_t(64, 48)], {"beta": 0})
    plan = make_plan(ignored, H200)
    assert not plan.problem.epilogue.tensors
    candidate = build_candidate(plan, plan.reference, plan.reference.space.default, H200, ignored, "")
    assert {"ptr": "self"} not in candidate.plan["launches"][0]["params"]


def fused_problem():
    card = REAL_CARDS["gemma_tiny_q_proj"]
    product = make_plan(card, H200).problem
    bias = TensorArg((64,), (1,), BF16)
    residual = TensorArg((64, 64), (64, 1), BF16)
    ops = [EpilogueOp("aten.add.Tensor", (RESULT, EpilogueInput("bias", bias, (0, 1)))),
           EpilogueOp("aten.gelu.default", (RESULT,), {"approximate": "tanh"}),
           EpilogueOp("aten.add.Tensor", (EpilogueInput("residual", residual, (64, 1)), RESULT),
                      {"alpha": 0.5})]
    return fuse_epilogue(product, ops, TensorArg((64, 64), (64, 1), BF16))


def test_an_op_list_fuses_after_the_product_rounding_as_eager_stores_each_result():
    problem = fused_problem()
    steps = [(s.expr, s.rounds_to) for s in problem.epilogue.steps]
    assert steps == [("v", BF16), ("v + e0", BF16), ("kf::gelu_tanh(v)", BF16), ("e1 + p0 * v", None)]
    assert [e.name for e in problem.epilogue.tensors] == ["bias", "residual"]
    family = Matmul()
    kernel = family.render(problem, "mma", family.variants(problem, H200)[2].space.default, H200)
    assert "const float e0 = kf::to_float(t0[n]);" in kernel.source
    assert "const float e1 = kf::to_float(t1[m * 64 + n]);" in kernel.source
    assert kernel.plan["launches"][0]["params"][2:] == [{"ptr": "bias"}, {"ptr": "residual"},
                                                        {"ptr": "out"}, {"f32": 0.5}]


@pytest.mark.parametrize("op, why", [
    (EpilogueOp("aten.sum.dim_IntList", (RESULT, [1])), "cannot be fused"),
    (EpilogueOp("aten.add.Tensor", (RESULT, RESULT)), "exactly once"),
    (EpilogueOp("aten.add.Tensor", (RESULT, EpilogueInput("x", TensorArg((64,), (1,), F32), (0, 1)))),
     "not bfloat16"),
])
def test_ops_that_cannot_join_the_epilogue_are_declined(op, why):
    product = make_plan(REAL_CARDS["gemma_tiny_q_proj"], H200).problem
    with pytest.raises(Declined, match=why):
        fuse_epilogue(product, [op], product.out)


def ref(name: str) -> dict:
    return {"t": "ref", "v": name}


def linear_gelu_residual_region(m: int = 40, k: int = 72, n: int = 48, dtype: str = BF16) -> OpCard:
    """mm, + bias, gelu (tanh), + residual: a Linear layer with its activation and residual."""
    nodes = ({"op": "aten.mm.default", "args": [ref("x0"), ref("x1")], "kwargs": {}},
             {"op": "aten.add.Tensor", "args": [ref("n0"), ref("x2")], "kwargs": {}},
             {"op": "aten.gelu.default", "args": [ref("n1")], "kwargs": {"approximate": "tanh"}},
             {"op": "aten.add.Tensor", "args": [ref("x3"), ref("n2")], "kwargs": {}})
    inputs = (t([m, k], dtype), weight_t(k, n, dtype), t([n], dtype), t([m, n], dtype))
    region = Region(nodes, inputs, ("n3",))
    return OpCard(region.op, list(inputs), region=region.to_dict())


def test_a_fusion_region_becomes_one_matmul_with_an_epilogue():
    card = linear_gelu_residual_region()
    problem = region_problem(card)
    assert (problem.a_name, problem.b_name) == ("x0", "x1")
    assert [e.name for e in problem.epilogue.tensors] == ["x2", "x3"]
    family = Matmul()
    plan = Plan(family, problem, tuple(family.variants(problem, H200)))
    for variant in plan.available:
        candidate = build_candidate(plan, variant, variant.space.default, H200, card, "")
        check_plan(candidate, resolved(card, candidate))
        args, result, launches = run_plan(card, candidate)
        check_outputs(card, args, result)
        assert [p for p in candidate.plan["launches"][-1]["params"] if "ptr" in p][-3:] == [
            {"ptr": "x2"}, {"ptr": "x3"}, {"ptr": "out"}]


def test_regions_that_are_not_a_product_and_elementwise_ops_are_declined():
    nodes = ({"op": "aten.relu.default", "args": [ref("x0")], "kwargs": {}},
             {"op": "aten.mul.Tensor", "args": [ref("n0"), 2.0], "kwargs": {}})
    region = Region(nodes, (t([4, 4]),), ("n1",))
    with pytest.raises(Declined, match="does not start with a matrix product"):
        region_problem(OpCard(region.op, [t([4, 4])], region=region.to_dict()))
    nodes = ({"op": "aten.mm.default", "args": [ref("x0"), ref("x1")], "kwargs": {}},
             {"op": "aten.relu.default", "args": [ref("n0")], "kwargs": {}})
    region = Region(nodes, (t([4, 4]), t([4, 4])), ("n0", "n1"))
    with pytest.raises(Declined, match="only output"):
        region_problem(OpCard(region.op, [t([4, 4]), t([4, 4])], region=region.to_dict()))


# ----- NVRTC -----


@pytest.fixture(scope="module")
def compiler():
    pytest.importorskip("cuda.core", reason="NVRTC through cuda.core is not installed")
    from kforge.runtime.nvrtc import Compiler

    return Compiler()


def compile_jobs(compiler, jobs: list[tuple[str, object, str]]) -> list[tuple[str, object, object, float]]:
    """Compile (label, candidate, arch), two at a time; each with its own wall time."""

    def one(job):
        label, candidate, arch = job
        start = time.perf_counter()
        result = compiler.compile(candidate.source, arch, candidate.meta.get("nvrtc_options"))
        return label, candidate, result, time.perf_counter() - start

    compiler.compile('extern "C" __global__ void warm_up() {}', "sm_90")  # loads cuda.core once
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, jobs))


def assert_compiled(label, candidate, result, spills_allowed: bool = False) -> None:
    assert result.ok, f"{label}:\n{result.log[:3000]}"
    names = set(parse_plan(candidate.plan).kernel_names())
    assert names <= set(result.resources), f"{label}: no register report for {names - set(result.resources)}"
    if not spills_allowed:
        assert not result.spills, f"{label} spills:\n{result.log}"


GPUS = {"sm_90": H200, "sm_121": GB10}


def job(name: str, approach: str, arch: str, params: dict | None = None):
    card, gpu = REAL_CARDS[name], GPUS[arch]
    plan = make_plan(card, gpu)
    variant = plan.variant(approach)
    params = params or variant.space.default
    return (f"{name}/{arch}/{approach} {params}", build_candidate(plan, variant, params, gpu, card, ""), arch)


def report(results) -> None:
    for label, _, result, seconds in results:
        print(f"nvrtc {seconds:6.2f} s  {label}  registers "
              f"{max((r.registers for r in result.resources.values()), default=0)}")


def test_each_kernel_kind_compiles_for_h200_and_gb10_without_spills(compiler):
    jobs = [job("gemma_gate_decode", "gemv", "sm_90"),
            job("gemma_gate_prefill", "wgmma", "sm_90"),  # two consumer warpgroups
            job("decode_batch16", "wgmma", "sm_90"),  # one, split K
            job("decode_batch16", "mma", "sm_90"),  # split K
            job("sd35_tiny_transposed_a", "mma", "sm_90"),  # ldmatrix.trans
            job("qwen_tiny_bmm_kt", "simt", "sm_90"),  # float32
            job("gemma_gate_decode", "gemv", "sm_121"),
            job("gemma_gate_prefill", "mma", "sm_121"),
            job("sd35_tiny_addmm", "simt", "sm_121")]
    results = compile_jobs(compiler, jobs)
    report(results)
    for label, candidate, result, _ in results:
        assert_compiled(label, candidate, result)


def test_fused_epilogues_compile(compiler):
    card = linear_gelu_residual_region(256, 512, 384)
    problem = region_problem(card)
    family = Matmul()
    plan = Plan(family, problem, tuple(family.variants(problem, H200)))
    jobs = [(f"region/{v.approach}", build_candidate(plan, v, v.space.default, H200, card, ""), "sm_90")
            for v in plan.available]
    results = compile_jobs(compiler, jobs)
    report(results)
    for label, candidate, result, _ in results:
        assert_compiled(label, candidate, result)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90", "sm_121"])
def test_every_variant_compiles_for_every_real_card(compiler, arch):
    jobs = [job(name, v.approach, arch) for name, card in REAL_CARDS.items()
            for v in make_plan(card, GPUS[arch]).available]
    results = compile_jobs(compiler, jobs)
    report(results)
    for label, candidate, result, _ in results:
        # ptxas for sm_121 holds the float32 reference at 48 registers, one spilled.
        assert_compiled(label, candidate, result, "sm_121/simt" in label)


@pytest.mark.slow
def test_sampled_points_compile(compiler):
    rng = random.Random(0)
    jobs = []
    for name in rng.sample(sorted(REAL_CARDS), 8):
        plan = make_plan(REAL_CARDS[name], H200)
        jobs += [job(name, v.approach, "sm_90", p) for v, p in points(plan, rng, 1)[2::3]]
    for label, candidate, result, _ in compile_jobs(compiler, jobs):
        assert_compiled(label, candidate, result, spills_allowed=True)  # may ask for too many registers


# ----- the tensor-core layouts against CuTe -----

ORACLE = r"""
#include <cstdint>
#include <cstdio>
#include <cute/tensor.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/atom/mma_traits_sm80.hpp>
#include "matmul_smem.cuh"
using namespace cute;
using T = cutlass::bfloat16_t;
int main() {
  int bad = 0;
  // Swizzle128 is CuTe's 128-byte swizzled K-major layout (evaluated through an aligned pointer:
  // the swizzle acts on byte addresses).
  alignas(1024) static T big[256 * 64];
  auto swizzled = make_tensor(make_smem_ptr(big), tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{},
                                                                make_shape(Int<256>{}, Int<64>{})));
  for (int r = 0; r < 256; ++r)
    for (int c = 0; c < 64; ++c) bad += int(&swizzled(r, c) - big) != kf::mm::Swizzle128::offset(r, c);
  // sw128_descriptor is make_gmma_desc<K> of each 16-wide K slice of a 64-row tile.
  alignas(1024) static T storage[64 * 64];
  auto tile = make_tensor(make_smem_ptr(storage), tile_to_shape(GMMA::Layout_K_SW128_Atom<T>{},
                                                                make_shape(Int<64>{}, Int<64>{})));
  for (int kk = 0; kk < 4; ++kk) {
    auto slice = local_tile(tile, make_shape(Int<64>{}, Int<16>{}), make_coord(0, kk));
    GmmaDescriptor cute_desc = GMMA::make_gmma_desc<GMMA::Major::K>(slice);
    GmmaDescriptor ours(kf::mm::sw128_descriptor(uint32_t((raw_pointer_cast(slice.data()) - storage) * 2)));
    bad += cute_desc.bitfield.leading_byte_offset_ != ours.bitfield.leading_byte_offset_;
    bad += cute_desc.bitfield.stride_byte_offset_ != ours.bitfield.stride_byte_offset_;
    bad += cute_desc.bitfield.layout_type_ != ours.bitfield.layout_type_;
    bad += cute_desc.bitfield.base_offset_ != ours.bitfield.base_offset_;
    bad += ours.bitfield.start_address_ != kk * 32 / 16;
  }
  // wgmma m64n256k16 accumulators: value v of thread t is (m, n) as matmul_sm90.cu stores it.
  using C = MMA_Traits<SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>>::CLayout;
  for (int t = 0; t < 128; ++t)
    for (int v = 0; v < 128; ++v) {
      const int idx = C{}(t, v);
      bad += idx % 64 != t / 32 * 16 + t % 32 / 4 + 8 * (v / 2 % 2) || idx / 64 != v / 4 * 8 + t % 4 * 2 + v % 2;
    }
  // mma.sync m16n8k16 fragments as the ldmatrix addressing in matmul.cu assumes them.
  using F = MMA_Traits<SM80_16x8x16_F32BF16BF16F32_TN>;
  for (int t = 0; t < 32; ++t) {
    for (int v = 0; v < 8; ++v) {
      const int idx = typename F::ALayout{}(t, v), r = v / 2;
      bad += idx % 16 != t / 4 + r % 2 * 8 || idx / 16 != t % 4 * 2 + v % 2 + r / 2 * 8;
    }
    for (int v = 0; v < 4; ++v) {
      const int b = typename F::BLayout{}(t, v), c = typename F::CLayout{}(t, v);
      bad += b % 8 != t / 4 || b / 8 != t % 4 * 2 + v % 2 + v / 2 * 8;
      bad += c % 16 != t / 4 + v / 2 * 8 || c / 16 != t % 4 * 2 + v % 2;
    }
  }
  printf("mismatches %d\n", bad);
  return bad != 0;
}
"""


@pytest.mark.slow
def test_tensor_core_layouts_match_cute(tmp_path: Path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    try:
        import cutlass_library
    except ImportError:
        pytest.skip("the CUTLASS headers (pip install nvidia-cutlass) are not installed")
    include = Path(cutlass_library.__file__).parent / "source" / "include"
    library = Path(__file__).resolve().parents[2] / "kforge" / "propose" / "library" / "cuda"
    (tmp_path / "oracle.cu").write_text(ORACLE)
    build = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90a", f"-I{include}", f"-I{library}",
                            "-o", str(tmp_path / "oracle"), str(tmp_path / "oracle.cu")],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(tmp_path / "oracle")], capture_output=True, text=True)
    assert run.returncode == 0 and "mismatches 0" in run.stdout, run.stdout[-2000:]
