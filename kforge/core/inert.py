"""Text from data (a database, an LLM reply, a model's names) made inert for a terminal: the one
sanitizer every screen kforge draws passes such text through.

Control characters are dropped: ESC (which starts the sequences that write the clipboard
(OSC 52), set the window title or clear the screen), the other C0 and C1 controls, DEL, and the
bidirectional overrides that make text read differently from what it is. Newlines and tabs stay.

Stored text is shown bounded (``capped``): a database may hold a text of any length, and a view
that laid out all of it took a minute and printed 30 MB for one 5 MB text.
"""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def inert(text: str) -> str:
    """``text`` without the characters a terminal would act on."""
    return _CONTROL.sub("", text)


def capped(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, with one line (or, in one line of text, a note at
    its end) saying how much was left out."""
    if len(text) <= limit:
        return text
    kept = text[:limit]
    return (f"{kept}{chr(10) if chr(10) in kept else ' '}[... {len(text) - limit:,} more "
            "characters not shown]")
