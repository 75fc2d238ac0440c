"""A log of plain lines that wrap to its width (a long line, such as the e2e summary, reads whole
on 80 columns) and wrap again when it is resized. Lines show as they are: never read as markup,
the characters a terminal would act on dropped (``inert``). The panes' keys scroll it."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import ClassVar

from rich.text import Text
from textual.binding import BindingType
from textual.events import Resize
from textual.widgets import RichLog

from kforge.core.inert import inert
from kforge_tui.widgets.scrolling import SCROLL_KEYS, PagerKeys


class WrappingLog(PagerKeys, RichLog):
    BINDINGS: ClassVar[list[BindingType]] = SCROLL_KEYS

    def __init__(self, max_lines: int | None = None, **kwargs) -> None:
        super().__init__(max_lines=max_lines, wrap=True, markup=False, highlight=False,
                         min_width=1, **kwargs)
        self.messages: deque[str] = deque(maxlen=max_lines)  # the lines as written, to rewrap
        self._wrapped_at = 0

    def write_line(self, line: str) -> None:
        self.write_lines([line])

    def write_lines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.messages.append(inert(line))
            self.write(Text(self.messages[-1]))  # a Text: never read as markup

    def clear(self) -> WrappingLog:
        self.messages.clear()
        return super().clear()

    def on_resize(self, event: Resize) -> None:
        width = event.size.width
        if width and self._wrapped_at and width != self._wrapped_at:
            RichLog.clear(self)
            for line in self.messages:
                self.write(Text(line))
        self._wrapped_at = width or self._wrapped_at
