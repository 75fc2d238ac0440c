"""Benchmark the built-in kernel library at real shapes of the four built-in models.

For each op card: eager and torch.compile times, then a short search over the library's space
(every variant at its default point, then a few REFINE steps from the best so far, as the MCTS
would take them), and a table: the best kernel's time, its speedup over eager and torch.compile,
and the share of the memory floor it reaches (bytes moved at the measured copy bandwidth divided
by its time). A second table gives the same per family, for ``docs/BENCHMARKS.md``.

Shapes come from the models' published configurations:
- ResNet-50 (torchvision), fp16, batch 32 at 224x224: stem 64@112x112, stages 256@56x56,
  512@28x28, 1024@14x14, 2048@7x7 (in-place ReLU, in-place residual add, 3x3/2 max pool, global
  average pooling lowered to a mean over H, W).
- Stable Diffusion 3.5 Medium, bf16, 1024x1024: MMDiT hidden 1536 (24 heads of 64), 4096 image
  tokens (128x128 latent, patch 2), LayerNorm without affine (eps 1e-6),
  RMSNorm on q/k per head, GELU-tanh MLP of 6144, adaLN modulation [1,1,1536]; VAE decoder
  GroupNorm (32 groups, eps 1e-6) and SiLU at 512@128x128 up to 128@1024x1024.
- Gemma 4 E2B, bf16, 2048 tokens: hidden 1536, 8 heads, head_dim 256, vocab 262144, per-layer
  embeddings 35 x 256, GELU-tanh MLP of 6144; RMSNorm as transformers writes it (cast to fp32,
  pow 2, mean, + eps, pow -0.5, two muls, cast back) and eager attention's fp32 softmax.
- Qwen3.5 (9B configuration), bf16, 2048 tokens: hidden 4096, 16 heads of 256, vocab 248320,
  SiLU MLP of 12288, sigmoid output gate; Gated DeltaNet's causal depthwise conv1d over
  8192 channels (kernel 4, padding 3) on a channels-fastest view.
- Beyond them: ResNet-50's inference batch norms (fp16, batch 32, every stage), SD3.5's joint
  attention ``cat`` and q/k RMSNorm ``mean`` over a transposed view, a UNet's layer_norm on a
  [B, C, H*W] activation read as [B, H*W, C] (SD 1.5 at 768x768: 320 channels at 96x96 / 4),
  decode-step embeddings (one token), rotary ``cos`` and ``cat``, and whole-tensor reductions.

Run on a GPU machine from the repository root (a few minutes on an H200):
    python3 bench/bench_library.py [--refine 3] [--only softmax] [--no-compile]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kforge.core.candidate import Candidate, EvalOutcome
from kforge.core.mcts import Action
from kforge.core.opcard import OpCard
from kforge.core.protocols import NodeView, ProposalRequest
from kforge.errors import KforgeError
from kforge.eval.local import baseline_local, device_context, evaluate_local
from kforge.eval.pipeline import EvalSettings
from kforge.propose.library import LibraryProposer, supports
from kforge.propose.library.examples import channels_last, tensor

F32, F16, BF16 = "float32", "float16", "bfloat16"
FP32 = {"t": "dtype", "v": F32}
BF16_DTYPE = {"t": "dtype", "v": BF16}


def card(op: str, *args, **kwargs) -> OpCard:
    return OpCard(op, list(args), kwargs)


def t(shape: list[int], dtype: str, **kw) -> dict:
    return tensor(shape, dtype, **kw)


def rms_norm_chain(tokens: int, hidden: int) -> list[OpCard]:
    """transformers' RMSNorm, op by op, on [1, tokens, hidden] bf16."""
    x32, col = t([1, tokens, hidden], F32), t([1, tokens, 1], F32)
    return [
        card("aten._to_copy.default", t([1, tokens, hidden], BF16), dtype=FP32),
        card("aten.pow.Tensor_Scalar", x32, 2),
        card("aten.mean.dim", x32, [-1], True),
        card("aten.add.Tensor", col, 1e-6),
        card("aten.pow.Tensor_Scalar", col, -0.5),
        card("aten.mul.Tensor", x32, col),
        card("aten.mul.Tensor", x32, t([hidden], F32)),
        card("aten._to_copy.default", x32, dtype=BF16_DTYPE),
    ]


