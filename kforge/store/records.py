"""Rows of the session database as plain dataclasses, and the status vocabularies they use."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kforge.core.candidate import Candidate, EvalOutcome
from kforge.core.mcts import Action, NodeRecord, NodeState
from kforge.core.opcard import OpCard


class SessionStatus(StrEnum):
    READY = "ready"  # profiled, never searched
    RUNNING = "running"  # an engine is working on it
    PAUSED = "paused"  # an engine holds it but schedules nothing new
    STOPPED = "stopped"  # stopped by the user; can be resumed
    DONE = "done"  # every op's search ended
    FAILED = "failed"  # the engine stopped on an error (kept in `error`)


class CardStatus(StrEnum):
    PENDING = "pending"
    SEARCHING = "searching"
    STOPPED = "stopped"  # the session's search ended first (budget, stop): resumable
    DONE = "done"
    SKIPPED = "skipped"  # not a target (views, copies) or declined


class NodeStatus(StrEnum):
    """Lifecycle of a search node. The first two are in flight; the rest are final."""

    PROPOSING = "proposing"  # asked the proposer; no candidate yet
    EVALUATING = "evaluating"  # candidate stored, evaluation pending or running
    OK = "ok"
    NO_CANDIDATE = "no_candidate"  # the proposer returned nothing usable
    # ... plus every failing EvalStatus value (compile_error, mismatch, cheat, ...)

    @staticmethod
    def in_flight(status: str) -> bool:
        return status in (NodeStatus.PROPOSING, NodeStatus.EVALUATING)


class CommandKind(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    STOP = "stop"
    PRUNE = "prune"  # arg: node id
    UNPRUNE = "unprune"  # arg: node id
    FOCUS = "focus"  # arg: card id, or null to clear


def loads(text: str | None, default: Any = None) -> Any:
    return json.loads(text) if text else default


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=True)


@dataclass(frozen=True)
class Session:
    id: int
    model: str
    gpu: dict
    settings: dict
    status: str
    error: str
    created_at: float
    updated_at: float
    engine_pid: int | None = None
    engine_host: str | None = None
    heartbeat_at: float | None = None
    usd_spent: float = 0.0
    run_seconds: float = 0.0

    @property
    def gpu_label(self) -> str:
        name, arch = self.gpu.get("name", "?"), self.gpu.get("arch", "?")
        return f"{name} ({arch})"


@dataclass(frozen=True)
class SessionSummary:
    """A session with the figures a list shows."""

    session: Session
    cards: int
    targets: int
    nodes: int
    improved: int  # cards whose best kernel beats eager
    best_speedup: float | None
    last_activity: float


@dataclass(frozen=True)
class CardRow:
    """An op card with its search state."""

    card: OpCard
    status: str
    stop_reason: str
    spent: int
    best_node: int | None
    best_speedup: float | None
    modules: list[str]
    baseline: dict | None

    @property
    def id(self) -> int:
        assert self.card.id is not None
        return self.card.id


@dataclass(frozen=True)
class NodeRow:
    """A search node without its code (cheap to list by the thousand)."""

    id: int
    session_id: int
    card_id: int
    parent_id: int | None
    action: str
    status: str
    meta: dict
    reward: float | None
    speedup: float | None
    median_us: float | None
    repairable: bool
    pruned: bool
    summary: str
    usd: float
    created_at: float
    finished_at: float | None

    @property
    def in_flight(self) -> bool:
        return NodeStatus.in_flight(self.status)

    @property
    def ok(self) -> bool:
        return self.status == NodeStatus.OK

    def record(self) -> NodeRecord:
        """The node as the pure MCTS tree sees it (the root's children have parent 0)."""
        state = (NodeState.IN_FLIGHT if self.in_flight
                 else NodeState.OK if self.ok else NodeState.FAILED)
        return NodeRecord(id=self.id, parent=self.parent_id or 0, action=Action(self.action),
                          state=state, reward=self.reward, repairable=self.repairable,
                          pruned=self.pruned)


@dataclass(frozen=True)
class NodeDetail:
    """A node with its candidate, evaluation outcome and LLM exchanges."""

    row: NodeRow
    candidate: Candidate | None
    outcome: EvalOutcome | None
    llm_calls: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class Command:
    id: int
    session_id: int
    kind: str
    arg: Any
    created_at: float
    done_at: float | None
    result: str
