"""Tables with vim keys: the sessions list and the op profile (sortable, filterable). Both are
updated in place: a changed cell repaints its row alone, so a table that did not change sends
nothing to the terminal."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Set
from contextlib import contextmanager
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any, ClassVar

from rich.cells import cell_len
from rich.console import RenderableType
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.geometry import Region
from textual.widgets import DataTable
from textual.widgets.data_table import RowDoesNotExist

from kforge.core.laws import Ranges
from kforge.core.opcard import OpCard
from kforge.core.region import folded
from kforge.store import CardStatus
from kforge.store.records import CardRow
from kforge_tui.format import (
    CONFIRMING,
    best_cell,
    card_status,
    dtype_of,
    fmt_us,
    literal,
    percent_text,
    share_bar,
    sparkline,
)
from kforge_tui.header import clip
from kforge_tui.widgets.scrolling import HALF_PAGE_KEYS, SteadyScrollbars

Cell = RenderableType
Row = tuple[str, Sequence[Cell]]  # a row's key and its cells, in column order


class VimTable(SteadyScrollbars, DataTable):
    """A row-cursor table that also moves with j/k and g/G."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j,down", "cursor_down", "down", show=False, id="down"),
        Binding("k,up", "cursor_up", "up", show=False, id="up"),
        Binding("g,home", "scroll_top", "top", show=False, id="top"),
        Binding("G,end", "scroll_bottom", "bottom", show=False, id="bottom"),
        Binding("enter", "select_cursor", "open", show=False, id="select"),
        *HALF_PAGE_KEYS,
    ]

    _rows_repaint_alone = False  # set by _row_repaints_only

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)

    # A text cell is shown literally: DataTable would read a string as markup.
    def add_row(self, *cells: Cell, **kwargs: Any) -> Any:
        return super().add_row(*map(_literal_cell, cells), **kwargs)

    def update_cell(self, row_key: Any, column_key: Any, value: Cell, **kwargs: Any) -> None:
        super().update_cell(row_key, column_key, _literal_cell(value), **kwargs)

    def show_rows(self, rows: Sequence[Row], narrower: bool = False) -> None:
        """Show exactly these rows, in this order. While the keys and their order stay the same,
        only the changed cells are written and only their rows repaint; a row added, removed or
        moved rebuilds the table, the cursor staying on its row. So does a ``narrower`` table,
        each column then as wide as its widest cell now (a column only widens in place)."""
        if narrower or [key for key, _ in rows] != [row.key.value for row in self.ordered_rows]:
            keep = self.selected_key
            self.clear()
            if narrower:
                for column in self.columns.values():
                    column.content_width = cell_len(column.label.plain)
            for key, cells in rows:
                self.add_row(*cells, key=key)
            if keep is not None:
                self.select_key(keep)
            return
        for key, cells in rows:
            cells = [_literal_cell(cell) for cell in cells]
            old = self.get_row(key)
            changed = [(column, new) for column, before, new in zip(self.columns, old, cells)
                       if not same_cell(before, new)]
            if not changed:
                continue
            with self._row_repaints_only():
                for column, new in changed:
                    # A cell wider than its column widens it: the whole table is laid out again.
                    wider = cell_len(plain(new)) > self.columns[column].content_width
                    self.update_cell(key, column, new, update_width=wider)
            self.refresh_row(self.get_row_index(key))

    @contextmanager
    def _row_repaints_only(self) -> Iterator[None]:
        self._rows_repaint_alone = True
        try:
            yield
        finally:
            self._rows_repaint_alone = False

    def refresh(self, *regions: Region, repaint: bool = True, layout: bool = False,
                recompose: bool = False) -> DataTable:
        # update_cell repaints the whole table; show_rows repaints the changed rows instead.
        if self._rows_repaint_alone and not (regions or layout or recompose):
            return self
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)

    def action_half_page(self, step: int) -> None:
        rows = self.scrollable_content_region.height - self.header_height
        self.move_cursor(row=max(0, self.cursor_row + step * max(1, rows // 2)), animate=False)

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


def _literal_cell(cell: Cell) -> Cell:
    return literal(cell, end="") if isinstance(cell, str) else cell


def plain(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def same_cell(a: Cell, b: Cell) -> bool:
    """Whether two cells draw the same (rich Text's own equality ignores its style)."""
    if isinstance(a, Text) and isinstance(b, Text):
        return a.plain == b.plain and a.style == b.style and a.spans == b.spans
    return type(a) is type(b) and a == b


@dataclass(frozen=True)
class SortKey:
    label: str
    reverse: bool

    def value(self, row: CardRow):
        c = row.card
        return {"share": c.share, "best": row.best_over_eager or 0.0, "eager": c.eager_us or 0.0,
                "calls": c.calls, "op": c.short_op, "status": row.status}[self.label]


SORTS = (SortKey("share", True), SortKey("best", True), SortKey("eager", True),
         SortKey("calls", True), SortKey("op", False), SortKey("status", False))


class OpTable(VimTable):
    """The op profile: one row per op card, targets first. Where its cells do not fit the
    table's width, their narrower forms are taken column by column (``_widths``) as far as
    needed; where even those do not fit (a pane of 40 columns beside the others), columns are
    left out, least needed first (``DROPS``), so that the table never scrolls sideways: the op,
    its share, its best speedup and its status always show.

    Headings say what a figure is relative to and where it came from: ``×eager`` (the best
    kernel's speedup over eager, both timed by the evaluator; ``-`` where no kernel beats eager
    or torch.compile) and ``eager`` with its source (``prof``: the profile's GPU time per call in
    the model run, before the evaluator has timed the op; ``eval``: the evaluator's device time
    per call, op alone; a table that holds both marks each cell). ``share`` is the op's share of
    the profiled model's time. An op with a would-be best under confirmation says
    ``confirming``; its figure counts only once confirmed."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "next_sort", "sort", id="sort"),
        Binding("i", "screen.op_details", "details", id="op_details"),
        Binding("enter", "select_cursor", "its search tree", show=False, id="select"),
    ]
    # The figures people scan for come first, so they fit at 80 columns; shapes can be long.
    # "share" draws the op's share of the model's time as a bar; "trend" the best speedup over
    # the op's iterations.
    COLUMNS = ("op", "share", "best", "trend", "eager", "calls", "dtype", "status", "shapes")
    HEADINGS = {"best": "×eager"}  # by column key; the others are headed by their key
    OP_WIDTH = 22
    BAR_WIDTH = 3
    TREND_WIDTH = 6
    PERCENT_WIDTH = 6  # "100.0%", after the share bar
    # What gives way, in this order, as far as the columns need: the eager times of a table of
    # both sources (their unit moves to the heading: "eager us", "254.9 eval"), the shapes (down
    # to their heading), the status's stop reason, a long op name (down to OP_SHORT cells), the
    # share bar (down to one cell), the status words (down to SHORT_STATUS), the share bar and
    # the trend (down to their figures and heading), the op name (down to OP_SHORTEST), the
    # dtypes (down to their heading).
    OP_SHORT = 12
    OP_SHORTEST = 8
    EAGER_UNIT_HEADING = "eager us"
    # Left out in this order where even the narrowest cells do not fit (``i`` shows them all).
    DROPS = ("shapes", "dtype", "calls", "trend", "eager")

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sort = SORTS[0]
        self.name_filter = ""
        self._cards: list[CardRow] = []
        self._focus: int | None = None
        self._trends: Mapping[int, Sequence[float]] = {}
        self._confirming: Set[int] = frozenset()
        self._mixed = False  # eager figures of both sources: each cell names its own
        self.shown: tuple[str, ...] = ()  # the columns in the table, in COLUMNS order

    def on_mount(self) -> None:
        self._show_columns(self.COLUMNS)

    def _show_columns(self, names: Sequence[str]) -> None:
        """Make the table's columns these (its rows go with them: ``show_rows`` adds them)."""
        labels = {key.value: column.label for key, column in self.columns.items()}
        self.clear(columns=True)
        for name in names:
            self.add_column(labels.get(name, Text(self.HEADINGS.get(name, name))), key=name)
        self.shown = tuple(names)

    def on_resize(self) -> None:
        self._fill()

    def show(self, cards: list[CardRow], focus: int | None,
             trends: Mapping[int, Sequence[float]] | None = None,
             confirming: Set[int] = frozenset()) -> None:
        """Show the cards; ``trends`` holds each card's best speedup after each iteration,
        ``confirming`` the cards with a kernel under confirmation."""
        self._cards, self._focus = cards, focus
        self._trends = trends if trends is not None else {}
        self._confirming = confirming
        self._fill()

    def action_next_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self._fill()
        self.notify(f"ops sorted by {self.sort.label}", timeout=2)

    def set_filter(self, text: str) -> None:
        self.name_filter = text.strip().lower()
        self._fill()

    def visible_cards(self) -> list[CardRow]:
        return [row for row, _ in self._visible()]

    @staticmethod
    def row_key(row: CardRow, region: CardRow | None) -> str:
        """A row's key: its card's id, and for an op card inside a fusion region the region's id
        before it (several regions may call the same op card, each listing it)."""
        return str(row.id) if region is None else f"{region.id}/{row.id}"

    @staticmethod
    def card_id(key: str) -> int:
        """The id of the card a row key shows."""
        return int(key.rsplit("/", 1)[-1])

    @property
    def selected_card(self) -> int | None:
        key = self.selected_key
        return self.card_id(key) if key is not None else None

    def select_card(self, card_id: int) -> None:
        """Put the cursor on the card's first row."""
        key = next((row.key.value for row in self.ordered_rows
                    if row.key.value is not None and self.card_id(row.key.value) == card_id),
                   None)
        if key is not None:
            self.select_key(key)

    def _visible(self) -> list[tuple[CardRow, CardRow | None]]:
        """The rows shown, in order, each with the fusion region it is an op card of, if any
        above it (folded under it, whatever the sort)."""
        rows = [c for c in self._cards
                if not self.name_filter or self.name_filter in c.card.op.lower()]
        return folded(sorted(rows, key=lambda r: (not r.card.target, self._ordered(r))),
                      attrgetter("card"))

    def _ordered(self, row: CardRow):
        value = self.sort.value(row)
        return -value if self.sort.reverse and isinstance(value, (int, float)) else value

    def _fill(self) -> None:
        rows = self._visible()
        sources = {row.eager_source for row, _ in rows if row.card.eager_us is not None}
        self._mixed = len(sources) > 1
        label = "eager" if len(sources) != 1 else f"eager {next(iter(sources))}"
        widths = self._widths(rows, label)
        if self._mixed and widths.get("eager", 0) < self._eager_whole(rows):
            label = self.EAGER_UNIT_HEADING  # the cells leave their unit to the heading
        shown = tuple(name for name in self.COLUMNS if name in widths)
        reshaped = shown != self.shown
        keep = self.selected_key
        if reshaped:
            self._show_columns(shown)
        relabelled = self._label_eager(label)
        narrower = reshaped or relabelled or any(
            self.columns[name].content_width > width for name, width in widths.items())
        picked = [self.COLUMNS.index(name) for name in shown]
        table = []
        for row, region in rows:
            cells = self._cells(row, widths, region is not None)
            table.append((self.row_key(row, region), [cells[i] for i in picked]))
        self.show_rows(table, narrower)
        if reshaped and keep is not None:
            self.select_key(keep)

    def _label_eager(self, label: str) -> bool:
        """Head the eager column with its figures' source; whether the heading changed."""
        column = self.columns.get("eager")
        if column is None or column.label.plain == label:
            return False
        column.label = Text(label)
        return True

    def heading(self, name: str) -> str:
        column = self.columns.get(name)
        return column.label.plain if column is not None else self.HEADINGS.get(name, name)

    def _room(self, rows: int) -> int:
        """The cells the columns may take side by side, padding included: the table's width
        less its vertical scrollbar where the rows overflow its height."""
        room = self.size.width
        if rows + 1 > self.size.height:  # the header takes a line
            room -= self.styles.scrollbar_size_vertical
        return room

    def _eager_whole(self, rows: list[tuple[CardRow, bool]]) -> int:
        return max((len(self._eager(row, None)) for row, _ in rows), default=0)

    def _widths(self, rows: list[tuple[CardRow, bool]], eager_label: str) -> dict[str, int]:
        """Each shown column's width for these rows: whole cells where they fit, else narrowed
        in the order the class's comment gives, each as far as the others still need, and where
        that is not enough, without the columns of ``DROPS``, one by one, as far as needed."""
        cards = [row for row, _ in rows]
        whole = [self._cells(row, {}, region is not None) for row, region in rows]
        heads = {name: len(self.HEADINGS.get(name, name)) for name in self.COLUMNS}
        heads["eager"] = len(eager_label)
        needs = {name: max([heads[name], *(cell_len(cells[i].plain) for cells in whole)])
                 for i, name in enumerate(self.COLUMNS)}
        if not self.size.width:  # not laid out yet: its first resize fills it again
            return needs
        marks = [("◎ " if row.id == self._focus else "", row.id in self._confirming)
                 for row in cards]
        words = max((len(card_status(replace(row, stop_reason=""), focus != "", confirming))
                     for (focus, confirming), row in zip(marks, cards)), default=0)
        short = max((len(focus + short_status(CONFIRMING if confirming else row.status))
                     for (focus, confirming), row in zip(marks, cards)), default=0)
        eager = max([len(self.EAGER_UNIT_HEADING),
                     *(len(self._eager(row, 0)) for row in cards)]) if self._mixed else 0
        floors = [("eager", eager), ("shapes", 0), ("status", words), ("op", self.OP_SHORT),
                  ("share", 1 + self.PERCENT_WIDTH), ("status", short),
                  ("share", 0), ("trend", 0), ("op", self.OP_SHORTEST), ("dtype", 0)]
        room = self._room(len(cards))
        drops = list(self.DROPS)
        while True:
            widths = narrowed(needs, [f for f in floors if f[0] in needs],
                              room - 2 * self.cell_padding * len(needs), heads)
            if sum(widths.values()) + 2 * self.cell_padding * len(needs) <= room or not drops:
                return widths
            del needs[drops.pop(0)]

    def _eager(self, row: CardRow, width: int | None) -> str:
        """A card's eager time per call: with its source in a table of both sources, and where
        ``width`` is less than that needs, without its unit (microseconds, as the heading then
        says)."""
        us = row.card.eager_us
        whole = fmt_us(us)
        if not self._mixed or us is None:
            return whole
        whole += f" {row.eager_source}"
        if width is None or len(whole) <= width:
            return whole
        return f"{us:.1f} {row.eager_source}" if us < 1000 else f"{us:.0f} {row.eager_source}"

    def _cells(self, row: CardRow, widths: Mapping[str, int],
               in_region: bool = False) -> tuple[Text, ...]:
        """A card's cells, each at most as wide as ``widths`` says (whole where it says
        nothing); an op card inside the fusion region above it is marked and in italics."""
        c = row.card
        style = "" if c.target and not in_region else "italic"  # dim text would not read
        op_width = min(widths.get("op", self.OP_WIDTH), self.OP_WIDTH)
        mark = "└ " if in_region else ""
        suffix = range_suffix(c, op_width - len(mark))
        op = mark + clip(c.short_op, max(op_width - len(suffix) - len(mark), 2)) + suffix
        share_width = widths.get("share", self.BAR_WIDTH + self.PERCENT_WIDTH)
        bar = min(share_width - self.PERCENT_WIDTH, self.BAR_WIDTH)
        percent = percent_text(c.share)
        share = (f"{share_bar(c.share, bar)}{percent:>{self.PERCENT_WIDTH}}" if bar > 0
                 else percent.rjust(min(share_width, self.PERCENT_WIDTH)))
        trend_width = min(widths.get("trend", self.TREND_WIDTH), self.TREND_WIDTH)
        trend = sparkline(self._trends.get(row.id, ()), trend_width)
        shapes, dtype = c.shapes, dtype_of(row)
        cells = (op, share, best_cell(row), trend.ljust(trend_width),
                 self._eager(row, widths.get("eager")), str(c.calls),
                 clip(dtype, widths.get("dtype", len(dtype))),
                 status_text(row, row.id == self._focus, widths.get("status"),
                             row.id in self._confirming),
                 clip(shapes, widths.get("shapes", len(shapes))))
        return tuple(literal(cell, style=style, no_wrap=True, overflow="ellipsis")
                     for cell in cells)


def range_suffix(card: OpCard, room: int) -> str:
    """What follows a range card's op name in ``room`` cells: its whole range (`` L=1..4095``)
    where two cells of the name still fit beside it, else its symbols alone (`` L…``; the search
    tree's root line shows the whole range). Nothing for an exact card."""
    if card.ranges is None:
        return ""
    whole = f" {card.range_text}"
    if room - len(whole) >= 2:
        return whole
    return " " + ",".join(symbol.name for symbol in Ranges.from_dict(card.ranges).symbols) + "…"


# The status words as a narrow op table shows them: four cells at most, so that a focus mark
# before one still fits under the column's heading.
SHORT_STATUS = {CardStatus.PENDING: "todo", CardStatus.SEARCHING: "run",
                CardStatus.STOPPED: "stop", CardStatus.DONE: "done", CardStatus.SKIPPED: "skip",
                CONFIRMING: "conf"}


def short_status(status: str) -> str:
    return SHORT_STATUS.get(status, status)


def status_text(row: CardRow, focused: bool, width: int | None = None,
                confirming: bool = False) -> str:
    """A card's status in at most ``width`` cells where that can be: its word and stop reason
    (the reason cut with an ellipsis, three cells of it at least), else its word alone, else its
    short word. While one of its kernels is confirming, the word is ``confirming``."""
    whole = card_status(row, focused, confirming)
    if width is None or len(whole) <= width:
        return whole
    word = card_status(replace(row, stop_reason=""), focused, confirming)
    if row.stop_reason and not confirming and len(word) + len(": ") + 3 + len("…") <= width:
        return clip(whole, width)
    if len(word) <= width:
        return word
    status = short_status(CONFIRMING if confirming else row.status)
    return card_status(replace(row, status=status, stop_reason=""), focused)


def narrowed(needs: Mapping[str, int], floors: Sequence[tuple[str, int]], room: int,
             heads: Mapping[str, int] | None = None) -> dict[str, int]:
    """Column widths (``needs``: each column's whole width) that take at most ``room`` cells
    where they can: each of ``floors`` in turn narrows its column towards its floor (never below
    its heading's width, ``heads``, by default the column's name) as far as still needed. Where
    all of them do not make the columns fit, each stays as narrowed as it got (pure)."""
    widths = dict(needs)
    over = sum(widths.values()) - room
    for name, floor in floors:
        if over <= 0:
            break
        head = heads[name] if heads is not None else len(name)
        cut = min(over, max(0, widths[name] - max(floor, head)))
        widths[name] -= cut
        over -= cut
    return widths
