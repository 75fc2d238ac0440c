"""Small modal dialogs: yes/no, pick one of a list, type a line, read a diff, and trust what a
session names to run. Each fits an 80x24 terminal: at most 76 cells wide, its text wrapped."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from kforge.core.inert import inert
from kforge_tui.diffing import line_kind
from kforge_tui.format import literal


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


class DiffView(Dialog):
    """A unified diff, coloured by line kind; escape or q closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "cancel", "close", id="close"),
        Binding("j", "scroll_down", show=False, id="down"),
        Binding("k", "scroll_up", show=False, id="up"),
    ]
    DEFAULT_CSS = """
    DiffView > Vertical { width: 100%; height: 100%; max-width: 100%; max-height: 100%; }
    DiffView VerticalScroll { height: 1fr; }
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

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = literal(self.title_text)
            box.border_subtitle = "escape: close"
            with VerticalScroll():
                yield Static()

    def on_mount(self) -> None:
        self.query_one(Static).update(self.render_diff())
        self.query_one(VerticalScroll).focus()

    def render_diff(self) -> Text:
        if not self.lines:
            return Text("no difference")
        text = Text()
        for line in self.lines:
            style = self.get_component_rich_style(f"diff--{line_kind(line)}", partial=True) \
                if line_kind(line) != "context" else ""
            text.append(inert(line) + "\n", style=style)  # stored kernel source
        return text

    def action_scroll_down(self) -> None:
        self.query_one(VerticalScroll).scroll_down(animate=False)

    def action_scroll_up(self) -> None:
        self.query_one(VerticalScroll).scroll_up(animate=False)
