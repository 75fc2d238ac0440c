"""The pure side of a session's search: each op card's search state, the rules that end one card's
search or the whole session's, which card goes next, and the best kernel found so far.

No I/O, no clocks, no asyncio: the engine feeds it what the store, the proposer and the evaluator
say (and the money and time spent), and carries out what it decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from kforge.core import budget
from kforge.core.mcts import Tree
from kforge.core.opcard import OpCard
from kforge.core.reward import reward_from_speedup
from kforge.core.settings import SearchSettings

SEED_STRIDE = 1_000_003  # keeps the seeds derived under one search seed apart from another's
FAILURE_LINE_CHARS = 200


def derived_seed(seed: int, salt: int) -> int:
    """The seed of one card's tree or one request (``salt``: its id) under the search's seed."""
    return seed * SEED_STRIDE + salt


def failure_line(meta: dict, status: str, summary: str) -> str:
    """One line on a failed attempt, as listed to the proposer under 'approaches that failed'."""
    return f"{meta.get('approach', '?')}: {status}: {summary}"[:FAILURE_LINE_CHARS]


def searched_cards(cards: Iterable[tuple[int, OpCard]], top_ops: int | None) -> set[int]:
    """The ids of the cards a search works on: the target ops among ``cards`` (those the proposer
    does not decline), only the ``top_ops`` with the largest time shares when that is set."""
    targets = sorted((c for c in cards if c[1].target), key=lambda c: -c[1].share)
    return {card_id for card_id, _ in targets[:top_ops]}


@dataclass(frozen=True)
class Best:
    """A card's best kernel so far: its node and its speedup over eager."""

    node: int | None = None
    speedup: float | None = None

    def after(self, node_id: int, speedup: float | None) -> Best:
        """The best once ``node_id`` finished with ``speedup`` (None: it failed)."""
        if speedup is not None and (self.speedup is None or speedup > self.speedup):
            return Best(node_id, speedup)
        return self


@dataclass(frozen=True)
class NodeResult:
    """A finished node, as far as the schedule cares."""

    node_id: int
    speedup: float | None = None  # None: no kernel, or one that failed
    repairable: bool = False  # a failure a repair may fix (a compile error, a mismatch)
    failure: str = ""  # a failure's line for the proposer's list of approaches that failed

    @property
    def reward(self) -> float | None:
        return None if self.speedup is None else reward_from_speedup(self.speedup)


class Phase(StrEnum):
    PENDING = "pending"
    SEARCHING = "searching"
    DONE = "done"


@dataclass(frozen=True)
class CardProgress:
    """One op's line in a progress display."""

    card_id: int
    op: str
    signature: str
    spent: int  # finished iterations
    best_speedup: float | None
    phase: Phase


@dataclass(eq=False)
class CardSearch:
    """One op card's search: its tree, what was tried and failed, what it spent and found."""

    card_id: int
    card: OpCard  # kept current: the baseline brings its eager and floor times
    tree: Tree
    spent: int = 0  # finished iterations
    best: Best = field(default_factory=Best)
    done: bool = False
    metas: dict[int, dict] = field(default_factory=dict)  # node id -> its candidate's meta
    failed: list[str] = field(default_factory=list)  # failure lines, oldest first

    @property
    def committed(self) -> int:
        """Iterations finished or under way."""
        return self.spent + self.tree.inflight()

    def op_budget(self) -> budget.OpBudget:
        c = self.card
        ceiling = c.eager_us / c.floor_us if c.eager_us and c.floor_us else None
        return budget.OpBudget(
            card_id=self.card_id, share=c.share, vendor=c.vendor,
            best_speedup=max(self.best.speedup or 1.0, 1.0), ceiling=ceiling,
            spent=self.committed, since_best=self.tree.since_improvement)

    def would_lead(self, speedup: float | None) -> bool:
        """Whether a node with ``speedup`` would become this card's best."""
        return speedup is not None and self.best.after(-1, speedup) is not self.best

    def finish(self, result: NodeResult, spent: int, best: Best) -> None:
        """Take a finished node in: the tree backs its reward up, and the count and the best
        become the card's as stored with the node (the store derives them from the card's
        finished nodes, so results that finish in parallel each count once)."""
        self.tree.complete(result.node_id, result.reward, repairable=result.repairable)
        self.spent = spent
        self.best = best
        if result.failure:
            self.failed.append(result.failure)

    def progress(self) -> CardProgress:
        phase = (Phase.DONE if self.done else Phase.SEARCHING if self.committed
                 else Phase.PENDING)
        return CardProgress(self.card_id, self.card.short_op, self.card.signature, self.spent,
                            self.best.speedup, phase)


