"""The session bar's whole-model speedup: projected from the op cards, and once `kforge e2e` has
measured the model, the measured gain beside it, fitted to 80 and to 120 columns."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kforge.store import Store
from kforge.store.events import ModelMeasured
from kforge_tui.header import Part, model_parts, session_header
from kforge_tui.screens.session import SessionScreen
from tests.tui.conftest import make_app, until
from tests.tui.fixtures import build
from tests.tui.test_defects import screen_lines

MEASURED = ModelMeasured(speedups={"eager": 1.0, "eager+kforge": 1.05, "graphs": 2.0,
                                   "graphs+kforge": 2.1},
                         gains={"eager+kforge": 1.05, "graphs+kforge": 1.02}, projected=1.44)
# The fixture session's cards project 1.31x: softmax (60% of the time) at 1.60x, add (30%) at
# 1.05x.
AT_80 = "#1 toy · stopped · 7/12 · model 1.05x (eager+kforge) · ≤1.31x · $0.08 · 0m · …"
AT_120 = ("#1 toy · stopped — r to resume · 7/12 it · model 1.05x measured (eager+kforge) · "
          "≤1.31x · $0.08/$2.00 · 0m · Fake GPU")


def test_the_measured_gain_names_its_mode_beside_the_projection():
    assert model_parts(1.44, MEASURED) == [
        Part("model 1.05x measured (eager+kforge)", "model 1.05x (eager+kforge)", keep=2),
        Part("≤1.44x projected", "≤1.44x", keep=1)]
    assert model_parts(None, MEASURED) == [
        Part("model 1.05x measured (eager+kforge)", "model 1.05x (eager+kforge)", keep=2)]


def test_without_a_measured_gain_the_projection_stands_alone():
    alone = [Part("model ≤1.44x projected", "model ≤1.44x", keep=2)]
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
    assert "· model 1.05x measured (eager+kforge) · ≤1.31x projected ·" in wide
    assert session_header(session, cards, False, "GPU: Fake GPU", 78,
                          measured=MEASURED) == AT_80
    assert "model ≤1.31x" in session_header(session, cards, False, "GPU: Fake GPU", 78)


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
        assert "model ≤1.31x projected" in screen_lines(app)[0]
        await measure(db)
        await until(pilot, lambda: "measured (eager+kforge)" in screen_lines(app)[0],
                    what="the measurement in the bar")
        await measure(db, ModelMeasured({}, {"graphs+kforge": 1.2}, 1.44))
        await until(pilot, lambda: "model 1.20x measured (graphs+kforge)" in screen_lines(app)[0],
                    what="the newer measurement in the bar")
