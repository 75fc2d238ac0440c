"""The first screen: every session in the database, with new, open, resume and delete."""

from __future__ import annotations

import asyncio
from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from kforge.errors import KforgeError
from kforge.store.commands import is_alive
from kforge.store.records import SessionSummary
from kforge_tui.format import session_cells
from kforge_tui.messages import ErrorRaised, SessionsLoaded
from kforge_tui.widgets.status_bar import StatusBar
from kforge_tui.widgets.tables import VimTable

RELOAD_S = 3.0  # re-read the list this often even without events (engine liveness, ages)
COLUMNS = ("id", "model", "gpu", "status", "ops", "nodes", "best", "cost", "last activity")


class SessionsScreen(Screen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("o", "open", "open", id="open"),
        Binding("n", "new_session", "new", id="new_session"),
        Binding("r", "resume", "resume", id="resume"),
        Binding("d", "delete", "delete", id="delete"),
    ]
    DEFAULT_CSS = """
    SessionsScreen #notice { padding: 0 1; color: $text-muted; height: auto; }
    SessionsScreen VimTable { height: 1fr; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.summaries: dict[int, SessionSummary] = {}
        self.alive: dict[int, bool] = {}

    def compose(self) -> ComposeResult:
        yield StatusBar(id="topbar")
        yield Static(id="notice")
        yield VimTable(id="sessions")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        table = self.query_one(VimTable)
        for name in COLUMNS:
            table.add_column(name, key=name)
        self.show_bar()
        self.app.gpu_known_signal.subscribe(self, lambda _gpu: self.show_bar())
        self.watch_sessions()

    def on_screen_resume(self) -> None:
        self.show_bar()
        self.query_one(VimTable).focus()

    def show_bar(self) -> None:
        app = self.app
        self.query_one(StatusBar).show(f"kforge · {app.db_path} · {app.gpu_label}")
        self.show_notice()

    def show_notice(self) -> None:
        app = self.app
        lines = []
        if not app.db_path.exists():
            lines.append(f"No database at {app.db_path} yet: press n to profile a model "
                         "(it creates one).")
        elif not self.summaries:
            lines.append("No sessions yet: press n to profile a model and start a search.")
        if app.gpu is not None and not app.gpu.present:
            lines.append(f"No NVIDIA GPU here ({app.gpu.detail}): you can browse, prune and "
                         "delete; new searches and resuming need a GPU.")
        notice = self.query_one("#notice", Static)
        notice.update("\n".join(lines))
        notice.display = bool(lines)

    # ----- keeping the list current -----

    @work(exclusive=True, group="sessions")
    async def watch_sessions(self) -> None:
        app = self.app
        seen, waited = -1, RELOAD_S
        while True:
            try:
                store = await app.open_store()
                if store is not None:
                    seq = await store.last_seq()
                    if seq != seen or waited >= RELOAD_S:
                        seen, waited = seq, 0.0
                        summaries = await store.list_sessions()
                        alive = {s.session.id: is_alive(s.session) for s in summaries}
                        self.post_message(SessionsLoaded(summaries, alive))
            except KforgeError as exc:
                self.post_message(ErrorRaised(str(exc)))
                waited = 0.0
            await asyncio.sleep(app.poll_s)
            waited += app.poll_s

    @on(SessionsLoaded)
    def show_sessions(self, message: SessionsLoaded) -> None:
        table = self.query_one(VimTable)
        keep = table.selected_key
        self.summaries = {s.session.id: s for s in message.summaries}
        self.alive = message.alive
        now = self.app.clock()
        table.clear()
        for s in message.summaries:
            table.add_row(*session_cells(s, now, message.alive[s.session.id]),
                          key=str(s.session.id))
        if keep is not None:
            table.select_key(keep)
        self.show_notice()

    # ----- actions -----

    def selected(self) -> int | None:
        key = self.query_one(VimTable).selected_key
        return int(key) if key is not None else None

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_open(self) -> None:
        sid = self.selected()
        if sid is not None:
            self.app.open_session(sid)

    def action_resume(self) -> None:
        sid = self.selected()
        if sid is None:
            return
        if self.alive.get(sid):
            self.app.notify(f"session {sid} is already searching: attaching")
            self.app.open_session(sid)
        else:
            self.app.resume_session(sid, open_after=True)

    def action_new_session(self) -> None:
        self.app.new_session()

    def action_delete(self) -> None:
        sid = self.selected()
        if sid is None:
            return
        if self.alive.get(sid):
            self.app.report(f"session {sid} is being searched right now: open it and stop it "
                            "(S) first")
            return
        model = self.summaries[sid].session.model
        self.app.confirm(f"Delete session {sid} ({model}) and all its kernels?",
                         lambda: self.delete(sid))

    @work(group="delete")
    async def delete(self, sid: int) -> None:
        store = await self.app.open_store()
        if store is None:
            return
        try:
            await store.delete_session(sid)
        except KforgeError as exc:
            self.post_message(ErrorRaised(str(exc)))
            return
        self.app.notify(f"deleted session {sid}")
        self.watch_sessions()

    def palette_commands(self) -> list[tuple[str, str, object]]:
        rows = [("New session", "profile a model and start a search", self.action_new_session)]
        for sid, s in self.summaries.items():
            rows.append((f"Open session {sid}: {s.session.model}",
                         f"{s.session.status}, {s.nodes} nodes",
                         lambda sid=sid: self.app.open_session(sid)))
        return rows