class Schedule:
    """Every card's search in one session and the rules over them: the session's budgets, each
    op's stop rules, the focus, and the pick of the next card."""

    def __init__(self, settings: SearchSettings, cards: Iterable[CardSearch],
                 searched: set[int]) -> None:
        self.settings = settings
        self.cards = {c.card_id: c for c in cards}
        self.searched = searched
        for card in self.cards.values():
            card.done = card.done or card.card_id not in searched
        # a focus on a card this session does not have is dropped
        self.focus = settings.focus if settings.focus in self.cards else None

    @property
    def total_iterations(self) -> int:
        return self.settings.iterations_per_op * len(self.searched)

    def iterations(self) -> int:
        """Iterations finished, over every card."""
        return sum(c.spent for c in self.cards.values())

    def in_flight(self) -> int:
        return sum(c.tree.inflight() for c in self.cards.values())

    def conclude(self, card: CardSearch) -> str | None:
        """If a stop rule (per-op budget, patience, physical floor) ends ``card``'s search now,
        mark it done and say why; None when it goes on or was done already."""
        if card.done:
            return None
        reason = budget.stop_reason(card.op_budget(), self.settings.per_op_limit,
                                    self.settings.patience)
        card.done = reason is not None
        return reason

    def conclude_all(self) -> list[tuple[CardSearch, str]]:
        """``conclude`` for every card: the ones it ended, with why."""
        ended = [(card, self.conclude(card)) for card in self.cards.values()]
        return [(card, reason) for card, reason in ended if reason is not None]

    def exhausted(self, usd: float, run_s: float) -> str | None:
        """Why no new work may start, given the USD spent and the seconds run; None while the
        session's budgets last."""
        s = self.settings
        if sum(c.committed for c in self.cards.values()) >= self.total_iterations:
            return "iteration budget spent"
        if s.usd is not None and usd >= s.usd:
            return f"USD budget of ${s.usd:.2f} spent"
        if s.wall_s is not None and run_s >= s.wall_s:
            return f"time budget of {s.wall_s:.0f} s spent"
        return None

    def owes(self, card: CardSearch) -> bool:
        """Whether ``card`` may still get iterations: not done, and inside the focus."""
        return not card.done and (self.focus is None or card.card_id == self.focus)

    def focus_ended(self) -> CardSearch | None:
        """The focused card once nothing is left to search there (its stop rule ended it, it was
        skipped, or it is not among the cards searched): a focus narrows the search and never
        ends it, so the engine then clears it. None while the focus has work, or without one."""
        card = self.cards.get(self.focus) if self.focus is not None else None
        return card if card is not None and card.done else None

    def next_card(self) -> CardSearch | None:
        """The card to spend the next iteration on (within the focus), or None when no card
        still being searched is owed one."""
        active = [c for c in self.cards.values() if self.owes(c)]
        if not active:
            return None
        ids = {c.card_id for c in active}
        elsewhere = sum(c.committed for c in self.cards.values() if c.card_id not in ids)
        pick = budget.pick_next([c.op_budget() for c in active],
                                self.total_iterations - elsewhere)
        return None if pick is None else self.cards[pick]

    def progress(self) -> list[CardProgress]:
        """The searched cards' lines, largest time share first."""
        ranked = sorted(self.cards.values(), key=lambda c: -c.card.share)
        return [c.progress() for c in ranked if c.card_id in self.searched]
