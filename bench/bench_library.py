"""Benchmark the built-in kernel library at real shapes of the four built-in models.

For each op card: eager and torch.compile times, then a short search over the library's space
(every variant at its default point, then a few REFINE steps from the best so far, as the MCTS
would take them), and a table: the best kernel's time, its speedup over eager and torch.compile,
and the share of the memory floor it reaches (bytes moved at the measured copy bandwidth divided
by its time).

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

Run on a GPU machine from the repository root (a few minutes on an H200):
    python3 bench/bench_library.py [--refine 3] [--only softmax] [--no-compile]
"""

from __future__ import annotations

import argparse
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
        rows.append((model, c.short_op, c.signature[:60], base.eager.median_us,
                     base.compiled.median_us if base.compiled else None, best_us,
                     best.candidate.meta["approach"] if best else "-",
                     base.eager.median_us / best_us if best_us else None,
                     base.compiled.median_us / best_us if best_us and base.compiled else None,
                     100 * base.floor_us / best_us if best_us and base.floor_us else None,
                     len(tried)))
        print(f"{label}: eager {base.eager.median_us:.1f} us, best {fmt(best_us)} us "
              f"({len(tried)} tried{'; failed ' + ', '.join(failed) if failed else ''}) "
              f"[{time.perf_counter() - started:.0f} s]", file=sys.stderr)

    header = ("model", "op", "args", "eager us", "compile us", "best us", "variant", "x eager",
              "x compile", "% floor", "tried")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {fmt(r[3])} | {fmt(r[4])} | {fmt(r[5])} | {r[6]} | "
              f"{fmt(r[7], '.2f', 'x')} | {fmt(r[8], '.2f', 'x')} | {fmt(r[9], '.0f', '%')} | {r[10]} |")
    wins = sum(1 for r in rows if r[7] and r[7] > 1.0)
    print(f"\n{wins} of {len(rows)} cards beat eager; {time.perf_counter() - started:.0f} s in all.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
