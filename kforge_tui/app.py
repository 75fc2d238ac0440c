"""The kforge-tui application: opens the store, holds the theme and key map, and starts the
``python -m kforge`` subprocesses the screens ask for. ``main`` is the console script."""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from rich.color import ColorSystem
from textual import events, work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.notifications import SeverityLevel
from textual.signal import Signal
from textual.widget import Widget
from textual.widgets import Input

from kforge.core.inert import inert
from kforge.core.settings import Settings
from kforge.engine.plugins import needs_consent
from kforge.errors import KforgeError
from kforge.store import Store
from kforge.store.config import (
    config_path,
    db_path,
    load_config,
    save_config_value,
    store_options,
)
from kforge.store.events import EngineAttached
from kforge.store.lease import engine_alive
from kforge.store.records import MAX_ROW_ID
from kforge_tui.commands import KforgeCommands
from kforge_tui.config.keymap import binding_ids, user_keymap
from kforge_tui.config.themes import (
    DEFAULT_THEME,
    ThemeSpec,
    colour_depth,
    load_themes,
    starting_theme,
    syntax_for,
)
from kforge_tui.demo import build_demo
from kforge_tui.launch import (
    NEEDS_GPU,
    GpuCheck,
    needs_gpu,
    probe_gpu,
    resume_argv,
    run_kforge,
    search_evaluator,
)
from kforge_tui.messages import ErrorRaised, Notice
from kforge_tui.screens.dialogs import Ask, Choose, Confirm, Dialog, DiffView, TrustPlugins
from kforge_tui.screens.help import Help, help_rows, legend_of
from kforge_tui.screens.new_session import NewSessionScreen
from kforge_tui.screens.session import SessionScreen
from kforge_tui.screens.sessions import SessionsScreen
from kforge_tui.terminal_scroll import TerminalScrolls
from kforge_tui.widgets.code_view import CodeView
from kforge_tui.widgets.search_tree import SearchTree
from kforge_tui.widgets.tables import OpTable, VimTable


