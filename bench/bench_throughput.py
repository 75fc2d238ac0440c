"""How many honest evaluations a search gets per minute, and how long its winners take to be
confirmed: real library searches of the Llama-shaped prefill and the UNet-style model of
``bench/bench_e2e.py``.

Per model: ``kforge profile``, then ``kforge search --proposer library --top 6 --iterations 16
--parallel 4`` (within ``--time``, a bound that should not bind), then from the session's
database: evaluations per minute of search, the confirmations' latency (queued to verdict,
which includes the wait for the op's search to settle) p50/p90, their own run time (the
re-check, re-timing and sanitizer) p50/p90 and its two parts run at once (the sanitizer, the
fresh worker's evaluation) p50 beside a search evaluation's p50, the seconds the baselines spent
in torch.compile, the share of the search workers' time their evaluations took, how many passed,
failed or gave way, the sanitizer's seconds per tool (median; cached verdicts counted apart), the
wall time from the first node to the last confirmed winner, and the would-be bests still
confirming at the end.

Run on a GPU machine from the repository root (about 3 minutes a model):
    python3 bench/bench_throughput.py [--models llama,unet] [--time 140s] [--workers N] [--out DIR]
    python3 bench/bench_throughput.py --summary path/to/k.db   # the figures of a searched database
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kforge.core.candidate import EvalOutcome
from kforge.core.outcome import Confirmation, Placement, SanitizerReport

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
MODELS = {"llama": f"{HERE / 'bench_e2e.py'}:build_llama",
          "unet": f"{HERE / 'bench_e2e.py'}:build_unet"}
SESSION = 1
# An evaluation that waited longer than this for the GPU's lock was stalled (an evaluation's own
# wait for another's timed section is well under a second)
STALL_S = 2.0


def kforge(*args: str, timeout: float, env: dict[str, str] | None = None) -> float:
    """Run the kforge CLI; its wall time.

    The profile and the search run as commands of their own, not through ``kforge.app`` in this
    process: the search's throughput is the figure, measured as a user's search runs, without a
    CUDA context or a profiled model's cached memory of this process on the GPU beside it; and
    ``timeout`` bounds a step that hangs."""
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kforge", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout, check=False, env=env)
    seconds = time.perf_counter() - started
    print(f"$ kforge {' '.join(args)}  ({seconds:.0f} s, rc {proc.returncode})", flush=True)
    print(proc.stdout[-1500:] + proc.stderr[-1500:], flush=True)
    if proc.returncode != 0:
        raise RuntimeError(f"kforge {args[0]} failed")
    return seconds


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summarize(db: Path, session: int = SESSION) -> dict:
    """The figures of one searched session, read from its database."""
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    run_s, settings = con.execute("SELECT run_seconds, settings FROM sessions WHERE id = ?",
                                  (session,)).fetchone()
    workers = (json.loads(settings or "{}").get("eval") or {}).get("workers") or 1
    nodes = con.execute("SELECT n.id, n.status, n.confirmed, n.created_at, n.card_id, "
                        "e.outcome FROM nodes n LEFT JOIN evaluations e ON e.node_id = n.id "
                        "WHERE n.session_id = ? ORDER BY n.id", (session,)).fetchall()
    cards = con.execute("SELECT id, best_node, baseline FROM op_cards WHERE session_id = ? AND "
                        "status != 'skipped' AND spent > 0", (session,)).fetchall()
    con.close()
    evaluated = [n for n in nodes if n["outcome"] is not None]
    latencies, runs, tools, cached, verdicts, confirmed_at = [], [], {}, 0, {}, []
    sanitizer_runs, reruns, walls, waits, spans, steps = [], [], [], [], {}, {}
    for n in evaluated:
        outcome = EvalOutcome.from_dict(json.loads(n["outcome"]))
        c = outcome.confirmation or Confirmation()
        if c.waited_s is not None and c.ran_s is not None:
            latencies.append(c.waited_s + c.ran_s)
            runs.append(c.ran_s)
            if c.sanitizer is not None and c.sanitizer.ran and not c.sanitizer.cached:
                sanitizer_runs.append(c.sanitizer.seconds)
            if c.confirmed:  # the fresh worker's evaluation is the outcome kept
                reruns.append(outcome.wall_s)
            verdict = ("passed" if n["confirmed"] else "failed" if n["status"] != "ok"
                       else "kept unconfirmed")
            verdicts[verdict] = verdicts.get(verdict, 0) + 1
            if n["confirmed"]:
                confirmed_at.append(c.at)
        else:
            walls.append(outcome.wall_s)
            where = outcome.placement or Placement()
            if where.gpu_wait_s is not None:
                waits.append(where.gpu_wait_s)
            if outcome.compile is not None:
                steps.setdefault("compile", []).append(outcome.compile.seconds)
            for step, seconds in where.steps_s.items():
                steps.setdefault(step, []).append(seconds)
            if where.worker is not None and where.started_at is not None:
                spans.setdefault(where.worker, []).append(
                    (where.started_at, where.started_at + outcome.wall_s))
        sanitizer = c.sanitizer or SanitizerReport(True)
        if sanitizer.cached:
            cached += 1
        for tool, seconds in sanitizer.tool_seconds.items():
            tools.setdefault(tool, []).append(seconds)
    first = min((n["created_at"] for n in nodes), default=None)
    # the pace between the first search evaluation's start and the last one's end: without the
    # workers' start, the first baselines or the confirmations after the last evaluation
    starts = [a for each in spans.values() for a, _ in each]
    ends = [b for each in spans.values() for _, b in each]
    sustained_s = max(ends) - min(starts) if len(starts) > 1 else 0.0
    winners = [c["best_node"] for c in cards if c["best_node"] is not None]
    # the workers' time on baselines, most of it torch.compile of each searched op
    compile_s = sum(json.loads(c["baseline"]).get("compile_s") or 0.0
                    for c in cards if c["baseline"])
    return {
        "evaluations": len(evaluated), "search_s": round(run_s, 1),
        "evaluations_per_min": round(60 * len(evaluated) / run_s, 1) if run_s else None,
        "sustained_per_min": (round(60 * len(evaluated) / sustained_s, 1) if sustained_s > 0
                              else None),
        "confirmations": len(latencies), "verdicts": verdicts,
        "confirm_p50_s": percentile(latencies, 0.5), "confirm_p90_s": percentile(latencies, 0.9),
        "confirm_ran_p50_s": percentile(runs, 0.5), "confirm_ran_p90_s": percentile(runs, 0.9),
        # what a confirmation's run is made of: the sanitizer (its tools at once) and, beside it,
        # the fresh worker's evaluation; the rest of ``ran`` is the wait for a fresh worker
        "confirm_sanitizer_p50_s": percentile(sanitizer_runs, 0.5),
        "confirm_rerun_p50_s": percentile(reruns, 0.5),
        "evaluation_p50_s": percentile(walls, 0.5),  # one search evaluation, in its worker
        # the share of the search workers' time spent on search evaluations (the rest: baselines,
        # replacements, waiting for work)
        "workers_busy": round(sum(walls) / (run_s * workers), 2) if run_s else None,
        # of it, the time spent waiting for the GPU's lock (timed sections take turns)
        "gpu_wait_p50_s": percentile(waits, 0.5),
        "gpu_wait_share": round(sum(waits) / sum(walls), 2) if waits and sum(walls) else None,
        # stalls: evaluations that waited over STALL_S for the lock (every search worker at once
        # behind a long shared hold elsewhere, a starting process's say), and their wait in all
        "stalled": len([w for w in waits if w > STALL_S]),
        "stalled_wait_s": round(sum(w for w in waits if w > STALL_S), 1),
        # a search worker's time from one evaluation's end to the next one's start
        "worker_gap_p50_s": percentile(gaps_between(spans), 0.5),
        # where a search evaluation's time goes, step by step
        "step_median_s": {s: round(statistics.median(v), 3) for s, v in steps.items()},
        "sanitizer_tool_median_s": {t: round(statistics.median(v), 2) for t, v in tools.items()},
        "sanitizer_cached": cached,
        "to_last_confirmed_s": (round(max(confirmed_at) - first, 1)
                                if confirmed_at and first is not None else None),
        "cards": len(cards), "winners": len(winners),
        "baseline_compile_s": round(compile_s, 1),
        "still_confirming": [n["id"] for n in nodes if n["status"] == "confirming"],
    }


def gaps_between(spans: dict[int, list[tuple[float, float]]]) -> list[float]:
    """Each worker's idle stretches between its evaluations (start, end), in seconds."""
    gaps = []
    for worker_spans in spans.values():
        ordered = sorted(worker_spans)
        gaps += [max(0.0, b[0] - a[1]) for a, b in zip(ordered, ordered[1:])]
    return gaps


