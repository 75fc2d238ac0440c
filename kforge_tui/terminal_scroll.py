"""Scrolling a view by a few lines as a terminal scrolls: the terminal moves the lines that stay on
screen itself, and only the lines scrolled in are sent.

Textual repaints a scrolled view whole: every line of a kernel in colour, about 9 KB at 80x24
for each line moved (214 KB/s while j is held). A terminal can move a band of its rows up or
down itself (a scrolling region, DECSTBM, then SU or SD: what less and vim send), which costs a
few bytes. That is only right where every row of the band moves whole with the view: the band is
the view's rows, the whole width of the terminal, and nothing else shows in it but the view and
what holds it (a pane's side borders, the same on every row). ``band`` checks that from what the
screen shows now; elsewhere (four panes side by side, a toast over the view) the view repaints
as Textual does.

The moves go out in front of the next update the app writes, the one that carries the rows they
scrolled in (``TerminalScrolls._display``): one frame, in order. A full repaint needs none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Console
from textual._compositor import ChopsUpdate, CompositorUpdate
from textual.app import App
from textual.geometry import Region
from textual.screen import Screen
from textual.widget import Widget


def scroll_rows(band: Region, lines: int) -> str:
    """What makes a terminal move the rows of ``band`` up by ``lines`` (down where negative),
    then forget the band: a scrolling region, a scroll, and the whole screen as its region
    again."""
    move = f"\x1b[{lines}S" if lines > 0 else f"\x1b[{-lines}T"
    return f"\x1b[{band.y + 1};{band.bottom}r{move}\x1b[r"


def band(widget: Widget) -> Region | None:
    """The terminal rows a scroll of ``widget`` may move whole (the whole width, the rows of its
    scrolled content), where nothing but the widget, its scrollbars and what holds it shows in
    them; None where something else does, or the widget is not on the app's top screen."""
    screen = widget.screen
    if not widget.is_attached or screen is not widget.app.screen:
        return None
    content = widget.scrollable_content_region
    rows = Region(0, content.y, screen.size.width, content.height)
    if not content or content.width <= 0:
        return None
    holders = set(widget.ancestors_with_self)
    for other, (region, clip) in screen._compositor.visible_widgets.items():
        if other in holders or widget in other.ancestors:
            continue
        if region.intersection(clip).overlaps(rows):
            return None
    return rows


@dataclass
class Pending:
    """Moves not yet written, and who to tell once they are."""

    moves: list[str] = field(default_factory=list)
    written: list[Callable[[], None]] = field(default_factory=list)


class Prefixed(CompositorUpdate):
    """A compositor update with terminal sequences to write before it."""

    def __init__(self, before: str, update: CompositorUpdate) -> None:
        self.before = before
        self.update = update

    def render_segments(self, console: Console) -> str:
        return self.before + self.update.render_segments(console)


class TerminalScrolls(App):
    """An app whose views may scroll by moving the terminal's rows (``scroll_terminal``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pending: dict[Screen, Pending] = {}

    def scroll_terminal(self, rows: Region, lines: int, written: Callable[[], None]) -> None:
        """Move ``rows`` of the terminal by ``lines`` before the next update of the top screen;
        ``written`` is called once the move went out (or was not needed: a full repaint)."""
        pending = self._pending.setdefault(self.screen, Pending())
        pending.moves.append(scroll_rows(rows, lines))
        pending.written.append(written)

    def _display(self, screen: Screen, renderable) -> None:
        pending = self._pending.pop(screen, None) if renderable is not None else None
        if pending is not None:
            if isinstance(renderable, ChopsUpdate):  # a partial update: the rows it carries
                renderable = Prefixed("".join(pending.moves), renderable)
            for tell in pending.written:
                tell()
        super()._display(screen, renderable)