class KforgeApp(TerminalScrolls):
    TITLE = "kforge"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "quit", id="quit"),
        Binding("question_mark", "help", "help", id="help"),
        Binding("ctrl+p,colon", "command_palette", "commands", show=False, id="palette"),
        Binding("ctrl+t", "change_theme", "theme", show=False, id="theme"),
    ]
    COMMANDS = App.COMMANDS | {KforgeCommands}
    # Text at 4.5:1 or better on 256 and 16 colours too: Textual heads tables in bright blue on
    # ANSI themes (3.8:1 on xterm's), and draws inactive tabs, line numbers, placeholders and
    # the prompts of lists at half strength (2.4-3.8:1 once reduced to 256 colours).
    CSS = """
    DataTable:ansi > .datatable--header { background: ansi_blue; }
    Tab { color: $foreground 80%; }
    Tab.-active { color: $foreground; }
    TextArea > .text-area--gutter { color: $foreground 75%; }
    Input > .input--placeholder, Input > .input--suggestion { color: $foreground 70%; }
    SelectCurrent Static#label { color: $foreground 70%; }
    SelectCurrent.-has-value Static#label { color: $foreground; }
    """

    def __init__(self, db: Path, *, config: Settings | None = None, theme: str | None = None,
                 gpu: GpuCheck | None = None, clock: Callable[[], float] = time.time,
                 poll_s: float = 0.5, theme_folders: list[Path] | None = None,
                 remember_theme: bool = True, session: int | None = None,
                 demo: bool = False) -> None:
        super().__init__()
        self.db_path = db
        self.demo = demo  # browsing the recorded demo session: nothing is written
        self.clock = clock
        self.poll_s = poll_s
        self.gpu = gpu
        self.gpu_known_signal: Signal[GpuCheck] = Signal(self, "gpu-known")
        self.store: Store | None = None
        self._opening = asyncio.Lock()  # screens open the store at once on start: one connection
        self._first_session = session
        self._problems: list[str] = []
        self._config = config if config is not None else self._read_config()
        self.specs: dict[str, ThemeSpec] = {}
        self._load_themes(theme_folders, theme)
        self._remember_theme = remember_theme and not demo  # the demo writes nothing of yours
        self.starting: dict[int, int] = {}  # session id -> pid of an engine started, not yet seen
        self.engine_starting_signal: Signal[int] = Signal(self, "engine-starting")
        keymap, problems = user_keymap(self._config.keys, binding_ids(binding_owners()))
        self._problems += problems
        self.set_keymap(keymap)

    @property
    def config(self) -> Settings:
        """The user's config file, as read at start."""
        return self._config

    def _read_config(self) -> Settings:
        try:
            return load_config()
        except KforgeError as exc:
            self._problems.append(str(exc))
            return Settings()

    def _load_themes(self, folders: list[Path] | None, wanted: str | None) -> None:
        self.specs, problems = load_themes(folders)
        self._problems += problems
        depth = colour_depth(self.console)
        withheld: set[str] = set()  # Textual's own: they have no colours for a smaller palette
        if depth is not ColorSystem.TRUECOLOR:
            withheld = set(self.available_themes)
            for name in withheld:
                self.unregister_theme(name)
        for spec in self.specs.values():
            if spec.offered_at(depth):
                self.register_theme(spec.at(depth))
        name = starting_theme(wanted, self._config.tui.theme, depth)
        if name not in self.available_themes:
            instead = next((n for n in (starting_theme(None, DEFAULT_THEME, depth),
                                        DEFAULT_THEME, "textual-dark")
                            if n in self.available_themes), None)
            colours = {ColorSystem.EIGHT_BIT: "256", ColorSystem.STANDARD: "16"}.get(depth)
            why = (f"is not made for this terminal's {colours} colours"
                   if colours and (name in self.specs or name in withheld) else "does not exist")
            self._problems.append(f"theme {name!r} {why}; using {instead}")
            name = instead or DEFAULT_THEME
        self.theme = name

    def syntax_roles(self) -> dict[str, str]:
        return syntax_for(self.current_theme, self.specs)

    # ----- start and stop -----

    def on_mount(self) -> None:
        self.theme_changed_signal.subscribe(self, self._remember)
        self.push_screen(SessionsScreen())
        if self._first_session is not None:
            self.open_session(self._first_session)
        for problem in self._problems:
            self.notify(problem, severity="warning", timeout=10)
        if self.gpu is None:
            self.check_gpu()

    def _remember(self, theme) -> None:
        if self._remember_theme:
            try:
                save_config_value("tui", "theme", theme.name)
            except OSError as exc:
                self.report(f"cannot save the theme choice to {config_path()}: {exc.strerror}")

    async def on_unmount(self) -> None:
        if self.store is not None:
            await self.store.close()

    async def open_store(self) -> Store | None:
        """The session database, opened on first use (read-only in a place this process may not
        write); None while it does not exist yet."""
        async with self._opening:
            if self.store is None and self.db_path.exists():
                opener = Store.open_read_only if self.demo else Store.open_to_browse
                self.store = await opener(self.db_path, options=store_options())
        return self.store

    @work(group="gpu")
    async def check_gpu(self) -> None:
        self.gpu = await probe_gpu()
        self.gpu_known_signal.publish(self.gpu)

    @property
    def gpu_label(self) -> str:
        return "GPU: checking…" if self.gpu is None else f"GPU: {self.gpu.label}"

    # ----- the one path of notifications -----

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = True) -> None:
        """kforge's toasts, a widget's too, show their text literally: they quote settings such
        as ``[search]``, paths and stored text, never markup (``markup`` is not honoured).
        Textual's own toasts keep their markup (ctrl+c's "Press [b]ctrl+q[/b] to quit the
        app")."""
        if asked_by_textual():
            super().notify(message, title=title, severity=severity, timeout=timeout,
                           markup=markup)
            return
        super().notify(inert(message), title=inert(title), severity=severity, timeout=timeout,
                       markup=False)

    def report(self, text: str) -> None:
        self.notify(text, title="kforge", severity="error", timeout=8)

    @property
    def read_only(self) -> bool:
        """Whether nothing can be written: the demo, or a database this process may not write
        (the file or its folder), which the store opened read-only."""
        return self.demo or (self.store is not None and self.store.read_only)

    def refused_read_only(self, doing: str) -> bool:
        """Where nothing can be written, say why ``doing`` cannot be done, and return True."""
        if self.demo:
            self.notify(f"the demo is a read-only recording: {doing} works on your own sessions "
                        "(kforge-tui without --demo)", title="demo", severity="warning")
        elif self.read_only:
            self.notify(f"the database {self.db_path} is read-only here (this process may not "
                        f"write the file or its folder): {doing} needs to write it",
                        title="read-only", severity="warning")
        return self.read_only

    def on_error_raised(self, message: ErrorRaised) -> None:
        self.report(message.text)

    def on_notice(self, message: Notice) -> None:
        self.notify(message.text, timeout=4)

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        # A blinking cursor repaints its whole line twice a second (1 KB/s at 80 columns) while
        # a form or the command palette waits: text fields keep a steady cursor.
        if isinstance(event.widget, Input):
            event.widget.cursor_blink = False

    # ----- what screens ask for -----

    def open_session(self, session_id: int) -> None:
        self.push_screen(SessionScreen(session_id))

    def new_session(self) -> None:
        if self.refused_read_only("starting a search"):
            return

        def opened(session_id: int | None) -> None:
            if session_id is not None:
                self.open_session(session_id)

        self.push_screen(NewSessionScreen(), opened)

    def confirm(self, question: str, then: Callable[[], object],
                default_yes: bool = False) -> None:
        """Ask ``question``; on yes, run ``then``. Enter answers no unless ``default_yes``."""
        self.push_screen(Confirm(question, default_yes), lambda yes: yes and then())

    @work(group="resume")
    async def resume_session(self, session_id: int, open_after: bool = False) -> None:
        """Start a detached engine for the session (``kforge resume --detach``). Where its stored
        settings name plug-ins or a cluster that the config file does not (what ``kforge
        resume`` would refuse), ask first, and give those again (``--proposer SPEC``...) only on
        a yes."""
        store = await self.open_store()
        if store is None or self.refused_read_only("resuming a search"):
            return
        try:
            session = await store.get_session(session_id)
            evaluator = search_evaluator(self.config, session.settings)
            if needs_gpu(evaluator) and self.gpu is not None and not self.gpu.present:
                raise KforgeError(NEEDS_GPU.format(detail=self.gpu.detail))
            named = needs_consent(session_id, session.settings, self.config)
            if named:
                if not await self.push_screen_wait(TrustPlugins(session_id, named)):
                    self.notify(f"session {session_id} was not resumed", timeout=3)
                    return
                session = await store.get_session(session_id)
                if needs_consent(session_id, session.settings, self.config) != named:
                    raise KforgeError(f"session {session_id}'s stored plug-ins changed while "
                                      "you were asked; resume it again to see them")
            self.notify(f"starting the search of session {session_id}…", timeout=3)
            answer = await run_kforge(resume_argv(session_id, self.db_path, named),
                                      lambda _line: None)
        except KforgeError as exc:
            self.report(str(exc))
            return
        self.engine_started(answer)
        if open_after:
            self.open_session(session_id)

    def engine_started(self, answer: dict) -> None:
        """A detached engine was started for the session ``answer`` names (``kforge search`` or
        ``resume --detach --json``): it is starting until it takes the session, and if its
        process ends before it ever did, say so."""
        session_id, pid = answer["session"], answer.get("engine_pid")
        if not isinstance(pid, int):
            return
        self.notify(f"started an engine for session {session_id} (process {pid})", timeout=4)
        self.starting[session_id] = pid
        self.engine_starting_signal.publish(session_id)
        self.watch_start(session_id, pid, answer["log"])  # a detached engine's answer names it

    @work(group="engine-start")
    async def watch_start(self, session_id: int, pid: int, log: str) -> None:
        """Wait until the engine took the session (it may have ended since: a search with
        nothing to do) or its process ended without taking it, which is said."""
        store = await self.open_store()
        try:
            if store is not None:
                seq = await store.last_seq()  # the engine may take the session before
                while (await store.get_session(session_id)).engine_pid != pid and not any(
                        isinstance(e.record, EngineAttached)
                        for e in await store.events_since(seq, session_id)):
                    if not process_runs(pid):
                        self.report(f"the engine of session {session_id} (process {pid}) "
                                    f"ended before it took the session: its log says why "
                                    f"({log})")
                        break
                    await asyncio.sleep(self.poll_s)
        except KforgeError as exc:
            self.report(str(exc))
        finally:
            if self.starting.get(session_id) == pid:  # not a later start of the same session
                del self.starting[session_id]
                self.engine_starting_signal.publish(session_id)

    def action_help(self) -> None:
        if not isinstance(self.screen, Help):
            self.push_screen(Help(help_rows(self.screen), legend_of(self.screen)))


