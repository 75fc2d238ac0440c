"""The first screen: every session in the database, with new, open, resume and delete."""

from __future__ import annotations

from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Static

from kforge.core.inert import inert
from kforge.errors import KforgeError
from kforge.store.commands import is_alive
from kforge.store.records import SessionSummary
from kforge_tui.commands import PaletteCommand
from kforge_tui.follow import poll_wait
from kforge_tui.format import session_cells
from kforge_tui.header import sessions_header, short_gpu, short_model
from kforge_tui.launch import needs_gpu, search_evaluator
from kforge_tui.legend import SESSIONS, Legend
from kforge_tui.messages import DatabaseUnreadable, ErrorRaised, SessionsLoaded
from kforge_tui.screens.backdrop import Backdrop
from kforge_tui.widgets.footer import KeysFooter
from kforge_tui.widgets.status_bar import StatusBar
from kforge_tui.widgets.tables import VimTable

RELOAD_S = 3.0  # re-read the list this often even without events (engine liveness, ages)
COLUMNS = ("id", "model", "gpu", "status", "ops", "nodes", "best", "cost", "activity")
# "best": the best op kernel's speedup, over eager (the heading says so).
HEADINGS = {"best": "×eager"}
MODEL_WIDTH = 18  # so that a row fits 80 columns


class SessionsScreen(Backdrop):
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
        self.problem: str | None = None  # why the database cannot be read, while it cannot

    def compose(self) -> ComposeResult:
        yield StatusBar(id="topbar")
        yield Static(id="notice", markup=False)  # it quotes paths and database errors
        yield VimTable(id="sessions")
        yield KeysFooter()

    def on_mount(self) -> None:
        table = self.query_one(VimTable)
        for name in COLUMNS:
            table.add_column(HEADINGS.get(name, name), key=name)
        self.show_bar()
        self.app.gpu_known_signal.subscribe(self, lambda _gpu: self.show_bar())
        self.watch_sessions()

    def on_screen_resume(self) -> None:
        self.show_bar()
        self.query_one(VimTable).focus()

    def on_resize(self) -> None:
        self.show_bar()

    def show_bar(self) -> None:
        app = self.app
        self.query_one(StatusBar).show(sessions_header(app.db_path, app.gpu_label,
                                                       self.size.width - 2, app.demo,
                                                       app.read_only))
        self.show_notice()

    def show_notice(self) -> None:
        app = self.app
        lines = []
        if self.problem is not None:
            lines.append(f"Cannot read the database: {self.problem}")
        elif app.demo:
            lines.append("The demo: a recorded search to browse (read-only). Press enter to "
                         "open it, ? for the keys.")
        elif not app.db_path.exists():
            lines.append(f"No database at {app.db_path} yet: press n to profile a model "
                         "(it creates one).")
        elif not self.summaries:
            lines.append("No sessions yet: press n to profile a model and start a search.")
        if app.gpu is not None and not app.gpu.present and not app.demo:
            lines.append(gpu_notice(app.gpu.detail, search_evaluator(app.config)))
        notice = self.query_one("#notice", Static)
        text = inert("\n".join(lines))
        if notice.content != text:  # an update repaints the screen
            notice.update(text)
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
                self.post_message(DatabaseUnreadable(str(exc)))
                waited = 0.0
            await poll_wait(self, app.poll_s)
            waited += app.poll_s

    @on(SessionsLoaded)
    def show_sessions(self, message: SessionsLoaded) -> None:
        if not self.summaries:  # the store is open now: read-only or not
            self.show_bar()
        self.summaries = {s.session.id: s for s in message.summaries}
        self.alive = message.alive
        self.problem = None
        now = self.app.clock()
        rows = []
        for s in message.summaries:
            cells = list(session_cells(s, now, message.alive[s.session.id]))
            cells[COLUMNS.index("model")] = short_model(cells[COLUMNS.index("model")], MODEL_WIDTH)
            cells[COLUMNS.index("gpu")] = short_gpu(cells[COLUMNS.index("gpu")])
            rows.append((str(s.session.id), cells))
        self.query_one(VimTable).show_rows(rows)
        self.show_notice()

    @on(DatabaseUnreadable)
    def show_problem(self, message: DatabaseUnreadable) -> None:
        """Say once what keeps the database from being read; the list keeps trying."""
        if message.text != self.problem:
            self.app.report(message.text)
        self.problem = message.text
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
        if sid is None or self.app.refused_read_only("resuming a search"):
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
        if sid is None or self.app.refused_read_only("deleting a session"):
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
        self.app.notify(f"deleted session {sid}")  # the list follows at its next look

    def legend(self) -> Legend:
        return SESSIONS

    def palette_commands(self) -> list[PaletteCommand]:
        rows = [PaletteCommand("New session: profile a model and start a search",
                               self.action_new_session, "new_session"),
                PaletteCommand("Resume the selected session's search", self.action_resume,
                               "resume"),
                PaletteCommand("Delete the selected session", self.action_delete, "delete")]
        for sid, s in self.summaries.items():
            rows.append(PaletteCommand(f"Open session {sid}: {s.session.model}",
                                       lambda sid=sid: self.app.open_session(sid),
                                       help=f"{s.session.status}, {s.nodes} nodes"))
        return rows


def gpu_notice(detail: str, evaluator: str) -> str:
    """What a machine without a GPU can do, by the one rule (``needs_gpu``) that the form and
    resume follow."""
    if needs_gpu(evaluator):
        return (f"No NVIDIA GPU here ({detail}): browse, prune and delete; searching with the "
                f"{evaluator} evaluator needs one (sessions with a plug-in evaluator run here).")
    return f"No NVIDIA GPU here ({detail}); searches run with the plug-in evaluator {evaluator}."
