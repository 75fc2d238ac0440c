"""The model results: profile a built-in model, search its top native ops with the kernel library
(MCTS, and best-of-N at the same budget), apply the winners and measure the model end to end.

    python bench/bench_models.py resnet50 --out /tmp/kf            # one model, on GPU 0
    python bench/bench_models.py gemma4 --mode decode --top 8 --iterations 16
    python bench/bench_models.py --summary /tmp/kf/*.json           # the cross-model tables

Each run writes ``<out>/<model>[-<mode>].json`` and prints markdown tables: per op (time share,
eager, torch.compile, kforge, % of the memory floor, iterations to the best), MCTS against
best-of-N (iterations to reach 95% of the better of the two), and the model end to end (eager,
torch.compile, patched; projected against measured speedup). Best-of-N is the same engine with
unbounded widening, so every iteration is an independent new proposal at the root.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kforge.core.opcard import VENDOR_LIBRARIES  # noqa: E402
from kforge.store import Store  # noqa: E402

SESSION = 1
BEST_OF_N = {"widen_k": 1e9}  # the root may always widen: every iteration is a fresh proposal


def kforge(*args: str, timeout: float) -> str:
    """Run the kforge CLI; its output goes to our log as well.

    The profile and the searches run as commands of their own, not through ``kforge.app`` in
    this process: this process then runs the model end to end, and a search's CUDA context, its
    evaluator pool and the memory a profile leaves in torch's caching allocator must not be in
    it while it does; and ``timeout`` bounds a step that hangs."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kforge", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout)
    print(f"$ kforge {' '.join(args)}  ({time.perf_counter() - started:.0f} s, rc {proc.returncode})")
    print(proc.stdout[-6000:])
    if proc.returncode != 0:
        print(proc.stderr[-4000:])
        raise SystemExit(f"kforge {args[0]} failed")
    return proc.stdout


async def card_results(db: Path) -> list[dict]:
    """Per searched card: times, best kernel, iterations to best, and the order of speedups."""
    store = await Store.open(db, create=False)
    try:
        rows = []
        for row in await store.list_cards(SESSION):
            if not row.spent:
                continue
            nodes = await store.list_nodes(SESSION, row.id)
            speeds = [n.speedup if n.ok and n.speedup else 0.0 for n in nodes if not n.in_flight]
            best = await store.get_node(row.best_node) if row.best_node else None
            kernel_us = best.outcome.timing.median_us if best and best.outcome.timing else None
            c = row.card
            rows.append({
                "op": c.short_op, "signature": c.signature, "share": c.share,
                "library": c.library, "eager_us": c.eager_us, "compiled_us": c.compiled_us,
                "floor_us": c.floor_us, "kernel_us": kernel_us, "speedup": row.best_speedup,
                "approach": best.row.meta.get("approach") if best else None,
                "iterations": len(speeds),
                "to_best": speeds.index(max(speeds)) + 1 if speeds and max(speeds) > 0 else None,
                "speeds": speeds, "status": row.status, "stop_reason": row.stop_reason})
        return rows
    finally:
        await store.close()


def iterations_to(speeds: list[float], target: float) -> int | None:
    return next((i + 1 for i, s in enumerate(speeds) if s >= target), None)


