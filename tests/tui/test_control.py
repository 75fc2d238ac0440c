"""Pilot tests with the store as the channel: pruning, pause and resume, and attaching to a
running engine double that writes to the store while the TUI watches."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kforge.core.settings import SearchSettings, Settings
from kforge.engine.engine import Engine
from kforge.store import SessionStatus, Store
from kforge_tui.screens.dialogs import Confirm
from kforge_tui.screens.session import SessionScreen
from kforge_tui.widgets.search_tree import SearchTree
from tests.doubles import FakeEvaluator, FakeProposer, sample_cards
from tests.tui.conftest import make_app, until
from tests.tui.test_navigation import open_first_session


async def pruned(db: Path, node_id: int) -> bool:
    async with await Store.open(db, create=False) as store:
        return (await store.get_nodes([node_id]))[0].pruned


async def test_prune_and_unprune_write_the_store_when_no_engine_runs(fixture_db):
    db, ids = fixture_db
    app = make_app(db)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_first_session(pilot)
        tree = screen.query_one(SearchTree)
        await pilot.press("2", "g", "j")
        assert tree.selected_id == ids["a"]
        await pilot.press("x")
        await until(pilot, lambda: screen.model.nodes[ids["a"]].row.pruned,
                    what="the prune to come back through the event log")
        assert screen.model.pruned(ids["a1"])  # the whole subtree is out of the search
        assert "✂" in tree.render_label(tree.cursor_node, tree.rich_style, tree.rich_style).plain
        await pilot.press("u")
        await until(pilot, lambda: not screen.model.nodes[ids["a"]].row.pruned)
    assert not await pruned(db, ids["a"])


async def test_pause_without_an_engine_says_so_and_offers_to_resume(fixture_db):
    db, _ = fixture_db
    app = make_app(db)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_first_session(pilot)
        await pilot.press("p")
        await until(pilot, lambda: isinstance(app.screen, Confirm), what="the resume offer")
        assert "No search is running for session 1" in app.screen.question
        await pilot.press("n")
        assert isinstance(app.screen, SessionScreen)


async def test_remapped_keys_work_and_bad_entries_are_reported(fixture_db):
    db, ids = fixture_db
    config = Settings.from_dict({"keys": {"prune": "z", "no_such_thing": "y",
                                          "diff": "ctrl+enter"}})
    app = make_app(db, config=config)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_first_session(pilot)
        messages = [n.message for n in app._notifications]
        assert any("no_such_thing: no such binding" in m for m in messages)
        assert any("cannot send ctrl+enter" in m for m in messages)
        await pilot.press("2", "g", "j", "x")  # x is no longer prune
        await pilot.pause(0.2)
        assert not screen.model.nodes[ids["a"]].row.pruned
        await pilot.press("z")
        await until(pilot, lambda: screen.model.nodes[ids["a"]].row.pruned)


async def live_session(db: Path) -> int:
    async with await Store.open(db) as store:
        settings = {"search": {"iterations_per_op": 30, "parallel": 2, "patience": 1000},
                    "fake": {}}
        return await store.create_profiled_session("live", settings, {"name": "Fake GPU",
                                                                      "arch": "sm_90"},
                                                   sample_cards())


async def start_engine(db: Path, sid: int, delay_s: float) -> tuple[Store, asyncio.Task]:
    """The engine double: the real engine with fake proposer and evaluator, on its own
    connection, as a separate process would be."""
    store = await Store.open(db)
    settings = SearchSettings.from_dict({"iterations_per_op": 30, "parallel": 2,
                                         "patience": 1000})
    engine = Engine(store, sid, FakeProposer(), FakeEvaluator(delay_s=delay_s), settings)
    return store, asyncio.create_task(engine.run())


async def test_attach_follows_a_live_search_pauses_it_and_catches_up_after_a_detach(tmp_path):
    db = tmp_path / "k.db"
    sid = await live_session(db)
    engine_store, engine = await start_engine(db, sid, delay_s=0.02)
    try:
        app = make_app(db, session=sid)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                        and app.screen.state is not None)
            screen = app.screen
            await until(pilot, lambda: len(screen.model.nodes) >= 5, what="nodes to arrive")
            await until(pilot, lambda: screen.state.alive, what="the engine to look alive")
            tree = screen.query_one(SearchTree)
            await until(pilot, lambda: len(tree.root.children) >= 2, what="live tree lines")
            await pilot.press("p")
            await until(pilot, lambda: screen.state.session.status == SessionStatus.PAUSED,
                        what="the engine to pause")
            paused_at = len(screen.model.nodes)
            await pilot.pause(0.5)
            in_store = len(await engine_store.list_nodes(sid))
            assert in_store <= paused_at + 2  # in-flight work may land; nothing new starts
            await pilot.press("p")
            await until(pilot, lambda: screen.state.session.status == SessionStatus.RUNNING)
            await pilot.press("2", "g", "j", "x")
            node_id = tree.selected_id
            await until(pilot, lambda: screen.model.nodes[node_id].row.pruned,
                        what="the engine to prune")
        # The TUI is gone; the search goes on. A new TUI catches up from the store.
        await until_store(engine_store, sid, lambda n: n >= in_store + 5)
        app = make_app(db, session=sid)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                        and app.screen.state is not None)
            screen = app.screen
            stored = {n.id for n in await engine_store.list_nodes(sid)}
            await until(pilot, lambda: stored <= set(screen.model.nodes),
                        what="the new TUI to hold every stored node")
            assert screen.model.nodes[node_id].row.pruned
    finally:
        engine.cancel()
        await asyncio.gather(engine, return_exceptions=True)
        await engine_store.close()


async def until_store(store: Store, sid: int, enough, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if enough(len(await store.list_nodes(sid))):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the engine made no progress after the TUI closed")
