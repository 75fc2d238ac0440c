"""What the TUI sends to its terminal while nobody presses a key: nothing while nothing on screen
changes, changed rows and lines alone when something does, no reads for a screen out of sight,
and a live search within its budget of bytes a second, at a pace the test sets so that the
rate does not depend on the machine (bench/bench_tui_output.py measures the same in tmux)."""

from __future__ import annotations

import asyncio
import io
import time
from collections import Counter
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from rich.console import Console
from textual.geometry import Region
from textual.screen import Screen
from textual.widget import Widget

from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus
from kforge.core.settings import SearchSettings
from kforge.engine.engine import Engine
from kforge.store import Store
from kforge_tui.app import KforgeApp
from kforge_tui.screens import sessions
from kforge_tui.screens.backdrop import shown
from kforge_tui.screens.session import SessionScreen
from kforge_tui.screens.sessions import SessionsScreen
from kforge_tui.widgets.search_tree import SearchTree
from kforge_tui.widgets.status_bar import StatusBar
from kforge_tui.widgets.tables import OpTable, VimTable
from tests.doubles import FakeEvaluator, FakeProposer
from tests.tui.conftest import make_app, until
from tests.tui.fixtures import timing
from tests.tui.test_control import live_session

LIVE_BUDGET_BYTES_S = 10_000  # a live search at 120x40
IDLE_BUDGET_BYTES_S = 1_000  # nothing changing


@dataclass
class Output:
    """Bytes the app would write to a 256-colour terminal, and the widgets it repainted."""

    written: int = 0
    repaints: list[tuple[Widget, tuple[Region, ...], bool]] = field(default_factory=list)

    def clear(self) -> None:
        self.written = 0
        self.repaints.clear()

    def of(self, kind: type) -> list[tuple[tuple[Region, ...], bool]]:
        return [(regions, layout) for widget, regions, layout in self.repaints
                if isinstance(widget, kind)]


def watch_output(app: KforgeApp, monkeypatch: pytest.MonkeyPatch) -> Output:
    """Count what the app hands its terminal (a headless app writes nothing, so each screen
    update is rendered here as the terminal driver would), and every repaint asked of a widget
    (past VimTable's own filter)."""
    output = Output()
    terminal = Console(color_system="256", force_terminal=True, file=io.StringIO())
    display = app._display

    def displayed(screen, update) -> None:
        if update is not None:
            output.written += len(update.render_segments(terminal).encode())
        display(screen, update)

    monkeypatch.setattr(app, "_display", displayed)
    refresh = Widget.refresh

    def repaint(widget, *regions, repaint=True, layout=False, recompose=False):
        if widget.is_attached and widget.screen is app.screen:
            output.repaints.append((widget, regions, layout))
        return refresh(widget, *regions, repaint=repaint, layout=layout, recompose=recompose)

    monkeypatch.setattr(Widget, "refresh", repaint)
    return output


def count_calls(store: Store, *names: str) -> Counter:
    """Count calls of the store's reads, by name."""
    calls: Counter = Counter()
    for name in names:
        method = getattr(store, name)

        async def counted(*args, _name=name, _method=method, **kwargs):
            calls[_name] += 1
            return await _method(*args, **kwargs)

        setattr(store, name, counted)
    return calls


async def session_open(pilot) -> SessionScreen:
    app = pilot.app
    await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                and app.screen.state is not None
                and app.screen.query_one(SearchTree).card is not None, what="the session")
    await settled(pilot)
    return app.screen


async def settled(pilot, quiet_s: float = 0.3, limit_s: float = 20.0) -> None:
    """Wait until the app has sent nothing to its terminal for ``quiet_s``: the first paint and
    what it set off (the tree's cursor, its repaint timer) are done, however loaded the machine
    (a cursor that settles on the root line late repaints every line under it)."""
    app = pilot.app
    display = app._display
    updates = [0]

    def counted(screen, update) -> None:
        if update is not None:
            updates[0] += 1
        display(screen, update)

    app._display = counted
    try:
        deadline = time.monotonic() + limit_s
        while True:
            before = updates[0]
            await pilot.pause(quiet_s)
            if updates[0] == before:
                return
            assert time.monotonic() < deadline, f"the screen kept changing for {limit_s:.0f} s"
    finally:
        del app._display  # the app's own method again


async def test_an_unchanged_session_sends_nothing_while_it_polls(fixture_db, monkeypatch):
    db, _ = fixture_db
    monkeypatch.setattr(sessions, "RELOAD_S", 0.2)  # the list under it would reload often
    app = make_app(db, session=1)
    async with app.run_test(size=(80, 24)) as pilot:
        await session_open(pilot)
        calls = count_calls(app.store, "events_since")
        output = watch_output(app, monkeypatch)
        await pilot.pause(1.0)
        assert calls["events_since"] >= 5  # it polled all along (every 0.05 s)
        assert output.written == 0
        assert output.repaints == []


