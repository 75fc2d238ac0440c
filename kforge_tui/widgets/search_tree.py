"""The live MCTS tree of one op card, built to stay responsive at 10,000 nodes.

Tree lines hold the model's ``NodeInfo`` objects, which the model updates in place; labels are
rendered from them on demand (``render_label``), so an update costs nothing until a line is drawn.
Children are added only when their parent is first expanded, and a timer repaints just the visible
lines whose figures changed (the model names them). Only new nodes under an already loaded parent
touch the tree's shape.
"""

from __future__ import annotations

from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from kforge.store.records import CardRow
from kforge_tui.format import (
    ICON_BEST,
    card_root_label,
    fmt_speedup,
    node_label,
)
from kforge_tui.search_model import NodeFilter, NodeInfo, SearchModel
from kforge_tui.widgets.scrolling import HALF_PAGE_KEYS, SteadyScrollbars

Line = TreeNode[NodeInfo | None]
# Widest label: "▼ ✔ #123456 refine 0.99x n=12345 ↳12.34x ★best: 12.34x over compile".
LABEL_WIDTH = 70


class SearchTree(SteadyScrollbars, Tree[NodeInfo | None]):
    """One card's search tree: status icon, result, visits and the subtree's best speedup."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j,down", "cursor_down", "down", show=False, id="down"),
        Binding("k,up", "cursor_up", "up", show=False, id="up"),
        Binding("g,home", "first", "top", show=False, id="top"),
        Binding("G,end", "last", "bottom", show=False, id="bottom"),
        Binding("l,right", "open_node", "expand", show=False, id="expand"),
        Binding("h,left", "close_node", "collapse", show=False, id="collapse"),
        Binding("enter", "select_cursor", "its kernel", show=False, id="select"),
        *HALF_PAGE_KEYS,
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "search-tree--ok", "search-tree--failed", "search-tree--flight", "search-tree--pruned",
        "search-tree--figures", "search-tree--best",
    }
    DEFAULT_CSS = """
    SearchTree > .search-tree--ok { color: $success; }
    SearchTree > .search-tree--failed { color: $error; }
    SearchTree > .search-tree--flight { color: $warning; }
    SearchTree > .search-tree--pruned { color: $text-muted; text-style: strike; }
    SearchTree > .search-tree--figures { color: $text-muted; }
    SearchTree > .search-tree--best { color: $accent; text-style: bold; }
    /* Textual draws them in $ansi-background, which is black: unseen on a black terminal. */
    SearchTree:ansi > .tree--guides { color: $text-muted; }
    """

    def __init__(self, model: SearchModel, **kwargs) -> None:
        super().__init__("no op selected", None, **kwargs)
        self.model = model
        self.card: CardRow | None = None
        self.node_filter = NodeFilter.ALL
        self.guide_depth = 2
        self.auto_expand = False
        self._lines: dict[int, Line] = {}  # node id -> its tree line, once loaded
        self._loaded: set[int] = set()  # ids whose children are in the tree (0: the root)

    # ----- what is shown -----

    def show_card(self, card: CardRow | None, keep_cursor: bool = False) -> None:
        """Show a card's tree from scratch (a new card or a new filter)."""
        cursor = self.selected_id if keep_cursor else None
        opened = {i for i, line in self._lines.items() if line.is_expanded} if keep_cursor else set()
        self.card = card
        self.clear()
        self._lines.clear()
        self._loaded.clear()
        if card is None:
            return
        self._load(self.root)
        self.root.expand()
        for node_id in sorted(opened):
            if node_id in self._lines:
                self._expand_loaded(self._lines[node_id])
        if cursor is not None:
            self.select_id(cursor)
        elif card.best_node is not None:
            self.select_id(card.best_node, focus_only=True)

    def update_card(self, card: CardRow) -> None:
        """The shown card as it is now: where its best kernel moved (or a best so far became one,
        beating eager or torch.compile), the lines that lose and gain ``★best`` repaint."""
        before = self.card.best_kernel if self.card is not None else None
        self.card = card
        after = card.best_kernel
        if before != after:
            for node_id in (before, after):
                line = self._lines.get(node_id) if node_id is not None else None
                if line is not None:
                    line.refresh()

    def set_filter(self, node_filter: NodeFilter) -> None:
        self.node_filter = node_filter
        self.show_card(self.card, keep_cursor=True)

    @property
    def selected_id(self) -> int | None:
        node = self.cursor_node
        return node.data.id if node is not None and node.data is not None else None

    def select_id(self, node_id: int, focus_only: bool = False) -> bool:
        """Move the cursor to a node, loading and expanding its ancestors on the way."""
        if self.card is None or node_id not in self.model.nodes:
            return False
        parent: Line = self.root
        for ancestor in self.model.ancestors(node_id):
            self._expand_loaded(parent)
            line = self._lines.get(ancestor)
            if line is None:  # filtered out
                return False
            parent = line
        self.last_line  # noqa: B018 - lays out the lines now, so the node knows its line
        self.move_cursor(parent, animate=False)
        if not focus_only:
            self.scroll_to_node(parent, animate=False)
        return True

    def open_all(self) -> None:
        """Load and expand every node (the whole tree on screen at once)."""
        pending = [self.root]
        while pending:
            line = pending.pop()
            if line is self.root or line.allow_expand:
                self._expand_loaded(line)
                pending.extend(line.children)

    # ----- live updates -----

    def nodes_changed(self, added: list[NodeInfo], removed: list[int]) -> None:
        """Fold in a batch of changes: add lines under loaded parents, drop removed ones, and
        leave the repaint of changed figures to the timer."""
        if self.card is None:
            return
        if self.node_filter is not NodeFilter.ALL and (added or removed):
            self.show_card(self.card, keep_cursor=True)  # which ancestors show may have changed
            return
        for node_id in removed:
            line = self._lines.pop(node_id, None)
            if line is not None:
                line.remove()
        for info in added:
            if info.row.card_id != self.card.id:
                continue
            parent_id = info.row.parent_id or 0
            parent = self.root if parent_id == 0 else self._lines.get(parent_id)
            if parent is None:
                continue
            if parent_id in self._loaded:
                self._add_line(parent, info)
            elif not parent.allow_expand:
                parent.allow_expand = True
        if any(info.row.card_id == self.card.id for info in added) or removed:
            self.root.refresh()  # its node count

    def repaint_if_dirty(self) -> None:
        """Repaint the visible lines whose figures changed since the last time (timer-driven);
        a line repaints alone, so a quiet tree sends nothing to the terminal."""
        touched = self.model.take_touched()
        if not touched:
            return
        top = int(self.scroll_offset.y)
        for line_no in range(top, top + self.size.height):
            node = self.get_node_at_line(line_no)
            if node is None:
                break
            if node.data is not None and node.data.id in touched:
                node.refresh()

    # ----- loading -----

    def _load(self, parent: Line) -> None:
        parent_id = parent.data.id if parent.data is not None else 0
        if parent_id in self._loaded or self.card is None:
            return
        self._loaded.add(parent_id)
        for info in self.model.children(self.card.id, parent_id or None, self.node_filter):
            self._add_line(parent, info)

    def _add_line(self, parent: Line, info: NodeInfo) -> None:
        assert self.card is not None
        shown = bool(info.children) and bool(
            self.model.children(self.card.id, info.id, self.node_filter))
        self._lines[info.id] = parent.add("", info, allow_expand=shown)

    def _expand_loaded(self, line: Line) -> None:
        self._load(line)
        if not line.is_expanded:
            line.expand()

    def _on_tree_node_expanded(self, event: Tree.NodeExpanded) -> None:
        self._load(event.node)

    def action_first(self) -> None:
        self._jump(0)

    def action_last(self) -> None:
        self._jump(self.last_line)

    def action_half_page(self, step: int) -> None:
        half = max(1, self.scrollable_content_region.height // 2)
        self._jump(min(max(0, self.cursor_line + step * half), self.last_line))

    def _jump(self, line: int) -> None:
        # No scroll animation: at 10,000 lines it would repaint the tree for every frame.
        self.cursor_line = line
        self.scroll_to_line(line, animate=False)

    def action_open_node(self) -> None:
        node = self.cursor_node
        if node is None:
            return
        if node.allow_expand and not node.is_expanded:
            self._expand_loaded(node)
        elif node.children:
            self.move_cursor(node.children[0], animate=False)

    def action_close_node(self) -> None:
        node = self.cursor_node
        if node is None:
            return
        if node.is_expanded and node.children:
            node.collapse()
        elif node.parent is not None:
            self.move_cursor(node.parent, animate=False)

    # ----- drawing -----

    def render_label(self, node: Line, base_style: Style, style: Style) -> Text:
        info = node.data
        if info is None:  # the root: the op, with the count of its nodes as it is now
            label = (card_root_label(self.card, self.model.count(self.card.id))
                     if self.card is not None else str(node.label))
            return Text.assemble((label, style + Style(bold=True)))
        pruned = self.model.pruned(info.id)
        label = node_label(info.row, info.visits, info.best, pruned)
        prefix = ("▼ " if node.is_expanded else "▶ ") if node.allow_expand else "  "
        best = self.card is not None and self.card.best_kernel == info.id
        tone = self.part_style(f"search-tree--{label.tone}")
        text = style
        if pruned:
            # Under the cursor the struck text keeps the cursor's colours, which are readable.
            text = style + (Style(strike=True) if node is self.cursor_node else tone)
        parts = [(prefix, base_style), (label.icon + " ", tone), (label.text, text),
                 (label.figures, self.part_style("search-tree--figures"))]
        if best:
            parts.append((f" {ICON_BEST}best", self.part_style("search-tree--best")))
            if self.card.best_beats == "compile":  # slower than eager, faster than compile
                parts.append((f": {fmt_speedup(self.card.best_over_compiled)} over compile",
                              self.part_style("search-tree--figures")))
        return Text.assemble(*parts)

    def part_style(self, part: str) -> Style:
        """A component's colour and text style, without its background (the line's shows). The
        colour is mixed over the tree's background first: a partial style drops the alpha of a
        colour such as $text-muted ("auto 60%") and would draw it at full strength."""
        mixed = self.get_component_rich_style(part, partial=False)
        return Style.from_color(mixed.color) + self.get_component_styles(part).text_style

    def get_label_width(self, node: Line) -> int:
        # Called for every shown line each time the tree's shape changes, only to size the
        # horizontal scroll: a fixed width that fits every label avoids formatting 10,000 of them.
        return LABEL_WIDTH
