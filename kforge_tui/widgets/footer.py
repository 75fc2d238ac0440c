"""The footer of the full screens: their keys, with help and quit first, so that a narrow
terminal (80 columns) cuts the keys needed least; every key is also listed by ? and the palette."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Footer

FIRST = ("help", "quit")  # actions whose keys always show


class KeysFooter(Footer):
    def __init__(self) -> None:
        super().__init__(compact=True)

    def compose(self) -> ComposeResult:
        keys = list(super().compose())
        yield from sorted(keys, key=lambda key: getattr(key, "action", None) not in FIRST)