def table(results: dict[str, dict]) -> str:
    rows = [("model", "evals", "search s", "evals/min", "sustained/min", "confirms", "p50 s",
             "p90 s", "ran p50 s", "ran p90 s", "sanitizer p50 s", "rerun p50 s", "eval p50 s",
             "baseline compile s", "workers busy", "GPU wait p50 s", "GPU wait share",
             f"waited > {STALL_S:.0f} s (s)", "worker gap p50 s", "to last winner s", "winners",
             "confirming", "verdicts", "sanitizer s/tool", "evaluation steps p50 s")]
    for name, r in results.items():
        if "error" in r:
            rows.append((name, r["error"][:80], *[""] * 23))
            continue

        def f(v):
            if isinstance(v, float):  # shares and short waits keep their second decimal
                return f"{v:.2f}" if v < 1 else f"{v:.1f}"
            return "-" if v is None else str(v)

        rows.append((name, str(r["evaluations"]), f(r["search_s"]), f(r["evaluations_per_min"]),
                     f(r.get("sustained_per_min")),
                     str(r["confirmations"]), f(r["confirm_p50_s"]), f(r["confirm_p90_s"]),
                     f(r.get("confirm_ran_p50_s")), f(r.get("confirm_ran_p90_s")),
                     f(r.get("confirm_sanitizer_p50_s")), f(r.get("confirm_rerun_p50_s")),
                     f(r.get("evaluation_p50_s")), f(r.get("baseline_compile_s")),
                     f(r.get("workers_busy")), f(r.get("gpu_wait_p50_s")),
                     f(r.get("gpu_wait_share")),
                     f"{r.get('stalled', '-')} ({f(r.get('stalled_wait_s'))})",
                     f(r.get("worker_gap_p50_s")),
                     f(r["to_last_confirmed_s"]), f"{r['winners']}/{r['cards']}",
                     str(len(r["still_confirming"])), json.dumps(r["verdicts"]),
                     json.dumps(r["sanitizer_tool_median_s"])
                     + (f" +{r['sanitizer_cached']} cached" if r["sanitizer_cached"] else ""),
                     json.dumps(r.get("step_median_s") or {})))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama,unet")
    parser.add_argument("--top", type=int, default=6)
    parser.add_argument("--iterations", type=int, default=16)
    parser.add_argument("--time", default="240s", help="each search's time budget")
    parser.add_argument("--parallel", type=int, default=4, help="proposals in flight")
    parser.add_argument("--workers", type=int, help="search workers per GPU (the [eval] "
                        "setting; default: kforge's own)")
    parser.add_argument("--work", default="/tmp/kforge-throughput")
    parser.add_argument("--out", default="bench-out/throughput")
    parser.add_argument("--summary", nargs="*", type=Path, help="print the figures of these "
                        "databases' session 1")
    args = parser.parse_args()
    if args.summary:
        print(table({str(db): summarize(db) for db in args.summary}))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if args.workers:  # a config file of the bench's own, read by the profile and the search
        config = Path(args.work) / "config.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(f"[eval]\nworkers = {args.workers}\n")
        env["KFORGE_CONFIG"] = str(config)
    results: dict[str, dict] = {}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        db = Path(args.work) / name / "k.db"
        db.parent.mkdir(parents=True, exist_ok=True)
        db.unlink(missing_ok=True)
        try:
            kforge("profile", MODELS[name], "--db", str(db), "--samples", "2", timeout=300,
                   env=env)
            search_s = kforge("search", "--session", str(SESSION), "--db", str(db),
                              "--proposer", "library", "--top", str(args.top), "--iterations",
                              str(args.iterations), "--parallel", str(args.parallel),
                              "--time", args.time,
                              "--quiet", timeout=900, env=env)
            results[name] = {**summarize(db), "command_s": round(search_s, 1)}
            shutil.copyfile(db, out / f"{name}.db")  # the search's record, for a later look
        except Exception as exc:  # one model failing leaves the other's figures standing
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        (out / f"{name}.json").write_text(json.dumps(results[name], indent=1))
        print(table(results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
