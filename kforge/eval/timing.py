"""The timing protocol shared by candidates, eager and torch.compile.

Each call is timed alone after an L2 flush, between two events on the evaluation stream. Subjects
are interleaved call by call (the order flips every round) so clock and thermal drift cancel
between them; the number of rounds follows the measured call time so that short ops get enough
repetitions for a stable median. Inputs rotate over a few sets, and the results of a round stay
alive until the round ends, so no call finds another's output in a recycled buffer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kforge.core.candidate import Timing
from kforge.eval.device import Runtime


@dataclass(frozen=True)
class TimingPlan:
    warmup: int = 3
    min_reps: int = 20
    max_reps: int = 200
    budget_s: float = 0.12  # wall time aimed at for all timed rounds together


def summarize(samples_us: list[float]) -> Timing:
    """Median and p10/p90 of per-call times."""
    if not samples_us:
        raise ValueError("no timing samples")
    p10, p50, p90 = np.percentile(np.asarray(samples_us, dtype=float), [10, 50, 90])
    return Timing(median_us=float(p50), p10_us=float(p10), p90_us=float(p90),
                  reps=len(samples_us))


def reps_for(round_s: float, plan: TimingPlan) -> int:
    """Rounds that fit the budget, within the plan's bounds."""
    if round_s <= 0:
        return plan.max_reps
    return int(min(plan.max_reps, max(plan.min_reps, plan.budget_s / round_s)))


@dataclass
class TimedRun:
    timings: dict[str, Timing]
    last: dict[str, tuple[int, Any]]  # per subject: the input set and result of its last call


def time_interleaved(subjects: dict[str, Callable[[int], Any]], n_sets: int, runtime: Runtime,
                     plan: TimingPlan = TimingPlan()) -> TimedRun:
    """Time each subject (called with an input-set index) interleaved with the others."""
    names = list(subjects)
    start = time.perf_counter()
    for i in range(plan.warmup):
        for name in names:
            runtime.flush()
            subjects[name](i % n_sets)
    runtime.sync()
    round_s = (time.perf_counter() - start) / max(plan.warmup, 1)
    reps = reps_for(round_s, plan)
    pending: list[tuple[str, Any]] = []
    last: dict[str, tuple[int, Any]] = {}
    for r in range(reps):
        last = {}  # this round's results stay alive until the next round starts
        for name in names if r % 2 == 0 else reversed(names):
            runtime.flush()
            token = runtime.start()
            last[name] = (r % n_sets, subjects[name](r % n_sets))
            pending.append((name, runtime.stop(token)))
    runtime.sync()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for name, token in pending:
        samples[name].append(runtime.elapsed_us(token))
    return TimedRun({name: summarize(values) for name, values in samples.items()}, last)
