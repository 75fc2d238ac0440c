"""Measured selection: which winners to keep in a model, judged by the whole model's time.

A kernel that beats its op in isolation can still lose in the model: outside CUDA graphs its
launch path costs CPU time, and under torch.compile it takes the op out of Inductor's fusions.
So winners are tried in the model one at a time, greedily, in the caller's order (the most
promising first): ``measure(subset)`` times a whole forward with that subset of winners in place,
and a winner is kept only when the model with it is faster than without it beyond the timing
noise of both measurements (the rule and noise estimate every kforge speedup decision uses:
``kforge.core.reward.significant_win`` over ``kforge.integrate.winners.combined_spread``).

Every kept winner makes the measured median strictly smaller, so the selection is never slower
than the model without any winner, by the same measure. Pure: ``measure`` is the only effect,
called ``len(winners) + 1`` times. A trial that ``measure`` cannot run (``TrialFailed``: the
forward with that winner cannot be captured as a CUDA graph, say) leaves the winner out with
the reason; the model without any winner must run.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from kforge.core.candidate import Timing
from kforge.core.reward import significant_win
from kforge.integrate.winners import combined_spread

K = TypeVar("K", bound=Hashable)


class TrialFailed(Exception):
    """``measure`` could not run the model with a subset of winners; the message says why."""


@dataclass(frozen=True)
class Trial(Generic[K]):
    """One winner tried on top of the winners kept before it."""

    winner: K
    timing: Timing | None  # the model with the kept winners and this one (None: it failed)
    speedup: float  # the model's time without this winner over its time with it
    spread: float  # the combined relative noise of the two timings
    kept: bool
    failed: str = ""  # why the model could not run with this winner

    @property
    def reason(self) -> str:
        if self.failed:
            return f"the model cannot run with it: {self.failed}"
        if self.kept:
            return f"the model is {self.speedup:.3f}x faster with it (noise ±{self.spread:.1%})"
        if self.speedup < 1.0:
            return f"the model is slower with it ({self.speedup:.3f}x)"
        if self.speedup > 1.0 + self.spread:
            return f"the model is {self.speedup:.3f}x with it, below the minimum gain"
        return (f"the model is {self.speedup:.3f}x with it, inside the timing noise "
                f"(±{self.spread:.1%})")


@dataclass(frozen=True)
class Selection(Generic[K]):
    """The winners kept, the model's time without any and with those kept, and every trial."""

    kept: tuple[K, ...]
    baseline: Timing
    final: Timing
    trials: tuple[Trial[K], ...]

    @property
    def speedup(self) -> float:
        """The model without any winner over the model with the kept ones (medians)."""
        return self.baseline.median_us / self.final.median_us

    @property
    def dropped(self) -> tuple[Trial[K], ...]:
        return tuple(t for t in self.trials if not t.kept)


def select(winners: Sequence[K], measure: Callable[[frozenset[K]], Timing], *,
           min_gain: float = 1.0) -> Selection[K]:
    """Greedy forward selection of ``winners`` (tried in the given order) by whole-model time;
    a winner is kept where it makes the model faster beyond noise and by at least
    ``min_gain``."""
    kept: list[K] = []
    baseline = current = measure(frozenset())
    trials = []
    for winner in winners:
        try:
            timing = measure(frozenset([*kept, winner]))
        except TrialFailed as failed:
            trials.append(Trial(winner, None, 0.0, 0.0, False, str(failed)))
            continue
        speedup = current.median_us / timing.median_us if timing.median_us > 0 else 0.0
        spread = combined_spread(timing, current)
        keep = significant_win(speedup, spread) and speedup >= min_gain
        trials.append(Trial(winner, timing, speedup, spread, keep))
        if keep:
            kept.append(winner)
            current = timing
    return Selection(tuple(kept), baseline, current, tuple(trials))
