"""The new-session form: model, dtype, proposer, budgets and the Ray cluster to evaluate on; runs
``kforge search --detach --json`` and shows its progress lines until its answer names the new
session."""

from __future__ import annotations

from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Button, Input, Label, Select

from kforge.errors import KforgeError
from kforge_tui.format import literal
from kforge_tui.launch import (
    DTYPES,
    NEEDS_GPU,
    PROPOSERS,
    NewSession,
    builtin_models,
    kforge_command,
    needs_gpu,
    run_kforge,
    search_argv,
    search_evaluator,
)
from kforge_tui.widgets.wrapping_log import WrappingLog


class NewSessionScreen(ModalScreen[int | None]):
    """Dismisses with the new session's id, or None when cancelled."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "cancel", id="cancel"),
    ]
    DEFAULT_CSS = """
    NewSessionScreen { align: center middle; }
    NewSessionScreen > Vertical {
        width: 90; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    NewSessionScreen .row { height: 1; margin-top: 1; }
    NewSessionScreen.-short .row { margin-top: 0; }
    NewSessionScreen .row > Label { width: 12; }
    NewSessionScreen .row > Input, NewSessionScreen .row > Select { width: 1fr; }
    NewSessionScreen #models { color: $text-muted; height: auto; width: 100%; }
    NewSessionScreen #warning { color: $warning; height: auto; width: 100%; }
    NewSessionScreen WrappingLog { height: 6; border: round $panel; }
    NewSessionScreen #buttons { height: 1; margin-top: 1; align-horizontal: right; }
    NewSessionScreen #buttons > Button { margin-left: 2; }
    """

    def compose(self) -> ComposeResult:
        models = builtin_models()
        names = [name for name, _ in models]
        with Vertical():
            yield Label("New session: profile a model, then search in the background",
                        classes="title")
            yield Label(id="warning", markup=False)
            with Horizontal(classes="row"):
                yield Label("model")
                yield Input(placeholder="resnet50, gemma4-tiny, or path/to/file.py:factory",
                            suggester=SuggestFromList(names), id="model", compact=True)
            yield Label("built-in: " + ", ".join(n for n in names if not n.endswith("-tiny"))
                        + " (each has a -tiny twin)", id="models")
            with Horizontal(classes="row"):
                yield Label("dtype")
                yield Select([(d, d) for d in DTYPES], prompt="model default", id="dtype",
                             compact=True)
            with Horizontal(classes="row"):
                yield Label("proposer")
                yield Select([(p, p) for p in PROPOSERS],
                             prompt=f"config default ({self.app.config.search.proposer})",
                             id="proposer", compact=True)
            with Horizontal(classes="row"):
                yield Label("iterations")
                yield Input(placeholder="per op, e.g. 24", id="iterations", compact=True)
            with Horizontal(classes="row"):
                yield Label("USD")
                yield Input(placeholder="LLM spend limit, e.g. 5", id="usd", compact=True)
            with Horizontal(classes="row"):
                yield Label("time")
                yield Input(placeholder="e.g. 30m or 2h", id="time", compact=True)
            with Horizontal(classes="row"):
                yield Label("cluster")
                configured = self.app.config.search.cluster
                yield Input(placeholder=f"Ray: auto or head:6379 ({configured or 'local GPUs'})",
                            id="cluster", compact=True)
            yield WrappingLog(id="progress")
            with Horizontal(id="buttons"):
                yield Button("Start", variant="primary", id="start", compact=True)
                yield Button("Cancel", id="cancel", compact=True)

    # Below this many lines the fields sit without blank lines between them, so the progress
    # log and the buttons stay on screen (80x24 included) after a start that failed.
    SHORT_HEIGHT = 32

    def on_resize(self) -> None:
        self.set_class(self.size.height < self.SHORT_HEIGHT, "-short")

    def on_mount(self) -> None:
        self.set_class(self.app.size.height < self.SHORT_HEIGHT, "-short")
        self.show_refusal()
        self.query_one("#progress", WrappingLog).display = False
        self.query_one("#model", Input).focus()

    def form(self) -> NewSession:
        def text(widget_id: str) -> str:
            return self.query_one(f"#{widget_id}", Input).value

        def choice(widget_id: str) -> str:
            select = self.query_one(f"#{widget_id}", Select)
            return "" if select.is_blank() else str(select.value)

        return NewSession(model=text("model"), dtype=choice("dtype"),
                          proposer=choice("proposer"), iterations=text("iterations"),
                          usd=text("usd"), time=text("time"))

    @on(Input.Changed, "#cluster")
    def show_refusal(self) -> None:
        warning = self.query_one("#warning", Label)
        refusal = self.gpu_refusal()
        warning.update(literal(refusal or ""))
        warning.display = refusal is not None

    def cluster(self) -> str:
        """The Ray cluster the search evaluates on: the form's, else the config's ("": none)."""
        return self.query_one("#cluster", Input).value.strip() or self.app.config.search.cluster

    def gpu_refusal(self) -> str | None:
        """Why a search cannot start here: the configured evaluator needs the GPU this machine
        lacks (a plug-in evaluator runs anywhere, a Ray cluster's GPUs do the evaluating, and a
        model is profiled on the CPU)."""
        gpu = self.app.gpu
        if (gpu is None or gpu.present or self.cluster()
                or not needs_gpu(search_evaluator(self.app.config))):
            return None
        return NEEDS_GPU.format(detail=gpu.detail)

    @on(Input.Submitted)
    @on(Button.Pressed, "#start")
    def start(self) -> None:
        if refusal := self.gpu_refusal():
            self.app.report(refusal)
            return
        try:
            argv = search_argv(self.form(), self.app.db_path)
        except KforgeError as exc:
            self.app.report(str(exc))
            return
        if address := self.query_one("#cluster", Input).value.strip():
            argv += ["--cluster", address]
        self.run_search(argv)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.workers.cancel_group(self, "new-session")
        self.dismiss(None)

    @work(exclusive=True, group="new-session")
    async def run_search(self, argv: list[str]) -> None:
        log = self.query_one("#progress", WrappingLog)
        self.query_one("#models").display = False  # room for the progress on 80x24
        log.display = True
        log.clear()
        log.write_line("$ kforge " + " ".join(argv[len(kforge_command()):]))
        self.query_one("#start", Button).disabled = True
        try:
            answer = await run_kforge(argv, log.write_line)
        except KforgeError as exc:
            self.app.report(str(exc))
            return
        finally:
            self.query_one("#start", Button).disabled = False
        self.app.engine_started(answer)
        self.dismiss(answer["session"])
