"""Reward arithmetic: speedups become log rewards, and each card's rewards a normalised value.

A kernel's reward is ``log(eager_time / kernel_time)``: 0 for parity, +0.69 for 2x, -0.69 for 2x
slower, whether the op takes 3 microseconds or 3 milliseconds. Kernel Forge fed raw milliseconds to
UCT, so for microsecond kernels the exploration term swamped any difference in value.

Log rewards still differ in spread between cards: a 2 us op's kernels may all lie within 10% of
eager while a 2 ms op's span 3x. The tree search therefore values a node on its card's own scale
(``RewardScale``): 0 for the lower of eager and the slowest kernel seen, 1 for the higher of eager
and the fastest, so that the exploration constant means the same on every card.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kforge.core.candidate import Baseline, Timing

# The value of a failed evaluation on the normalised scale: half the card's spread below the
# lower of eager and the slowest kernel, so a line of work that keeps failing loses value but is
# not written off at once.
FAILURE_REWARD = -0.5
# The narrowest spread (log units, about 5%) the scale stretches to [0, 1]: differences within
# timing noise are not magnified into large value gaps.
MIN_SPAN = 0.05


@dataclass(frozen=True)
class RewardScale:
    """One card's rewards mapped onto [0, 1]: ``low`` and ``high`` are the lowest and highest
    of eager (0) and every reward seen."""

    low: float = 0.0
    high: float = 0.0
    min_span: float = MIN_SPAN

    def including(self, reward: float) -> RewardScale:
        if self.low <= reward <= self.high:
            return self
        return replace(self, low=min(self.low, reward), high=max(self.high, reward))

    @property
    def span(self) -> float:
        return max(self.high - self.low, self.min_span)

    def value(self, reward: float) -> float:
        return (reward - self.low) / self.span if self.span > 0 else 0.0


def reward_from_speedup(speedup: float) -> float:
    if speedup <= 0:
        raise ValueError(f"speedup must be positive, got {speedup}")
    return math.log(speedup)


def speedup_from_reward(reward: float) -> float:
    return math.exp(reward)


def significant_win(speedup: float, spread: float) -> bool:
    """A kernel is worth integrating only if it beats eager by more than the timing noise.

    ``spread`` is the relative p10..p90 width of the measurement (candidate and eager combined).
    """
    return speedup > 1.0 + max(spread, 0.0)


def short_of_baselines(kernel: Timing | None, eager: Timing | None,
                       baseline: Baseline | None) -> str | None:
    """Why a kernel timed at ``kernel`` could never be used, or None when it beats a baseline
    by more than the timing noise: eager (``eager``, timed beside it, else the card's), what the
    eager and CUDA-graph integrations replace, or torch.compile (the card's), what the compiled
    modes replace. A kernel that beats neither is never worth confirming."""
    if kernel is None or kernel.median_us <= 0:
        return "no timing"
    bases = [("eager", eager or (baseline.eager if baseline else None)),
             ("torch.compile", baseline.compiled if baseline else None)]
    shortfalls = []
    for name, base in bases:
        if base is None:
            continue
        speedup = base.median_us / kernel.median_us
        spread = math.hypot(kernel.spread, base.spread)
        if significant_win(speedup, spread):
            return None
        shortfalls.append(f"{speedup:.2f}x {name} is slower" if speedup < 1.0 else
                          f"{speedup:.2f}x {name} is not faster beyond the timing noise "
                          f"(±{spread:.0%})")
    return "; ".join(shortfalls) or "no baseline"
