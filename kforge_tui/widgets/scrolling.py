"""Scrollbars that repaint only when what they show changed.

At each layout of the screen Textual's ScrollView compares the virtual size the compositor hands
it (its region's) with its own (its content's). The two differ whenever the content does not fill
the widget exactly, so every layout anywhere on the screen (a log line, a tree line) repainted the
scrollbars of every table and tree: about 1 KB each at 120 columns, the largest share of what a
live search sent to the terminal.
"""

from __future__ import annotations

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
