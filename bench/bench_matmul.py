"""Benchmark the library's matmul family against cuBLAS (eager) and torch.compile at the built-in
models' mm/addmm/bmm shapes, a Llama-style config the library was not tuned on, and fused
epilogues (a product followed by bias, activation or residual, as one kernel against eager's
cuBLAS call plus separate kernels).

For each card: eager and torch.compile (``--compile-mode``, max-autotune without CUDA graphs by
default) timed side by side, then a short search of the family's space (every variant at its
default point, then ``--refine`` steps to an untried neighbour of the best so far), each candidate
verified and timed against eager by the evaluator. The table gives the best kernel, its speedup
over eager and torch.compile, its rate and share of the GPU's peak FLOP/s, and its NVRTC compile
time (candidates are compiled ``--jobs`` at a time beforehand, so under that much load).

Shapes:
- Gemma 4 E2B (bf16): prefill of 2048 tokens (MLP 1536 -> 12288 -> 1536, 1536 -> 6144 -> 1536)
  and decode (one row: the MLP, k_proj 1536 -> 256, o_proj 2048 -> 1536, lm_head 262144).
- SD3.5 Medium (bf16): addmm at 8192 tokens, hidden 1536 (attention projections, MLP of 6144).
- Qwen3.5 (bf16): decode rows (2048 -> 512, 8192, 32; 4096 -> 2048; lm_head 248320), a prefill
  projection 2048 -> 8192 at 2048 tokens, and the float32 bmm of its linear attention.
- Llama-style, 8 layers, hidden 2048, 32 heads of 64 (8 KV heads), MLP 8192 (bf16): prefill of
  512 tokens and decode of 1, 4 and 16 rows.
- Fused: SD3.5's MLP up-projection + GELU (tanh), Llama's o_proj + residual and gate projection +
  SiLU, Gemma's down-projection + residual.

Run on a GPU machine from the repository root:
    python3 bench/bench_matmul.py [--refine 4] [--only llama] [--compile-mode none]
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from kforge.core.argspec import resolve_op
from kforge.core.candidate import EvalOutcome
from kforge.core.opcard import OpCard
from kforge.core.region import Region
from kforge.errors import KforgeError
from kforge.eval.process.local import device_context, evaluate_local
from kforge.eval.verify.inputs import InputFactory
from kforge.eval.verify.pipeline import EvalSettings
from kforge.propose.library.cards import Declined
from kforge.propose.library.examples import tensor
from kforge.propose.library.families.matmul import Matmul, MatmulProblem, region_problem
from kforge.propose.library.proposer import Plan, build_candidate, make_plan
from kforge.propose.library.space import Params
from kforge.runtime.regions import region_function, register_cards
from kforge.runtime.timing import time_interleaved

BF16, F32 = "bfloat16", "float32"
# Dense peak of the GPUs this was run on, TFLOP/s: 16-bit tensor cores, float32 CUDA cores.
PEAK_TFLOPS = {"H200": {BF16: 989.4, "float16": 989.4, F32: 66.9},
               "H100": {BF16: 989.4, "float16": 989.4, F32: 66.9}}


def t(shape: list[int], dtype: str = BF16, **kw) -> dict:
    return tensor(shape, dtype, **kw)


def linear(m: int, k: int, n: int, dtype: str = BF16) -> OpCard:
    """x @ W.t() as nn.Linear issues it: the weight a transposed (K-major) view."""
    return OpCard("aten.mm.default", [t([m, k], dtype), t([k, n], dtype, stride=[1, k])])


def linear_bias(m: int, k: int, n: int) -> OpCard:
    return OpCard("aten.addmm.default", [t([n]), t([m, k]), t([k, n], stride=[1, k])])


def ref(name: str) -> dict:
    return {"t": "ref", "v": name}


def fused(m: int, k: int, n: int, *ops: str) -> OpCard:
    """A region: x @ W.t(), then ``ops`` in order: "bias", "residual" (adds an [m, n] tensor),
    "gelu_tanh", "silu"."""
    inputs = [t([m, k]), t([k, n], stride=[1, k])]
    nodes = [{"op": "aten.mm.default", "args": [ref("x0"), ref("x1")], "kwargs": {}}]
    for op in ops:
        last = ref(f"n{len(nodes) - 1}")
        if op in ("bias", "residual"):
            inputs.append(t([n] if op == "bias" else [m, n]))
            nodes.append({"op": "aten.add.Tensor", "args": [last, ref(f"x{len(inputs) - 1}")], "kwargs": {}})
        elif op == "gelu_tanh":
            nodes.append({"op": "aten.gelu.default", "args": [last], "kwargs": {"approximate": "tanh"}})
        else:
            nodes.append({"op": f"aten.{op}.default", "args": [last], "kwargs": {}})
    region = Region(tuple(nodes), tuple(inputs), (f"n{len(nodes) - 1}",))
    return OpCard(region.op, list(inputs), region=region.to_dict())


def cards() -> list[tuple[str, OpCard]]:
    gemma = [linear(2048, 1536, 12288), linear(2048, 12288, 1536), linear(2048, 1536, 6144),
             linear(2048, 6144, 1536), linear(1, 1536, 12288), linear(1, 12288, 1536),
             linear(1, 1536, 256), linear(1, 2048, 1536), linear(1, 1536, 262144)]
    sd35 = [linear_bias(8192, 1536, 1536), linear_bias(8192, 1536, 6144), linear_bias(8192, 6144, 1536)]
    qwen = [linear(1, 2048, 512), linear(1, 2048, 8192), linear(1, 4096, 2048), linear(1, 2048, 32),
            linear(1, 2048, 248320), linear(2048, 2048, 8192),
            OpCard("aten.bmm.default", [t([1024, 64, 128], F32), t([1024, 128, 64], F32, stride=[8192, 1, 128])])]
    llama = [linear(512, 2048, 2048), linear(512, 2048, 512), linear(512, 2048, 8192),
             linear(512, 8192, 2048)]
    for rows in (1, 4, 16):
        llama += [linear(rows, 2048, 2048), linear(rows, 2048, 8192), linear(rows, 8192, 2048)]
    fusions = [fused(8192, 1536, 6144, "bias", "gelu_tanh"), fused(512, 2048, 2048, "residual"),
               fused(512, 2048, 8192, "silu"), fused(2048, 6144, 1536, "residual"),
               fused(1, 2048, 8192, "silu")]
    return ([("Gemma4-E2B", c) for c in gemma] + [("SD3.5-M", c) for c in sd35]
            + [("Qwen3.5", c) for c in qwen] + [("Llama-8L-2048", c) for c in llama]
            + [("fused", c) for c in fusions])


def plan_for(card: OpCard, gpu) -> Plan:
    if card.region is None:
        return make_plan(card, gpu)
    problem = region_problem(card)
    family = Matmul()
    return Plan(family, problem, tuple(family.variants(problem, gpu)))


def baselines(card: OpCard, mode: str, settings: EvalSettings) -> tuple[float, float | None, float | None]:
    """Eager and torch.compile (``mode``; "none": skipped) medians in us, and the compile time."""
    ctx = device_context(0)
    register_cards([card])
    op = resolve_op(card.op)
    runtime = ctx.runtime
    with runtime.scope():
        inputs = InputFactory(card, runtime.device, None, 0).sets(settings.seeds)
        n = len(inputs)
        subjects = {"eager": lambda r: op(*inputs[r % n].args, **inputs[r % n].kwargs)}
        compile_s = None
        if mode != "none":
            torch._dynamo.reset()
            traced = region_function(card.region) if card.region else (lambda *a, **k: op(*a, **k))
            compiled = torch.compile(traced, mode=mode, dynamic=False)
            start = time.perf_counter()
            compiled(*inputs[0].args, **inputs[0].kwargs)
            runtime.sync()
            compile_s = time.perf_counter() - start
            subjects["compiled"] = lambda r: compiled(*inputs[r % n].args, **inputs[r % n].kwargs)
        timings = time_interleaved(subjects, runtime, settings.timing).timings
    compiled_us = timings["compiled"].median_us if "compiled" in timings else None
    return timings["eager"].median_us, compiled_us, compile_s


@dataclass
class Tried:
    approach: str
    params: Params
    outcome: EvalOutcome

    @property
    def us(self) -> float | None:
        return self.outcome.timing.median_us if self.outcome.ok and self.outcome.timing else None


def precompile(card: OpCard, plan: Plan, gpu, jobs: int) -> None:
    """Compile, in parallel, what the search is likely to try (every variant's default point and
    its neighbours), into the evaluator's cache: NVRTC runs outside the GIL."""
    loader = device_context(0).loader
    candidates = []
    for variant in plan.available:
        space = variant.space
        near = [p for p in space.points() if space.distance(p, space.default) == 1]
        candidates += [build_candidate(plan, variant, p, gpu, card, "") for p in [space.default, *near]]
    loader.compile(candidates[0])  # loads cuda.core once before threads race to it
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(loader.compile, candidates[1:]))


