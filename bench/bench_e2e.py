"""Every mode a user would pick, per model, side by side: eager, eager + kforge, CUDA graphs +/-
kforge, torch.compile default / reduce-overhead / max-autotune +/- kforge, and (``--aa``) each
compiled mode's A/A control (kforge's backend with no kernel).

    python bench/bench_e2e.py                              # every model, every mode
    python bench/bench_e2e.py --models unet,llama --modes eager,graphs,compile,reduce-overhead
    python bench/bench_e2e.py --reuse                      # keep each model's searched database
    python bench/bench_e2e.py --aa-only --models unet      # A/A only: no profile, no search
    python bench/bench_e2e.py --summary bench-out/e2e/*.json   # the tables again, from results

Per model: ``kforge profile``, a small offline search of its largest ops with the built-in kernel
library (``kforge search --proposer library``), then in this process every mode timed interleaved
(``kforge.integrate.decide.measure_session``, what ``kforge e2e`` runs): the kforge kernels of
eager and CUDA graph modes chosen by measuring the model; those of each compiled mode by a few
whole-model compiles in that mode's kernel choice (``--trials``), then kforge's compiled model
against torch.compile alone, Inductor's own result kept where kforge's is not faster. Latency is
device time (the host released ahead of the GPU); host-inclusive time is a column of its own.
Each model's result is written to ``<out>/<model>.json`` as soon as it is measured; the tables
(latency, speedup over eager, what kforge gains per mode, compile and capture times) end with
geometric means over the models.

The models: kforge's built-in zoo (ResNet-50; SD3.5 with 2 MMDiT layers; Gemma 4 and Qwen3.5
decode steps and a Gemma 4 prefill, with 4 layers), a UNet-style fp16 model (``build_unet``: two
blocks of GroupNorm, SiLU, conv and softmax attention with LayerNorm) and a Llama-architecture
prefill (``build_llama``: the TinyLlama-1.1B config, 4 of its 22 layers), neither of them built in.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve()
SESSION = 1

# name -> (model spec, extra `kforge profile` arguments)
MODELS: dict[str, tuple[str, list[str]]] = {
    "unet": (f"{HERE}:build_unet", []),
    "llama": (f"{HERE}:build_llama", []),
    "resnet50": ("resnet50", []),
    "gemma4-decode": ("gemma4", ["--mode", "decode", "--layers", "4"]),
    "gemma4-prefill": ("gemma4", ["--mode", "prefill", "--layers", "4"]),
    "qwen35-decode": ("qwen35", ["--mode", "decode", "--layers", "4"]),
    "sd35": ("sd35", ["--layers", "2"]),
}


# ----- the models no built-in covers -----


class UNetBlock(nn.Module):
    """GroupNorm, SiLU and 3x3 conv twice (residual), then softmax self-attention over the
    pixels behind a LayerNorm (residual)."""

    def __init__(self, channels: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.GroupNorm(32, channels), nn.GroupNorm(32, channels)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.attn_norm = nn.LayerNorm(channels)
        self.qkv = nn.Linear(channels, 3 * channels)
        self.out = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.conv2(F.silu(self.norm2(self.conv1(F.silu(self.norm1(x))))))
        b, c, h, w = x.shape
        tokens = x.flatten(2).transpose(1, 2)  # [b, h*w, c]
        q, k, v = (t.reshape(b, h * w, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(self.attn_norm(tokens)).chunk(3, dim=-1))
        scores = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)
        mixed = (scores @ v).transpose(1, 2).reshape(b, h * w, c)
        tokens = tokens + self.out(mixed)
        return tokens.transpose(1, 2).reshape(b, c, h, w)


class UNetStyle(nn.Module):
    """In conv, a block at full resolution, a strided conv down, a block at half resolution, an
    upsampling back with a skip connection, out conv."""

    def __init__(self, channels: int = 256, heads: int = 4, in_channels: int = 4) -> None:
        super().__init__()
        self.inp = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.high = UNetBlock(channels, heads)
        self.down = nn.Conv2d(channels, channels, 3, stride=2, padding=1)
        self.low = UNetBlock(channels, heads)
        self.out_norm = nn.GroupNorm(32, channels)
        self.outp = nn.Conv2d(channels, in_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        high = self.high(self.inp(x))
        low = self.low(self.down(high))
        up = F.interpolate(low, scale_factor=2.0, mode="nearest") + high
        return self.outp(F.silu(self.out_norm(up)))


def build_unet(batch: int = 8, device: torch.device | None = None):
    """The UNet-style model in fp16 on 32x32 latents of 4 channels."""
    with torch.device(device or "cpu"):
        model = UNetStyle().to(torch.float16)
        x = torch.randn(batch, 4, 32, 32, dtype=torch.float16)
    return model, (x,)


TINYLLAMA = {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
             "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
             "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
             "hidden_act": "silu", "tie_word_embeddings": False}


def build_llama(batch: int = 1, seq_len: int = 512, layers: int = 4,
                device: torch.device | None = None):
    """A Llama-architecture prefill (TinyLlama-1.1B's config, ``layers`` of its 22 layers) in
    bf16: ``seq_len`` prompt tokens, the last token's logits kept, as generation does."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{**TINYLLAMA, "num_hidden_layers": layers})
    with torch.device(device or "cpu"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
        ids = torch.randint(0, config.vocab_size, (batch, seq_len))
    return model, (ids,), {"use_cache": False, "logits_to_keep": 1}


# ----- one model: profile, search, every mode -----


def kforge(*args: str, timeout: float) -> None:
    """Run the kforge CLI; its output goes to our log as well.

    The profile and the search run as commands of their own, not through ``kforge.app`` in this
    process: this process then times the model, and a search's CUDA context, its evaluator pool
    and the memory a profile leaves in torch's caching allocator must not be in it while it
    does; and ``timeout`` bounds a step that hangs."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kforge", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout, check=False)
    print(f"$ kforge {' '.join(args)}  ({time.perf_counter() - started:.0f} s, "
          f"rc {proc.returncode})")
    print(proc.stdout[-4000:])
    if proc.returncode != 0:
        raise RuntimeError(f"kforge {args[0]} failed: {proc.stderr.strip()[-2000:]}")


def searched_db(name: str, args: argparse.Namespace) -> Path:
    """The model's database with a profiled and searched session (reused with --reuse)."""
    spec, extra = MODELS[name]
    db = Path(args.work) / name / "k.db"
    if args.reuse and db.exists():
        print(f"{name}: reusing {db}")
        return db
    db.parent.mkdir(parents=True, exist_ok=True)
    db.unlink(missing_ok=True)
    kforge("profile", spec, "--db", str(db), "--samples", "2", *extra,
           timeout=args.step_timeout)
    kforge("search", "--session", str(SESSION), "--db", str(db), "--proposer", "library",
           "--top", str(args.top), "--iterations", str(args.iterations), "--parallel", "4",
           "--quiet", timeout=args.step_timeout)
    return db


def measure_model(name: str, args: argparse.Namespace) -> dict:
    from kforge.integrate.decide import measure_session
    from kforge.integrate.measure import parse_modes, rebuild_model
    from kforge.integrate.patching import build_patch
    from kforge.integrate.plan import read_plan

    db = searched_db(name, args)
    device = torch.device("cuda", 0)
    plan = read_plan(db, SESSION, graphs=True)
    patch = build_patch(plan, device)
    loaded = rebuild_model(plan.session, device, trust_model=True)  # a session this bench made
    started = time.perf_counter()
    result = measure_session(patch, loaded, parse_modes(args.modes, aa=args.aa), reps=args.reps,
                             warmup=args.warmup, trials=args.trials)
    torch._dynamo.reset()  # the next model starts from empty compile caches
    return summary(name, device, len(patch.table), result, started)


def measure_aa(name: str, args: argparse.Namespace) -> dict:
    """The A/A control alone: each compiled mode of ``--modes`` against kforge's backend with no
    kernel, interleaved; no profile, no search."""
    from kforge.capture import ModelOptions, load_model
    from kforge.integrate.measure import parse_modes, run_modes
    from kforge.runtime.guard import Patch
    from kforge.runtime.table import KernelTable

    device = torch.device("cuda", 0)
    spec, _ = MODELS[name]
    loaded = load_model(spec, ModelOptions(device=str(device)))
    modes = [m for m in parse_modes(args.modes, aa=True) if not m.kforge or m.control]
    started = time.perf_counter()
    result = run_modes(loaded, modes, patched=Patch(KernelTable()), projected=1.0,
                       reps=args.reps, warmup=args.warmup)
    torch._dynamo.reset()
    return summary(name, device, 0, result, started)


def summary(name: str, device: torch.device, winners: int, result, started: float) -> dict:
    def timing(t) -> dict:
        return {"median_us": t.median_us if t else None, "p10_us": t.p10_us if t else None,
                "p90_us": t.p90_us if t else None}

    return {
        "model": name, "gpu": torch.cuda.get_device_name(device), "winners": winners,
        "projected": result.projected, "measure_s": time.perf_counter() - started,
        "modes": {s.mode: {"label": s.name, "error": s.error, "setup_s": s.setup_s,
                           "kernels": s.kernels, "ran": s.ran, **timing(s.timing),
                           "host_us": s.host.median_us if s.host else None,
                           "tried_us": s.tried.median_us if s.tried else None,
                           "rel_diff": s.difference.rel if s.difference else None}
                  for s in result.subjects},
        "notes": result.notes}


# ----- tables -----


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def fmt(value: float | None, unit: str = "", digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def tables(results: list[dict]) -> str:
    """Markdown: latency per mode, speedup over eager, kforge's gain per mode, setup times."""
    from kforge.integrate.measure import BASES, CONTROLS, KFORGE_SUFFIX, MODES

    every = {**MODES, **CONTROLS}
    done = [r for r in results if "modes" in r]
    order = [m for base in BASES for m in (base, base + "+aa", base + KFORGE_SUFFIX)]
    modes = [m for m in order if any(m in r["modes"] for r in done)]
    labels = [every[m].label for m in modes]
    head = "| model | " + " | ".join(labels) + " |\n|---|" + "---:|" * len(labels)

    def median(r: dict, mode: str) -> float | None:
        return (r["modes"].get(mode) or {}).get("median_us")

    def latency(r: dict, mode: str) -> str:
        us = median(r, mode)
        return f"{us / 1000:.3f}" if us else (r["modes"].get(mode) or {}).get("error", "-")[:60]

    def host(r: dict, mode: str) -> str:
        us = (r["modes"].get(mode) or {}).get("host_us")
        return f"{us / 1000:.3f}" if us else "-"

    lines = ["### Latency per forward (ms; device time, median of interleaved reps)", "", head]
    lines += [f"| {r['model']} | " + " | ".join(latency(r, m) for m in modes) + " |"
              for r in done]
    lines += ["", "### Host-inclusive latency (ms; the GPU idle before each call)", "", head]
    lines += [f"| {r['model']} | " + " | ".join(host(r, m) for m in modes) + " |"
              for r in done]
    lines += ["", "### Speedup over eager", "", head]
    speedups: dict[str, list[float]] = {m: [] for m in modes}
    for r in done:
        eager, cells = median(r, "eager"), []
        for m in modes:
            value = eager / median(r, m) if eager and median(r, m) else None
            if value:
                speedups[m].append(value)
            cells.append(fmt(value, "x"))
        lines.append(f"| {r['model']} | " + " | ".join(cells) + " |")
    lines.append("| **geomean** | " + " | ".join(fmt(geomean(speedups[m]), "x")
                                                for m in modes) + " |")
    bases = [b for b in BASES if b in modes and b + KFORGE_SUFFIX in modes]
    lines += ["", "### What kforge's kernels gain in each mode (mode / mode + kforge; 'no kernels' "
              "where none ran, Inductor's own result handed back)", "",
              "| model | winners | projected | " + " | ".join(MODES[b].label for b in bases) +
              " |", "|---|---:|---:|" + "---:|" * len(bases)]
    gains: dict[str, list[float]] = {b: [] for b in bases}
    for r in done:
        cells = []
        for b in bases:
            without, with_kforge = median(r, b), median(r, b + KFORGE_SUFFIX)
            value = without / with_kforge if without and with_kforge else None
            ran = (r["modes"].get(b + KFORGE_SUFFIX) or {}).get("ran")
            if value and ran == 0:
                tried = (r["modes"].get(b + KFORGE_SUFFIX) or {}).get("tried_us")
                cells.append("no kernels" + (f" (tried {without / tried:.3f}x)" if tried else ""))
                gains[b].append(1.0)  # what the user gets: Inductor's own model
                continue
            if value:
                gains[b].append(value)
            cells.append(fmt(value, "x", 3))
        lines.append(f"| {r['model']} | {r['winners']} | {fmt(r['projected'], 'x', 3)} | " +
                     " | ".join(cells) + " |")
    lines.append("| **geomean** | | | " + " | ".join(fmt(geomean(gains[b]), "x", 3)
                                                    for b in bases) + " |")
    lines += ["", "### Compile or capture time (s) and kforge kernels (calls, nodes)", "", head]
    for r in done:
        lines.append(f"| {r['model']} | " + " | ".join(
            f"{fmt((r['modes'].get(m) or {}).get('setup_s'), '', 1)} "
            f"{(r['modes'].get(m) or {}).get('kernels', '')}".strip() for m in modes) + " |")
    failed = [r for r in results if "error" in r]
    lines += [f"\n{r['model']} failed: {r['error']}" for r in failed]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, of {', '.join(MODELS)} (default: all)")
    parser.add_argument("--modes", default="all", help="as `kforge e2e --modes` (default: all)")
    parser.add_argument("--aa", action="store_true",
                        help="also each compiled mode's A/A control (kforge's backend, no kernel)")
    parser.add_argument("--aa-only", action="store_true",
                        help="only torch.compile alone against the A/A control (no search)")
    parser.add_argument("--trials", type=int, default=4,
                        help="kernels tried per compiled mode's kernel choice (default 4)")
    parser.add_argument("--out", default="bench-out/e2e", help="folder for the result files")
    parser.add_argument("--work", default="/tmp/kforge-e2e", help="folder for the databases")
    parser.add_argument("--reuse", action="store_true",
                        help="reuse a model's database from an earlier run (no new search)")
    parser.add_argument("--top", type=int, default=6, help="ops searched per model")
    parser.add_argument("--iterations", type=int, default=8, help="iterations per op")
    parser.add_argument("--reps", type=int, default=20, help="timed forwards per mode")
    parser.add_argument("--warmup", type=int, default=3, help="untimed forwards first")
    parser.add_argument("--step-timeout", type=float, default=900,
                        help="seconds for each profile or search")
    parser.add_argument("--summary", nargs="*", help="print the tables of these result files")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    if args.summary:
        print(tables([json.loads(Path(p).read_text()) for p in args.summary]))
        return 0
    if not torch.cuda.is_available():
        raise SystemExit("bench_e2e needs a CUDA GPU")
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    if unknown := [n for n in names if n not in MODELS]:
        raise SystemExit(f"unknown model {unknown[0]!r}: use {', '.join(MODELS)}")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in names:
        try:
            result = measure_aa(name, args) if args.aa_only else measure_model(name, args)
        except Exception as exc:  # one model failing leaves the others' results standing
            traceback.print_exc()  # where it failed, for the log
            result = {"model": name, "error": f"{type(exc).__name__}: {exc}"[:500]}
        (out / f"{name}.json").write_text(json.dumps(result, indent=1))
        results.append(result)
        print(tables(results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
