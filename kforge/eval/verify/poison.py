"""The values a candidate's fresh memory holds before it runs: every output and scratch buffer is
filled on every call, checked or timed, with one of several patterns taken in turn, so an element
a kernel never writes fails the comparison and no call can be told from another by its poison."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Poison:
    """One fill pattern: a value per kind of dtype."""

    floating: float
    integer: int
    boolean: bool

    def value_for(self, dtype: torch.dtype) -> float | int | bool:
        if dtype == torch.bool:
            return self.boolean
        if dtype.is_floating_point or dtype.is_complex:
            return self.floating
        info = torch.iinfo(dtype)
        return max(info.min, min(info.max, self.integer))

    def fill(self, t: torch.Tensor) -> None:
        if t.numel() and t.device.type != "meta":
            t.fill_(self.value_for(t.dtype))


# Consecutive calls never share a pattern, so an element left unwritten differs between two runs
# even where eager's value equals one pattern.
PATTERNS = (
    Poison(floating=math.nan, integer=0x5A5A5A5A, boolean=True),
    Poison(floating=-12345.0, integer=-0x5A5A5A5B, boolean=False),
    Poison(floating=math.inf, integer=0x7EADBEEF, boolean=True),
    Poison(floating=3.0e4, integer=-1, boolean=False),
)


class PoisonCycle:
    """The patterns in turn, one per call."""

    def __init__(self) -> None:
        self.calls = 0

    def next(self) -> Poison:
        poison = PATTERNS[self.calls % len(PATTERNS)]
        self.calls += 1
        return poison
