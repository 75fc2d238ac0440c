"""Small modal dialogs: yes/no, pick one of a list, type a line, read a long text (an op's
details, a diff), and trust what a session names to run. Each fits an 80x24 terminal: at most
76 cells wide (a long text: the whole terminal), its text wrapped."""

from __future__ import annotations

from typing import ClassVar

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from kforge.core.inert import inert
from kforge_tui.diffing import line_kind, wrapped
from kforge_tui.format import literal
from kforge_tui.widgets.scrolling import VimScroll


class Dialog(ModalScreen):
    """A centred box: a bold title over what ``body`` yields; escape cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "cancel", id="cancel"),
    ]
    DEFAULT_CSS = """
    Dialog { align: center middle; }
    Dialog > Vertical {
        width: 76; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    Dialog Label { width: 1fr; }
    Dialog .title { text-style: bold; margin-bottom: 1; }
    Dialog .hint { color: $text-muted; margin-top: 1; }
    """

    def __init__(self, title: str) -> None:
        super().__init__()
        self.title_text = title

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(literal(self.title_text), classes="title")  # it may quote stored text
            yield from self.body()

    def body(self) -> ComposeResult:
        return iter(())

    def action_cancel(self) -> None:
        self.dismiss(None)


class Confirm(Dialog):
    """A yes/no question: y says yes, n or escape no, and enter presses the focused button, No
    unless the question says that yes is the safe answer (``default_yes``)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "yes", "yes", id="yes"),
        Binding("n", "cancel", "no", id="no"),
        Binding("left,h", "app.focus_previous", show=False),
        Binding("right,l", "app.focus_next", show=False),
    ]
    DEFAULT_CSS = """
    Confirm #answers { height: 1; margin-top: 1; align-horizontal: right; }
    Confirm #answers > Button { margin-left: 2; }
    """

    def __init__(self, question: str, default_yes: bool = False) -> None:
        super().__init__(question)
        self.default_yes = default_yes

    @property
    def question(self) -> str:
        return self.title_text

    def body(self) -> ComposeResult:
        with Horizontal(id="answers"):
            yield Button("Yes (y)", id="yes", compact=True)
            yield Button("No (n)", id="no", compact=True)

    def on_mount(self) -> None:
        self.query_one("#yes" if self.default_yes else "#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_yes(self) -> None:
        self.dismiss(True)


# What starting a search does with each thing a session may name (``needs_consent``'s kinds).
TRUST_DOES = {
    "proposer": "import and run the proposer",
    "evaluator": "import and run the evaluator",
    "cluster": "connect to the Ray cluster, and load its answers (Python objects) here",
}


class TrustPlugins(Dialog):
    """Whether to start a session's search that would run code only its database names (each
    ``(what, spec)`` of ``needs_consent``), each shown literally. Escape, and enter on the
    focused Cancel, say no; only t or the Trust button say yes."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("t", "trust", "trust & resume", id="trust_plugins"),
        Binding("left,h", "app.focus_previous", show=False),
        Binding("right,l", "app.focus_next", show=False),
    ]
    DEFAULT_CSS = """
    TrustPlugins #named { height: auto; max-height: 10; }
    TrustPlugins .spec { text-style: bold; padding-left: 2; }
    TrustPlugins .why { margin-top: 1; }
    TrustPlugins #answers { height: 1; margin-top: 1; align-horizontal: right; }
    TrustPlugins #answers > Button { margin-left: 2; }
    """

    def __init__(self, session_id: int, named: list[tuple[str, str]]) -> None:
        super().__init__(f"Session {session_id} names code to run on this machine")
        self.named = named

    def body(self) -> ComposeResult:
        yield Label("Resuming its search would:")
        with VerticalScroll(id="named"):
            for what, spec in self.named:
                yield Label(TRUST_DOES[what])
                yield Label(literal(spec), classes="spec")
                if inert(spec) != spec:
                    yield Label("  (it holds control characters, left out above)")
        yield Label("Its database names these; your config file does not. Trust & resume "
                    "runs that code on this machine, with your rights: trust only a database "
                    "you know.", classes="why")
        with Horizontal(id="answers"):
            yield Button("Cancel (escape)", id="cancel", compact=True)
            yield Button("Trust & resume (t)", id="trust", compact=True)

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "trust")

    def action_trust(self) -> None:
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)


class Choose(Dialog):
    """Pick one option (arrows or j/k, then enter)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j", "down", show=False, id="down"),
        Binding("k", "up", show=False, id="up"),
    ]

    def __init__(self, title: str, options: list[str], current: str | None = None) -> None:
        super().__init__(title)
        self.options = options
        self.current = current

    def body(self) -> ComposeResult:
        yield OptionList(*(Option(literal(o), id=o) for o in self.options))

    def on_mount(self) -> None:
        listing = self.query_one(OptionList)
        if self.current in self.options:
            listing.highlighted = self.options.index(self.current)
        listing.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_down(self) -> None:
        self.query_one(OptionList).action_cursor_down()

    def action_up(self) -> None:
        self.query_one(OptionList).action_cursor_up()


