"""The session screen's numbered panes: a 2x2 grid on a wide terminal, one pane at a time on a
small one (80x24); the grid knows which pane is active and which widget takes the focus in each."""

from __future__ import annotations

from textual.containers import Container, Vertical
from textual.content import Content
from textual.events import DescendantFocus
from textual.widget import Widget
from textual.widgets import TabbedContent, TabPane

from kforge.core.inert import inert

PANES = ("ops", "tree", "code", "logs")
PANE_TITLES = {"ops": "1 ops", "tree": "2 search tree", "code": "3 kernel", "logs": "4 logs"}
# Below this size the panes take turns instead of sharing the screen.
COMPACT_WIDTH, COMPACT_HEIGHT = 110, 30


class Pane(Vertical):
    """A bordered pane with its number and name in the border."""

    DEFAULT_CSS = """
    Pane {
        border: round $panel-lighten-2; height: 1fr;
        border-title-color: $foreground; border-subtitle-color: $foreground;
    }
    Pane:focus-within { border: round $primary; }
    Pane > * { height: 1fr; }
    """

    def __init__(self, name: str, *children: Widget) -> None:
        super().__init__(*children, id=f"pane-{name}")
        self.pane = name
        self.border_title = self._title = PANE_TITLES[name]

    def title_with(self, detail: str | None) -> None:
        """Show ``detail`` after the pane's own title (what it shows now); None: the title alone.
        ``detail`` may quote typed text (a filter): it is shown literally, never as markup."""
        title = PANE_TITLES[self.pane]
        text = inert(f"{title} · {detail}" if detail else title)
        if text != self._title:  # setting a title repaints the whole pane
            self._title = text
            self.border_title = Content(text)

    def focus_target(self) -> Widget:
        """The widget that takes the focus when the pane is chosen."""
        content = self.children[0]
        return content.focus_target() if isinstance(content, PaneTabs) else content


class PaneTabs(TabbedContent):
    """A pane's tabs, each holding one widget."""

    DEFAULT_CSS = """
    PaneTabs > ContentSwitcher { height: 1fr; }
    PaneTabs TabPane { padding: 0; height: 1fr; }
    """

    def __init__(self, *tabs: TabPane, id: str | None = None) -> None:
        super().__init__(id=id)
        for tab in tabs:
            self.compose_add_child(tab)

    def focus_target(self) -> Widget:
        """The active tab's widget (the tabs themselves while none is shown yet)."""
        tab = self.get_pane(self.active) if self.active else None
        return tab.children[0] if tab is not None and tab.children else self

    def cycle(self, step: int) -> None:
        ids = [tab.id for tab in self.query(TabPane)]
        self.active = ids[(ids.index(self.active) + step) % len(ids)]


class PaneGrid(Container):
    """The panes, in the order of PANES."""

    DEFAULT_CSS = """
    PaneGrid { layout: grid; grid-size: 2 2; grid-columns: 2fr 3fr; grid-rows: 2fr 3fr; }
    PaneGrid.-compact { grid-size: 1 1; grid-columns: 1fr; grid-rows: 1fr; }
    """

    def __init__(self, *panes: Pane, id: str | None = None) -> None:
        super().__init__(*panes, id=id)
        self.active = PANES[0]

    @property
    def compact(self) -> bool:
        return self.has_class("-compact")

    def fit(self, width: int, height: int) -> None:
        """Share the screen, or take turns when the terminal is small."""
        compact = width < COMPACT_WIDTH or height < COMPACT_HEIGHT
        self.set_class(compact, "-compact")
        for pane in self.query(Pane):
            pane.border_subtitle = "tab/1-4: other panes" if compact else ""
        self._mark_active(self.active)

    def pane(self, name: str) -> Pane:
        return self.query_one(f"#pane-{name}", Pane)

    def choose(self, name: str) -> None:
        """Make ``name`` the active pane and focus its widget, at once (not after the keys
        already queued: a key typed right after the pane key goes to the pane)."""
        self._mark_active(name)
        self.screen.set_focus(self.pane(name).focus_target())

    def step(self, step: int) -> None:
        self.choose(PANES[(PANES.index(self.active) + step) % len(PANES)])

    def cycle_tab(self, step: int) -> None:
        """Switch the active pane's tab, if it has tabs."""
        pane = self.pane(self.active)
        tabs = pane.children[0]
        if isinstance(tabs, PaneTabs):
            tabs.cycle(step)
            self.call_after_refresh(lambda: pane.focus_target().focus())  # once the tab shows

    def _mark_active(self, name: str) -> None:
        # display is set inline, not by a CSS class, so it holds at once: a key typed right
        # after the pane key already reaches the newly shown pane.
        self.active = name
        compact = self.compact
        for pane in self.query(Pane):
            pane.set_class(pane.pane == name, "-active")
            pane.display = not compact or pane.pane == name

    def on_descendant_focus(self, event: DescendantFocus) -> None:
        for pane in self.query(Pane):
            if event.widget in pane.walk_children() and pane.pane != self.active:
                self._mark_active(pane.pane)