def model_cards() -> list[tuple[str, OpCard]]:
    resnet = [
        *(card("aten.native_batch_norm.default", t([32, c, hw, hw], F16), t([c], F16), t([c], F16),
               t([c], F16), t([c], F16), False, 0.1, 1e-5)
          for c, hw in ((64, 112), (256, 56), (512, 28), (1024, 14), (2048, 7))),
        card("aten.relu_.default", t([32, 64, 112, 112], F16)),
        card("aten.max_pool2d_with_indices.default", t([32, 64, 112, 112], F16), [3, 3], [2, 2], [1, 1]),
        card("aten.add_.Tensor", t([32, 256, 56, 56], F16), t([32, 256, 56, 56], F16)),
        card("aten.add_.Tensor", t([32, 1024, 14, 14], F16), t([32, 1024, 14, 14], F16)),
        card("aten.mean.dim", t([32, 2048, 7, 7], F16), [-1, -2], True),
        card("aten.mean.dim", channels_last([32, 2048, 7, 7], F16), [-1, -2], True),
    ]
    image, hidden = 4096, 1536
    sd35 = [
        card("aten.native_layer_norm.default", t([1, image, hidden], BF16), [hidden], None, None, 1e-6),
        card("aten._fused_rms_norm.default", t([1, image, 24, 64], BF16), [64], t([64], BF16), 1e-6),
        card("aten.gelu.default", t([1, image, 4 * hidden], BF16), approximate="tanh"),
        card("aten.mul.Tensor", t([1, image, hidden], BF16), t([1, 1, hidden], BF16)),
        card("aten.add.Tensor", t([1, image, hidden], BF16), t([1, 1, hidden], BF16)),
        card("aten.native_group_norm.default", t([1, 512, 128, 128], BF16), t([512], BF16),
             t([512], BF16), 1, 512, 128 * 128, 32, 1e-6),
        card("aten.native_group_norm.default", t([1, 128, 1024, 1024], BF16), t([128], BF16),
             t([128], BF16), 1, 128, 1024 * 1024, 32, 1e-6),
        card("aten.silu.default", t([1, 128, 1024, 1024], BF16)),
        card("aten.native_group_norm.default", t([1, 256, 512, 512], BF16), t([256], BF16),
             t([256], BF16), 1, 256, 512 * 512, 32, 1e-6),
        card("aten.native_group_norm.default", t([1, 512, 256, 256], BF16), t([512], BF16),
             t([512], BF16), 1, 512, 256 * 256, 32, 1e-6),
        card("aten.cat.default", [t([2, 24, image, 64], BF16, stride=[24 * image * 64, 64, 1536, 1]),
                                  t([2, 24, 333, 64], BF16, stride=[24 * 333 * 64, 64, 1536, 1])], 2),
        card("aten.mean.dim", t([2, 24, image, 64], F32, stride=[24 * image * 64, 64, 1536, 1]), [-1], True),
    ]
    unet = [
        card("aten.native_layer_norm.default", t([2, 2304, 320], F16, stride=[737280, 1, 2304]), [320],
             t([320], F16), t([320], F16), 1e-5),
        card("aten.native_layer_norm.default", t([2, 576, 640], F16, stride=[368640, 1, 576]), [640],
             t([640], F16), t([640], F16), 1e-5),
    ]
    tokens = 2048
    gemma = [
        card("aten.embedding.default", t([262144, 1536], BF16), t([1, tokens], "int64"), 0),
        card("aten.embedding.default", t([262144, 35 * 256], BF16), t([1, tokens], "int64"), 0),
        *rms_norm_chain(tokens, 1536),
        card("aten._to_copy.default", t([1, 8, tokens, tokens], BF16), dtype=FP32),
        card("aten._softmax.default", t([1, 8, tokens, tokens], F32), -1, False),
        card("aten.gelu.default", t([1, tokens, 6144], BF16), approximate="tanh"),
        card("aten.mul.Tensor", t([1, tokens, 6144], BF16), t([1, tokens, 6144], BF16)),
        card("aten.cos.default", t([1, tokens, 256], F32)),
        card("aten.cat.default", [t([1, 8, tokens, 128], BF16, stride=[8 * tokens * 256, 256, 2048, 1]),
                                  t([1, 8, tokens, 128], BF16)], -1),
        card("aten.embedding.default", t([262144, 1536], BF16), t([1, 1], "int64"), 0),
        card("aten.embedding.default", t([262144, 35 * 256], BF16), t([1, 1], "int64"), 0),
        card("aten.amax.default", t([1, 262144], F32), [-1], True),
        card("aten.sum.default", t([tokens, 1536], F32)),
    ]
    qwen = [
        card("aten.embedding.default", t([248320, 4096], BF16), t([1, tokens], "int64")),
        card("aten.convolution.default", t([1, 8192, tokens], BF16, stride=[tokens * 8192, 1, 8192]),
             t([8192, 1, 4], BF16), None, [1], [3], [1], False, [0], 8192),
        card("aten.silu.default", t([1, tokens, 12288], BF16)),
        card("aten.mul.Tensor", t([1, tokens, 12288], BF16), t([1, tokens, 12288], BF16)),
        card("aten.sigmoid.default", t([1, tokens, 4096], BF16)),
        card("aten._softmax.default", t([1, 16, tokens, tokens], F32), -1, False),
    ]
    return ([("ResNet-50", c) for c in resnet] + [("SD3.5-M", c) for c in sd35]
            + [("UNet", c) for c in unet]
            + [("Gemma4-E2B", c) for c in gemma] + [("Qwen3.5", c) for c in qwen])