class Ask(Dialog):
    """One line of text; enter accepts (an empty line is a valid answer)."""

    def __init__(self, title: str, value: str = "", placeholder: str = "") -> None:
        super().__init__(title)
        self.value = value
        self.placeholder = placeholder

    def body(self) -> ComposeResult:
        yield Input(self.value, placeholder=self.placeholder)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)


class Reading(Dialog):
    """A long text in a box as large as the terminal, which the panes' keys scroll (j/k, g/G,
    ctrl+d/ctrl+u); escape or q closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "cancel", "close", id="close"),
    ]
    DEFAULT_CSS = """
    Reading > Vertical { width: 100%; height: 100%; max-width: 100%; max-height: 100%; }
    Reading VimScroll { height: 1fr; }
    """

    def __init__(self, title: str, body: RenderableType = "") -> None:
        super().__init__(title)
        self.body_shown = literal(body) if isinstance(body, str) else body

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = literal(self.title_text)
            box.border_subtitle = "escape: close"
            with VimScroll():
                yield Static()

    def on_mount(self) -> None:
        self.query_one(VimScroll).focus()
        self.call_after_refresh(self.show_text)  # once laid out: the text's width is known

    def on_resize(self) -> None:
        self.show_text()

    def show_text(self) -> None:
        width = self.query_one(VimScroll).scrollable_content_region.width
        self.query_one(Static).update(self.render_text(width))

    def render_text(self, width: int) -> RenderableType:
        """What the box shows in ``width`` cells (a text wraps to them by itself)."""
        return self.body_shown


def facts_table(rows: list[tuple[str, str]]) -> Table:
    """Labels beside what they say, which wraps under itself in the room the labels leave."""
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 0), expand=True)
    table.add_column(no_wrap=True, style="bold")
    table.add_column(ratio=1)
    for label, text in rows:
        table.add_row(literal(label), literal(text))
    return table


class DiffView(Reading):
    """A unified diff, coloured by line kind; a wrapped line keeps its mark on each row."""

    DEFAULT_CSS = """
    DiffView > .diff--added { color: $success; }
    DiffView > .diff--removed { color: $error; }
    DiffView > .diff--hunk { color: $secondary; }
    DiffView > .diff--header { text-style: bold; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {"diff--added", "diff--removed", "diff--hunk",
                                             "diff--header"}

    def __init__(self, title: str, lines: list[str]) -> None:
        super().__init__(title)
        self.lines = lines

    def render_text(self, width: int) -> Text:
        if not self.lines:
            return Text("no difference")
        text = Text()
        for line in self.lines:
            kind = line_kind(line)
            style = self.get_component_rich_style(f"diff--{kind}", partial=True) \
                if kind != "context" else ""
            for row in wrapped(inert(line), width):  # stored kernel source
                text.append(row + "\n", style=style)
        return text
