"""The verdict on a candidate for a range card: the full evaluation at each of several points of
the range, and the candidate passes only if it passes at every one.

The points: the profiled one (``at``, with the captured samples), then every symbol at its ``lo``,
at its ``hi``, and ``INTERIOR_POINTS`` points drawn at random inside the range (drawn where the
candidate cannot see them, anew for every evaluation). Each is an evaluation of the card's exact
variant at that point through ``kforge.eval.verify.pipeline.evaluate_variant``: the plan resolved
for that variant, random and stress inputs (samples are of the profiled point only), timing against
eager. The first failure is the verdict, naming its point, so a kernel that is wrong anywhere in the
range is not used for it.

The outcome is the profiled point's (its timings, correctness and work), with the speedup over
the whole range: eager's time summed over the points over the candidate's, the saving of a
generation whose steps visit those points. ``EvalOutcome.ranges`` holds each point's figures.
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path

from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus
from kforge.core.gpu import GpuInfo
from kforge.core.laws import RangeError
from kforge.core.opcard import OpCard
from kforge.core.outcome import RangeFigures, RangePoint
from kforge.core.ranges import card_at, card_ranges, verification_points
from kforge.core.settings import EvalSettings
from kforge.eval.verify.pipeline import KernelLoader, evaluate_variant
from kforge.runtime.device import Runtime

INTERIOR_POINTS = 3


def evaluate_range(card: OpCard, candidate: Candidate, *, runtime: Runtime,
                   loader: KernelLoader, gpu: GpuInfo, samples_dir: Path | None = None,
                   settings: EvalSettings | None = None, chance: random.Random | None = None
                   ) -> EvalOutcome:
    """The verdict on ``candidate`` for the range card ``card``. Never raises for a bad
    candidate."""
    started = time.perf_counter()
    try:
        ranges = card_ranges(card)
    except RangeError as exc:
        return EvalOutcome(EvalStatus.INFRA, f"the card's ranges cannot be read: {exc}")
    chance = chance or random.Random(random.SystemRandom().getrandbits(64))
    profiled = ranges.at
    points = [profiled] + [p for p in verification_points(ranges, INTERIOR_POINTS, chance)
                           if p != profiled]

    def at(point: dict[str, int]) -> EvalOutcome:
        # the profiled point keeps the card's key, under which its samples are stored
        exact = (dataclasses.replace(card, ranges=None) if point == profiled
                 else card_at(card, point))
        return evaluate_variant(exact, candidate, runtime=runtime, loader=loader, gpu=gpu,
                                samples_dir=samples_dir if point == profiled else None,
                                settings=settings)

    figures = []
    first: EvalOutcome | None = None
    for point in points:
        outcome = at(point)
        where = ", ".join(f"{name}={value}" for name, value in point.items())
        if not outcome.ok:
            return dataclasses.replace(
                outcome, summary=f"at {where}: {outcome.summary}"[:2000],
                wall_s=round(time.perf_counter() - started, 4),
                ranges=RangeFigures(failed_at=point, visited=tuple(points)))
        figures.append(RangePoint(point, outcome.speedup,
                                  outcome.timing.median_us if outcome.timing else None,
                                  outcome.eager.median_us if outcome.eager else None))
        first = first or outcome
    assert first is not None  # the profiled point is always evaluated
    kernel_us = sum(f.median_us or 0.0 for f in figures)
    eager_us = sum(f.eager_us or 0.0 for f in figures)
    speedup = eager_us / kernel_us if kernel_us > 0 and eager_us > 0 else first.speedup
    speedups = [f.speedup for f in figures if f.speedup]
    spread = (f" ({min(speedups):.2f}x..{max(speedups):.2f}x)" if speedups else "")
    return dataclasses.replace(
        first, speedup=speedup, wall_s=round(time.perf_counter() - started, 4),
        summary=f"{speedup:.2f}x eager over {ranges.text()} at {len(points)} points{spread}"
        if speedup else first.summary,
        ranges=RangeFigures(points=tuple(figures)))
