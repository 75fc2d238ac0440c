"""Parameter spaces of the library's kernels, and the moves the search makes in them.

A space is a few named axes, each an ordered tuple of values (block sizes, vector widths, ...),
and a validity rule. A point is a dict of one value per axis. The distance between two points
counts one per position moved along each axis; the neighbours of a point are the valid points
nearest to it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from kforge.core.opcard import canonical_json

Params = dict[str, int]


@dataclass(frozen=True)
class Axis:
    name: str
    values: tuple[int, ...]

    def position(self, value: int) -> int:
        """Index of ``value`` on the axis, or of the axis value nearest to it."""
        if value in self.values:
            return self.values.index(value)
        return min(range(len(self.values)), key=lambda i: (abs(self.values[i] - value), i))


def _grid(axes: tuple[Axis, ...], valid: Callable[[Params], bool]) -> list[Params]:
    names = [a.name for a in axes]
    combos = itertools.product(*(a.values for a in axes))
    return [p for p in (dict(zip(names, c)) for c in combos) if valid(p)]


def _distance(axes: tuple[Axis, ...], a: Params, b: Params) -> int:
    return sum(abs(axis.position(a[axis.name]) - axis.position(b[axis.name])) for axis in axes)


@dataclass(frozen=True)
class Space:
    """The valid points of one kernel variant for one card, with its starting and safe points."""

    axes: tuple[Axis, ...]
    default: Params
    safe: Params
    valid: Callable[[Params], bool] = field(default=lambda p: True, compare=False)

    def __post_init__(self) -> None:
        for name, point in (("default", self.default), ("safe", self.safe)):
            if not self.contains(point):
                raise ValueError(f"{name} point {point} is not in the space")

    @classmethod
    def build(cls, axes: tuple[Axis, ...], valid: Callable[[Params], bool], default: Params,
              safe: Params) -> Space | None:
        """A space whose default and safe points are the valid points nearest to the ones asked
        for; None when no point is valid at all."""
        points = _grid(axes, valid)
        if not points:
            return None

        def snap(point: Params) -> Params:
            return min(points, key=lambda p: _distance(axes, point, p))

        return cls(axes, snap(default), snap(safe), valid)

    def contains(self, point: Params) -> bool:
        return (set(point) == {a.name for a in self.axes}
                and all(point[a.name] in a.values for a in self.axes) and self.valid(point))

    def points(self) -> list[Params]:
        """Every valid point, in axis order (deterministic)."""
        return _grid(self.axes, self.valid)

    def distance(self, a: Params, b: Params) -> int:
        return _distance(self.axes, a, b)

    def nearest(self, point: Params, exclude: Callable[[Params], bool]) -> list[Params]:
        """The valid points closest to ``point``, leaving out ``point`` itself and whatever
        ``exclude`` says; all at the same smallest distance, empty when none is left."""
        ranked: dict[int, list[Params]] = {}
        for p in self.points():
            if p != point and not exclude(p):
                ranked.setdefault(self.distance(point, p), []).append(p)
        return ranked[min(ranked)] if ranked else []

    def delta(self, src: Params, dst: Params) -> dict[str, int]:
        """Positions moved per axis from ``src`` to ``dst``."""
        return {a.name: a.position(dst[a.name]) - a.position(src[a.name]) for a in self.axes
                if dst[a.name] != src[a.name]}

    def step(self, point: Params, delta: dict[str, int]) -> Params | None:
        """``point`` moved by ``delta`` positions per axis, or None if that leaves the space."""
        moved = dict(point)
        for axis in self.axes:
            i = axis.position(point[axis.name]) + delta.get(axis.name, 0)
            if not 0 <= i < len(axis.values):
                return None
            moved[axis.name] = axis.values[i]
        return moved if self.contains(moved) else None


def point_key(family: str, approach: str, params: dict) -> str:
    """Identity of a library candidate: same key, same kernel."""
    return canonical_json([family, approach, params])


def powers_of_two(low: int, high: int) -> tuple[int, ...]:
    values, v = [], low
    while v <= high:
        values.append(v)
        v *= 2
    return tuple(values)


def pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def pow2_floor(n: int) -> int:
    return 1 << max(0, n.bit_length() - 1)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))
