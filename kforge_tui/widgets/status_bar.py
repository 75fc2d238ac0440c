"""The one-line bar at the top of each screen: where you are, progress, budget and the GPU."""

from __future__ import annotations

from textual.widgets import Static

from kforge.core.inert import inert


class StatusBar(Static):
    """Shows its text literally: it holds model paths and session names."""

    DEFAULT_CSS = """
    StatusBar {
        dock: top; height: 1; padding: 0 1;
        background: $panel; color: $foreground; text-style: bold;
    }
    """

    def __init__(self, content: str = "", **kwargs) -> None:
        super().__init__(inert(content), markup=False, **kwargs)

    def show(self, text: str) -> None:
        text = inert(text)
        # An update repaints the bar and lays the screen out again: only for new text.
        if text != self.content:
            self.update(text, layout=False)