def asked_by_textual() -> bool:
    """Whether the toast being shown was asked for by Textual itself: the first caller of
    ``App.notify`` outside ``Widget.notify`` (which every widget's toast goes through) is in
    Textual's package."""
    frame = sys._getframe(2)  # App.notify's caller
    while frame is not None and frame.f_code is Widget.notify.__code__:
        frame = frame.f_back
    return frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "textual"


def process_runs(pid: int) -> bool:
    """Whether a process of this machine is still running, as the store tells an engine's."""
    return engine_alive(pid, socket.gethostname(), None)


def binding_owners() -> tuple[type, ...]:
    """Every class whose bindings the config's [keys] table may remap."""
    return (KforgeApp, SessionsScreen, SessionScreen, NewSessionScreen, Dialog, Confirm, Choose,
            Ask, DiffView, TrustPlugins, Help, VimTable, OpTable, SearchTree, CodeView)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="kforge-tui", description="Browse kforge sessions and drive their searches.")
    parser.add_argument("--db", metavar="PATH",
                        help="session database (default: $KFORGE_DB or the user data folder)")
    parser.add_argument("--theme", help="theme name (remembered; see themes/ and "
                                        "<config dir>/themes/)")
    parser.add_argument("--no-mouse", action="store_true",
                        help="leave the mouse to the terminal (select and copy text over SSH)")
    parser.add_argument("--session", type=int, metavar="ID", help="open this session directly")
    parser.add_argument("--demo", action="store_true",
                        help="browse a recorded search (read-only; needs no GPU or database)")
    args = parser.parse_args(argv)
    if args.session is not None and not 1 <= args.session <= MAX_ROW_ID:
        parser.error(f"argument --session: a session is named by its number (1 to "
                     f"{MAX_ROW_ID}), not {args.session}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.demo:
        with tempfile.TemporaryDirectory(prefix="kforge-demo-") as folder:
            db, session = build_demo(Path(folder))
            return run(KforgeApp(db, theme=args.theme, session=session, demo=True), args)
    return run(KforgeApp(db_path(args.db), theme=args.theme, session=args.session), args)


def run(app: KforgeApp, args: argparse.Namespace) -> int:
    app.run(mouse=not args.no_mouse)
    return app.return_code or 0