@dataclass
class Tried:
    candidate: Candidate
    outcome: EvalOutcome
    view: NodeView
    lineage: list[NodeView]


def search(card: OpCard, proposer: LibraryProposer, gpu, refine: int, settings: EvalSettings) -> list[Tried]:
    """Every variant at its default point, then REFINE steps from the best so far."""
    done: list[Tried] = []

    def step(action: Action, parent: Tried | None) -> bool:
        request = ProposalRequest(card=card, action=action, gpu=gpu,
                                  parent=parent.view if parent else None,
                                  lineage=parent.lineage if parent else [],
                                  tried=[d.candidate.meta for d in done], seed=len(done))
        proposal = proposer.propose_now(request)
        if not proposal.candidates:
            return False
        candidate = proposal.candidates[0]
        outcome = evaluate_local(card, candidate, settings=settings)
        view = NodeView(len(done) + 1, action, candidate, outcome)
        done.append(Tried(candidate, outcome, view, (parent.lineage if parent else []) + [view]))
        return True

    for _ in supports(card).approaches:
        step(Action.NEW, None)
    for _ in range(refine):
        ok = [d for d in done if d.outcome.ok and d.outcome.speedup]
        if not ok or not step(Action.REFINE, max(ok, key=lambda d: d.outcome.speedup)):
            break
    return done