def copy_session(src: Path, dst: Path) -> None:
    """A second workspace holding the same profile and samples (copied: kforge follows no
    link beside a database)."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "k.db", dst / "k.db")
    if (src / "samples").exists() and not (dst / "samples").exists():
        shutil.copytree(src / "samples", dst / "samples")


def run_model(args: argparse.Namespace) -> dict:
    label = args.model + (f"-{args.mode}" if args.mode else "")
    root = Path(args.work or args.out) / label
    if root.exists():
        shutil.rmtree(root)
    mcts, bon = root / "mcts", root / "best-of-n"
    mcts.mkdir(parents=True)
    profile_args = ["profile", args.model, "--db", str(mcts / "k.db"), "--samples", "2"]
    if args.mode:
        profile_args += ["--mode", args.mode]
    if args.layers:
        profile_args += ["--layers", str(args.layers)]
    kforge(*profile_args, timeout=args.step_timeout)
    copy_session(mcts, bon)
    search = ["--proposer", "library", "--evaluator", args.evaluator, "--top", str(args.top),
              "--iterations", str(args.iterations), "--patience", str(10 * args.iterations),
              "--parallel", "4", "--quiet"]
    t0 = time.perf_counter()
    kforge("search", "--session", str(SESSION), "--db", str(mcts / "k.db"), *search,
           timeout=args.step_timeout)
    search_s = time.perf_counter() - t0
    if args.best_of_n:
        asyncio.run(set_best_of_n(bon / "k.db"))
        kforge("search", "--session", str(SESSION), "--db", str(bon / "k.db"), *search,
               timeout=args.step_timeout)
    result = {"model": label, "gpu": gpu_name(), "search_s": search_s,
              "cards": asyncio.run(card_results(mcts / "k.db")),
              "best_of_n": asyncio.run(card_results(bon / "k.db")) if args.best_of_n else []}
    save(result, args)  # the search results stand even if the end-to-end run fails
    print(op_table(result), "", mcts_table(result), "", sep="\n", flush=True)
    if args.e2e:
        try:
            result["e2e"] = end_to_end(mcts / "k.db", args)
        except Exception as exc:  # keep what was measured; say what failed
            result["e2e"] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"end to end failed: {result['e2e']['error']}", flush=True)
        save(result, args)
    return result


def save(result: dict, args: argparse.Namespace) -> None:
    out = Path(args.out) / f"{result['model']}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}", flush=True)


async def set_best_of_n(db: Path) -> None:
    store = await Store.open(db, create=False)
    try:
        session = await store.get_session(SESSION)
        search = {**session.settings.get("search", {}), "mcts": BEST_OF_N}
        await store.update_settings(SESSION, {"search": search})
    finally:
        await store.close()


def end_to_end(db: Path, args: argparse.Namespace) -> dict:
    """Eager, patched and torch.compile forwards; with --cuda-graphs also eager and patched as
    CUDA graph replays, where every winner is used (outside graphs only the winners worth their
    guard's CPU cost are)."""
    import torch

    from kforge.integrate.measure import rebuild_model, run_e2e
    from kforge.integrate.patching import build_patch
    from kforge.integrate.plan import read_plan

    device = torch.device("cuda", 0)
    out: dict = {}
    loaded = None
    for graphs in ([False, True] if args.cuda_graphs else [False]):
        plan = read_plan(db, SESSION, graphs=graphs)
        patch = build_patch(plan, device)
        loaded = loaded or rebuild_model(plan.session, device, trust_model=True)  # made here
        result = run_e2e(loaded, patch, patch.projected, reps=args.reps, cuda_graphs=graphs,
                         compile=not args.no_compile and not graphs)
        out["graphs" if graphs else "eager_mode"] = {
            "measured": result.measured, "projected": result.projected,
            "winners": len(patch.table),
            "subjects": {s.name: {"median_us": s.timing.median_us if s.timing else None,
                                  "p10_us": s.timing.p10_us if s.timing else None,
                                  "p90_us": s.timing.p90_us if s.timing else None,
                                  "setup_s": s.setup_s, "error": s.error,
                                  "rel_diff": s.difference.rel if s.difference else None}
                         for s in result.subjects},
            "hits": {k.label: k.hits for k in result.report.kernels},
            "notes": result.notes + patch.notes}
        print(f"e2e ({'CUDA graphs' if graphs else 'eager mode'}): measured "
              f"{fmt(result.measured, 'x', 3)}, projected {result.projected:.3f}x", flush=True)
    return out


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"


# ----- tables -----

def fmt(value: float | None, unit: str = "", digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def op_table(result: dict) -> str:
    lines = [f"### {result['model']} on {result['gpu']}", "",
             "| op | arguments | share | lib | eager us | compile us | kforge us | speedup "
             "| vs compile | % of floor | iters to best |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for c in result["cards"]:
        vs_compile = (c["compiled_us"] / c["kernel_us"]
                      if c["compiled_us"] and c["kernel_us"] else None)
        floor = 100 * c["floor_us"] / c["kernel_us"] if c["floor_us"] and c["kernel_us"] else None
        lines.append(
            f"| {c['op']} | `{c['signature'][:60]}` | {100 * c['share']:.1f}% | {c['library']} "
            f"| {fmt(c['eager_us'])} | {fmt(c['compiled_us'])} | {fmt(c['kernel_us'])} "
            f"| {fmt(c['speedup'], 'x', 2)} | {fmt(vs_compile, 'x', 2)} | {fmt(floor, '%', 0)} "
            f"| {c['to_best'] or '-'}/{c['iterations']} |")
    return "\n".join(lines)


def mcts_table(result: dict) -> str:
    if not result["best_of_n"]:
        return ""
    bon = {(c["op"], c["signature"]): c for c in result["best_of_n"]}
    lines = ["| op | arguments | MCTS best | best-of-N best | MCTS iters to 95% "
             "| best-of-N iters to 95% |", "|---|---|---:|---:|---:|---:|"]
    for c in result["cards"]:
        other = bon.get((c["op"], c["signature"]))
        if other is None:
            continue
        top = max(max(c["speeds"], default=0), max(other["speeds"], default=0))
        if top <= 0:
            continue
        lines.append(
            f"| {c['op']} | `{c['signature'][:50]}` | {fmt(c['speedup'], 'x', 2)} "
            f"| {fmt(other['speedup'], 'x', 2)} | {iterations_to(c['speeds'], 0.95 * top) or '-'} "
            f"| {iterations_to(other['speeds'], 0.95 * top) or '-'} |")
    return "\n".join(lines)


def e2e_table(results: list[dict]) -> str:
    lines = ["| model | mode | eager ms | torch.compile ms (compile s) | kforge ms | kforge "
             "speedup (measured) | projected | kernels used | rel. diff vs eager |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        e2e = r.get("e2e") or {}
        if e2e.get("error"):
            lines.append(f"| {r['model']} | failed: {e2e['error'][:80]} |||||||")
        for key in ("eager_mode", "graphs"):
            part = e2e.get(key)
            if not part:
                continue
            s = part["subjects"]

            def ms(name: str) -> str:
                v = s.get(name, {}).get("median_us")
                return "-" if v is None else f"{v / 1000:.3f}"

            compiled = s.get("torch.compile", {})
            compile_cell = ms("torch.compile") + (
                f" ({compiled['setup_s']:.0f})" if compiled.get("setup_s") else "")
            used = sum(1 for h in part["hits"].values() if h)
            lines.append(
                f"| {r['model']} | {'CUDA graphs' if key == 'graphs' else 'eager'} "
                f"| {ms('eager')} | {compile_cell} | {ms('patched')} "
                f"| {fmt(part['measured'], 'x', 3)} | {fmt(part['projected'], 'x', 3)} "
                f"| {used}/{part['winners']} "
                f"| {fmt(s.get('patched', {}).get('rel_diff'), '', 4)} |")
    return "\n".join(lines)


def summary(results: list[dict]) -> str:
    native = [c for r in results for c in r["cards"]
              if c["library"] not in VENDOR_LIBRARIES and c["speedup"]]
    kept = [max(1.0, c["speedup"]) for c in native]  # an op that loses stays on eager
    compiled = [c["compiled_us"] / c["eager_us"] for c in native
                if c["compiled_us"] and c["eager_us"]]
    geo = math.exp(sum(math.log(s) for s in kept) / len(kept)) if kept else None
    geo_compile = (math.exp(sum(math.log(1 / s) for s in compiled) / len(compiled))
                   if compiled else None)
    floors = [c["floor_us"] / c["kernel_us"] for c in native
              if c["floor_us"] and c["kernel_us"] and c["speedup"] > 1]
    return (f"native ops searched: {len(native)}; geometric-mean speedup over eager (losers kept "
            f"on eager): {fmt(geo, 'x', 2)}; torch.compile's: {fmt(geo_compile, 'x', 2)}; "
            f"winners at >= 85% of the copy-bandwidth floor: "
            f"{sum(f >= 0.85 for f in floors)}/{len(floors)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="resnet50 | sd35 | gemma4 | qwen35 (or -tiny)")
    parser.add_argument("--mode", choices=("prefill", "decode"), help="for the language models")
    parser.add_argument("--layers", type=int, help="truncate the model's depth")
    parser.add_argument("--out", default="bench-out", help="folder for the result files")
    parser.add_argument("--work", help="folder for the workspaces (default: --out)")
    parser.add_argument("--top", type=int, default=6, help="ops searched (largest shares)")
    parser.add_argument("--iterations", type=int, default=16, help="average iterations per op")
    parser.add_argument("--evaluator", default="gpu", help="gpu, or a module:factory double")
    parser.add_argument("--no-best-of-n", dest="best_of_n", action="store_false")
    parser.add_argument("--no-e2e", dest="e2e", action="store_false")
    parser.add_argument("--no-compile", action="store_true", help="skip whole-model compile")
    parser.add_argument("--cuda-graphs", action="store_true", help="also time CUDA graphs")
    parser.add_argument("--reps", type=int, default=20, help="timed forwards end to end")
    parser.add_argument("--step-timeout", type=float, default=900, help="seconds per step")
    parser.add_argument("--summary", nargs="*", help="print the tables of these result files")
    args = parser.parse_args()
    if args.summary:
        results = [json.loads(Path(p).read_text()) for p in args.summary]
        for r in results:
            print(op_table(r), "", mcts_table(r), "", sep="\n")
    else:
        if not args.model:
            parser.error("name a model, or give --summary files")
        os.environ.setdefault("PYTHONUNBUFFERED", "1")
        results = [run_model(args)]  # prints its op tables as soon as its search ends
    print(e2e_table(results), "", summary(results), sep="\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
