"""Rows of the session database as plain dataclasses, and the status vocabularies they use."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kforge.core.candidate import Candidate, EvalOutcome
from kforge.core.gpu import GpuInfo
from kforge.core.mcts import Action, NodeRecord, NodeState
from kforge.core.opcard import OpCard
from kforge.errors import KforgeError


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
    """Lifecycle of a search node. The first two are in flight; a confirming node is evaluated
    (the search builds on it) but not final; the rest are final."""

    PROPOSING = "proposing"  # asked the proposer; no candidate yet
    EVALUATING = "evaluating"  # candidate stored, evaluation pending or running
    CONFIRMING = "confirming"  # a would-be best, queued for or under confirmation
    OK = "ok"  # correct; ``confirmed`` says whether it passed a confirmation
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


class DamagedRow(KforgeError):
    """A stored row this kforge cannot read: a column holds invalid JSON or a value of the wrong
    type (the database was edited by hand, or damaged)."""


MAX_ROW_ID = 2**63 - 1  # SQLite's largest integer: no session, node or card has a larger id
NUMBER = (int, float)
NOTHING = type(None)


@contextmanager
def reading(what: str) -> Iterator[None]:
    """Decode one stored row: whatever goes wrong becomes one DamagedRow naming ``what`` (such as
    "session 3") and the reason, never an error from deep inside a reader."""
    try:
        yield
    except DamagedRow:
        raise
    except Exception as exc:  # any failure to decode means the row is not what kforge wrote
        reason = " ".join(str(exc).split())[:160]
        if isinstance(exc, KeyError) or not reason:
            reason = f"{type(exc).__name__} {reason}".strip()
        raise DamagedRow(f"{what} in the database cannot be read ({reason}): the row is damaged; "
                         "restore the database from a copy, or delete that row") from None


def column(row: Mapping[str, Any], name: str, kinds: type | tuple[type, ...]) -> Any:
    """The value of column ``name``, which must be of ``kinds`` (SQLite keeps whatever was
    written, whatever the column's declared type)."""
    value = row[name]
    if not isinstance(value, kinds):
        raise TypeError(f"{name} holds {_shown(value)}, not {_names(kinds)}")
    if isinstance(value, float) and not math.isfinite(value):  # kforge stores no infinity
        raise ValueError(f"{name} holds {value!r}, not a finite number")
    return value


# The latest moment a stored timestamp may name: the end of year 9999, the last a date shows.
LATEST_TIME = 253_402_300_799.0


def time_column(row: Mapping[str, Any], name: str, *, optional: bool = False) -> float | None:
    """Column ``name`` as a moment (seconds since 1970) a viewer can show as a date or an age;
    None where ``optional`` and empty."""
    value = column(row, name, (*NUMBER, NOTHING) if optional else NUMBER)
    if value is not None and not 0 <= value <= LATEST_TIME:
        raise ValueError(f"{name} holds {value!r}, not a moment kforge wrote")
    return value


def json_column(row: Mapping[str, Any], name: str, kinds: type | tuple[type, ...],
                default: Any = None) -> Any:
    """Column ``name`` read as JSON, which must decode to one of ``kinds``; ``default`` for an
    empty or NULL column."""
    text = row[name]
    if text is None or text == "":
        return default
    if not isinstance(text, str):
        raise TypeError(f"{name} holds {_shown(text)}, not JSON text")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(value, kinds):
        raise TypeError(f"{name} holds {_shown(value)}, not {_names(kinds)}")
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _names(kinds: type | tuple[type, ...]) -> str:
    words = {dict: "an object", list: "a list", str: "text", int: "a whole number",
             float: "a number", NOTHING: "nothing"}
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if float in kinds:
        kinds = tuple(k for k in kinds if k is not int)  # a whole number is a number
    return " or ".join(words.get(k, k.__name__) for k in kinds)


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
        return self.gpu_info.label

    @property
    def gpu_info(self) -> GpuInfo:
        """The GPU fingerprint stored with the session; a name or architecture it lacks (a
        session made by a test, or before fingerprints) reads as "?"."""
        return GpuInfo.from_dict({"name": "?", "arch": "?", **self.gpu})


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

    @property
    def eager_source(self) -> str:
        """Where the card's eager time comes from: ``eval`` once the evaluator has timed eager
        alone (its device time per call), ``prof`` before (the profile's time per call in the
        model run: GPU time, or CPU time for a profile on the CPU)."""
        return "eval" if self.baseline is not None else "prof"

    @property
    def best_over_compiled(self) -> float | None:
        """The best kernel's speedup over torch.compile of the op: both device times, as the
        evaluator timed them (None before it timed the op, or where torch.compile was not
        timed)."""
        c = self.card
        if self.best_speedup is None or self.baseline is None or not c.compiled_us \
                or not c.eager_us:
            return None
        return self.best_speedup * c.compiled_us / c.eager_us

    @property
    def best_beats(self) -> str | None:
        """What the card's best kernel is faster than: ``"eager"``, else ``"compile"``
        (torch.compile alone: the compiled modes may use it), else None. A kernel slower than
        both is no best (an older database may hold one as its card's best)."""
        if self.best_node is None:
            return None
        if (self.best_speedup or 0.0) > 1.0:
            return "eager"
        return "compile" if (self.best_over_compiled or 0.0) > 1.0 else None

    @property
    def best_kernel(self) -> int | None:
        """The card's best node where it beats eager or torch.compile; one slower than both is
        no best."""
        return self.best_node if self.best_beats else None

    @property
    def best_over_eager(self) -> float | None:
        """The best kernel's speedup over eager, where the card has a best (``best_kernel``)."""
        return self.best_speedup if self.best_kernel is not None else None


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
    confirmed: bool = False  # passed its confirmation: the only kind a card's best may be

    @property
    def in_flight(self) -> bool:
        return NodeStatus.in_flight(self.status)

    @property
    def ok(self) -> bool:
        return self.status == NodeStatus.OK

    @property
    def confirming(self) -> bool:
        return self.status == NodeStatus.CONFIRMING

    def record(self) -> NodeRecord:
        """The node as the pure MCTS tree sees it (the root's children have parent 0)."""
        state = (NodeState.IN_FLIGHT if self.in_flight
                 else NodeState.OK if self.ok or self.confirming else NodeState.FAILED)
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
