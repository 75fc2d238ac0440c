"""Shape-range cards: one op card covering a range of integer *symbols* (the KV length ``L`` of a
decode step, say), with the integers of its arg specs that follow them as affine laws.

Pure data and decisions. A range card's ``args``/``kwargs`` are its exact variant at the point it
was profiled (each symbol's ``at``), so whatever reads a card without ranges (samples, baselines,
the sanitizer) sees one valid variant. Its ``ranges`` (``Ranges.to_dict``) name the symbols with
their closed ranges ``lo..hi`` and, for each integer of the arg specs that varies (a shape, a
stride, a storage offset, an integer argument), where it sits (a path from ``{"args": ...,
"kwargs": ...}``) and its law ``a * symbol + b`` (integers ``a != 0`` and ``b``).

``fit_laws`` finds the laws from the same call observed at three or more values of a symbol (two
points fit any line; a third confirms it); ``instantiate`` makes the exact variant at a point;
``RangeMatcher`` says at which point, if any, a concrete call is an instance of a range card.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from kforge.core.argspec import freeze
from kforge.core.laws import Law, Path, Point, RangeError, Ranges
from kforge.core.opcard import OpCard, canonical_json

# Matched points kept per matcher (a generation visits one point per token).
MATCH_CACHE_SIZE = 4096
# What stands for an integer in a call's skeleton: a string no arg spec holds.
_HOLE = "\0int"
_NON_NEGATIVE_FIELDS = ("shape", "stride", "offset")


def int_leaves(args: list, kwargs: dict) -> Iterator[tuple[Path, int]]:
    """``(path, value)`` of every integer (not bool) in a call's arg specs, in a fixed order."""

    def walk(value: Any, path: Path) -> Iterator[tuple[Path, int]]:
        if type(value) is int:
            yield path, value
        elif isinstance(value, dict):
            for key in sorted(value):
                yield from walk(value[key], (*path, key))
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                yield from walk(item, (*path, i))

    yield from walk({"args": args, "kwargs": kwargs}, ())


