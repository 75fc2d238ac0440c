"""Where the search spends its iterations: an Amdahl-aware split over op cards.

An op's worth is the model time still recoverable from it: ``share * (1/best - 1/ceiling)``, where
``best`` is the speedup found so far and ``ceiling`` the speedup at its physical floor. A 40% op at
parity is worth far more than a 0.1% op, and an op already near its floor is worth little. That is
weighted by a prior that a search finds anything at all: generated kernels beat PyTorch's native
kernels often, vendor libraries (cuBLAS, cuDNN, flash attention) rarely.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Where no floor is known, assume a search could at best double an op's speed.
DEFAULT_CEILING = 2.0
# Chance that a search beats eager, by where eager time goes (Kernel Forge: 13 of 24 native ops,
# 1 of 9 vendor-library ops).
PRIOR_NATIVE = 0.55
PRIOR_VENDOR = 0.11
# An op within this fraction of its ceiling is "at its floor" and stops.
NEAR_FLOOR = 0.9


@dataclass(frozen=True)
class OpBudget:
    """The search state of one op, as far as budgeting cares."""

    card_id: int
    share: float
    vendor: bool = False
    best_speedup: float = 1.0
    ceiling: float | None = None  # eager time / floor time
    spent: int = 0  # completed evaluations
    since_best: int = 0  # evaluations since the last improvement

    @property
    def ceiling_or_default(self) -> float:
        if self.ceiling is None or self.ceiling <= 1.0:
            return max(DEFAULT_CEILING, self.best_speedup)
        return max(self.ceiling, self.best_speedup)

    @property
    def headroom(self) -> float:
        """Fraction of model time still recoverable from this op."""
        best = max(self.best_speedup, 1.0)
        return max(0.0, self.share * (1.0 / best - 1.0 / self.ceiling_or_default))

    @property
    def worth(self) -> float:
        return self.headroom * (PRIOR_VENDOR if self.vendor else PRIOR_NATIVE)


def stop_reason(op: OpBudget, limit: int, patience: int) -> str | None:
    """Why this op's search should stop now, or None to go on."""
    if op.spent >= limit:
        return "budget spent"
    if op.since_best >= patience:
        return f"no gain in {patience} iterations"
    if op.ceiling and op.ceiling > 1.0 and op.best_speedup >= NEAR_FLOOR * op.ceiling:
        return "at its physical floor"
    return None


def allocate(ops: list[OpBudget], total: int, min_each: int = 2) -> dict[int, int]:
    """Split ``total`` iterations over ``ops`` by worth, each op getting at least ``min_each``
    (as far as the total allows). Largest-remainder rounding keeps the sum exact."""
    if not ops or total <= 0:
        return {op.card_id: 0 for op in ops}
    base = min(min_each, total // len(ops))
    plan = {op.card_id: base for op in ops}
    rest = total - base * len(ops)
    weights = [op.worth for op in ops]
    if sum(weights) < 1e-12:  # nothing worth anything (or underflow): split evenly
        weights = [1.0] * len(ops)
    scale = rest / sum(weights)
    shares = [w * scale for w in weights]
    for op, s in zip(ops, shares):
        plan[op.card_id] += math.floor(s)
    leftover = total - sum(plan.values())
    by_remainder = sorted(range(len(ops)), key=lambda i: (-(shares[i] - math.floor(shares[i])),
                                                           -ops[i].share, ops[i].card_id))
    for i in by_remainder[:leftover]:
        plan[ops[i].card_id] += 1
    return plan


def pick_next(ops: list[OpBudget], total: int, min_each: int = 2) -> int | None:
    """The op to spend the next iteration on: the one furthest behind its share of a plan that is
    re-made from the current bests (so an op that found its speedup yields to the others)."""
    if not ops:
        return None
    spent = sum(op.spent for op in ops)
    plan = allocate(ops, max(total, spent), min_each)
    behind = [(plan[op.card_id] - op.spent) / max(plan[op.card_id], 1) for op in ops]
    best = max(range(len(ops)), key=lambda i: (behind[i], ops[i].worth, -ops[i].card_id))
    return ops[best].card_id if plan[ops[best].card_id] > ops[best].spent else None
