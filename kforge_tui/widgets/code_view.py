"""A read-only text view for kernel source, launch plans and logs, coloured by the app's theme:
it scrolls as a pager does (j/k, g/G, ctrl+d/ctrl+u), and finds text (/, then n and N)."""

from __future__ import annotations

import re
from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.geometry import Region
from textual.widgets import TextArea
from textual.widgets.text_area import Selection

from kforge.core.inert import inert
from kforge_tui.highlight import TEXT_AREA_THEME, register_cuda, text_area_theme
from kforge_tui.screens.dialogs import Ask
from kforge_tui.terminal_scroll import TerminalScrolls, band
from kforge_tui.widgets.scrolling import SCROLL_KEYS


class CodeView(TextArea):
    """TextArea, read-only and without a cursor: the keys move the view, not a cursor, and a
    move of a few lines scrolls the terminal's own rows where it can (``terminal_scroll``):
    only the lines scrolled in are sent. Knows the CUDA language and follows the theme."""

    DEFAULT_CSS = """
    CodeView, CodeView:focus { border: none; padding: 0; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        *SCROLL_KEYS,
        Binding("slash", "find", "find", id="find"),
        Binding("n", "next_match(1)", "next match", id="next_match"),
        Binding("N", "next_match(-1)", "previous match", show=False, id="previous_match"),
    ]

    def __init__(self, language: str | None = None, **kwargs) -> None:
        super().__init__("", read_only=True, show_line_numbers=language is not None,
                         soft_wrap=language is None, show_cursor=False, **kwargs)
        self._wanted_language = language
        self.pattern = ""  # the text / last looked for
        self._moved = 0  # lines the terminal was asked to move, not written yet (signed)
        self._scrolled_in: Region | None = None  # the screen's rows the next scroll repaints

    def on_mount(self) -> None:
        register_cuda(self)
        self.apply_syntax_theme()
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.apply_syntax_theme())
        wanted = self._wanted_language
        self.language = wanted if wanted in self.available_languages else None

    def apply_syntax_theme(self) -> None:
        roles = getattr(self.app, "syntax_roles", dict)()
        self.register_theme(text_area_theme(roles))
        self.theme = TEXT_AREA_THEME

    def show_text(self, text: str) -> None:
        self.load_text(inert(text))  # stored text: a TextArea never reads markup
        self.scroll_home(animate=False)

    # ----- scrolling -----

    def action_line(self, step: int) -> None:
        self.scroll_lines(step)

    def action_half_page(self, step: int) -> None:
        self.scroll_lines(step * max(1, self.scrollable_content_region.height // 2))

    def action_first(self) -> None:
        self.scroll_lines(-round(self.scroll_y))

    def action_last(self) -> None:
        self.scroll_lines(self.max_scroll_y - round(self.scroll_y))

    def scroll_lines(self, lines: int) -> None:
        """Scroll the view by ``lines`` (up where negative). A move of fewer lines than the view
        shows, the same way as the moves not written yet, moves the terminal's rows and repaints
        only the lines scrolled in; any other repaints the view."""
        now = round(self.scroll_y)
        moved = max(0, min(now + lines, self.max_scroll_y)) - now
        if not moved:
            return
        height = self.scrollable_content_region.height
        total = self._moved + moved
        rows = band(self) if isinstance(self.app, TerminalScrolls) else None
        if rows is not None and self._moved * moved >= 0 and abs(total) < height:
            self.app.scroll_terminal(rows, moved, self._written)
            self._moved = total
            # The terminal's rows scrolled in are blank from edge to edge: they are drawn again
            # whole, what holds the view (a pane's borders) too.
            top = rows.y + (height - total if total > 0 else 0)
            self._scrolled_in = Region(rows.x, top, rows.width, abs(total))
        self.scroll_to(y=now + moved, animate=False, immediate=True)

    def _written(self) -> None:
        self._moved = 0

    def watch_scroll_y(self, old: float, new: float) -> None:
        scrolled_in, self._scrolled_in = self._scrolled_in, None
        if scrolled_in is None:
            super().watch_scroll_y(old, new)
            return
        self.vertical_scrollbar.position = new
        # Every line the view drew before now shows another line of the text: each is drawn
        # again when next asked for (a toast going), only those scrolled in now; and the
        # scrollbar, which the terminal moved with the rows, whole.
        self._styles_cache.clear()
        content = self.scrollable_content_region
        self.screen.refresh(scrolled_in, Region(content.right, content.y,
                                                self.region.right - content.right,
                                                content.height))

    # ----- finding text -----

    def action_find(self) -> None:
        self.app.push_screen(Ask("Find (a capital letter: match case; empty: none)",
                                 self.pattern, "e.g. __syncthreads"), self.find)

    def find(self, pattern: str | None) -> None:
        if pattern is None:
            return
        self.pattern = pattern
        if pattern:
            self.action_next_match(1)
        else:
            self.selection = Selection.cursor(self.selection.end)

    def action_next_match(self, step: int) -> None:
        """Select the next match of the pattern after the one selected (the previous one where
        ``step`` is -1), or the first one in view, going round the ends; say which it is."""
        if not self.pattern:
            self.app.notify("/ to find text first", timeout=3)
            return
        matches = self.matches()
        if not matches:
            self.app.notify(f"no match for {self.pattern!r}", timeout=3)
            return
        if self.selection.start != self.selection.end:
            here = self.selection.start
        else:  # nothing found yet: from the view's first line
            here = (round(self.scroll_y), -1) if step > 0 else (round(self.scroll_y) + 1, 0)
        after = [m for m in matches if (m[0] > here if step > 0 else m[0] < here)]
        start, end = (after[0] if after else matches[0]) if step > 0 else \
            (after[-1] if after else matches[-1])
        self.selection = Selection(start, end)
        height = self.scrollable_content_region.height
        if not self.scroll_y <= start[0] < self.scroll_y + height:  # a third down the view
            self.scroll_lines(start[0] - height // 3 - round(self.scroll_y))
        self.app.notify(f"{self.pattern!r}: match {matches.index((start, end)) + 1} of "
                        f"{len(matches)}", timeout=2)

    def matches(self) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """Where the pattern occurs, as (start, end) locations: ignoring case unless the pattern
        holds a capital letter (as vim's smartcase)."""
        flags = 0 if any(c.isupper() for c in self.pattern) else re.IGNORECASE
        found = re.compile(re.escape(self.pattern), flags)
        return [((row, m.start()), (row, m.end()))
                for row, line in enumerate(self.text.split("\n"))
                for m in found.finditer(line)]