def skeleton(op: str, args: list, kwargs: dict) -> str:
    """The call with every integer replaced by a hole: equal exactly when two calls differ at
    most in their integers."""

    def holes(value: Any) -> Any:
        if type(value) is int:
            return _HOLE
        if isinstance(value, dict):
            return {key: holes(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [holes(item) for item in value]
        return value

    return canonical_json([op, holes(args), holes(kwargs)])


def value_at(args: list, kwargs: dict, path: Path) -> Any:
    """The value at ``path`` in a call's arg specs; None where the path leads nowhere."""
    value: Any = {"args": args, "kwargs": kwargs}
    for step in path:
        if isinstance(value, dict) and isinstance(step, str) and step in value:
            value = value[step]
        elif isinstance(value, (list, tuple)) and type(step) is int and 0 <= step < len(value):
            value = value[step]
        else:
            return None
    return value


# ----- finding laws -----


def fit_laws(observations: Sequence[tuple[int, list, dict]], symbol: str = "L"
             ) -> tuple[Law, ...] | None:
    """The laws under which one call, observed as ``(value of symbol, args, kwargs)`` at three or
    more distinct values, is one range card: every integer that differs between observations is
    ``a * symbol + b`` with integers ``a`` and ``b`` at all of them. None when the calls differ
    in anything but integers, an integer follows no such law, or fewer than three distinct
    values were observed; an empty tuple when no integer varies."""
    values = [value for value, _, _ in observations]
    if len(set(values)) != len(values) or len(values) < 3:
        return None
    first_value, first_args, first_kwargs = observations[0]
    shape = skeleton("", first_args, first_kwargs)
    if any(skeleton("", a, k) != shape for _, a, k in observations[1:]):
        return None
    columns = [dict(int_leaves(a, k)) for _, a, k in observations]
    laws = []
    for path, first in columns[0].items():
        seen = [column[path] for column in columns]
        if all(v == first for v in seen):
            continue
        second_value, second = values[1], seen[1]
        rise, run = second - first, second_value - first_value
        if rise % run:
            return None
        a = rise // run
        b = first - a * first_value
        if a == 0 or any(a * x + b != v for x, v in zip(values, seen)):
            return None
        laws.append(Law(path, symbol, a, b))
    return tuple(laws)


def valid_span(laws: Sequence[Law], symbol: str, lo: int, hi: int) -> tuple[int, int] | None:
    """``lo..hi`` narrowed to where every shape, stride and storage offset the laws give stays a
    valid one (shapes at least 1, strides and offsets at least 0); None where nothing is left."""
    for law in laws:
        if law.symbol != symbol or not _is_layout_integer(law.path):
            continue
        least = 1 if "shape" in law.path else 0
        # a * x + b >= least
        bound = least - law.b
        if law.a > 0:
            lo = max(lo, -(-bound // law.a))
        else:
            hi = min(hi, bound // law.a)
    return (lo, hi) if lo <= hi else None


def _is_layout_integer(path: Path) -> bool:
    return any(field in path for field in _NON_NEGATIVE_FIELDS)


# ----- exact variants of a range -----


def instantiate(args: list, kwargs: dict, ranges: Ranges, point: Mapping[str, int]
                ) -> tuple[list, dict]:
    """The exact arg specs of a range card at ``point`` (every symbol given, inside its
    range)."""
    if not ranges.contains(point):
        raise RangeError(f"{_point_text(point)} is outside the card's range {ranges.text()}")
    root = copy.deepcopy({"args": args, "kwargs": kwargs})
    for law in ranges.laws:
        *parents, last = law.path
        holder: Any = root
        for step in parents:
            holder = holder[step]
        holder[last] = law.value(point)
    return root["args"], root["kwargs"]


def _point_text(point: Mapping[str, int]) -> str:
    return ", ".join(f"{name}={value}" for name, value in point.items())


def solve(ranges: Ranges, args: list, kwargs: dict) -> Point | None:
    """The one point at which the laws give the integers the call holds where each symbol's
    first law sits, inside the range; None where there is none (the rest of the call is not
    compared here: see ``RangeMatcher``)."""
    point: Point = {}
    for symbol in ranges.symbols:
        law = next(law for law in ranges.laws if law.symbol == symbol.name)
        held = value_at(args, kwargs, law.path)
        if type(held) is not int or (held - law.b) % law.a:
            return None
        value = (held - law.b) // law.a
        if not symbol.lo <= value <= symbol.hi:
            return None
        point[symbol.name] = value
    return point


class RangeMatcher:
    """Says at which point of a range card a concrete call (its arg specs) is the card's exact
    variant, or that it is none: the point is solved from the call, then the card's variant at
    that point must equal the call in every argument."""

    def __init__(self, args: list, kwargs: dict, ranges: Ranges) -> None:
        self.args = args
        self.kwargs = kwargs
        self.ranges = ranges
        self._frozen: dict[tuple[int, ...], Any] = {}

    def match(self, args: list, kwargs: dict, frozen: Any = None) -> Point | None:
        """The point, or None. ``frozen``: the call's ``freeze([args, kwargs])``, if the caller
        has it already."""
        point = solve(self.ranges, args, kwargs)
        if point is None:
            return None
        key = tuple(point.values())
        expected = self._frozen.get(key)
        if expected is None:
            if len(self._frozen) >= MATCH_CACHE_SIZE:
                self._frozen.clear()
            expected = self._frozen[key] = freeze(list(
                instantiate(self.args, self.kwargs, self.ranges, point)))
        call = frozen if frozen is not None else freeze([args, kwargs])
        return point if expected == call else None


# ----- range cards -----


def card_ranges(card: OpCard) -> Ranges:
    """A range card's ranges; RangeError for an exact card."""
    if card.ranges is None:
        raise RangeError(f"card {card.key} of {card.op} has no ranges")
    return Ranges.from_dict(card.ranges)


def range_card(card: OpCard, ranges: Ranges) -> OpCard:
    """``card`` (the exact variant at the ranges' ``at`` point) as a range card."""
    expected = instantiate(card.args, card.kwargs, ranges, ranges.at)
    if freeze(list(expected)) != freeze([card.args, card.kwargs]):
        raise RangeError(f"the laws do not give card {card.key}'s own arguments at "
                         f"{_point_text(ranges.at)}")
    return card.with_(ranges=ranges.to_dict())


def card_at(card: OpCard, point: Mapping[str, int]) -> OpCard:
    """The exact card of a range card at ``point``: its own key, no ranges, no id (times and
    shares are the profiled point's)."""
    args, kwargs = instantiate(card.args, card.kwargs, card_ranges(card), point)
    return replace(card, args=args, kwargs=kwargs, ranges=None, key="", id=None)


# ----- points to check and time -----


def verification_points(ranges: Ranges, interior: int, chance: random.Random) -> list[Point]:
    """Where a range kernel is verified: every symbol at its ``lo``, every symbol at its ``hi``,
    then ``interior`` points drawn uniformly inside the range (fewer where the range has fewer
    points), without repeats."""
    lows = {s.name: s.lo for s in ranges.symbols}
    highs = {s.name: s.hi for s in ranges.symbols}
    points = [lows] if lows == highs else [lows, highs]
    room = 1
    for s in ranges.symbols:
        room *= s.hi - s.lo + 1
    wanted = min(interior, room - len(points))
    while wanted > 0:
        point = {s.name: chance.randint(s.lo, s.hi) for s in ranges.symbols}
        if point not in points:
            points.append(point)
            wanted -= 1
    return points
