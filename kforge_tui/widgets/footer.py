"""The footer of the full screens: their keys, with help and quit first, as many as fit whole
(a narrow terminal, 80 columns, leaves out the keys needed least rather than cutting one in the
middle); every key is also listed by ? and the palette."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

FIRST = ("help", "quit")  # actions whose keys always show


def key_width(key: FooterKey) -> int:
    """Cells a compact footer gives a key: its key, a space, its words, a space after."""
    return len(key.key_display) + 1 + len(key.description) + 1


class KeysFooter(Footer):
    """A screen may word its keys for what they do now, or leave some out (``footer_label``:
    an action and its binding's words, to the words shown or None)."""

    def __init__(self) -> None:
        super().__init__(compact=True)

    def compose(self) -> ComposeResult:
        label = getattr(self.screen, "footer_label", lambda _action, words: words)
        keys = []
        for key in super().compose():
            if isinstance(key, FooterKey) and not key.has_class("-command-palette"):
                words = label(key.action, key.description)
                if words is None:
                    continue
                key.description = words
            keys.append(key)
        keys.sort(key=lambda key: getattr(key, "action", None) not in FIRST)
        palette = [key for key in keys if key.has_class("-command-palette")]
        room = (self.size.width or self.app.size.width) - sum(key_width(k) + 1 for k in palette)
        for key in keys:
            if key in palette:
                continue
            if isinstance(key, FooterKey):
                room -= key_width(key)
                if room < 0:
                    break
            yield key
        yield from palette

    def on_resize(self) -> None:
        self.refresh(recompose=True)
