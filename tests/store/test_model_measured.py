"""A whole-model measurement (``kforge e2e``) kept in the event log: written, read back as the
session's latest, and its headline."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from kforge.errors import KforgeError
from kforge.store import Store
from kforge.store.events import EventFormatError, ModelMeasured, from_row
from tests.doubles import sample_cards

FIRST = ModelMeasured(speedups={"eager": 1.0, "eager+kforge": 1.1}, gains={"eager+kforge": 1.1},
                      projected=1.4)
SECOND = ModelMeasured(speedups={"eager": 1.0, "eager+kforge": 1.05, "graphs": 2.0,
                                 "graphs+kforge": 2.3},
                       gains={"eager+kforge": 1.05, "graphs+kforge": 1.15}, projected=1.44)


async def test_the_latest_measurement_of_each_session_reads_back(tmp_path: Path):
    path = tmp_path / "k.db"
    async with await Store.open(path) as store:
        one = await store.create_profiled_session("toy", {}, {}, sample_cards())
        two = await store.create_profiled_session("other", {}, {}, sample_cards())
        assert await store.latest_model_measurement(one) is None
        await store.add_model_measurement(one, FIRST)
        await store.log(one, "a later log line")
        await store.add_model_measurement(one, SECOND)
        await store.add_model_measurement(two, FIRST)
    async with await Store.open_read_only(path) as store:
        latest = await store.latest_model_measurement(one)
        other = await store.latest_model_measurement(two)
    assert latest is not None and latest.record == SECOND and latest.session_id == one
    assert latest.at > 0
    assert other is not None and other.record == FIRST


async def test_a_measurement_of_no_session_is_refused_and_writes_nothing(tmp_path: Path):
    async with await Store.open(tmp_path / "k.db") as store:
        before = await store.last_seq()
        with pytest.raises(KforgeError, match="no session 7"):
            await store.add_model_measurement(7, FIRST)
        assert await store.last_seq() == before


async def test_a_measurement_stored_as_json_integers_reads_as_figures(tmp_path: Path):
    path = tmp_path / "k.db"
    async with await Store.open(path) as store:
        sid = await store.create_profiled_session("toy", {}, {}, sample_cards())
    raw = sqlite3.connect(path)
    with raw:
        raw.execute("INSERT INTO events (session_id, kind, data, at) VALUES (?, ?, ?, ?)",
                    (sid, "model_measured", json.dumps({"speedups": {"eager": 1},
                                                        "gains": {}, "projected": 2}), 1.0))
    raw.close()
    async with await Store.open(path) as store:
        latest = await store.latest_model_measurement(sid)
    assert latest is not None
    assert latest.record == ModelMeasured({"eager": 1.0}, {}, 2.0) and latest.at == 1.0


def test_a_measurement_with_a_figure_that_is_no_number_is_a_clear_error():
    with pytest.raises(EventFormatError, match="'model_measured' holds"):
        from_row("model_measured", {"speedups": {"eager": "fast"}, "gains": {}, "projected": 1})
    with pytest.raises(EventFormatError, match="lacks its payload key 'gains'"):
        from_row("model_measured", {"speedups": {}, "projected": 1})


def test_the_headline_is_the_mode_where_kforge_gains_most():
    assert SECOND.best_gain == ("graphs+kforge", 1.15)
    assert FIRST.best_gain == ("eager+kforge", 1.1)
    assert ModelMeasured({"eager": 1.0}, {}, 1.2).best_gain is None
