"""The laws of a range card (``kforge.core.ranges``): its symbols, each with a closed range of
integers, and for each integer of its arg specs that varies, the affine law ``a * symbol + b``
it follows. Pure data, below op cards, so that a card can describe its range."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kforge.core.schema import Origin, Record, SchemaError, read
from kforge.errors import KforgeError

Path = tuple[str | int, ...]
Point = dict[str, int]


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
class Ranges(Record):
    """A range card's symbols and laws, stored as the codec (``kforge.core.schema``) writes
    them."""

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

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Ranges:
        try:
            return read(cls, data, Origin.record(), what="range fields")
        except SchemaError as exc:
            raise RangeError(f"a range description is damaged: {exc}") from None


# ----- reading integers in arg specs -----
