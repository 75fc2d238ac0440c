"""The search nodes of a session as the tree view needs them: children by parent, and subtree
statistics (visits, best speedup) kept current as nodes arrive and finish. Pure data, no Textual."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from kforge.store import NodeStatus
from kforge.store.records import NodeRow


class NodeFilter(StrEnum):
    """Which nodes the tree shows (with the ancestors that lead to them)."""

    ALL = "all"
    OK = "ok"
    FAILED = "failed"
    IN_FLIGHT = "in flight"
    PRUNED = "pruned"
    IMPROVED = "faster than eager"

    def matches(self, row: NodeRow) -> bool:
        if self is NodeFilter.OK:
            return row.ok
        if self is NodeFilter.FAILED:
            return not row.ok and not row.in_flight and not row.confirming
        if self is NodeFilter.IN_FLIGHT:
            return row.in_flight
        if self is NodeFilter.PRUNED:
            return row.pruned
        if self is NodeFilter.IMPROVED:
            return row.ok and (row.speedup or 0.0) > 1.0
        return True


@dataclass(eq=False)
class NodeInfo:
    """One node with what the tree shows beside it. Mutated in place, so a tree line holding it
    always renders the current figures."""

    row: NodeRow
    children: list[int] = field(default_factory=list)
    visits: int = 0  # evaluated nodes in this subtree, itself included (MCTS visit count)
    best: float | None = None  # best speedup in this subtree

    @property
    def id(self) -> int:
        return self.row.id

    @property
    def finished(self) -> bool:
        return not NodeStatus.in_flight(self.row.status)


class SearchModel:
    """All nodes of one session, indexed by card and parent."""

    def __init__(self) -> None:
        self.nodes: dict[int, NodeInfo] = {}
        self._tops: dict[int, list[int]] = {}  # card id -> ids of the root's children
        self._by_card: dict[int, set[int]] = {}  # card id -> its node ids
        self._visible: dict[tuple[int, NodeFilter], set[int]] = {}
        self._trends: dict[int, list[float]] = {}  # card id -> best_trend, once asked
        self._touched: set[int] = set()  # nodes whose tree line reads differently now

    def load(self, rows: Iterable[NodeRow]) -> None:
        for row in sorted(rows, key=lambda r: r.id):
            self.upsert(row)

    def upsert(self, row: NodeRow) -> bool:
        """Add or update a node; True when it is new (the tree's shape changed)."""
        self._visible.clear()
        self._trends.pop(row.card_id, None)
        info = self.nodes.get(row.id)
        if info is None:
            info = self.nodes[row.id] = NodeInfo(row)
            self._siblings(row).append(row.id)
            self._by_card.setdefault(row.card_id, set()).add(row.id)
            if info.finished:
                self._credit(info)
            self._touched.update(self.ancestors(row.id))
            return True
        was_finished, was_pruned = info.finished, info.row.pruned
        info.row = row
        if info.finished and not was_finished:
            self._credit(info)
        elif info.finished and row.ok:
            self._raise_best(info.id, row.speedup)
        self._touched.update(self.ancestors(row.id))
        if row.pruned != was_pruned:  # the whole subtree is drawn in or out of the search
            self._touched.update(self.subtree(row.id))
        return False

    def remove(self, node_id: int) -> NodeInfo | None:
        """Drop a node and its subtree (the engine deletes in-flight nodes it will redo)."""
        info = self.nodes.get(node_id)
        if info is None:
            return None
        self._visible.clear()
        self._trends.pop(info.row.card_id, None)
        for child in list(info.children):
            self.remove(child)
        self._siblings(info.row).remove(node_id)
        del self.nodes[node_id]
        self._by_card[info.row.card_id].discard(node_id)
        self._touched.discard(node_id)
        self._touched.update(self.ancestors(info.row.parent_id))
        for ancestor in self.ancestors(info.row.parent_id):
            node = self.nodes[ancestor]
            node.visits -= info.visits
            node.best = _max_speedup(node.row, (self.nodes[c] for c in node.children))
        return info

    # ----- reading -----

    def children(self, card_id: int, node_id: int | None,
                 node_filter: NodeFilter = NodeFilter.ALL) -> list[NodeInfo]:
        ids = self.nodes[node_id].children if node_id else self._tops.get(card_id, [])
        if node_filter is NodeFilter.ALL:
            return [self.nodes[i] for i in ids]
        visible = self.visible(card_id, node_filter)
        return [self.nodes[i] for i in ids if i in visible]

    def visible(self, card_id: int, node_filter: NodeFilter) -> set[int]:
        """Nodes of a card that match the filter, and their ancestors."""
        key = (card_id, node_filter)
        if key not in self._visible:
            shown: set[int] = set()
            for info in self.nodes.values():
                if info.row.card_id == card_id and node_filter.matches(info.row):
                    shown.update(self.ancestors(info.id))
            self._visible[key] = shown
        return self._visible[key]

    def ancestors(self, node_id: int | None) -> list[int]:
        """The node and its ancestors, root side first."""
        path: list[int] = []
        while node_id and node_id in self.nodes:
            path.append(node_id)
            node_id = self.nodes[node_id].row.parent_id
        return path[::-1]

    def pruned(self, node_id: int) -> bool:
        """Whether the node or an ancestor is pruned (the search skips the whole subtree)."""
        return any(self.nodes[i].row.pruned for i in self.ancestors(node_id))

    def subtree(self, node_id: int) -> list[int]:
        """The node and every node below it."""
        found, pending = [], [node_id]
        while pending:
            current = pending.pop()
            found.append(current)
            pending.extend(self.nodes[current].children)
        return found

    def count(self, card_id: int) -> int:
        return len(self._by_card.get(card_id, ()))

    def best_trend(self, card_id: int) -> list[float]:
        """The card's best speedup after each of its finished nodes, in the order the search
        made them, from its first working kernel on (the search's progress, for a sparkline)."""
        if card_id not in self._trends:
            trend: list[float] = []
            for node_id in sorted(self._by_card.get(card_id, ())):
                row = self.nodes[node_id].row
                if NodeStatus.in_flight(row.status):
                    continue
                if row.ok and row.speedup is not None and (not trend or row.speedup > trend[-1]):
                    trend.append(row.speedup)
                elif trend:
                    trend.append(trend[-1])
            self._trends[card_id] = trend
        return self._trends[card_id]

    def best_trends(self) -> dict[int, list[float]]:
        """``best_trend`` of every card that has nodes."""
        return {card_id: self.best_trend(card_id) for card_id in self._by_card}

    def confirming_cards(self) -> set[int]:
        """The cards with a node under confirmation (a would-be best, not yet the card's best)."""
        return {info.row.card_id for info in self.nodes.values() if info.row.confirming}

    def take_touched(self) -> set[int]:
        """The nodes whose tree line reads differently since the last call (a node that
        changed, the ancestors whose figures it changed, a pruned subtree), forgotten once
        taken."""
        touched, self._touched = self._touched, set()
        return touched

    # ----- statistics -----

    def _siblings(self, row: NodeRow) -> list[int]:
        parent = self.nodes.get(row.parent_id) if row.parent_id else None
        return parent.children if parent else self._tops.setdefault(row.card_id, [])

    def _credit(self, info: NodeInfo) -> None:
        speedup = info.row.speedup if info.row.ok else None
        for ancestor in self.ancestors(info.id):
            self.nodes[ancestor].visits += 1
        self._raise_best(info.id, speedup)

    def _raise_best(self, node_id: int, speedup: float | None) -> None:
        if speedup is None:
            return
        for ancestor in self.ancestors(node_id):
            node = self.nodes[ancestor]
            if node.best is None or speedup > node.best:
                node.best = speedup


def _max_speedup(row: NodeRow, children: Iterable[NodeInfo]) -> float | None:
    values = [c.best for c in children if c.best is not None]
    if row.ok and row.speedup is not None:
        values.append(row.speedup)
    return max(values, default=None)
