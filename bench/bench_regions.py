"""Fusion regions one by one: per region card of each model, the eager chain, the same chain
compiled by torch.compile, kforge's best region kernel, and how close that kernel comes to the
copy-bandwidth floor.

    python bench/bench_regions.py                                  # every model below
    python bench/bench_regions.py --models llama,gemma4-decode --top 4 --iterations 8
    python bench/bench_regions.py --summary bench-out/regions/*.json   # the table again

Per model: ``kforge profile`` (regions on), then for each of its ``--top`` region cards by time
share ``kforge search --focus CARD --proposer library`` (the built-in library's region families,
verified and timed by the evaluator as any candidate is: the eager chain and the compiled chain
are the card's two baselines). Each model's records go to ``<out>/<model>.json`` as soon as its
searches end; the table is printed from those records. The goals it marks: norm, gated-activation
and rotary regions at >= 3x their eager chain, and at >= 85% of the floor or ahead of Inductor's
kernel for the same chain.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import HERE, kforge  # noqa: E402  (the same way of running the CLI)

SESSION = 1
MODELS: dict[str, tuple[str, list[str]]] = {
    "llama": (f"{HERE}:build_llama", []),  # the transformer config no built-in uses
    "gemma4-prefill": ("gemma4", ["--mode", "prefill", "--layers", "4"]),
    "gemma4-decode": ("gemma4", ["--mode", "decode", "--layers", "4"]),
    "qwen35-decode": ("qwen35", ["--mode", "decode", "--layers", "4"]),
    "sd35": ("sd35", ["--layers", "2"]),
}
GOAL_SPEEDUP, GOAL_FLOOR = 3.0, 0.85


def kind_of(ops: list[str]) -> str:
    """What a region computes, by its ops: the families the goals name, else "other"."""
    names = {op.split(".")[1] for op in ops}
    if "rsqrt" in names or {"native_layer_norm", "native_group_norm"} & names:
        return "norm"
    if {"silu", "gelu"} & names and "mul" in names:
        return "gated"
    if "neg" in names and "cat" in names:
        return "rotary"
    if "_softmax" in names:
        return "softmax"
    return "other"


async def region_records(db: Path) -> list[dict]:
    """One record per region card of the session: its baselines and best kernel."""
    from kforge.store import Store

    async with await Store.open(db, create=False) as store:
        rows = await store.list_cards(SESSION)
        records = []
        for row in rows:
            card = row.card
            if card.region is None:
                continue
            base = row.baseline or {}
            best = (await store.get_node(row.best_node)).outcome if row.best_node else None
            records.append({
                "card": row.id, "region": card.short_op,
                "kind": kind_of([n["op"] for n in card.region["nodes"]]),
                "share": card.share, "calls": card.calls, "searched": row.spent > 0,
                "eager_us": (base.get("eager") or {}).get("median_us"),
                "compiled_us": (base.get("compiled") or {}).get("median_us"),
                "kernel_us": best.timing.median_us if best and best.timing else None,
                "floor_fraction": best.floor_fraction if best else None})
        return records


def profiled_db(name: str, spec: str, extra: list[str], args: argparse.Namespace) -> Path:
    """A fresh database under ``--work`` holding model ``name`` profiled as session 1."""
    db = Path(args.work) / name / "k.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    db.unlink(missing_ok=True)
    kforge("profile", spec, "--db", str(db), "--samples", "2", *extra, timeout=args.step_timeout)
    return db


def measure_model(name: str, args: argparse.Namespace) -> dict:
    db = profiled_db(name, *MODELS[name], args)
    regions = sorted(asyncio.run(region_records(db)), key=lambda r: -r["share"])
    for record in regions[:args.top]:
        kforge("search", "--session", str(SESSION), "--db", str(db), "--proposer", "library",
               "--focus", str(record["card"]), "--iterations", str(args.iterations), "--quiet",
               timeout=args.step_timeout)
    return {"model": name, "regions": asyncio.run(region_records(db))}


def table(results: list[dict]) -> str:
    """Markdown: one row per searched region card, and which goals it meets."""
    lines = ["| model | region | kind | share | eager chain | compiled chain | kforge | "
             "vs eager | vs compiled | % of floor | goal |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for result in results:
        if "error" in result:
            lines.append(f"| {result['model']} | {result['error'][:80]} |||||||||")
            continue
        for r in result["regions"]:
            if not r["searched"]:
                continue
            eager, compiled, kernel = r["eager_us"], r["compiled_us"], r["kernel_us"]
            vs_eager = eager / kernel if eager and kernel else None
            vs_compiled = compiled / kernel if compiled and kernel else None
            floor = r["floor_fraction"]
            goal = ""
            if r["kind"] in ("norm", "gated", "rotary"):
                met = (vs_eager is not None and vs_eager >= GOAL_SPEEDUP
                       and ((floor or 0) >= GOAL_FLOOR or (vs_compiled or 0) > 1.0))
                goal = "met" if met else "missed"
            lines.append(
                f"| {result['model']} | {r['region']} | {r['kind']} | {100 * r['share']:.1f}% | "
                f"{_us(eager)} | {_us(compiled)} | {_us(kernel)} | {_x(vs_eager)} | "
                f"{_x(vs_compiled)} | {_pct(floor)} | {goal} |")
    return "\n".join(lines)


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} us"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def model_parser(doc: str, models: dict, name: str, top: int, iterations: int,
                 step_timeout: float) -> argparse.ArgumentParser:
    """The options every per-model bench of this kind takes; ``name`` names its folders."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--models", default=",".join(models),
                        help=f"comma-separated, of {', '.join(models)}")
    parser.add_argument("--out", default=f"bench-out/{name}", help="folder for the records")
    parser.add_argument("--work", default=f"/tmp/kforge-{name}", help="folder for the databases")
    parser.add_argument("--top", type=int, default=top, help="cards searched per model")
    parser.add_argument("--iterations", type=int, default=iterations, help="iterations per card")
    parser.add_argument("--step-timeout", type=float, default=step_timeout,
                        help="seconds one kforge command may take")
    parser.add_argument("--summary", nargs="*", help="print the table of these record files")
    return parser


def run_models(parser: argparse.ArgumentParser, models: dict,
               measure: Callable[[str, argparse.Namespace], dict],
               table: Callable[[list[dict]], str]) -> int:
    """Measure each model (a failure is a row), keep its record, print the tables."""
    args = parser.parse_args()
    if args.summary is not None:
        print(table([json.loads(Path(p).read_text()) for p in args.summary]))
        return 0
    unknown = [m for m in args.models.split(",") if m not in models]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}: use {', '.join(models)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.models.split(","):
        try:
            result = measure(name, args)
        except Exception as exc:  # one model's failure is a row, not the end of the run
            result = {"model": name, "error": f"{type(exc).__name__}: {exc}"}
        (out / f"{name}.json").write_text(json.dumps(result, indent=1))
        results.append(result)
        print(table([result]), flush=True)
    print(table(results))
    return 0


def main() -> int:
    return run_models(model_parser(__doc__, MODELS, "regions", 4, 8, 900), MODELS,
                      measure_model, table)


if __name__ == "__main__":
    raise SystemExit(main())
