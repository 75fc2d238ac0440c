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
from dataclasses import dataclass, replace
from typing import Any

from kforge.core.argspec import decode, freeze, tensor_specs
from kforge.core.opcard import OpCard, canonical_json, describe_tensor
from kforge.errors import KforgeError

Path = tuple[str | int, ...]
Point = dict[str, int]
# Matched points kept per matcher (a generation visits one point per token).
MATCH_CACHE_SIZE = 4096
# What stands for an integer in a call's skeleton: a string no arg spec holds.
_HOLE = "\0int"
_NON_NEGATIVE_FIELDS = ("shape", "stride", "offset")


class RangeError(KforgeError):
    """A malformed range description, or a point outside a card's range."""


@dataclass(frozen=True)
class Symbol:
    """One varying integer: its closed range and the value the card's arg specs hold (``at``)."""

    name: str
    lo: int
    hi: int
    at: int

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise RangeError(f"range symbol {self.name!r} is not a name")
        if not self.lo <= self.at <= self.hi:
            raise RangeError(f"range symbol {self.name}: needs lo <= at <= hi, got "
                             f"{self.lo} <= {self.at} <= {self.hi}")


@dataclass(frozen=True)
class Law:
    """The integer at ``path`` equals ``a * symbol + b``."""

    path: Path
    symbol: str
    a: int
    b: int

    def value(self, point: Mapping[str, int]) -> int:
        return self.a * point[self.symbol] + self.b

    def text(self) -> str:
        """``L``, ``L+1``, ``2L-3``, ``-L+8``."""
        scale = {1: "", -1: "-"}.get(self.a, str(self.a))
        offset = f"{self.b:+d}" if self.b else ""
        return f"{scale}{self.symbol}{offset}"


@dataclass(frozen=True)
class Ranges:
    """A range card's symbols and laws."""

    symbols: tuple[Symbol, ...]
    laws: tuple[Law, ...]

    def __post_init__(self) -> None:
        names = [s.name for s in self.symbols]
        if not names or len(set(names)) != len(names):
            raise RangeError(f"a range needs one or more distinct symbols, got {names}")
        for law in self.laws:
            if law.symbol not in names:
                raise RangeError(f"the law at {list(law.path)} uses {law.symbol!r}, which is not "
                                 f"a symbol of the range ({', '.join(names)})")
            if law.a == 0:
                raise RangeError(f"the law at {list(law.path)} does not vary (a = 0)")
        unused = set(names) - {law.symbol for law in self.laws}
        if unused:
            raise RangeError(f"range symbol {sorted(unused)[0]!r} governs no integer")

    @property
    def at(self) -> Point:
        return {s.name: s.at for s in self.symbols}

    def symbol(self, name: str) -> Symbol:
        return next(s for s in self.symbols if s.name == name)

    def contains(self, point: Mapping[str, int]) -> bool:
        return all(s.lo <= point.get(s.name, s.lo - 1) <= s.hi for s in self.symbols)

    def text(self) -> str:
        """``L=1..4096`` (symbols joined with ``, ``)."""
        return ", ".join(f"{s.name}={s.lo}..{s.hi}" for s in self.symbols)

    def to_dict(self) -> dict:
        return {"symbols": [{"name": s.name, "lo": s.lo, "hi": s.hi, "at": s.at}
                            for s in self.symbols],
                "laws": [{"path": list(law.path), "symbol": law.symbol, "a": law.a, "b": law.b}
                         for law in self.laws]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Ranges:
        try:
            symbols = tuple(Symbol(str(s["name"]), _int(s["lo"]), _int(s["hi"]), _int(s["at"]))
                            for s in data["symbols"])
            laws = tuple(Law(tuple(law["path"]), str(law["symbol"]), _int(law["a"]),
                             _int(law["b"])) for law in data["laws"])
        except (KeyError, TypeError) as exc:
            raise RangeError(f"a range description lacks {exc} or is not a mapping") from None
        return cls(symbols, laws)


def _int(value: Any) -> int:
    if type(value) is not int:
        raise RangeError(f"a range holds integers, not {value!r}")
    return value


# ----- reading integers in arg specs -----


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


# ----- display -----


class _LawText(str):
    """A varying integer written as its law, told apart from a string argument."""


def symbolic_args(args: list, kwargs: dict, ranges: Ranges) -> tuple[list, dict]:
    """The arg specs with each varying integer written as its law (``"L+1"``), for display."""
    root = copy.deepcopy({"args": args, "kwargs": kwargs})
    for law in ranges.laws:
        *parents, last = law.path
        holder: Any = root
        for step in parents:
            holder = holder[step]
        holder[last] = _LawText(law.text())
    return root["args"], root["kwargs"]


def describe_range_args(args: list, kwargs: dict, ranges: Ranges) -> str:
    """``bf16[1,8,L+1,256], -2 for L=1..4096``: the arguments with varying integers written as
    their laws (a tensor's dtype and contiguity mark as at the profiled point), and the range."""
    shown_args, shown_kwargs = symbolic_args(args, kwargs, ranges)
    # decode visits positional arguments in order, then keyword arguments sorted by name
    exact = iter(tensor_specs(args) + [t for name in sorted(kwargs)
                                       for t in tensor_specs(kwargs[name])])

    def tensor(spec: dict) -> str:
        held = describe_tensor(next(exact))
        dims = ",".join(str(d) for d in spec["shape"])
        return f"{held[:held.index('[')]}[{dims}]{'*' if held.endswith('*') else ''}"

    def one(spec: Any) -> str:
        return decode(spec, tensor, make_list=lambda items: f"[{', '.join(items)}]",
                      make_named=lambda kind, name: str(name),
                      make_scalar=lambda v: v if isinstance(v, _LawText) else repr(v))

    parts = [one(a) for a in shown_args] + [f"{k}={one(v)}" for k, v in
                                            sorted(shown_kwargs.items())]
    return f"{', '.join(parts)} for {ranges.text()}"