async def test_an_unchanged_session_list_sends_nothing_when_it_reloads(fixture_db, monkeypatch):
    db, _ = fixture_db
    monkeypatch.setattr(sessions, "RELOAD_S", 0.2)
    app = make_app(db)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                    and app.screen.query_one(VimTable).row_count == 2)
        await pilot.pause(0.3)
        calls = count_calls(app.store, "list_sessions")
        output = watch_output(app, monkeypatch)
        await pilot.pause(1.0)
        assert calls["list_sessions"] >= 2  # read again, found the same
        assert output.written == 0
        assert output.repaints == []


async def test_a_screen_out_of_sight_reads_nothing(fixture_db):
    db, _ = fixture_db
    app = make_app(db)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                    and app.screen.query_one(VimTable).row_count == 2)
        calls = count_calls(app.store, "last_seq", "list_sessions", "events_since")
        await pilot.press("enter")
        session = await session_open(pilot)
        calls.clear()
        await pilot.pause(0.5)
        assert calls["events_since"] >= 3  # the session shown polls
        assert calls["last_seq"] == calls["list_sessions"] == 0  # the list under it does not

        app.push_screen(Screen())  # a full screen over the session
        await pilot.pause(0.2)
        calls.clear()
        await pilot.pause(0.5)
        assert sum(calls.values()) == 0

        app.pop_screen()
        await until(pilot, lambda: calls["events_since"] > 0, what="the session to poll again")
        await pilot.press("escape")
        assert app.screen is not session
        await until(pilot, lambda: calls["last_seq"] > 0, what="the list to poll again")


async def finish_node(db: Path, session_id: int, card_id: int, parent: int, speed: float) -> int:
    """Do what an engine does for one iteration: a node, its kernel, its result, the card's best."""
    async with await Store.open(db) as store:
        node_id = await store.add_node(session_id, card_id, parent, "refine")
        await store.set_candidate(node_id, Candidate(f"// kernel {node_id}", "launch()"), [])
        await store.finish_node(node_id, EvalOutcome(EvalStatus.OK, timing=timing(100 / speed),
                                                     eager=timing(100.0), speedup=speed), 0.1,
                                confirmed=True)
        await store.update_card(card_id, best_node=node_id, best_speedup=speed, spent=7)
    return node_id


async def test_a_finished_node_repaints_its_op_row_and_tree_lines_alone(fixture_db, monkeypatch):
    db, ids = fixture_db
    app = make_app(db, session=1)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await session_open(pilot)
        table = screen.query_one(OpTable)
        keys = [row.key for row in table.ordered_rows]
        cleared = Counter()
        monkeypatch.setattr(table, "clear", lambda *a, **k: cleared.update(["clear"]))
        output = watch_output(app, monkeypatch)

        node_id = await finish_node(db, ids["session"], ids["card"], ids["a1"], 2.5)
        await until(pilot, lambda: node_id in screen.model.nodes
                    and "2.50x" in str(table.get_row(str(ids["card"]))), what="the new best")
        await pilot.pause(0.3)  # the tree's repaint timer

        assert cleared == Counter() and [row.key for row in table.ordered_rows] == keys
        softmax_row = table.get_row_index(str(ids["card"]))
        table_repaints = output.of(OpTable)
        assert table_repaints and all(regions and not layout for regions, layout in table_repaints)
        rows = {region.y + int(table.scroll_offset.y) - table.header_height
                for regions, _ in table_repaints for region in regions}
        assert rows == {softmax_row}  # the other ops' rows stay as they were drawn
        # The tree: the new line (its shape changed), then, line by line, the lines whose
        # figures changed: the new node's, its ancestors', and the op's (its count of nodes).
        tree = screen.query_one(SearchTree)
        changed = set(screen.model.ancestors(node_id))
        allowed = {y for y in range(tree.last_line + 1)
                   if (line := tree.get_node_at_line(y)) is not None
                   and (line.data is None or line.data.id in changed)}
        tree_lines = [regions for regions, layout in output.of(SearchTree) if not layout]
        assert tree_lines and all(region.height == 1 for regions in tree_lines
                                  for region in regions)
        drawn = {region.y + int(tree.scroll_offset.y) for regions in tree_lines
                 for region in regions}
        assert drawn <= allowed
        assert 1 <= len(output.of(StatusBar)) <= 2  # the iteration count changed


# The pace of a live search: the app looks every POLL_S and finds NODES_PER_POLL evaluations
# done (two in flight, 0.3 s each, as bench/bench_tui_output.py runs it).
POLL_S = 0.5
PARALLEL = 2
NODES_PER_POLL = 3
POLLS = 6