def search(card: OpCard, plan: Plan, gpu, refine: int, settings: EvalSettings) -> list[Tried]:
    """Every variant at its default point, then steps to the untried points nearest the best."""
    tried: list[Tried] = []

    def evaluate(variant, params: Params) -> None:
        candidate = build_candidate(plan, variant, params, gpu, card, "")
        tried.append(Tried(variant.approach, params, evaluate_local(card, candidate, settings=settings)))

    for variant in plan.available:
        evaluate(variant, variant.space.default)
    for _ in range(refine):
        ok = [d for d in tried if d.us]
        if not ok:
            break
        best = min(ok, key=lambda d: d.us)
        variant = plan.variant(best.approach)
        seen = [d.params for d in tried if d.approach == best.approach]
        near = variant.space.nearest(best.params, exclude=lambda p: p in seen)
        if not near:
            break
        evaluate(variant, near[0])
    return tried


def fmt(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def describe(card: OpCard, problem: MatmulProblem) -> str:
    shape = f"[{problem.batch}x]" if problem.batch > 1 else ""
    ops = "+".join(node["op"].split(".")[1] for node in card.region["nodes"][1:]) if card.region else ""
    return (f"{card.short_op if not card.region else 'mm+' + ops} {shape}{problem.m}x{problem.k}"
            f"x{problem.n} {problem.dtype}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refine", type=int, default=4, help="steps after every variant's default")
    parser.add_argument("--only", default="", help="only cards whose model or op contains this")
    parser.add_argument("--compile-mode", default="max-autotune-no-cudagraphs",
                        help="torch.compile mode, or 'none' to skip it")
    parser.add_argument("--peak-tflops", type=float, default=None, help="override the GPU's peak")
    parser.add_argument("--jobs", type=int, default=16, help="parallel NVRTC compiles")
    args = parser.parse_args()

    try:
        gpu = device_context(0).gpu
    except KforgeError as exc:
        print(f"bench_matmul: {exc}", file=sys.stderr)
        return 1
    peaks = next((p for name, p in PEAK_TFLOPS.items() if name in gpu.name), {})
    print(f"# {gpu.label}, {gpu.sm_count} SMs; peak TFLOP/s {args.peak_tflops or peaks or 'unknown'}",
          file=sys.stderr)
    settings = EvalSettings(compile_baseline=False, counters=False)
    rows = []
    started = time.perf_counter()
    for model, card in cards():
        if args.only and args.only not in model and args.only not in card.short_op:
            continue
        try:
            plan = plan_for(card, gpu)
        except Declined as exc:
            print(f"skip {model} {card.signature}: {exc}", file=sys.stderr)
            continue
        label = describe(card, plan.problem)
        eager_us, compiled_us, compile_s = baselines(card, args.compile_mode, settings)
        precompile(card, plan, gpu, args.jobs)
        tried = search(card, plan, gpu, args.refine, settings)
        ok = [d for d in tried if d.us]
        best = min(ok, key=lambda d: d.us) if ok else None
        failed = [f"{d.approach} {d.params}: {d.outcome.status.value} {d.outcome.summary[:120]}"
                  for d in tried if not d.outcome.ok]
        peak = args.peak_tflops or peaks.get(plan.problem.dtype)
        tflops = plan.problem.flops / best.us / 1e6 if best else None
        rows.append((model, label, eager_us, compiled_us, best, tflops,
                     100 * tflops / peak if tflops and peak else None, len(tried)))
        print(f"{model} {label}: eager {eager_us:.1f} us, compile {fmt(compiled_us)} us "
              f"({fmt(compile_s, '.0f')} s), best {fmt(best.us if best else None)} us "
              f"{best.approach + ' ' + str(best.params) if best else ''} [{time.perf_counter() - started:.0f} s]"
              + ("".join(f"\n  failed {f}" for f in failed)), file=sys.stderr)

    header = ("model", "product", "eager us", "compile us", "best us", "variant", "x eager",
              "x compile", "TFLOP/s", "% peak", "nvrtc s", "tried")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for model, label, eager_us, compiled_us, best, tflops, share, count in rows:
        speedup = best.outcome.speedup if best else None
        vs_compile = compiled_us / best.us if best and compiled_us else None
        variant = f"{best.approach} {best.params}" if best else "-"
        nvrtc = best.outcome.compile.seconds if best and best.outcome.compile else None
        print(f"| {model} | {label} | {eager_us:.1f} | {fmt(compiled_us)} | {fmt(best.us if best else None)} "
              f"| {variant} | {fmt(speedup, '.2f', 'x')} | {fmt(vs_compile, '.2f', 'x')} | {fmt(tflops, '.0f')} "
              f"| {fmt(share, '.0f', '%')} | {fmt(nvrtc, '.2f')} | {count} |")
    within = sum(1 for r in rows if r[4] and r[4].outcome.speedup and r[4].outcome.speedup >= 0.95)
    print(f"\n{within} of {len(rows)} cards within 5% of eager or faster; "
          f"{time.perf_counter() - started:.0f} s in all.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
