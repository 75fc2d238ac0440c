"""Search settings: budgets and knobs, read from a session's stored settings with defaults."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, fields

from kforge.core.mcts import MctsParams
from kforge.errors import KforgeError


@dataclass(frozen=True)
class SearchSettings:
    proposer: str = "library"
    evaluator: str = "gpu"
    iterations_per_op: int = 24  # average; the split over ops follows share and headroom
    max_op_factor: float = 3.0  # an op may take up to this many times the average
    usd: float | None = None  # total LLM spend allowed for the session
    wall_s: float | None = None  # total engine run time allowed for the session
    parallel: int = 2  # proposals in flight at once
    patience: int = 12  # stop an op after this many iterations without improvement
    seed: int = 0
    focus: int | None = None  # only search this card
    top_ops: int | None = None  # only search the ops with the largest time shares
    mcts: MctsParams = field(default_factory=MctsParams)

    @property
    def per_op_limit(self) -> int:
        return max(1, math.ceil(self.iterations_per_op * self.max_op_factor))

    @classmethod
    def from_dict(cls, data: dict) -> SearchSettings:
        known = {f.name for f in fields(cls)} - {"mcts"}
        values = {k: v for k, v in data.items() if k in known}
        mcts = MctsParams(**data.get("mcts", {})) if data.get("mcts") else MctsParams()
        settings = cls(**values, mcts=mcts)
        settings.check()
        return settings

    def to_dict(self) -> dict:
        return asdict(self)

    def check(self) -> None:
        if self.iterations_per_op < 1:
            raise KforgeError("iterations per op must be at least 1")
        if self.parallel < 1:
            raise KforgeError("parallel proposals must be at least 1")
        if self.usd is not None and self.usd < 0:
            raise KforgeError("the USD budget cannot be negative")
        if self.top_ops is not None and self.top_ops < 1:
            raise KforgeError("--top must be at least 1")
        if self.wall_s is not None and self.wall_s <= 0:
            raise KforgeError("the time budget must be positive")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*$")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h`` -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise KforgeError(f"cannot read {text!r} as a duration: use e.g. 90s, 15m or 2h")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
