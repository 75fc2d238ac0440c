"""The command palette's kforge commands: whatever the current screen offers."""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider


class KforgeCommands(Provider):
    """Lists ``screen.palette_commands()``: (title, help, callback) triples."""

    def _commands(self) -> list[tuple[str, str, object]]:
        offer = getattr(self.screen, "palette_commands", None)
        return offer() if offer else []

    async def discover(self) -> Hits:
        for title, help_text, callback in self._commands():
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, callback in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), partial(callback), help=help_text)
