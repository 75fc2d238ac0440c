"""The `?` screen: kforge's keys that work where you are, with the ids that remap them, and what
the symbols and labels of the screen under it mean."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Label, Static

from kforge.store.config import config_path
from kforge_tui.format import literal
from kforge_tui.legend import Legend
from kforge_tui.screens.dialogs import Dialog, facts_table
from kforge_tui.widgets.scrolling import VimScroll


def help_rows(screen) -> list[tuple[str, str, str]]:
    """``(keys, what it does, binding id)`` for every active binding of kforge's own (one with
    an id) on ``screen``, one row per action, the keys the footer shows first so that they show
    without scrolling on 80x24 (``help_rank``). Textual's own bindings are left out: the panes
    take the keys kforge lists instead."""
    rows: dict[tuple[str, str], list[Binding]] = {}
    ranks: dict[tuple[str, str], int] = {}
    for active in screen.active_bindings.values():
        binding = active.binding
        if binding.system or not binding.id:
            continue
        ident = (binding.id, binding.description or binding.action)
        rows.setdefault(ident, []).append(binding)
        ranks[ident] = min(ranks.get(ident, 3), help_rank(active, screen))
    ordered = sorted(rows.items(), key=lambda item: (ranks[item[0]], item[0][0], item[0][1]))
    return [(keys_text(screen.app, bindings), what, ident)
            for (ident, what), bindings in ordered]


def keys_text(app, bindings: list[Binding]) -> str:
    """An action's keys as help lists them: the letters (vim's keys) before the named keys."""
    shown = [app.get_key_display(b) for b in sorted(bindings, key=lambda b: len(b.key) > 1)]
    return " ".join(dict.fromkeys(shown))


# Actions that move around a screen rather than act on the session.
MOVES = frozenset({"pane", "cycle_pane", "cycle_tab"})


def help_rank(active, screen) -> int:
    """Where a binding sits in help: the keys the footer shows (what kforge does here) first,
    then the screen's other actions, the app's keys, and moves between panes and within
    widgets last."""
    binding = active.binding
    if binding.show:
        return 0
    if active.node is screen:
        return 3 if binding.action.split("(", 1)[0] in MOVES else 1
    return 2 if active.node is screen.app else 3


def legend_of(screen) -> Legend:
    """What the symbols and labels of ``screen`` mean (``legend``: none where it has none)."""
    return getattr(screen, "legend", lambda: ())()


class Help(Dialog):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q,question_mark", "cancel", "close", id="close"),
    ]
    # The box takes what the terminal leaves, so the hint below it shows on 80x24 too.
    DEFAULT_CSS = """
    Help > Vertical { height: 100%; max-height: 48; }
    Help VimScroll { height: 1fr; }
    Help DataTable { height: auto; max-height: 1000; }
    Help .section { text-style: bold; margin-top: 1; }
    """

    def __init__(self, rows: list[tuple[str, str, str]], legend: Legend = ()) -> None:
        super().__init__("Keys here")
        self.rows = rows
        self.legend = legend

    def body(self) -> ComposeResult:
        with VimScroll():
            yield DataTable(cursor_type="none", zebra_stripes=True)
            if self.legend:
                yield Label("What the symbols and labels mean", classes="section")
                yield Static(facts_table(list(self.legend)))
        yield Label(f"Remap a key by its id in [keys] of {config_path()}, e.g. prune = \"z\". "
                    "ctrl+p or : opens the command palette; escape closes this.",
                    classes="hint", markup=False)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.can_focus = False  # the box scrolls, with the panes' keys
        table.add_columns("key", "does", "id")
        for row in self.rows:
            table.add_row(*map(literal, row))
        self.query_one(VimScroll).focus()

