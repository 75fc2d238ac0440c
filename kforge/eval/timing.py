"""The timing protocol shared by candidates, eager and torch.compile.

Each call is timed alone after an L2 flush, between two events on the evaluation stream. Subjects
are interleaved call by call (the order flips every round) so clock and thermal drift cancel
between them; the number of rounds follows the measured call time so that short ops get enough
repetitions for a stable median. A subject may prepare each call (new input values, fresh
outputs) and look at its result afterwards, both outside the timed window; the results of a round
stay alive until the round ends, so no call finds another's output in a recycled buffer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kforge.core.candidate import Timing
from kforge.core.settings import TimingPlan  # the plan is a setting: [eval] warmup, ...
from kforge.eval.device import Runtime


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


@dataclass(frozen=True)
class Subject:
    """One timed subject. ``run(r)`` is the timed call of round ``r``; ``prepare(r)`` runs
    before it and ``after(r, result)`` after it, both outside the timed window (before the L2
    flush and after the stop event)."""

    run: Callable[[int], Any]
    prepare: Callable[[int], None] | None = None
    after: Callable[[int, Any], None] | None = None


@dataclass
class TimedRun:
    timings: dict[str, Timing]
    last: dict[str, tuple[int, Any]]  # per subject: the round and result of its last call


def time_interleaved(subjects: dict[str, Subject | Callable[[int], Any]], runtime: Runtime,
                     plan: TimingPlan = TimingPlan()) -> TimedRun:
    """Time each subject interleaved with the others, round by round."""
    named = {name: s if isinstance(s, Subject) else Subject(s) for name, s in subjects.items()}
    names = list(named)

    def call(name: str, r: int, timed: bool) -> Any:
        subject = named[name]
        if subject.prepare is not None:
            subject.prepare(r)
        runtime.flush()
        token = runtime.start() if timed else None
        result = subject.run(r)
        if timed:
            pending.append((name, runtime.stop(token)))
        if subject.after is not None:
            subject.after(r, result)
        return result

    pending: list[tuple[str, Any]] = []
    start = time.perf_counter()
    for r in range(plan.warmup):
        for name in names:
            call(name, r, timed=False)
    runtime.sync()
    round_s = (time.perf_counter() - start) / max(plan.warmup, 1)
    reps = reps_for(round_s, plan)
    last: dict[str, tuple[int, Any]] = {}
    for r in range(plan.warmup, plan.warmup + reps):
        last = {}  # this round's results stay alive until the next round starts
        for name in names if r % 2 == 0 else reversed(names):
            last[name] = (r, call(name, r, timed=True))
    runtime.sync()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for name, token in pending:
        samples[name].append(runtime.elapsed_us(token))
    return TimedRun({name: summarize(values) for name, values in samples.items()}, last)
