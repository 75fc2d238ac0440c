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

Each card is measured in a child process (``--in-process``: all in this one): a kernel that
faults kills only its child's CUDA context, the card's line names the kernel, its point and the
check it faulted in, and a new child goes on with the next card.

Run on a GPU machine from the repository root (a few minutes on an H200):
    python3 bench/bench_library.py [--refine 3] [--only softmax] [--no-compile]
"""

from __future__ import annotations

import argparse
import json
import math
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kforge.core.candidate import Candidate, EvalOutcome
from kforge.core.mcts import Action
from kforge.core.opcard import OpCard
from kforge.core.protocols import NodeView, ProposalRequest
from kforge.errors import KforgeError
from kforge.eval.process.local import baseline_local, device_context, evaluate_local
from kforge.eval.verify.pipeline import EvalSettings
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


class Crashed(Exception):
    """An evaluation left this process's GPU context dead (or unfit): nothing more can run here."""


def search(card: OpCard, proposer: LibraryProposer, gpu, refine: int, settings: EvalSettings,
           emit: Callable[[dict], None] = lambda event: None) -> list[Tried]:
    """Every variant at its default point, then REFINE steps from the best so far. ``emit`` is
    told of each candidate before it is evaluated and of its outcome after; Crashed once an
    outcome says the process is unfit for another."""
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
        named = {"approach": candidate.meta["approach"], "params": candidate.meta.get("params", {})}
        emit({"kind": "evaluating", **named})
        outcome = evaluate_local(card, candidate, settings=settings)
        timing, eager = outcome.timing, outcome.eager
        emit({"kind": "tried", **named, "status": outcome.status.value, "summary": outcome.summary,
              "median_us": timing.median_us if timing else None,
              "eager_us": eager.median_us if eager else None})
        if outcome.restart:
            raise Crashed(outcome.summary)
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


def selected(only: str) -> list[int]:
    """Indices in ``model_cards()`` of the cards whose op or model contains ``only``."""
    return [i for i, (model, c) in enumerate(model_cards())
            if not only or only in c.op or only in model]


def run_cards(indices: list[int], refine: int, compile_baseline: bool,
              emit: Callable[[dict], None]) -> int:
    """Measure the cards at ``indices`` in this process, telling ``emit`` of every step
    (``Table.take`` reads the events). 3 once an evaluation left the GPU context unfit."""
    try:
        gpu = device_context(0).gpu
    except KforgeError as exc:
        emit({"kind": "fatal", "error": str(exc)})
        return 1
    emit({"kind": "gpu", "label": gpu.label, "sm_count": gpu.sm_count,
          "bandwidth_gbs": gpu.bandwidth_gbs})
    proposer = LibraryProposer(gpu)
    settings = EvalSettings(compile_baseline=compile_baseline)
    cards = model_cards()
    for i in indices:
        model, c = cards[i]
        emit({"kind": "card", "card": i})
        if not supports(c):
            emit({"kind": "skip", "reason": supports(c).reason})
            continue
        try:
            base = baseline_local(c, settings=settings)
        except KforgeError as exc:
            emit({"kind": "skip", "reason": str(exc)})
            continue
        except Exception as exc:  # a context poisoned before, or eager's own fault
            emit({"kind": "skip", "reason": f"baseline failed: {type(exc).__name__}: {exc}"})
            if not device_context(0).runtime.alive():
                return 3
            continue
        emit({"kind": "baseline", "eager_us": base.eager.median_us,
              "compiled_us": base.compiled.median_us if base.compiled else None,
              "floor_us": base.floor_us})
        try:
            search(c, proposer, gpu, refine, settings, emit)
        except Crashed:
            emit({"kind": "done"})
            return 3
        emit({"kind": "done"})
    return 0


