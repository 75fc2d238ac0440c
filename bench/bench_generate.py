"""Tokens per second of a real generation: eager, eager + kforge, CUDA graphs +/- kforge and
torch.compile +/- kforge side by side, each run's tokens compared with eager's.

    python bench/bench_generate.py gemma4 --layers 4                 # profile, search, generate
    python bench/bench_generate.py qwen35 --layers 8 --cache static,dynamic
    python bench/bench_generate.py gemma4 --session 3 --db k.db      # an existing session's kernels
    python bench/bench_generate.py gemma4 --no-kforge                # the modes without kforge

Without ``--session``: ``kforge profile`` of the model's decode step at three KV lengths spanning
the generation (``--seq-len`` its middle, ``--seq-lengths`` its start and end, so the variants
that follow the KV length become range cards), then a small offline search of its largest ops
with the built-in kernel library, in a database under ``--work``. Then, in this process, a
greedy ``generate`` of ``--new-tokens`` tokens after a random prompt of ``--prompt`` tokens in
every mode (``kforge.integrate.generate.run_generation``), per cache kind of ``--cache``: the
static cache by default (where the model has none, the dynamic one, with a note), the dynamic
cache on request (there the KV length grows every token: range kernels are what can serve its
attention-adjacent ops). eager + kforge uses the winners projected to pay for their guard, the
other kforge modes all winners. Each result goes to ``<out>/generate-<model>-<cache>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_e2e import kforge  # noqa: E402  (the same way of running the CLI)

SESSION = 1


def model_options(args: argparse.Namespace) -> list[str]:
    options = ["--batch", str(args.batch)]
    if args.layers:
        options += ["--layers", str(args.layers)]
    if args.dtype:
        options += ["--dtype", args.dtype]
    return options


def searched_session(args: argparse.Namespace) -> tuple[Path, int]:
    """A database with the model's decode step profiled at three KV lengths and searched."""
    db = Path(args.work) / args.model / "k.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    db.unlink(missing_ok=True)
    start, end = args.prompt, args.prompt + args.new_tokens
    middle = (start + end) // 2
    kforge("profile", args.model, "--mode", "decode", "--seq-len", str(middle),
           "--seq-lengths", f"{start},{end}", "--samples", "2", *model_options(args),
           "--db", str(db), timeout=args.step_timeout)
    kforge("search", "--session", str(SESSION), "--db", str(db), "--proposer", "library",
           "--top", str(args.top), "--iterations", str(args.iterations), "--parallel", "4",
           "--quiet", timeout=args.step_timeout)
    return db, SESSION


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a built-in language model (gemma4, qwen35, ...-tiny) or "
                                      "path/to/file.py:factory of a transformers model")
    parser.add_argument("--session", type=int, help="take the kernels of this session "
                                                    "(no profile or search)")
    parser.add_argument("--db", help="the database of --session (default: kforge's own)")
    parser.add_argument("--no-kforge", action="store_true", help="the modes without kforge only")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--layers", type=int, help="keep the first N layers (default: all)")
    parser.add_argument("--dtype", help="bf16, fp16 or fp32 (default: the model's)")
    parser.add_argument("--modes", default="all",
                        help="comma-separated: eager, graphs, compile (each +/- kforge), "
                             "or ids such as graphs+kforge (default: all)")
    parser.add_argument("--cache", default="static", help="static, dynamic or both (comma)")
    parser.add_argument("--compile-mode", default="reduce-overhead",
                        help="torch.compile mode of the compiled modes")
    parser.add_argument("--reps", type=int, default=3, help="timed generates per mode")
    parser.add_argument("--top", type=int, default=8, help="ops searched")
    parser.add_argument("--iterations", type=int, default=8, help="iterations per op")
    parser.add_argument("--step-timeout", type=float, default=1800,
                        help="seconds for the profile and for the search")
    parser.add_argument("--work", default="/tmp/kforge-generate", help="folder for databases")
    parser.add_argument("--out", default="bench-out/generate", help="folder for result files")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from kforge.capture import ModelOptions, load_model
    from kforge.integrate.api import patch
    from kforge.integrate.generate import parse_modes, run_generation
    from kforge.integrate.patching import projected_patch
    from kforge.integrate.plan import read_plan
    from kforge.store.config import db_path

    if not torch.cuda.is_available():
        print("note: no CUDA GPU: CUDA graph modes are not measured, kforge's kernels not loaded")
    kernels = eager_kernels = searched = None
    spec, options = args.model, ModelOptions(dtype=args.dtype, batch=args.batch,
                                             layers=args.layers)
    if not args.no_kforge and torch.cuda.is_available():
        searched = ((db_path(args.db), args.session) if args.session
                    else searched_session(args))
        stored = read_plan(*searched).session
        spec, settings = stored.model, stored.settings
        options = ModelOptions(dtype=settings.get("dtype"), batch=settings.get("batch"),
                               layers=settings.get("layers"))
    loaded = load_model(spec, ModelOptions(dtype=options.dtype, batch=options.batch,
                                           layers=options.layers, mode="prefill",
                                           seq_len=args.prompt))
    if searched is not None:  # every winner, bound to the model (its region kernels run)
        db, session = searched
        kernels = patch(session, db=db, cuda_graphs=True).for_model(loaded.model)
        eager_kernels = projected_patch(kernels)  # those worth their guard outside graphs
        print(kernels.report())
    prompt = loaded.kwargs.get("input_ids")
    if prompt is None:
        raise SystemExit(f"{spec} takes no input_ids: the generation benchmark runs language "
                         "models")
    modes = parse_modes(args.modes, kforge=kernels is not None)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for cache in [c.strip() for c in args.cache.split(",") if c.strip()]:
        result = run_generation(loaded.model, prompt, args.new_tokens, modes=modes,
                                kernels=kernels, eager_kernels=eager_kernels, cache=cache,
                                compile_mode=args.compile_mode, reps=args.reps)
        print(f"\n{spec}: {result.batch} x {result.prompt_tokens} prompt tokens, "
              f"{result.new_tokens} new tokens, {result.cache} cache")
        print(result.table(), flush=True)
        name = Path(spec).stem if ":" in spec else spec
        (out / f"generate-{name}-{cache}.json").write_text(json.dumps(
            {"model": spec, "layers": options.layers, **result.to_dict()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
