"""The command palette's kforge commands: whatever the current screen offers, each shown with the
keys that do the same there now (after the user's ``[keys]`` remap). A title may quote stored text
(a session's model path): it is shown literally, never read as markup."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.content import Content
from textual.fuzzy import Matcher
from textual.screen import Screen

from kforge.core.inert import inert


@dataclass(frozen=True)
class PaletteCommand:
    """A palette entry: its title, what it runs, and either the id of the binding that does the
    same (whose keys the palette shows) or a line of help."""

    title: str
    run: Callable[[], object]
    binding: str | None = None
    help: str = ""


def keys_of(screen: Screen, binding_id: str) -> str:
    """The keys bound to ``binding_id`` on ``screen`` now, as the footer shows them."""
    shown = [screen.app.get_key_display(active.binding)
             for active in screen.active_bindings.values() if active.binding.id == binding_id]
    return " or ".join(dict.fromkeys(shown))


class KforgeCommands(Provider):
    """Lists ``screen.palette_commands()``."""

    def _commands(self) -> list[tuple[str, str, Callable[[], object]]]:
        offer = getattr(self.screen, "palette_commands", None)
        commands: list[PaletteCommand] = offer() if offer else []
        return [(inert(c.title), keys_of(self.screen, c.binding) if c.binding else c.help, c.run)
                for c in commands]

    async def discover(self) -> Hits:
        for title, help_text, run in self._commands():
            yield DiscoveryHit(Content(title), run, text=title, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, run in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, highlighted(matcher, title), run, text=title, help=help_text)


def highlighted(matcher: Matcher, title: str) -> Content:
    """``title`` as written, its characters that match the query highlighted (``Matcher.highlight``
    would read the title as markup)."""
    content = Content(title)
    _score, offsets = matcher.fuzzy_search.match(matcher.query, title)
    for offset in offsets:
        if not title[offset].isspace():
            content = content.stylize(matcher.match_style, offset, offset + 1)
    return content
