"""The one-line bar at the top of each screen: where you are, progress, budget and the GPU."""

from __future__ import annotations

from textual.widgets import Static


class StatusBar(Static):
    DEFAULT_CSS = """
    StatusBar {
        dock: top; height: 1; padding: 0 1;
        background: $panel; color: $foreground; text-style: bold;
    }
    """

    def show(self, text: str) -> None:
        # An update repaints the bar and lays the screen out again: only for new text.
        if text != self.content:
            self.update(text, layout=False)
