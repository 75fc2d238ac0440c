"""Profile the built-in models at full size on the GPU and print each one's op table.

    python bench/profile_zoo.py                   # all four models, prefill and decode for LLMs
    python bench/profile_zoo.py --models gemma4 --top 20 --seq-len 1024
    python bench/profile_zoo.py --tiny --device cpu      # the tiny twins: a smoke run anywhere

Per run it prints the top op variants with their share of GPU operator time, calls per forward,
eager time per call and the library that runs them, then the share per library. Models are built
with random weights directly on the GPU (nothing is downloaded) and freed before the next one.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import torch

from kforge.capture import ModelOptions, load_model, profile
from kforge.capture.report import format_table, library_shares, summary_line
from kforge.errors import KforgeError

RUNS = (("resnet50", None), ("sd35", None), ("gemma4", "prefill"), ("gemma4", "decode"),
        ("qwen35", "prefill"), ("qwen35", "decode"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=None,
                        help="restrict to these models (resnet50 sd35 gemma4 qwen35)")
    parser.add_argument("--top", type=int, default=12, help="op variants shown per run")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="override the LLM sequence length")
    parser.add_argument("--layers", type=int, default=None, help="truncate the deep models")
    parser.add_argument("--samples", type=int, default=0, help="sample inputs saved per card")
    parser.add_argument("--device", default="cuda", help="default cuda")
    parser.add_argument("--tiny", action="store_true", help="profile the tiny twins instead")
    args = parser.parse_args()
    on_gpu = args.device.startswith("cuda")
    if on_gpu and not torch.cuda.is_available():
        print("profile_zoo needs a CUDA GPU (or --device cpu --tiny)", file=sys.stderr)
        return 1
    gpu = torch.cuda.get_device_name() if on_gpu else "CPU"
    print(f"# {gpu}  torch {torch.__version__}")
    failures = 0
    for name, mode in RUNS:
        if args.models and name not in args.models:
            continue
        options = ModelOptions(
            device=args.device, mode=mode, seq_len=args.seq_len if mode else None,
            layers=args.layers if name != "resnet50" else None)
        failures += not run(f"{name}-tiny" if args.tiny else name, options, args.top,
                            args.samples, on_gpu)
    return 1 if failures else 0


def run(name: str, options: ModelOptions, top: int, samples: int, on_gpu: bool) -> bool:
    label = f"{name} {options.mode}" if options.mode else name
    print(f"\n## {label}", flush=True)
    started = time.perf_counter()
    loaded = None
    try:
        loaded = load_model(name, options)
        settings = loaded.settings
        built = time.perf_counter()
        with tempfile.TemporaryDirectory() as staging:
            result = profile(loaded, samples_per_card=samples, staging_dir=Path(staging))
    except KforgeError as exc:
        print(f"FAILED: {exc}", flush=True)
        return False
    finally:
        del loaded  # free the model before the next one is built
        gc.collect()
        if on_gpu:
            torch.cuda.empty_cache()
    done = time.perf_counter()
    print(summary_line(name, settings, result))
    memory = ""
    if on_gpu:
        memory = f", peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
        torch.cuda.reset_peak_memory_stats()
    print(f"build {built - started:.1f} s, profile {done - built:.1f} s{memory}")
    print(format_table(result, top=top))
    print("by library: " + ", ".join(f"{lib} {share:.1%}"
                                      for lib, share in library_shares(result).items()))
    for warning in result.warnings:
        print(f"note: {warning}")
    sys.stdout.flush()
    return True


if __name__ == "__main__":
    raise SystemExit(main())
