"""A read-only text view for kernel source, launch plans and logs, coloured by the app's theme."""

from __future__ import annotations

from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.widgets import TextArea

from kforge.core.inert import inert
from kforge_tui.highlight import TEXT_AREA_THEME, register_cuda, text_area_theme


class CodeView(TextArea):
    """TextArea, read-only, with vim scrolling; knows the CUDA language and follows the theme."""

    DEFAULT_CSS = """
    CodeView, CodeView:focus { border: none; padding: 0; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j", "cursor_down", "down", show=False, id="down"),
        Binding("k", "cursor_up", "up", show=False, id="up"),
        Binding("g", "cursor_top", "top", show=False, id="top"),
        Binding("G", "cursor_bottom", "bottom", show=False, id="bottom"),
    ]

    def __init__(self, language: str | None = None, **kwargs) -> None:
        super().__init__("", read_only=True, show_line_numbers=language is not None,
                         soft_wrap=language is None, **kwargs)
        self._wanted_language = language

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

    def action_cursor_top(self) -> None:
        self.move_cursor((0, 0))

    def action_cursor_bottom(self) -> None:
        self.move_cursor((self.document.line_count - 1, 0))
