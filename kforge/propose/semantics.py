"""What an aten operator computes, in words a kernel author can act on: one statement per op family
(softmax, group norm, pointwise, matmul, ...), notes for single ops, and names for the outputs
that an op's schema leaves unnamed. The statements are data (``op_semantics.json``), reviewed by
a test that every op the kernel library or a profiled model meets has one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from kforge.errors import KforgeError

DATA = Path(__file__).with_name("op_semantics.json")


@dataclass(frozen=True)
class OpMeaning:
    """``returns`` names the outputs where the data names them (empty: the schema's names or
    none)."""

    family: str
    meaning: str
    note: str = ""
    returns: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Family:
    name: str
    meaning: str
    notes: dict[str, str]
    returns: dict[str, tuple[str, ...]]


def base_name(op: str) -> str:
    """``aten.native_group_norm.default`` -> ``native_group_norm``; an in-place or out variant
    belongs to its base (``aten.add_.Tensor`` -> ``add``). Non-aten ops keep their full name."""
    parts = op.split(".")
    if len(parts) < 2 or parts[0] != "aten":
        return op
    name = parts[1]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


@cache
def _families() -> dict[str, _Family]:
    """Op base name -> its family, from the data file. Raises KforgeError when an op is listed
    twice or a note names an op outside its family."""
    data = json.loads(DATA.read_text())
    by_op: dict[str, _Family] = {}
    for entry in data["families"]:
        ops = entry["ops"]
        family = _Family(entry["name"], entry["meaning"], dict(entry.get("notes", {})),
                         {op: tuple(names) for op, names in entry.get("returns", {}).items()})
        for op in (*family.notes, *family.returns):
            if op not in ops:
                raise KforgeError(f"{DATA.name}: family {family.name!r} has a note or return "
                                  f"names for {op!r}, which is not one of its ops")
        for op in ops:
            if op in by_op:
                raise KforgeError(f"{DATA.name}: op {op!r} is in families {by_op[op].name!r} "
                                  f"and {family.name!r}")
            by_op[op] = family
    return by_op


def family_names() -> set[str]:
    return {family.name for family in _families().values()}


def op_meaning(op: str) -> OpMeaning | None:
    """What ``op`` (``aten.<name>.<overload>``) computes, or None for an op no family covers."""
    name = base_name(op)
    family = _families().get(name)
    if family is None:
        return None
    return OpMeaning(family.name, family.meaning, family.notes.get(name, ""),
                     family.returns.get(name, ()))
