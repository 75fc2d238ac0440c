"""Time a card's library variants three ways, side by side: bare, as the evaluator prepares each
call, and by the evaluator itself, to tell a kernel's own time from what the harness adds to it.

- bare: the plan's launches on one input set, on outputs and scratch made as integration makes
  them, L2 flushed before each call;
- prepared: each call as the evaluator makes it (new input values, fresh outputs and scratch
  between fences, filled with poison, L2 flushed), timed the same way;
- evaluated: the median the evaluator's verdict reports (eager timed interleaved with it).
Eager is timed bare as well. Every variant runs at its default point unless ``--params`` names others.

Cards are bench_library's (``--only`` as there). Run on a GPU machine from the repository root:
    python3 bench/bench_variant.py --only "group_norm [[1, 512, 128" [--approach split --params '{...}' ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_library import model_cards

from kforge.core.argspec import resolve_op
from kforge.core.opcard import OpCard
from kforge.core.settings import TimingPlan
from kforge.errors import KforgeError
from kforge.eval.process.local import device_context, evaluate_local
from kforge.eval.verify.inputs import InputFactory
from kforge.eval.verify.pipeline import CandidateCalls, EvalSettings, plan_runner
from kforge.propose.library.proposer import build_candidate, make_plan
from kforge.runtime.timing import Subject, time_interleaved


def timed_median(runtime, calls: int, run, prepare=None) -> float:
    """Median GPU time of ``run(i)`` over CALLS calls after 3 untimed ones, each after
    ``prepare(i)`` and an L2 flush: the evaluator's own timing loop, one subject."""
    plan = TimingPlan(warmup=3, min_reps=calls, max_reps=calls)
    return time_interleaved({"it": Subject(run, prepare)}, runtime, plan).timings["it"].median_us


def label(model: str, card: OpCard) -> str:
    shapes = [a.get("shape") for a in card.args if isinstance(a, dict) and "shape" in a]
    return f"{model} {card.op.split('.')[1]} {shapes}"


def time_variant(ctx, card: OpCard, plan, variant, params: dict, factory: InputFactory,
                 calls_n: int) -> str:
    """One table row: the variant timed bare, prepared and evaluated."""
    runtime, device = ctx.runtime, ctx.runtime.device
    candidate = build_candidate(plan, variant, params, ctx.gpu, card, "bench_variant")
    compiled = ctx.loader.compile(candidate)
    if not compiled.ok:
        return f"does not compile: {compiled.log[:300]}"
    runner = plan_runner(card, candidate, ctx.loader.load(compiled), compiled, device)
    inputs, calls, fresh = factory.random_set(1), CandidateCalls(runner, runtime), {}

    def allocate(i: int) -> None:  # scratch a plan wants zeroed is zeroed here
        fresh["memory"] = runner.allocate()

    def prepare(i: int) -> None:
        factory.refill(inputs, 100 + i)
        fresh["memory"] = calls.memory()

    bare = timed_median(runtime, calls_n,
                        lambda i: runner.launch(inputs.args, inputs.kwargs, fresh["memory"]), allocate)
    prepared = timed_median(runtime, calls_n, lambda i: calls.run(inputs, fresh["memory"]), prepare)
    outcome = evaluate_local(card, candidate, settings=EvalSettings(compile_baseline=False))
    verdict = "" if outcome.ok else f" ({outcome.status.value}: {outcome.summary[:200]})"
    return (f"{bare:.1f} | {prepared:.1f} | "
            f"{fmt(outcome.timing.median_us if outcome.timing else None)}{verdict} | "
            f"{fmt(outcome.eager.median_us if outcome.eager else None)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", required=True, help="cards whose label contains this")
    parser.add_argument("--approach", default="", help="only this variant")
    parser.add_argument("--params", action="append", default=[],
                        help="a JSON point of the variant's space (repeat for several)")
    parser.add_argument("--calls", type=int, default=50, help="timed calls per way")
    args = parser.parse_args()
    try:
        ctx = device_context(0)
    except KforgeError as exc:
        print(f"bench_variant: {exc}", file=sys.stderr)
        return 1
    print(f"# {ctx.gpu.label}, {ctx.gpu.sm_count} SMs", file=sys.stderr)
    print("| card | variant | params | bare us | prepared us | evaluated us "
          "| eager evaluated us | eager bare us |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for model, card in model_cards():
        name = label(model, card)
        if args.only not in name:
            continue
        plan = make_plan(card, ctx.gpu)
        with ctx.runtime.scope():  # inputs made on the stream that uses them
            factory = InputFactory(card, ctx.runtime.device)
            eager_us = time_eager(ctx.runtime, card, factory, args.calls)
            for variant in plan.available:
                if args.approach and variant.approach != args.approach:
                    continue
                for params in [json.loads(p) for p in args.params] or [variant.space.default]:
                    row = time_variant(ctx, card, plan, variant, params, factory, args.calls)
                    print(f"| {name} | {variant.approach} | {json.dumps(params)} | {row} "
                          f"| {eager_us:.1f} |", flush=True)
    return 0


def time_eager(runtime, card: OpCard, factory: InputFactory, calls_n: int) -> float:
    op, inputs = resolve_op(card.op), factory.random_set(1)
    return timed_median(runtime, calls_n, lambda i: op(*inputs.args, **inputs.kwargs))


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    raise SystemExit(main())
