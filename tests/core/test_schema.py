"""The one codec (``kforge.core.schema``): strict reading names the field at fault, lenient
reading keeps the default with a note, value rules live in field metadata, and a record reads
back what it wrote."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kforge.core.gpu import GpuInfo
from kforge.core.opcard import OpCard
from kforge.core.schema import (
    InvalidValue,
    Origin,
    Record,
    Rule,
    SchemaError,
    bounds,
    check,
    checked,
    encode,
    read,
    salvage,
    spread,
)


@dataclass(frozen=True)
class Inner:
    depth: int = checked(1, least=0, most=8)


@dataclass(frozen=True)
class Sample:
    name: str = checked(longest=8)
    rate: float = checked(1.0, finite=True, above=0)
    mode: str = checked("fast", choices=("fast", "safe"))
    count: int | None = checked(None, least=1, most=100)
    figures: dict[str, float] = checked(factory=dict, finite=True, least=0)
    inner: Inner = field(default_factory=Inner)
    seeds: tuple[int, ...] = (1, 2)
    where: Path | None = None
    label: str = checked("", stored_as="kind")

    def __post_init__(self) -> None:
        check(self)


FILE = Origin("in config.toml")


def error(data: dict[str, Any], origin: Origin = FILE) -> str:
    with pytest.raises(SchemaError) as caught:
        read(Sample, data, origin, "sample")
    return str(caught.value)


# ----- strict: what a person wrote -----


@pytest.mark.parametrize("data, expected", [
    ({"name": "a", "rate": "fast"}, "[sample] rate in config.toml must be a number, not 'fast'"),
    ({"name": "a", "count": True},
     "[sample] count in config.toml must be a whole number, not True"),
    ({"name": "a", "seeds": [1, "2"]},
     "[sample] seeds in config.toml must be a list of whole numbers, not [1, '2']"),
    ({"name": "a", "inner": {"depth": "deep"}},
     "[sample.inner] depth in config.toml must be a whole number, not 'deep'"),
    ({"name": "a", "figures": {"x": "y"}}, "[sample.figures] x in config.toml must be a number"),
    ({}, "[sample] name in config.toml is missing"),
    ({"name": "a", "rat": 2}, "unknown setting [sample] rat in config.toml (did you mean rate?)"),
])
def test_a_strict_error_names_the_field(data, expected):
    assert expected in error(data)


def test_a_missing_field_is_told_apart_from_a_bad_one():
    with pytest.raises(SchemaError) as caught:
        read(Sample, {}, FILE, "sample")
    assert caught.value.missing and caught.value.name == "sample.name"


# ----- value rules as field metadata -----


@pytest.mark.parametrize("data, expected", [
    ({"rate": 0}, "rate in config.toml must be a finite number above 0, not 0.0"),
    ({"rate": math.inf}, "rate in config.toml must be a finite number above 0, not inf"),
    ({"count": 0}, "count in config.toml must be at least 1, not 0"),
    ({"count": 101}, "count in config.toml must be at most 100, not 101"),
    ({"mode": "quick"}, "mode in config.toml must be one of fast, safe, not 'quick'"),
    ({"name": "a-long-name"}, "name in config.toml must be at most 8 characters long"),
    ({"figures": {"x": 1.0, "y": math.nan}}, "figures in config.toml must be a finite number of "
                                             "at least 0"),
    ({"inner": {"depth": 9}}, "[sample.inner] depth in config.toml must be at most 8, not 9"),
])
def test_the_rules_of_a_field_are_its_metadata(data, expected):
    assert expected in error({"name": "a", **data})


def test_a_record_built_in_code_keeps_its_rules_too():
    with pytest.raises(InvalidValue, match="count must be at least 1, not 0"):
        Sample("a", count=0)
    with pytest.raises(InvalidValue, match="rate must be a finite number above 0, not nan"):
        Sample("a", rate=math.nan)


def test_rules_may_be_given_for_a_type_declared_elsewhere():
    rules = {"depth": Rule(least=5)}
    with pytest.raises(SchemaError, match="depth must be at least 5, not 2"):
        read(Inner, {"depth": 2}, Origin.record(), rules=rules)


def test_the_bounds_of_a_record_are_read_from_its_rules():
    assert bounds(Sample) == {"count": (1, 100)}


# ----- lenient: what was stored -----


def test_lenient_reading_keeps_the_default_with_a_note():
    origin = Origin("in the stored sample", strict=False)
    sample = read(Sample, {"name": "a", "rate": -1, "count": "many", "old_key": 1,
                           "inner": {"depth": 99}}, origin, "sample")
    assert sample == Sample("a")
    assert origin.notes == [
        "ignored [sample] count in the stored sample must be a whole number, not 'many'; "
        "using the default",
        "ignored unknown setting [sample] old_key in the stored sample",
        "ignored [sample.inner] depth in the stored sample must be at most 8, not 99; using "
        "the default",
        "ignored [sample] rate in the stored sample must be a finite number above 0, not -1.0; "
        "using the default",
    ]


def test_lenient_reading_still_refuses_a_record_without_a_required_field():
    with pytest.raises(SchemaError, match="name .* is missing"):
        read(Sample, {"rate": 2}, Origin("stored", strict=False), "sample")


# ----- records a kforge process wrote -----


def test_a_record_passes_over_keys_a_newer_writer_added_but_refuses_a_bad_value():
    assert read(Sample, {"name": "a", "new_key": 3}, Origin.record()) == Sample("a")
    with pytest.raises(SchemaError, match="rate must be a finite number"):
        read(Sample, {"name": "a", "rate": "x"}, Origin.record())
    with pytest.raises(SchemaError, match="rate must be a finite number, not inf"):
        read(Sample, {"name": "a", "rate": float("inf")}, Origin.record())  # kforge writes none
    with pytest.raises(SchemaError, match="rate is missing"):
        read(Sample, {"name": "a"}, Origin.record(whole=True))


def test_a_record_reads_back_what_it_wrote():
    sample = Sample("a", rate=2.5, mode="safe", count=3, figures={"x": 1.0},
                    inner=Inner(4), seeds=(5,), where=Path("/tmp/x"), label="l")
    data = encode(sample)
    assert data["kind"] == "l" and "label" not in data and data["where"] == "/tmp/x"
    assert read(Sample, data, Origin.record()) == sample


@dataclass(frozen=True)
class Spread:
    id: int
    rest: dict[str, Any] = spread()


def test_a_spread_field_holds_the_keys_beside_the_others():
    assert encode(Spread(3, {"a": 1})) == {"id": 3, "a": 1}
    assert read(Spread, {"id": 3, "a": 1, "b": None}, Origin.record()) == Spread(3, {"a": 1,
                                                                                     "b": None})


def test_core_records_use_the_codec():
    gpu = GpuInfo(name="H200", arch="sm_90", sm_count=132, memory_gb=141.0)
    assert isinstance(gpu, Record) and GpuInfo.from_dict(gpu.to_dict()) == gpu
    assert GpuInfo.from_dict({"name": "g", "arch": "sm_80", "added_later": 1}).name == "g"
    card = OpCard("aten.relu.default", [{"t": "tensor", "shape": [4], "dtype": "float32"}])
    assert OpCard.from_dict(card.to_dict()) == card


# ----- facts a kforge process stored -----


@dataclass(frozen=True)
class Point:
    at: tuple[int, int]
    value: float | str = 0.0


@dataclass(frozen=True)
class Facts:
    points: tuple[Point, ...] = ()
    spans: tuple[dict[str, int], ...] = ()
    flag: bool | None = None


def test_unions_take_the_first_type_that_reads_and_tuples_hold_records():
    data = {"points": [{"at": [1, 2], "value": "nan"}, {"at": [3, 4], "value": 2}],
            "spans": [{"L": 1}], "flag": None}
    facts = read(Facts, data, Origin.record())
    assert facts == Facts((Point((1, 2), "nan"), Point((3, 4), 2.0)), ({"L": 1},))
    assert read(Facts, encode(facts), Origin.record()) == facts
    with pytest.raises(SchemaError, match=r"value must be a finite number or text, not True"):
        read(Facts, {"points": [{"at": [1, 2], "value": True}]}, Origin.record())
    with pytest.raises(SchemaError, match=r"at must be a list of 2 values, not \[1\]"):
        read(Facts, {"points": [{"at": [1]}]}, Origin.record())


def test_stored_facts_drop_each_damaged_value_with_a_note_naming_its_path():
    origin = Origin.facts()
    data = {"points": [{"at": [1, 2], "value": float("inf")}], "flag": 1, "later": "kept out"}
    assert salvage(Facts, data, origin, "facts") == Facts((Point((1, 2)),))
    assert origin.notes == ["facts.points[0].value is Infinity, not a finite number or text: "
                            "dropped", "facts.flag is 1, not true or false: dropped"]
    assert salvage(Point, {"value": 1.0}, origin, "point") is None
    assert salvage(Facts, [1, 2], origin, "facts") is None
    assert origin.notes[2:] == ["point lacks at: dropped",
                                "facts is [1, 2], not a table: dropped"]


def test_encoding_may_leave_out_the_fields_at_their_default():
    facts = Facts((Point((1, 2)),))
    assert encode(facts, defaults=False) == {"points": [{"at": [1, 2]}]}
    assert encode(Facts(), defaults=False) == {}
