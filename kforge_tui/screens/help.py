"""The `?` screen: the keys that work where you are, with the ids that remap them."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Label

from kforge.store.config import config_path
from kforge_tui.format import literal
from kforge_tui.screens.dialogs import Dialog


def help_rows(screen) -> list[tuple[str, str, str]]:
    """``(keys, what it does, binding id)`` for every active binding of ``screen``, one row per
    action, kforge's own first so that they show without scrolling on 80x24 (``help_rank``);
    bindings without an id (Textual's own) last."""
    rows: dict[tuple[str, str], list[str]] = {}
    ranks: dict[tuple[str, str], int] = {}
    app = screen.app
    for active in screen.active_bindings.values():
        binding = active.binding
        if binding.system or not (binding.description or binding.id):
            continue
        ident = (binding.id or "", binding.description or binding.action)
        display = app.get_key_display(binding)
        if display not in rows.setdefault(ident, []):
            rows[ident].append(display)
        ranks[ident] = min(ranks.get(ident, 4), help_rank(active, screen))
    ordered = sorted(rows.items(), key=lambda item: (ranks[item[0]], item[0][0], item[0][1]))
    return [(" ".join(keys), what, ident or "-") for (ident, what), keys in ordered]


# Actions that move around a screen rather than act on the session.
MOVES = frozenset({"pane", "cycle_pane", "cycle_tab"})


def help_rank(active, screen) -> int:
    """Where a binding sits in help: the keys the footer shows (what kforge does here) first,
    then the screen's other actions, the app's keys, moves between panes and within widgets,
    and Textual's own last."""
    binding = active.binding
    if not binding.id:
        return 4
    if binding.show:
        return 0
    if active.node is screen:
        return 3 if binding.action.split("(", 1)[0] in MOVES else 1
    return 2 if active.node is screen.app else 3


class Help(Dialog):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q,question_mark", "cancel", "close", id="close"),
    ]
    # The table takes what the box leaves, so the hint below it shows on an 80x24 terminal too.
    DEFAULT_CSS = """
    Help > Vertical { height: 100%; max-height: 40; }
    Help DataTable { height: 1fr; }
    """

    def __init__(self, rows: list[tuple[str, str, str]]) -> None:
        super().__init__("Keys here")
        self.rows = rows

    def body(self) -> ComposeResult:
        yield DataTable(cursor_type="row", zebra_stripes=True)
        yield Label(f"Remap a key by its id in [keys] of {config_path()}, e.g. prune = \"z\". "
                    "ctrl+p or : opens the command palette; escape closes this.",
                    classes="hint", markup=False)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("key", "does", "id")
        for row in self.rows:
            table.add_row(*map(literal, row))
        table.focus()
