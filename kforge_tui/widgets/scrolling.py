"""Scrolling as the panes do it: scrollbars that repaint only when what they show changed, and a
scrolled box that takes the panes' keys.

Scrollbars:

At each layout of the screen Textual's ScrollView compares the virtual size the compositor hands
it (its region's) with its own (its content's). The two differ whenever the content does not fill
the widget exactly, so every layout anywhere on the screen (a log line, a tree line) repainted the
scrollbars of every table and tree: about 1 KB each at 120 columns, the largest share of what a
live search sent to the terminal.
"""

from __future__ import annotations

from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.geometry import Size


class SteadyScrollbars:
    """Mixed in before a ScrollView widget class (not a widget itself, so the widget still
    inherits its CSS from its own class): the scrollbars are updated when the widget's size, its
    content's size or its container changed, not at every layout of the screen."""

    _scrollbars_fit: tuple[Size, Size, Size] | None = None
    virtual_size: Size

    def _size_updated(self, size: Size, virtual_size: Size, container_size: Size,
                      layout: bool = True) -> bool:
        fit = (size, self.virtual_size, container_size)
        if fit == self._scrollbars_fit:
            return False  # nothing moved: no resize event, no repaint
        self._scrollbars_fit = fit
        return super()._size_updated(  # type: ignore[misc]
            size, virtual_size, container_size, layout)


# Half a page down and up, in every pane and dialog that scrolls (as in less, vim, lazygit).
HALF_PAGE_KEYS: list[BindingType] = [
    Binding("ctrl+d", "half_page(1)", "half a page down", show=False, id="half_down"),
    Binding("ctrl+u", "half_page(-1)", "half a page up", show=False, id="half_up"),
]
# The keys that move through a long text, as in the panes.
SCROLL_KEYS: list[BindingType] = [
    Binding("j,down", "line(1)", "down", show=False, id="down"),
    Binding("k,up", "line(-1)", "up", show=False, id="up"),
    Binding("g,home", "first", "top", show=False, id="top"),
    Binding("G,end", "last", "bottom", show=False, id="bottom"),
    *HALF_PAGE_KEYS,
]


class PagerKeys:
    """Mixed in before a scrolling widget class, the actions of ``SCROLL_KEYS`` (which the class
    binds: Textual reads bindings from widget classes only) move its view."""

    def action_line(self, step: int) -> None:
        self.scroll_relative(y=step, animate=False)  # type: ignore[attr-defined]

    def action_first(self) -> None:
        self.scroll_home(animate=False)  # type: ignore[attr-defined]

    def action_last(self) -> None:
        self.scroll_end(animate=False)  # type: ignore[attr-defined]

    def action_half_page(self, step: int) -> None:
        half = max(1, self.scrollable_content_region.height // 2)  # type: ignore[attr-defined]
        self.scroll_relative(y=step * half, animate=False)  # type: ignore[attr-defined]


class VimScroll(PagerKeys, VerticalScroll):
    """A scrolled box (a dialog's text) that moves with the panes' keys."""

    BINDINGS: ClassVar[list[BindingType]] = SCROLL_KEYS
