"""Reward arithmetic: speedups become scale-free log rewards.

A kernel's reward is ``log(eager_time / kernel_time)``: 0 for parity, +0.69 for 2x, -0.69 for 2x
slower, whether the op takes 3 microseconds or 3 milliseconds. Kernel Forge fed raw milliseconds to
UCT, so for microsecond kernels the exploration term swamped any difference in value.
"""

from __future__ import annotations

import math

# Credited to a failed evaluation when it is backed up the tree: as bad as a kernel 2.7x slower
# than eager, so a line of work that keeps failing loses value but is not written off at once.
FAILURE_REWARD = -1.0


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
