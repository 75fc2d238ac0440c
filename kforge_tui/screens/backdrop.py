"""A screen that stays cheap to draw while a dialog covers it.

Under a dialog, Textual hands each change of the screen below to the dialog as the changed
regions, then also marks the whole screen below for a repaint: its next change, however small,
repaints the whole terminal (80 KB/s under help over a live search). A ``Backdrop`` drops that
mark, and hands on only the parts of a change that show: what a dialog's box covers
would be sent as the box again, unchanged (most of the bytes under help, which covers the
screen's middle from top to bottom). The screen repaints whole when it is on top again.
"""

from __future__ import annotations

from collections.abc import Iterable

from textual.geometry import Region
from textual.screen import Screen


def uncovered(region: Region, cover: Region) -> list[Region]:
    """The parts of ``region`` outside ``cover``: at most a band above, one below, and the two
    sides of the band between."""
    inside = region.intersection(cover)
    if not inside:
        return [region]
    parts = [Region(region.x, region.y, region.width, inside.y - region.y),
             Region(region.x, inside.bottom, region.width, region.bottom - inside.bottom),
             Region(region.x, inside.y, inside.x - region.x, inside.height),
             Region(inside.right, inside.y, region.right - inside.right, inside.height)]
    return [part for part in parts if part]


def shown(regions: Iterable[Region], covers: Iterable[Region]) -> list[Region]:
    """What of ``regions`` no cover hides."""
    parts = list(regions)
    for cover in covers:
        parts = [part for region in parts for part in uncovered(region, cover)]
    return parts


class Backdrop(Screen):
    def _covers(self) -> list[Region]:
        """Where the screens above this one draw widgets of their own. Only a screen's own
        background lets what is under it show through: a widget owns its cells whatever its
        colours, so a box with a transparent background hides the screen below it as well."""
        stack = self.app.screen_stack
        return [child.region for above in stack[stack.index(self) + 1:]
                for child in above.children if child.display and child.visible]

    def _compositor_refresh(self) -> None:
        app = self.app
        if app.is_inline or self is app.screen or self not in app._background_screens:
            super()._compositor_refresh()
            return
        dirty = self._compositor._dirty_regions
        if dirty:
            self._set_dirty(*dirty)
            if parts := shown(dirty, self._covers()):
                app.screen.refresh(*parts)
            dirty.clear()
            self._dirty_widgets.clear()
        app._update_mouse_over(self)
