"""A screen that stays cheap to draw while a dialog covers it.

Under a dialog, Textual hands each change of the screen below to the dialog as the changed
regions, which is all the terminal needs, and then also marks the whole screen below for a
repaint: its next change, however small, repaints the whole terminal (80 KB/s under help over a
live search). A ``Backdrop`` drops that mark; what changed under the dialog still reaches the
terminal region by region, and the screen repaints whole when it is on top again.
"""

from __future__ import annotations

from textual.screen import Screen


class Backdrop(Screen):
    def _compositor_refresh(self) -> None:
        below = self is not self.app.screen and self in self.app._background_screens
        super()._compositor_refresh()
        if below:
            self._repaint_required = False
