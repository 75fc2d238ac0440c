"""The matmul family on a GPU: each variant, launched through its plan by the evaluator, passes
verification against eager (cuBLAS) at the tiny models' cards, a Llama-style 8-layer model's
prefill of 512 tokens at hidden size 2048 (bf16), decode steps of 1 to 16 rows, float32 batches,
transposed and misaligned operands, and a fused Linear + bias + GELU + residual region. Each
outcome prints its time against eager's."""

from __future__ import annotations

import pytest
import torch

from kforge.core.opcard import OpCard
from kforge.propose.library.families.matmul import Matmul, region_problem
from kforge.propose.library.proposer import Plan, build_candidate, make_plan
from tests.propose.test_matmul_family import (
    REAL_CARDS,
    linear_gelu_residual_region,
    t,
    weight_t,
)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CARDS = {name: REAL_CARDS[name] for name in (
    "gemma_tiny_q_proj", "gemma_tiny_lm_head", "gemma_tiny_rotary", "sd35_tiny_addmm",
    "sd35_tiny_transposed_a", "qwen_tiny_n1", "qwen_tiny_bmm_nmajor", "qwen_tiny_bmm_broadcast",
    "llama_q_prefill512", "llama_down_prefill512", "llama_q_decode", "gemma_gate_decode",
    "decode_batch16", "fp16_decode")}
CARDS |= {
    "misaligned_a": OpCard("aten.mm.default", [t([40, 72], offset=1), weight_t(72, 48)]),
    "odd_k_rows": OpCard("aten.mm.default", [t([33, 1001]), weight_t(1001, 65)]),
    "n_major_b": OpCard("aten.mm.default", [t([96, 64], "float16"), t([64, 200], "float16")]),
    "addmm_full_bias": OpCard("aten.addmm.default", [t([70, 96]), t([70, 40]), weight_t(40, 96)],
                              {"beta": 0.5, "alpha": 2.0}),
    "bmm_bf16": OpCard("aten.bmm.default", [t([4, 100, 64]), t([4, 64, 80])]),
}


@pytest.fixture(scope="module")
def gpu_eval():
    from kforge.eval.process.local import device_context, evaluate_local
    from kforge.eval.verify.pipeline import EvalSettings
    from kforge.runtime.timing import TimingPlan

    settings = EvalSettings(timing=TimingPlan(warmup=2, min_reps=10, max_reps=50, budget_s=0.05),
                            compile_baseline=False)
    gpu = device_context(0).gpu
    return gpu, lambda card, candidate: evaluate_local(card, candidate, settings=settings)


def extra_points(plan: Plan) -> list[tuple]:
    """Beyond each default: the reference's safe point, the tensor-core variants' split-K and
    largest-tile points where the space has them."""
    found = [(plan.reference, plan.reference.space.safe)]
    for variant in plan.available:
        space = variant.space
        split = [p for p in space.points() if p.get("splits", 1) > 1]
        large = [p for p in space.points() if p.get("bm", 0) >= 128 and p.get("splits", 1) == 1]
        for options in (split, large):
            if options:
                found.append((variant, min(options, key=lambda p: space.distance(p, space.default))))
    return found


def check(gpu_eval, card: OpCard, plan: Plan, label: str) -> None:
    gpu, evaluate = gpu_eval
    points = [(v, v.space.default) for v in plan.available] + extra_points(plan)
    failures = []
    for variant, params in points:
        candidate = build_candidate(plan, variant, params, gpu, card, "")
        outcome = evaluate(card, candidate)
        time_us = outcome.timing.median_us if outcome.timing else None
        print(f"{label}: {variant.approach} {params}: {outcome.status.value}, "
              f"{time_us} us, {outcome.speedup}x eager, nvrtc "
              f"{outcome.compile.seconds if outcome.compile else None} s")
        if not outcome.ok:
            failures.append(f"{variant.approach} {params}: {outcome.status.value}: {outcome.summary}")
    assert not failures, f"{label}:\n" + "\n".join(failures)


@pytest.mark.parametrize("name", sorted(CARDS))
def test_every_variant_matches_eager(gpu_eval, name):
    card = CARDS[name]
    check(gpu_eval, card, make_plan(card, gpu_eval[0]), name)


@pytest.mark.parametrize("shape", [(40, 72, 48), (512, 2048, 2048), (1, 2048, 8192)])
def test_a_fused_linear_bias_gelu_residual_region_matches_eager(gpu_eval, shape):
    card = linear_gelu_residual_region(*shape)
    problem = region_problem(card)
    family = Matmul()
    check(gpu_eval, card, Plan(family, problem, tuple(family.variants(problem, gpu_eval[0]))),
          f"region {shape}")