class PacedEvaluator(FakeEvaluator):
    """The evaluator double, each evaluation waiting for a go from the test: the test, not the
    machine's speed, sets how much the search does between two looks of the screen."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Semaphore(0)
        self.waiting = 0
        self.let_through = 0

    async def evaluate(self, card, candidate):
        self.waiting += 1
        try:
            await self.go.acquire()
        finally:
            self.waiting -= 1
        self.let_through += 1
        return await super().evaluate(card, candidate)


@asynccontextmanager
async def paced_search(tmp_path: Path):
    """A live session and the real engine over it, evaluating only when let."""
    db = tmp_path / "k.db"
    sid = await live_session(db)
    store = await Store.open(db)
    evaluator = PacedEvaluator()
    settings = SearchSettings.from_dict({"iterations_per_op": 30, "parallel": PARALLEL,
                                         "patience": 1000})
    engine = asyncio.create_task(Engine(store, sid, FakeProposer(), evaluator, settings).run())
    try:
        yield db, sid, store, evaluator
    finally:
        engine.cancel()
        await asyncio.gather(engine, return_exceptions=True)
        await store.close()


async def step(pilot, screen: SessionScreen, store: Store, sid: int,
               evaluator: PacedEvaluator) -> None:
    """Let NODES_PER_POLL evaluations finish, and wait until the screen has shown all the
    search wrote meanwhile."""
    # The evaluations let through are counted: a waiter woken by a release still counts as
    # waiting until it runs, so waiting alone would be true before any of them had run.
    target = evaluator.let_through + NODES_PER_POLL
    for _ in range(NODES_PER_POLL):
        evaluator.go.release()
    await until(pilot, lambda: evaluator.let_through >= target
                and evaluator.waiting == evaluator.capacity, what="the search to wait again")
    # Read the store afresh on each look: a node still on its way to an evaluation slot changes
    # status after any one read of it.
    deadline = time.monotonic() + 10.0
    while not all(node.id in screen.model.nodes
                  and screen.model.nodes[node.id].row.status == node.status
                  for node in await store.list_nodes(sid)):
        assert time.monotonic() < deadline, "timed out waiting for the screen to follow"
        await pilot.pause(0.02)
    await settled(pilot, quiet_s=0.15)


async def live_rate(pilot, monkeypatch, screen: SessionScreen, store: Store, sid: int,
                    evaluator: PacedEvaluator) -> float:
    """Bytes a second sent while the search goes on at its pace, POLLS looks of the screen."""
    output = watch_output(pilot.app, monkeypatch)
    seen = len(screen.model.nodes)
    for _ in range(POLLS):
        await step(pilot, screen, store, sid, evaluator)
    assert len(screen.model.nodes) >= seen + POLLS * NODES_PER_POLL  # the screen followed
    return output.written / (POLLS * POLL_S)


async def test_a_live_search_stays_within_its_output_budget(tmp_path, monkeypatch):
    async with paced_search(tmp_path) as (db, sid, store, evaluator):
        app = make_app(db, session=sid, poll_s=0.05)  # each step shows in one look
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await session_open(pilot)
            await step(pilot, screen, store, sid, evaluator)
            rate = await live_rate(pilot, monkeypatch, screen, store, sid, evaluator)
            assert rate < LIVE_BUDGET_BYTES_S, f"{rate:.0f} bytes/s"


DIALOGS = {"help": "question_mark", "palette": "ctrl+p"}


@pytest.mark.parametrize("dialog", list(DIALOGS))
async def test_a_dialog_over_a_live_search_stays_within_the_budget(tmp_path, monkeypatch, dialog):
    async with paced_search(tmp_path) as (db, sid, store, evaluator):
        app = make_app(db, session=sid, poll_s=0.05)
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await session_open(pilot)
            await step(pilot, screen, store, sid, evaluator)
            await pilot.press(DIALOGS[dialog])
            await until(pilot, lambda: app.screen is not screen, what="the dialog")
            await settled(pilot)
            rate = await live_rate(pilot, monkeypatch, screen, store, sid, evaluator)
            assert rate < LIVE_BUDGET_BYTES_S, f"{rate:.0f} bytes/s"


def test_a_change_under_a_dialog_is_sent_only_where_it_shows():
    box = Region(22, 0, 76, 40)  # help at 120x40
    assert shown([Region(1, 17, 46, 21)], [box]) == [Region(1, 17, 21, 21)]
    assert shown([Region(0, 0, 120, 1)], [box]) == [Region(0, 0, 22, 1), Region(98, 0, 22, 1)]
    assert shown([Region(30, 5, 10, 1)], [box]) == []
    assert shown([Region(0, 0, 10, 10)], [Region(5, 5, 10, 10)]) == [Region(0, 0, 10, 5),
                                                                   Region(0, 5, 5, 5)]
    assert shown([Region(0, 0, 10, 10)], []) == [Region(0, 0, 10, 10)]


@pytest.mark.parametrize("dialog", [*DIALOGS, "form"])
async def test_a_dialog_over_an_unchanged_screen_sends_nothing(fixture_db, monkeypatch, dialog):
    db, _ = fixture_db
    monkeypatch.setattr(sessions, "RELOAD_S", 0.2)  # the list under the form reloads often
    app = make_app(db, session=None if dialog == "form" else 1)
    async with app.run_test(size=(80, 24)) as pilot:
        if dialog == "form":
            await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                        and app.screen.query_one(VimTable).row_count == 2, what="the list")
        else:
            await session_open(pilot)
        below = app.screen
        await pilot.press(DIALOGS.get(dialog, "n"))
        await until(pilot, lambda: app.screen is not below, what="the dialog")
        await settled(pilot)
        output = watch_output(app, monkeypatch)
        await pilot.pause(1.0)
        assert output.written < IDLE_BUDGET_BYTES_S
