"""The session bar's whole-model speedup: projected from the op cards, and once `kforge e2e` has
measured the model, the measured gain beside it, fitted to 80 and to 120 columns."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from kforge.store import Store
from kforge.store.events import ModelMeasured
from kforge_tui.header import Part, model_parts, session_header
from kforge_tui.screens.session import SessionScreen
from tests.tui.conftest import make_app, until
from tests.tui.fixtures import build
from tests.tui.test_defects import screen_lines

# kforge's best mode (graphs+kforge, 2.10x over eager) against the best mode without it
# (graphs, 2.00x): 1.05x, beyond both modes' 2% spread.
MEASURED = ModelMeasured(speedups={"eager": 1.0, "eager+kforge": 1.05, "graphs": 2.0,
                                   "graphs+kforge": 2.1},
                         gains={"eager+kforge": 1.05, "graphs+kforge": 1.05}, projected=1.44,
                         kernels={"eager+kforge": 3, "graphs+kforge": 3},
                         spreads={"eager": 1.02, "eager+kforge": 1.02, "graphs": 1.02,
                                  "graphs+kforge": 1.02})
# The fixture session's cards project 1.31x: softmax (60% of the time) at 1.60x, add (30%) at
# 1.05x.
AT_80 = "#1 toy · stopped · 7/12 · e2e 1.05x vs graphs · ≤1.31x vs eager proj · $0.08"
AT_120 = ("#1 toy · stopped — r to resume · 7/12 it · e2e 1.05x vs graphs · ≤1.31x over eager "
          "projected · $0.08 · 0m · Fake GPU")


def test_the_headline_names_its_source_and_what_it_is_relative_to():
    assert model_parts(1.44, MEASURED) == [
        Part("e2e graphs+kforge 1.05x over graphs (best without kforge)",
             "e2e 1.05x vs graphs", keep=2),
        Part("≤1.44x over eager projected", "≤1.44x vs eager proj", keep=1)]


@pytest.mark.parametrize(("measured", "full", "short"), [
    (replace(MEASURED, kernels={"eager+kforge": 0, "graphs+kforge": 0}),
     "e2e: no kforge kernel ran in any mode", "e2e: no kernels"),
    (replace(MEASURED, spreads={"graphs": 1.3}),
     "e2e graphs+kforge ≈ graphs (best without kforge): 1.05x, within noise, p90/p10 1.30",
     "e2e ≈1.05x vs graphs (noise)"),
    (replace(MEASURED, speedups={**MEASURED.speedups, "compile": 2.5}),
     "e2e graphs+kforge 0.84x vs compile: best without kforge is faster",
     "e2e 0.84x vs compile"),
    (replace(MEASURED, kernels={}, spreads={}),  # stored before kforge e2e counted them
     "e2e graphs+kforge 1.05x vs graphs (best without kforge), unchecked: kernels run and noise "
     "not recorded, run kforge e2e again", "e2e 1.05x vs graphs (unchecked)"),
], ids=["no-kernels", "noise", "slower", "unchecked"])
def test_no_kernels_noise_and_a_faster_mode_without_kforge_are_said(measured, full, short):
    assert model_parts(None, measured) == [Part(full, short, keep=2)]


def test_without_a_measurement_the_projection_stands_alone():
    alone = [Part("model ≤1.44x over eager projected", "model ≤1.44x vs eager proj", keep=2)]
    assert model_parts(1.44, None) == alone
    assert model_parts(1.44, ModelMeasured({"eager": 1.0}, {}, 1.44)) == alone
    assert model_parts(None, None) == []


@pytest.fixture
def stopped_session(tmp_path: Path):
    async def read():
        db = tmp_path / "k.db"
        await build(db)
        async with await Store.open(db, create=False) as store:
            return await store.get_session(1), await store.list_cards(1)

    return asyncio.run(read())


def test_the_bar_shows_both_in_full_where_they_fit_and_short_at_80_columns(stopped_session):
    session, cards = stopped_session
    wide = session_header(session, cards, False, "GPU: Fake GPU", 200, measured=MEASURED)
    assert ("· e2e graphs+kforge 1.05x over graphs (best without kforge) · ≤1.31x over eager "
            "projected ·") in wide
    assert session_header(session, cards, False, "GPU: Fake GPU", 78,
                          measured=MEASURED) == AT_80
    assert "model ≤1.31x" in session_header(session, cards, False, "GPU: Fake GPU", 78)


def test_a_narrow_bar_leaves_parts_out_whole_never_cutting_a_figure(stopped_session):
    session, cards = stopped_session
    for width in range(30, 80):
        bar = session_header(session, cards, False, "GPU: Fake GPU", width, measured=MEASURED)
        assert len(bar) <= width and "…" not in bar
        assert all(part in AT_80.split(" · ") for part in bar.split(" · "))


async def measure(db: Path, measured: ModelMeasured = MEASURED) -> None:
    async with await Store.open(db) as store:
        await store.add_model_measurement(1, measured)


@pytest.mark.parametrize(("size", "bar"), [((80, 24), AT_80), ((120, 40), AT_120)],
                         ids=["80x24", "120x40"])
async def test_the_session_bar_shows_the_stored_measurement(fixture_db, size, bar):
    db, _ = fixture_db
    await measure(db)
    app = make_app(db, session=1)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                    and app.screen.state is not None, what="the session")
        await pilot.pause(0.1)
        assert screen_lines(app)[0].strip() == bar


async def test_a_measurement_made_while_watching_reaches_the_bar(fixture_db):
    db, _ = fixture_db
    app = make_app(db, session=1)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                    and app.screen.state is not None, what="the session")
        assert "model ≤1.31x over eager projected" in screen_lines(app)[0]
        await measure(db)
        await until(pilot, lambda: "e2e 1.05x vs graphs" in screen_lines(app)[0],
                    what="the measurement in the bar")
        await measure(db, replace(MEASURED, kernels={"eager+kforge": 0, "graphs+kforge": 0}))
        await until(pilot, lambda: "e2e: no kernels" in screen_lines(app)[0],
                    what="the newer measurement in the bar")
