"""Range cards: laws are found from three or more observations and only then, an instance at any
point of the range matches at exactly that point, and nothing else matches."""

from __future__ import annotations

import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kforge.core.laws import Law, RangeError, Ranges, Symbol
from kforge.core.opcard import OpCard, variant_key
from kforge.core.ranges import (
    RangeMatcher,
    card_at,
    fit_laws,
    instantiate,
    range_card,
    solve,
    valid_span,
    verification_points,
)


def kv(length: int, heads: int = 8, dim: int = 64, dtype: str = "bfloat16") -> dict:
    """A contiguous ``[1, heads, length, dim]`` KV-cache tensor spec."""
    return {"t": "tensor", "shape": [1, heads, length, dim],
            "stride": [heads * length * dim, length * dim, dim, 1], "dtype": dtype, "offset": 0}


def cat_call(length: int) -> tuple[list, dict]:
    """The KV append of a decode step: the cache so far and the new token, along dim -2."""
    return [{"t": "list", "items": [kv(length), kv(1)]}, -2], {}


def observe(lengths, call=cat_call):
    return [(n, *call(n)) for n in lengths]


def cat_range(lo: int = 1, hi: int = 4096, at: int = 2048) -> OpCard:
    laws = fit_laws(observe([at, 1000, 3000]))
    assert laws
    card = OpCard("aten.cat.default", *cat_call(at))
    return range_card(card, Ranges((Symbol("L", lo, hi, at),), laws))


def test_the_kv_append_of_a_decode_step_becomes_one_range_card():
    laws = fit_laws(observe([2048, 1024, 3072]))
    assert {law.path: (law.a, law.b) for law in laws} == {
        ("args", 0, "items", 0, "shape", 2): (1, 0),
        ("args", 0, "items", 0, "stride", 0): (512, 0),
        ("args", 0, "items", 0, "stride", 1): (64, 0)}
    card = cat_range()
    assert card.signature == "[bf16[1,8,L,64], bf16[1,8,1,64]], -2 for L=1..4096"
    assert card.range_text == "L=1..4096"
    exact = card_at(card, {"L": 17})
    assert exact.ranges is None and exact.args == cat_call(17)[0]
    assert exact.key == variant_key("aten.cat.default", *cat_call(17))


def test_a_card_without_ranges_keeps_its_key_and_a_range_card_has_its_own():
    args, kwargs = cat_call(2048)
    plain = OpCard("aten.cat.default", args, kwargs)
    assert plain.key == variant_key("aten.cat.default", args, kwargs)
    ranged = cat_range()
    assert ranged.key != plain.key and ranged.args == plain.args
    assert plain.range_text == ""
    assert OpCard.from_dict(ranged.to_dict()) == ranged


