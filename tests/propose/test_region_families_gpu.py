"""Region kernels on a GPU: region cards captured on CUDA (a small transformer block, the tiny
models, and the hand-made modules of ``test_region_families`` at model sizes) get a family from
the library, and every variant it proposes, at its default point and the reference at its safe
point, passes the evaluator's verification (captured-style and random inputs, layouts, poisoned
outputs, untouched inputs); the speedup over the eager chain is reported (``pytest -s`` prints
one line per kernel: speedup and fraction of the copy-bandwidth floor)."""

from __future__ import annotations

import pytest
import torch

from kforge.capture.loader import ModelOptions, load_model
from kforge.capture.recorder import ModuleTracker
from kforge.capture.regions import TraceRecorder, region_cards
from kforge.core.opcard import OpCard
from kforge.propose.library.cards import Declined
from kforge.propose.library.proposer import build_candidate, make_plan
from kforge.runtime.regions import register_cards
from tests.capture.test_regions import Block
from tests.propose.test_region_families import handmade

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TINY_MODELS = ("gemma4-tiny", "qwen35-tiny", "sd35-tiny")
MODEL_SCALE = 64  # hand-made modules: rows of 4096 elements, 1024x1024 attention scores


def cuda_cards(forward, model: torch.nn.Module) -> list[OpCard]:
    """The region cards of one forward, captured on the GPU, their operators defined."""
    tracker = ModuleTracker(model)
    recorder = TraceRecorder(tracker)
    with torch.no_grad(), tracker, recorder:
        forward()
    torch.cuda.synchronize()
    cards = region_cards(recorder.trace, [], total_us=1.0).cards
    register_cards(cards)
    return cards


def block_cards() -> dict[str, OpCard]:
    model = Block().to("cuda", torch.bfloat16)
    x = torch.randn(2, 8, 32, device="cuda", dtype=torch.bfloat16)
    return {f"block/{c.short_op}": c for c in cuda_cards(lambda: model(x), model)}


def tiny_model_cards(name: str) -> dict[str, OpCard]:
    loaded = load_model(name, ModelOptions(device="cuda"))
    loaded.prepare()
    return {f"{name}/{c.op.split('.')[1]}": c
            for c in cuda_cards(loaded.step, loaded.model)}


def handmade_cards() -> dict[str, OpCard]:
    found = {}
    for name, (module, inputs, _) in handmade(torch.bfloat16, MODEL_SCALE).items():
        module = module.to("cuda", torch.bfloat16)
        inputs = tuple(t.to("cuda") for t in inputs)
        (card,) = cuda_cards(lambda: module(*inputs), module)
        found[f"handmade/{name}"] = card
    return found


@pytest.fixture(scope="module")
def cards() -> dict[str, OpCard]:
    found = {**block_cards(), **handmade_cards()}
    for name in TINY_MODELS:
        found.update(tiny_model_cards(name))
    return found


@pytest.fixture(scope="module")
def gpu_eval():
    from kforge.eval.process.local import device_context, evaluate_local
    from kforge.eval.verify.pipeline import EvalSettings
    from kforge.runtime.timing import TimingPlan

    settings = EvalSettings(timing=TimingPlan(warmup=2, min_reps=10, max_reps=50, budget_s=0.05),
                            compile_baseline=False)
    gpu = device_context(0).gpu
    return gpu, lambda card, candidate: evaluate_local(card, candidate, settings=settings)


def evaluate_family(gpu_eval, name: str, card: OpCard) -> list[str]:
    """Every proposed point of the card's family evaluated; the failures, as lines."""
    gpu, evaluate = gpu_eval
    plan = make_plan(card, gpu)
    points = [(v, v.space.default) for v in plan.available]
    points.append((plan.reference, plan.reference.space.safe))
    failures = []
    for variant, params in points:
        outcome = evaluate(card, build_candidate(plan, variant, params, gpu, card, ""))
        label = f"{name} {plan.family.name}/{variant.approach} {params}"
        if not outcome.ok or outcome.speedup is None:
            failures.append(f"{label}: {outcome.status.value}: {outcome.summary}")
            continue
        floor = f", {outcome.floor_fraction:.0%} of the floor" if outcome.floor_fraction else ""
        print(f"{label}: {outcome.speedup:.2f}x over eager{floor}")
    return failures


def test_the_block_s_norm_gate_and_softmax_regions_pass_verification(gpu_eval, cards):
    block = {n: c for n, c in cards.items() if n.startswith("block/")}
    assert len(block) == 3
    failures = [f for name, card in sorted(block.items())
                for f in evaluate_family(gpu_eval, name, card)]
    assert not failures, "\n".join(failures)


def test_hand_made_regions_at_model_sizes_pass_verification(gpu_eval, cards):
    failures = [f for name, card in sorted(cards.items()) if name.startswith("handmade/")
                for f in evaluate_family(gpu_eval, name, card)]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("model", TINY_MODELS)
def test_every_tiny_model_region_the_library_takes_passes_verification(gpu_eval, cards, model):
    gpu, _ = gpu_eval
    taken, failures = 0, []
    for name, card in sorted(cards.items()):
        if not name.startswith(model + "/"):
            continue
        try:
            make_plan(card, gpu)
        except Declined as exc:
            print(f"{name}: declined: {exc}")
            continue
        taken += 1
        failures += evaluate_family(gpu_eval, name, card)
    assert taken, f"no region of {model} has a library kernel"
    assert not failures, "\n".join(failures)
