"""A whole-model measurement (``kforge e2e``) kept in the event log: written, read back as the
session's latest, and its headline."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from kforge.core.candidate import Headline
from kforge.errors import KforgeError
from kforge.store import Store
from kforge.store.events import EventFormatError, ModelMeasured, from_row, to_row
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


# The sessions the audit saw: kforge gains most over CUDA graphs, but plain compile is faster
# than every kforge mode; and eager+kforge "gains" 1.22x with no kernel run, its timings spread
# 6.5-12.4 ms.
BEHIND_COMPILE = ModelMeasured(
    speedups={"eager": 1.0, "graphs": 1.2, "graphs+kforge": 1.7, "compile": 2.0,
              "compile+kforge": 1.9},
    gains={"graphs+kforge": 1.41, "compile+kforge": 0.95}, projected=1.5,
    times_us={"eager": 10000.0, "graphs": 8333.0, "graphs+kforge": 5882.0, "compile": 5000.0,
              "compile+kforge": 5263.0},
    kernels={"graphs+kforge": 12, "compile+kforge": 4},
    spreads={"eager": 1.02, "graphs": 1.01, "graphs+kforge": 1.02, "compile": 1.01,
             "compile+kforge": 1.02})
NO_KERNELS = ModelMeasured(
    speedups={"eager": 1.0, "eager+kforge": 1.22}, gains={"eager+kforge": 1.22}, projected=1.3,
    times_us={"eager": 9000.0, "eager+kforge": 7377.0}, kernels={"eager+kforge": 0},
    spreads={"eager": 1.9, "eager+kforge": 1.9})


def test_the_headline_is_kforges_best_mode_against_the_best_mode_without_it():
    assert BEHIND_COMPILE.headline() == Headline("loss", "compile+kforge", "compile",
                                                 5000.0 / 5263.0, 1.02)
    ahead = replace(BEHIND_COMPILE, times_us={**BEHIND_COMPILE.times_us, "compile+kforge": 4000.0})
    assert ahead.headline() == Headline("gain", "compile+kforge", "compile", 1.25, 1.02)


def test_a_mode_where_no_kforge_kernel_ran_is_never_the_headline():
    assert NO_KERNELS.headline() == Headline("no kernels", None, "eager")
    one_ran = replace(BEHIND_COMPILE, kernels={"graphs+kforge": 12, "compile+kforge": 0})
    headline = one_ran.headline()
    assert headline is not None and headline.mode == "graphs+kforge"
    assert headline.baseline == "compile" and headline.verdict == "loss"


def test_a_difference_inside_the_timings_spread_is_noise():
    noisy = replace(NO_KERNELS, kernels={"eager+kforge": 3})
    assert noisy.headline() == Headline("noise", "eager+kforge", "eager", 9000.0 / 7377.0, 1.9)


def test_a_measurement_stored_before_times_kernels_and_spreads_compares_speedups():
    old = ModelMeasured({"eager": 1.0, "eager+kforge": 1.25, "graphs": 2.0}, {}, 1.3)
    assert old.headline() == Headline("loss", "eager+kforge", "graphs", 1.25 / 2.0, None)
    assert ModelMeasured({"eager": 1.0}, {}, 1.3).headline() is None
    assert ModelMeasured({"eager+kforge": 1.0}, {}, 1.3).headline() is None


def test_the_new_figures_are_stored_and_old_rows_still_load():
    kind, data = to_row(BEHIND_COMPILE)
    assert from_row(kind, json.loads(json.dumps(data))) == BEHIND_COMPILE
    assert from_row("model_measured", {"speedups": {"eager": 1}, "gains": {},
                                       "projected": 1}) == ModelMeasured({"eager": 1.0}, {}, 1.0)
    with pytest.raises(EventFormatError, match="'model_measured' holds"):
        from_row("model_measured", {"speedups": {}, "gains": {}, "projected": 1,
                                    "kernels": {"eager+kforge": "many"}})
