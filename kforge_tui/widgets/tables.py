"""Tables with vim keys: the sessions list and the op profile (sortable, filterable)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.widgets import DataTable
from textual.widgets.data_table import RowDoesNotExist

from kforge.store.records import CardRow
from kforge_tui.format import card_status, dtype_of, fmt_speedup, fmt_us, shapes_of


class VimTable(DataTable):
    """A row-cursor table that also moves with j/k and g/G."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j", "cursor_down", "down", show=False, id="down"),
        Binding("k", "cursor_up", "up", show=False, id="up"),
        Binding("g", "scroll_top", "top", show=False, id="top"),
        Binding("G", "scroll_bottom", "bottom", show=False, id="bottom"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)

    @property
    def selected_key(self) -> str | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key
        return key.value

    def select_key(self, key: str) -> None:
        try:
            self.move_cursor(row=self.get_row_index(key), animate=False)
        except RowDoesNotExist:  # the row left the table (filtered out or deleted)
            return


@dataclass(frozen=True)
class SortKey:
    label: str
    reverse: bool

    def value(self, row: CardRow):
        c = row.card
        return {"share": c.share, "best": row.best_speedup or 0.0, "eager": c.eager_us or 0.0,
                "calls": c.calls, "op": c.short_op, "status": row.status}[self.label]


SORTS = (SortKey("share", True), SortKey("best", True), SortKey("eager", True),
         SortKey("calls", True), SortKey("op", False), SortKey("status", False))


class OpTable(VimTable):
    """The op profile: one row per op card, targets first."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "next_sort", "sort", id="sort"),
    ]
    # The figures people scan for come first, so they fit at 80 columns; shapes can be long.
    COLUMNS = ("op", "share", "best", "eager", "calls", "dtype", "status", "shapes")
    OP_WIDTH = 22

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sort = SORTS[0]
        self.name_filter = ""
        self._cards: list[CardRow] = []
        self._focus: int | None = None

    def on_mount(self) -> None:
        for name in self.COLUMNS:
            self.add_column(name, key=name)

    def show(self, cards: list[CardRow], focus: int | None) -> None:
        self._cards, self._focus = cards, focus
        self._fill()

    def action_next_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self._fill()
        self.notify(f"ops sorted by {self.sort.label}", timeout=2)

    def set_filter(self, text: str) -> None:
        self.name_filter = text.strip().lower()
        self._fill()

    def visible_cards(self) -> list[CardRow]:
        rows = [c for c in self._cards
                if not self.name_filter or self.name_filter in c.card.op.lower()]
        return sorted(rows, key=lambda r: (not r.card.target, self._ordered(r)))

    def _ordered(self, row: CardRow):
        value = self.sort.value(row)
        return -value if self.sort.reverse and isinstance(value, (int, float)) else value

    def _fill(self) -> None:
        keep = self.selected_key
        self.clear()
        for row in self.visible_cards():
            c = row.card
            style = "" if c.target else "dim"
            op = c.short_op if len(c.short_op) <= self.OP_WIDTH else (
                c.short_op[:self.OP_WIDTH - 1] + "…")
            cells = (op, f"{100 * c.share:.1f}%", fmt_speedup(row.best_speedup),
                     fmt_us(c.eager_us), str(c.calls), dtype_of(row),
                     card_status(row, row.id == self._focus), shapes_of(row))
            self.add_row(*(Text(cell, style=style, no_wrap=True, overflow="ellipsis")
                           for cell in cells), key=str(row.id))
        if keep is not None:
            self.select_key(keep)
