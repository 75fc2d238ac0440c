"""The evaluator's three figures, card by card, against the model's own profile: for every searched
op card of the UNet-style bench model, the Llama-shaped prefill and Gemma 4 decode, the profile's
GPU time per call, eager's kernel time (torch.profiler: kernels alone, no gaps between them),
eager's device, host and wall time, torch.compile's device time, the best kernel's device time,
the speedup shown and the device-time ratio it must equal, and the baseline's agreement with the
profile (``kforge.core.candidate.profile_disagreement``).

    python bench/bench_timing.py                                   # UNet and Llama, a small search
    python bench/bench_timing.py --models gemma4-decode --top 4 --iterations 4
    python bench/bench_timing.py --reuse --work /tmp/kforge-bench/e2e --e2e-out bench-out/e2e
    python bench/bench_timing.py --summary bench-out/timing/*.json  # the table again

Per model: ``kforge profile`` and one ``kforge search --top N --iterations I`` with the library
proposer, or, with ``--reuse``, the database ``bench/bench_e2e.py`` already searched under the same
``--work``. The projection's error per mode comes from ``bench_e2e.py``'s record of the model in
``--e2e-out``, else from a ``kforge e2e`` measurement stored in the database (``--e2e MODES`` runs
one). Records go to ``<out>/<model>.json`` as each model ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import HERE, kforge  # noqa: E402  (the same way of running the CLI)
from bench_regions import model_parser, profiled_db, run_models  # noqa: E402

SESSION = 1
MODELS: dict[str, tuple[str, list[str]]] = {
    "unet": (f"{HERE}:build_unet", []),
    "llama": (f"{HERE}:build_llama", []),
    "gemma4-decode": ("gemma4", ["--mode", "decode", "--layers", "2"]),
}
DEFAULT_MODELS = "unet,llama"
AGREEMENT_GOAL = 0.95  # of cards whose baseline agrees with the profile


async def card_records(db: Path) -> tuple[list[dict], str | None]:
    """One record per searched card, and the projection line of the last e2e measurement."""
    from kforge.core.candidate import Baseline
    from kforge.core.fmt import fmt_projection
    from kforge.store import Store

    async with await Store.open(db, create=False) as store:
        records = []
        for row in await store.list_cards(SESSION):
            if row.spent <= 0 or not row.baseline:
                continue
            base = Baseline.from_dict(row.baseline)
            best = (await store.get_node(row.best_node)).outcome if row.best_node else None
            kernel = best.timing if best and best.ok else None
            eager_run = best.eager if best and best.ok else None
            card = row.card
            records.append({
                "card": row.id, "op": card.short_op, "share": card.share, "calls": card.calls,
                "profile_us": base.profile_us or (card.total_us / card.calls
                                                  if card.total_us and card.calls else None),
                "eager_kernels_us": (sum(k["us"] for k in base.eager_kernels)
                                     if base.eager_kernels else None),
                "eager_device_us": base.eager.device_us, "eager_host_us": base.eager.host_us,
                "eager_wall_us": base.eager.wall_us,
                "compiled_device_us": base.compiled.device_us if base.compiled else None,
                "kernel_device_us": kernel.device_us if kernel else None,
                "kernel_host_us": kernel.host_us if kernel else None,
                "speedup": row.best_speedup,
                "device_ratio": (eager_run.device_us / kernel.device_us
                                 if kernel and eager_run and kernel.device_us > 0 else None),
                "profile_check": base.profile_check, "note": base.note,
                "held": best.confirmation.held if best and best.confirmation else ""})
        measured = await store.latest_model_measurement(SESSION)
        projection = None
        if measured is not None:
            m = measured.record
            projection = fmt_projection(m.projected, m.gains)
        return records, projection


def measure_model(name: str, args: argparse.Namespace) -> dict:
    db = Path(args.work) / name / "k.db"
    if args.reuse and db.exists():
        print(f"{name}: reusing {db}")
    else:
        db = profiled_db(name, *MODELS[name], args)
        kforge("search", "--session", str(SESSION), "--db", str(db), "--proposer", "library",
               "--top", str(args.top), "--iterations", str(args.iterations), "--parallel", "4",
               "--quiet", timeout=args.step_timeout)
    if args.e2e:
        kforge("e2e", str(SESSION), "--db", str(db), "--modes", args.e2e, "--reps", "10",
               timeout=args.step_timeout)
    records, projection = asyncio.run(card_records(db))
    measured = Path(args.e2e_out) / f"{name}.json" if args.e2e_out else None
    if measured is not None and measured.exists():
        projection = e2e_projection(json.loads(measured.read_text())) or projection
    return {"model": name, "cards": records, "projection": projection}


def e2e_projection(record: dict) -> str | None:
    """The projection line of a ``bench_e2e.py`` record: its projected speedup against what
    kforge gained in each mode measured with and without it."""
    from kforge.core.fmt import fmt_projection
    from kforge.integrate.measure import KFORGE_SUFFIX

    modes = record.get("modes") or {}
    gains = {}
    for mode, figures in modes.items():
        with_kforge = modes.get(mode + KFORGE_SUFFIX) or {}
        if figures.get("median_us") and with_kforge.get("median_us"):
            gains[mode + KFORGE_SUFFIX] = figures["median_us"] / with_kforge["median_us"]
    if record.get("projected") is None or not gains:
        return None
    return fmt_projection(record["projected"], gains) + " (bench_e2e)"


def table(results: list[dict]) -> str:
    """Markdown: one row per searched card; then per model the agreement and projection lines."""
    lines = ["| model | card | share | profile GPU | eager kernels | eager device | eager host | "
             "eager wall | compiled device | kernel device | speedup | device ratio | "
             "profile check |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    footer = []
    for result in results:
        if "error" in result:
            lines.append(f"| {result['model']} | {result['error'][:100]} |||||||||||")
            continue
        cards = result["cards"]
        for r in cards:
            check = "ok" if not r["profile_check"] else _ratio_text(r)
            if r["held"]:
                check += "; held (>10x)"
            lines.append(
                f"| {result['model']} | {r['op']} | {100 * r['share']:.1f}% | "
                f"{_us(r['profile_us'])} | {_us(r.get('eager_kernels_us'))} | "
                f"{_us(r['eager_device_us'])} | "
                f"{_us(r['eager_host_us'])} | {_us(r['eager_wall_us'])} | "
                f"{_us(r['compiled_device_us'])} | {_us(r['kernel_device_us'])} | "
                f"{_x(r['speedup'])} | {_x(r['device_ratio'])} | {check} |")
        checked = [r for r in cards if r["profile_us"]]
        agree = sum(not r["profile_check"] for r in checked)
        differ = [r["op"] for r in cards if r["speedup"] and r["device_ratio"]
                  and abs(r["speedup"] / r["device_ratio"] - 1) > 0.01]
        footer.append(
            f"- {result['model']}: baseline agrees with the profile (eager's kernels within 20% "
            f"of the profile's, its device time within 20% of them plus launch gaps) on {agree} of "
            f"{len(checked)} cards (goal {AGREEMENT_GOAL:.0%}: "
            f"{'met' if checked and agree >= AGREEMENT_GOAL * len(checked) else 'missed'}); "
            f"shown speedup differs from the device-time ratio on {len(differ)} cards"
            + (f" ({', '.join(differ)})" if differ else "")
            + f"; {result.get('projection') or 'no e2e measurement (run with --e2e)'}")
    return "\n".join(lines + [""] + footer)


def _ratio_text(r: dict) -> str:
    if r["profile_us"] and r["eager_device_us"]:
        return f"{r['eager_device_us'] / r['profile_us']:.2f}x the profile"
    return "disagrees"


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} us"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def main() -> int:
    parser = model_parser(__doc__, MODELS, "timing", 3, 3, 300)
    parser.set_defaults(models=DEFAULT_MODELS)
    parser.add_argument("--reuse", action="store_true",
                        help="use a model's database already under --work (bench_e2e.py's)")
    parser.add_argument("--e2e-out", metavar="DIR",
                        help="bench_e2e.py's records, for the projection's error per mode")
    parser.add_argument("--e2e", metavar="MODES", default="",
                        help="also run kforge e2e in these modes (eager,graphs,...) and state the "
                             "projection's error per mode")
    return run_models(parser, MODELS, measure_model, table)


if __name__ == "__main__":
    raise SystemExit(main())
