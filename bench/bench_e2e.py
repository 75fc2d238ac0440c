"""Whole-model latency with a session's winning kernels: eager, patched and torch.compile, and the
speedup projected from the op cards next to the one measured.

For a stored session it measures that session's model. Otherwise, for each built-in model it
profiles the model, runs a short search with the kernel library on the largest ops, and
measures the result: one line per model and run mode (plain eager, and CUDA graphs with
--cuda-graphs), then a summary table.

Run on a GPU machine from the repository root (a few minutes on an H200):
    python3 bench/bench_e2e.py                                  # resnet50, gemma4 decode/prefill
    python3 bench/bench_e2e.py --models gemma4:decode --cuda-graphs --layers 8
    python3 bench/bench_e2e.py --session 3 --db ~/.local/share/kforge/kforge.db --cuda-graphs
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from kforge.capture import ModelOptions, load_model, profile  # noqa: E402
from kforge.capture.loader import LoadedModel  # noqa: E402
from kforge.core.fmt import fmt_speedup, fmt_us  # noqa: E402
from kforge.engine.runner import prepare_session, run_session  # noqa: E402
from kforge.errors import KforgeError  # noqa: E402
from kforge.eval.gpuinfo import detect_gpu  # noqa: E402
from kforge.integrate.measure import (  # noqa: E402
    COMPILED,
    EAGER,
    PATCHED,
    E2eResult,
    rebuild_model,
    run_e2e,
)
from kforge.integrate.patching import build_patch, check_arch, cuda_device  # noqa: E402
from kforge.integrate.plan import read_plan  # noqa: E402
from kforge.integrate.runtime import device_arch  # noqa: E402
from kforge.store import Store  # noqa: E402

RUNS = ("resnet50", "gemma4:decode", "gemma4:prefill")


@dataclass
class Row:
    label: str
    kernels: int
    result: E2eResult

    def median(self, name: str) -> float | None:
        subject = self.result.subject(name)
        return subject.timing.median_us if subject and subject.timing else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--session", type=int, help="measure this stored session")
    parser.add_argument("--db", type=Path, help="its database (default: a fresh one per run)")
    parser.add_argument("--models", nargs="*", default=list(RUNS),
                        help="built-in models as NAME or NAME:MODE (default: %(default)s)")
    parser.add_argument("--layers", type=int, help="truncate the language and diffusion models")
    parser.add_argument("--top-ops", type=int, default=6, help="ops searched per model")
    parser.add_argument("--iterations", type=int, default=6, help="library tries per op")
    parser.add_argument("--search-s", type=float, default=75.0, help="search time per model")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--cuda-graphs", action="store_true", help="also time CUDA graph replays")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_e2e needs a CUDA GPU", file=sys.stderr)
        return 1
    device = cuda_device(None, "bench_e2e")
    print(f"# {torch.cuda.get_device_name(device)} ({device_arch(device)})  "
          f"torch {torch.__version__}", flush=True)
    rows: list[Row] = []
    try:
        if args.session is not None:
            if args.db is None:
                raise KforgeError("--session needs --db")
            rows += measure(args, args.db, args.session, device, None)
        else:
            with tempfile.TemporaryDirectory() as folder:
                db = args.db or Path(folder) / "bench.db"
                for run in args.models:
                    rows += search_and_measure(args, db, run, device)
    except KforgeError as exc:
        print(f"bench_e2e: {exc}", file=sys.stderr)
        return 1
    print_summary(rows)
    return 0


def search_and_measure(args: argparse.Namespace, db: Path, run: str,
                       device: torch.device) -> list[Row]:
    name, _, mode = run.partition(":")
    print(f"\n## {run}", flush=True)
    try:
        loaded = load_model(name, ModelOptions(device=str(device), mode=mode or None,
                                               layers=args.layers if name != "resnet50" else None))
    except KforgeError as exc:
        print(f"skipped: {exc}", flush=True)
        return []
    try:
        started = time.perf_counter()
        sid = asyncio.run(profile_and_search(args, db, loaded, device))
        print(f"profiled and searched in {time.perf_counter() - started:.0f} s (session {sid})",
              flush=True)
        return measure(args, db, sid, device, loaded)
    finally:
        del loaded
        gc.collect()
        torch.cuda.empty_cache()


async def profile_and_search(args: argparse.Namespace, db: Path, loaded: LoadedModel,
                             device: torch.device) -> int:
    store = await Store.open(db)
    try:
        staging = store.new_staging_dir()
        result = profile(loaded, samples_per_card=2, staging_dir=staging)
        sid = await store.create_profiled_session(
            loaded.name, {**loaded.settings, "samples": 2}, detect_gpu(device.index).to_dict(),
            result.cards, staging_dir=staging, modules=result.modules)
        await prepare_session(store, sid, {
            "proposer": "library", "evaluator": "gpu", "iterations_per_op": args.iterations,
            "top_ops": args.top_ops, "wall_s": args.search_s})
    finally:
        await store.close()
    await run_session(db, sid)
    return sid


def measure(args: argparse.Namespace, db: Path, sid: int, device: torch.device,
            loaded: LoadedModel | None) -> list[Row]:
    plan = read_plan(db, sid, runs_on=device_arch(device))
    check_arch(plan, device)
    patch = build_patch(plan, device)
    for note in patch.notes:
        print(f"note: {note}")
    for d in plan.winners:
        print(f"kernel: #{d.card.id} {d.card.short_op} {d.card.signature[:60]}  "
              f"{100 * d.card.share:.1f}%  {fmt_speedup(d.speedup)}")
    loaded = loaded or rebuild_model(plan.session, device)
    mode = plan.session.settings.get("mode")
    label = f"{loaded.name} {mode}" if mode else loaded.name
    rows = []
    for graphs in (False, True) if args.cuda_graphs else (False,):
        result = run_e2e(loaded, patch, patch.projected, reps=args.reps, cuda_graphs=graphs,
                         compile=not args.no_compile and not graphs)
        row = Row(label + (" (graphs)" if graphs else ""), len(patch.table), result)
        print_row(row)
        rows.append(row)
    return rows


def print_row(row: Row) -> None:
    r = row.result
    for s in r.subjects:
        timing = (f"{fmt_us(s.timing.median_us)} (p10 {fmt_us(s.timing.p10_us)}, "
                  f"p90 {fmt_us(s.timing.p90_us)})" if s.timing else s.error)
        setup = f", set up in {s.setup_s:.1f} s" if s.setup_s else ""
        diff = f", output vs eager: {s.difference}" if s.difference and s.name != EAGER else ""
        print(f"{row.label}: {s.name}: {timing}{setup}{diff}")
    print(f"{row.label}: {r.report.hits} kernel calls per forward; speedup measured "
          f"{fmt_speedup(r.measured)}, projected {r.projected:.3f}x", flush=True)


def print_summary(rows: list[Row]) -> None:
    print(f"\n{'model':<28} {'kernels':>7} {'eager':>10} {'patched':>10} {'compile':>10} "
          f"{'measured':>9} {'projected':>9}")
    for row in rows:
        print(f"{row.label:<28} {row.kernels:>7} {fmt_us(row.median(EAGER)):>10} "
              f"{fmt_us(row.median(PATCHED)):>10} {fmt_us(row.median(COMPILED)):>10} "
              f"{fmt_speedup(row.result.measured):>9} {row.result.projected:>8.3f}x")


if __name__ == "__main__":
    raise SystemExit(main())