def test_two_points_fit_any_line_so_a_third_must_confirm():
    assert fit_laws(observe([10, 20])) is None
    squares = [(n, [kv(n * n)], {}) for n in (2, 3, 4)]
    assert fit_laws(squares) is None  # 4, 9, 16: no line through all three
    halves = [(n, [kv(n // 2)], {}) for n in (2, 4, 6)]
    assert fit_laws(halves) is None  # slope 1/2 is not an integer law
    assert fit_laws(observe([10, 10, 20])) is None  # repeated point


def test_calls_that_differ_in_more_than_integers_are_not_one_card():
    other_dtype = [(n, [kv(n, dtype="float16" if n == 30 else "bfloat16")], {})
                   for n in (10, 20, 30)]
    assert fit_laws(other_dtype) is None
    assert fit_laws([(n, [kv(64)], {}) for n in (1, 2, 3)]) == ()  # nothing varies


@settings(max_examples=60, deadline=None)
@given(a=st.integers(-5, 5).filter(bool), b=st.integers(-50, 50),
       lengths=st.lists(st.integers(-100, 100), min_size=3, max_size=5, unique=True),
       constant=st.integers(0, 9))
def test_fit_recovers_every_affine_law(a, b, lengths, constant):
    def call(n):
        return [n * a + b, {"t": "list", "items": [constant, 2 * a * n - b]}], {"k": constant}

    laws = fit_laws(observe(lengths, call))
    assert {law.path: (law.a, law.b) for law in laws} == {
        ("args", 0): (a, b), ("args", 1, "items", 1): (2 * a, -b)}


@settings(max_examples=60, deadline=None)
@given(lo=st.integers(1, 50), width=st.integers(0, 300), data=st.data())
def test_every_point_of_the_range_matches_at_that_point_alone(lo, width, data):
    hi = lo + width
    at = data.draw(st.integers(lo, hi))
    card = cat_range(lo, hi, at)
    ranges = Ranges.from_dict(card.ranges)
    matcher = RangeMatcher(card.args, card.kwargs, ranges)
    point = data.draw(st.integers(lo, hi))
    args, kwargs = cat_call(point)
    assert matcher.match(args, kwargs) == {"L": point}
    assert instantiate(card.args, card.kwargs, ranges, {"L": point}) == (args, kwargs)
    outside = data.draw(st.one_of(st.integers(-5, lo - 1), st.integers(hi + 1, hi + 50)))
    assume(outside >= 1)
    assert matcher.match(*cat_call(outside)) is None


def test_a_call_equal_in_the_solved_integer_but_not_elsewhere_does_not_match():
    card = cat_range()
    matcher = RangeMatcher(card.args, card.kwargs, Ranges.from_dict(card.ranges))
    args, kwargs = cat_call(100)
    assert matcher.match(args, kwargs) == {"L": 100}
    strided = [{"t": "list", "items": [kv(100, dim=64) | {"stride": [1, 1, 1, 1]}, kv(1)]}, -2]
    assert matcher.match(strided, {}) is None
    assert matcher.match([args[0], -1], {}) is None
    assert matcher.match([{"t": "list", "items": [kv(100), kv(1), kv(1)]}, -2], {}) is None
    assert solve(Ranges.from_dict(card.ranges), [], {}) is None


@settings(max_examples=80, deadline=None)
@given(a=st.integers(-4, 4).filter(bool), b=st.integers(-40, 40), lo=st.integers(-20, 20),
       width=st.integers(0, 60))
def test_valid_span_keeps_exactly_the_points_with_valid_layouts(a, b, lo, width):
    laws = [Law(("args", 0, "shape", 0), "L", a, b), Law(("args", 0, "stride", 0), "L", 1, 3)]
    span = valid_span(laws, "L", lo, lo + width)
    good = [x for x in range(lo, lo + width + 1) if a * x + b >= 1 and x + 3 >= 0]
    if not good:
        assert span is None
    else:
        assert span == (good[0], good[-1]) and len(good) == good[-1] - good[0] + 1


def test_verification_points_are_the_ends_and_distinct_interior_points():
    ranges = Ranges.from_dict(cat_range(1, 4096, 2048).ranges)
    points = verification_points(ranges, 3, random.Random(5))
    assert points[:2] == [{"L": 1}, {"L": 4096}]
    assert len(points) == 5 and len({p["L"] for p in points}) == 5
    assert all(1 <= p["L"] <= 4096 for p in points)
    narrow = Ranges.from_dict(cat_range(7, 8, 7).ranges)
    assert verification_points(narrow, 3, random.Random(5)) == [{"L": 7}, {"L": 8}]
    single = Ranges.from_dict(cat_range(7, 7, 7).ranges)
    assert verification_points(single, 3, random.Random(5)) == [{"L": 7}]


def test_malformed_ranges_are_refused_naming_the_fault():
    law = {"path": ["args", 0], "symbol": "L", "a": 1, "b": 0}
    with pytest.raises(RangeError, match="lo <= at <= hi"):
        Ranges.from_dict({"symbols": [{"name": "L", "lo": 5, "hi": 9, "at": 2}], "laws": [law]})
    with pytest.raises(RangeError, match="not a symbol"):
        Ranges.from_dict({"symbols": [{"name": "L", "lo": 1, "hi": 9, "at": 2}],
                          "laws": [law | {"symbol": "B"}]})
    with pytest.raises(RangeError, match="governs no integer"):
        Ranges.from_dict({"symbols": [{"name": "L", "lo": 1, "hi": 9, "at": 2}], "laws": []})
    with pytest.raises(RangeError, match="lo must be a whole number"):
        Ranges.from_dict({"symbols": [{"name": "L", "lo": 1.5, "hi": 9, "at": 2}],
                          "laws": [law]})
    with pytest.raises(RangeError, match="laws is missing"):
        Ranges.from_dict({"symbols": []})
    card = cat_range()
    with pytest.raises(RangeError, match="outside"):
        card_at(card, {"L": 5000})
    with pytest.raises(RangeError, match="own arguments"):
        range_card(OpCard("aten.cat.default", *cat_call(7)), Ranges.from_dict(card.ranges))


def test_two_symbols_match_together():
    def call(batch: int, length: int) -> tuple[list, dict]:
        return [kv(length, heads=batch)], {}

    ranges = Ranges((Symbol("B", 1, 8, 2), Symbol("L", 1, 512, 100)),
                    (Law(("args", 0, "shape", 1), "B", 1, 0),
                     Law(("args", 0, "shape", 2), "L", 1, 0)))
    base = call(2, 100)
    assert instantiate(*base, ranges, {"B": 3, "L": 7})[0][0]["shape"] == [1, 3, 7, 64]
    # these laws leave the strides fixed: a contiguous call at another point does not match
    matcher = RangeMatcher(*base, ranges)
    assert matcher.match(*call(3, 7)) is None
    flat = [{"t": "tensor", "shape": [1, 3, 7, 64], "stride": [12800, 6400, 64, 1],
             "dtype": "bfloat16", "offset": 0}]
    assert matcher.match(flat, {}) == {"B": 3, "L": 7}
    points = verification_points(ranges, 4, random.Random(1))
    assert points[0] == {"B": 1, "L": 1} and points[1] == {"B": 8, "L": 512}