class Table:
    """The rows of the tables, built from ``run_cards``' events (in this process or a child's)."""

    def __init__(self, show_tried: bool) -> None:
        self.show_tried = show_tried
        self.cards = model_cards()
        self.rows: list[tuple] = []
        self.card: int | None = None  # the card being measured
        self.base: dict | None = None
        self.tried: list[dict] = []
        self.evaluating: dict | None = None  # a candidate sent and not yet answered
        self.finished: set[int] = set()
        self.fatal = False  # no GPU to measure on
        self.started = time.perf_counter()

    def take(self, event: dict) -> None:
        kind = event["kind"]
        if kind == "gpu":
            print(f"# {event['label']}, {event['sm_count']} SMs, copy bandwidth "
                  f"{fmt(event['bandwidth_gbs'], '.0f')} GB/s", file=sys.stderr)
        elif kind == "fatal":
            print(f"bench_library: {event['error']}", file=sys.stderr)
            self.fatal = True
        elif kind == "card":
            self.card, self.base, self.tried, self.evaluating = event["card"], None, [], None
        elif kind == "skip":
            print(f"skip {self.label()}: {event['reason']}", file=sys.stderr)
            self.finished.add(self.card)
        elif kind == "baseline":
            self.base = event
        elif kind == "evaluating":
            self.evaluating = event
        elif kind == "tried":
            self.evaluating = None
            self.tried.append(event)
            if self.show_tried:
                print(f"  {event['approach']} {event['params']}: {event['status']}, "
                      f"{fmt(event['median_us'])} us (eager in its run {fmt(event['eager_us'])} us)",
                      file=sys.stderr)
        elif kind == "done":
            self.finish()

    def lost(self, why: str, status: str = "crash") -> None:
        """The process measuring the current card ended without finishing it (``why``): the
        candidate in flight, if any, is that card's last, with ``status`` and the reason."""
        if self.card is None or self.card in self.finished:
            return
        if self.evaluating is not None:
            self.tried.append({**self.evaluating, "status": status, "summary": why,
                               "median_us": None, "eager_us": None})
            self.evaluating = None
        if self.base is None:
            print(f"skip {self.label()}: {why}", file=sys.stderr)
            self.finished.add(self.card)
            return
        self.finish()

    def label(self) -> str:
        model, c = self.cards[self.card]
        return f"{model} {c.short_op} {c.signature}"

    def finish(self) -> None:
        model, c = self.cards[self.card]
        base = self.base
        ok = [t for t in self.tried if t["status"] == "ok" and t["median_us"]]
        best = min(ok, key=lambda t: t["median_us"]) if ok else None
        best_us = best["median_us"] if best else None
        failed = [f"{t['approach']}: {t['status']}" for t in self.tried if t["status"] != "ok"]
        eager, compiled, floor = base["eager_us"], base["compiled_us"], base["floor_us"]
        self.rows.append((model, supports(c).family, c.short_op, c.signature[:60], eager, compiled,
                          best_us, best["approach"] if best else "-",
                          eager / best_us if best_us else None,
                          compiled / best_us if best_us and compiled else None,
                          100 * floor / best_us if best_us and floor else None, len(self.tried)))
        print(f"{self.label()}: eager {eager:.1f} us, best {fmt(best_us)} us "
              f"({len(self.tried)} tried{'; failed ' + ', '.join(failed) if failed else ''}) "
              f"[{time.perf_counter() - self.started:.0f} s]", file=sys.stderr)
        for t in self.tried:  # what failed, and where: the kernel, its point and the check
            if t["status"] != "ok":
                why = str(t.get("summary") or "")[:400]
                print(f"  {t['status']}: {t['approach']} {t['params']}: {why}", file=sys.stderr)
        self.finished.add(self.card)


EVENT = "kforge-bench-event "  # a child's stdout line carrying one event, as JSON


def child_command(left: list[int], args: argparse.Namespace) -> list[str]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child",
               ",".join(map(str, left)), "--refine", str(args.refine)]
    return command + (["--no-compile"] if args.no_compile else [])


def run_isolated(indices: list[int], args: argparse.Namespace, table: Table,
                 command: Callable[[list[int], argparse.Namespace], list[str]] = child_command
                 ) -> None:
    """The cards in child processes (``command(cards left, args)``), one after another: a child
    that crashes (a kernel fault kills its CUDA context) or stops answering for ``args.timeout``
    seconds ends only the card it was on; the next child goes on from the card after it."""
    left = list(indices)
    while left:
        child = subprocess.Popen(command(left, args), stdout=subprocess.PIPE, text=True,
                                 bufsize=1)
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=lambda: [*map(lines.put, child.stdout), lines.put(None)],
                         daemon=True).start()
        why, status = None, "crash"
        while True:
            try:
                line = lines.get(timeout=args.timeout)
            except queue.Empty:
                child.kill()
                why = f"no answer within {args.timeout:.0f} s (a hang?): the child was killed"
                status = "timeout"
                break
            if line is None:
                break
            if line.startswith(EVENT):
                table.take(json.loads(line[len(EVENT):]))
            else:
                print(line, end="", file=sys.stderr)
        code = child.wait()
        if table.fatal:
            return
        if why is None and code not in (0, 3):
            why = f"the process died with code {code}"
        if why is None and code == 3:
            why = "the evaluation left the GPU context unfit (a kernel fault)"
        if why is not None:
            table.lost(why, status)
        before, left = len(left), [i for i in left if i not in table.finished]
        if left and len(left) == before:  # a child that cannot even start: no use trying again
            print(f"bench_library: the child process ended before measuring a card "
                  f"({why or f'code {code}'}); {len(left)} cards left unmeasured", file=sys.stderr)
            return


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refine", type=int, default=3, help="REFINE steps after the NEW ones")
    parser.add_argument("--only", default="", help="only cards whose op or model contains this")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--show-tried", action="store_true",
                        help="print every candidate tried: variant, parameters, verdict, time")
    parser.add_argument("--in-process", action="store_true",
                        help="evaluate in this process (a kernel fault ends the whole run)")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds a child may go without news before it is killed")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # card indices, for run_isolated
    args = parser.parse_args()

    if args.child is not None:
        def emit(event: dict) -> None:
            print(EVENT + json.dumps(event), flush=True)

        return run_cards([int(i) for i in args.child.split(",") if i], args.refine,
                         not args.no_compile, emit)

    table = Table(args.show_tried)
    indices = selected(args.only)
    if args.in_process:
        if run_cards(indices, args.refine, not args.no_compile, table.take) == 3:
            table.lost("the GPU context died: the run ends here (without --in-process each card "
                       "runs in a child process)")
    else:
        run_isolated(indices, args, table)
    if table.fatal:
        return 1
    rows = table.rows

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
          f"{time.perf_counter() - table.started:.0f} s in all.")
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