def fmt(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refine", type=int, default=3, help="REFINE steps after the NEW ones")
    parser.add_argument("--only", default="", help="only cards whose op or model contains this")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--show-tried", action="store_true",
                        help="print every candidate tried: variant, parameters, verdict, time")
    args = parser.parse_args()

    try:
        gpu = device_context(0).gpu
    except KforgeError as exc:
        print(f"bench_library: {exc}", file=sys.stderr)
        return 1
    print(f"# {gpu.label}, {gpu.sm_count} SMs, copy bandwidth {fmt(gpu.bandwidth_gbs, '.0f')} GB/s",
          file=sys.stderr)
    proposer = LibraryProposer(gpu)
    settings = EvalSettings(compile_baseline=not args.no_compile)
    rows = []
    started = time.perf_counter()
    for model, c in model_cards():
        if args.only and args.only not in c.op and args.only not in model:
            continue
        label = f"{model} {c.short_op} {c.signature}"
        if not supports(c):
            print(f"skip {label}: {supports(c).reason}", file=sys.stderr)
            continue
        try:
            base = baseline_local(c, settings=settings)
        except KforgeError as exc:
            print(f"skip {label}: {exc}", file=sys.stderr)
            continue
        tried = search(c, proposer, gpu, args.refine, settings)
        ok = [d for d in tried if d.outcome.ok and d.outcome.timing]
        best = min(ok, key=lambda d: d.outcome.timing.median_us) if ok else None
        failed = [f"{d.candidate.meta['approach']}: {d.outcome.status.value}" for d in tried if not d.outcome.ok]
        best_us = best.outcome.timing.median_us if best else None
        rows.append((model, supports(c).family, c.short_op, c.signature[:60], base.eager.median_us,
                     base.compiled.median_us if base.compiled else None, best_us,
                     best.candidate.meta["approach"] if best else "-",
                     base.eager.median_us / best_us if best_us else None,
                     base.compiled.median_us / best_us if best_us and base.compiled else None,
                     100 * base.floor_us / best_us if best_us and base.floor_us else None,
                     len(tried)))
        if args.show_tried:
            for d in tried:
                timing = d.outcome.timing
                print(f"  {d.candidate.meta['approach']} {d.candidate.meta.get('params', '')}: "
                      f"{d.outcome.status.value}, {fmt(timing.median_us if timing else None)} us "
                      f"(eager in its run {fmt(d.outcome.eager.median_us if d.outcome.eager else None)}"
                      f" us)", file=sys.stderr)
        print(f"{label}: eager {base.eager.median_us:.1f} us, best {fmt(best_us)} us "
              f"({len(tried)} tried{'; failed ' + ', '.join(failed) if failed else ''}) "
              f"[{time.perf_counter() - started:.0f} s]", file=sys.stderr)

    header = ("model", "op", "args", "eager us", "compile us", "best us", "variant", "x eager",
              "x compile", "% floor", "tried")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        print(f"| {r[0]} | {r[2]} | {r[3]} | {fmt(r[4])} | {fmt(r[5])} | {fmt(r[6])} | {r[7]} | "
              f"{fmt(r[8], '.2f', 'x')} | {fmt(r[9], '.2f', 'x')} | {fmt(r[10], '.0f', '%')} | {r[11]} |")
    print_by_family(rows)
    wins = sum(1 for r in rows if r[8] and r[8] > 1.0)
    floor = sum(1 for r in rows if r[10] and r[10] >= 85)
    print(f"\n{wins} of {len(rows)} cards beat eager, {floor} reach 85% of the copy floor; "
          f"{time.perf_counter() - started:.0f} s in all.")
    return 0


def print_by_family(rows: list[tuple]) -> None:
    """The per-family table: each family's cards, eager, torch.compile, the best kernel and the
    share of the copy floor it reaches, then the family's geometric mean over eager."""
    header = ("family", "model", "args", "eager us", "compile us", "best us", "variant", "% floor")
    print("\n| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for family in sorted({r[1] for r in rows}):
        mine = [r for r in rows if r[1] == family]
        for r in mine:
            print(f"| {family} | {r[0]} | `{r[3]}` | {fmt(r[4])} | {fmt(r[5])} | {fmt(r[6])} | {r[7]} | "
                  f"{fmt(r[10], '.0f', '%')} |")
        speedups = [r[8] for r in mine if r[8]]
        if speedups:
            mean = math.exp(sum(math.log(x) for x in speedups) / len(speedups))
            print(f"| {family} | geometric mean | | | | | {mean:.2f}x eager | |")


if __name__ == "__main__":
    raise SystemExit(main())
