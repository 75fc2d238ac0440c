"""Focus narrows a search and never ends it, as the TUI drives it: f on an op, the op converges
under the test doubles (the real engine, a paced evaluator), and the search goes on with the
other ops, the focus cleared and said so, at 80x24 and 120x40."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from kforge.core.settings import SearchSettings
from kforge.engine.engine import Engine
from kforge.store import CardStatus, SessionStatus, Store
from kforge_tui.format import focus_of
from kforge_tui.screens.session import SessionScreen
from kforge_tui.widgets.tables import OpTable
from tests.doubles import FakeProposer
from tests.tui.conftest import make_app, until
from tests.tui.test_control import live_session
from tests.tui.test_defects import notices
from tests.tui.test_render_budget import PacedEvaluator

ITERATIONS = 4  # per op: the focused op's own budget ends its search


@asynccontextmanager
async def paced_engine(db: Path, sid: int):
    store = await Store.open(db)
    evaluator = PacedEvaluator()
    settings = SearchSettings.from_dict({"iterations_per_op": ITERATIONS, "parallel": 1,
                                         "patience": 1000, "max_op_factor": 1.0})
    engine = asyncio.create_task(Engine(store, sid, FakeProposer(), evaluator, settings).run())
    try:
        yield store, evaluator, engine
    finally:
        engine.cancel()
        await asyncio.gather(engine, return_exceptions=True)
        await store.close()


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_a_focused_op_that_converges_hands_the_search_back(tmp_path: Path, size):
    db = tmp_path / "k.db"
    sid = await live_session(db)
    async with paced_engine(db, sid) as (store, evaluator, engine):
        app = make_app(db, session=sid)
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                        and app.screen.state is not None and app.screen.state.alive,
                        what="the live session")
            screen = app.screen
            table = screen.query_one(OpTable)
            relu = next(row for row in table.visible_cards() if row.card.short_op == "relu")
            rows = [row.id for row in table.visible_cards()]
            await pilot.press("1", "g", *["j"] * rows.index(relu.id), "f")
            await until(pilot, lambda: focus_of(screen.state.session) == relu.id,
                        what="the focus on relu")
            await until(pilot, lambda: notices(app, "focus on relu 64"), what="its notice")
            # relu's own budget, evaluation by evaluation (one of another op may have been
            # under way when the focus came)
            for _ in range(ITERATIONS + 1):
                if screen.card(relu.id).status == CardStatus.DONE:
                    break
                target = evaluator.let_through + 1
                evaluator.go.release()
                await until(pilot, lambda: evaluator.let_through >= target and (
                    evaluator.waiting or screen.card(relu.id).status == CardStatus.DONE),
                    what="the next evaluation")
            await until(pilot, lambda: screen.card(relu.id).status == CardStatus.DONE,
                        what="relu done")
            relu_nodes = {n.id for n in await store.list_nodes(sid) if n.card_id == relu.id}
            await until(pilot, lambda: focus_of(screen.state.session) is None,
                        what="the focus to be cleared")
            await until(pilot, lambda: notices(app, "relu 64 is done: the search goes on with "
                                                    "every op"), what="the word why")
            for _ in range(3):  # the search goes on, with the other ops
                evaluator.go.release()
            await until(pilot, lambda: evaluator.let_through >= len(relu_nodes) + 2,
                        what="the other ops' evaluations")
            others = [n for n in await store.list_nodes(sid)
                      if n.card_id != relu.id and n.id > max(relu_nodes)]
            assert others and not engine.done()
            assert screen.state.session.status == SessionStatus.RUNNING
            await until(pilot, lambda: "◎" not in "".join(
                cell.plain for key in table.rows for cell in table.get_row(key)),
                what="the focus mark to go")
