"""Rows of the session database as dataclasses, the status vocabularies they use, and how a
row is read: by the codec (``kforge.core.schema``, as what kforge wrote: each column of its field's
type and rules), inside ``reading``, where anything damaged becomes one ``DamagedRow`` line."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from kforge.core import schema
from kforge.core.candidate import Candidate, EvalOutcome, LlmCall
from kforge.core.gpu import GpuInfo
from kforge.core.mcts import Action, NodeRecord, NodeState
from kforge.core.opcard import OpCard
from kforge.core.schema import Origin, Rule, SchemaError, checked
from kforge.errors import KforgeError

T = TypeVar("T")


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


class DamagedRow(KforgeError):
    """A stored row this kforge cannot read: a column holds invalid JSON or a value of the wrong
    type (the database was edited by hand, or damaged)."""


MAX_ROW_ID = 2**63 - 1  # SQLite's largest integer: no session, node or card has a larger id
# The latest moment a stored timestamp may name: the end of year 9999, the last a date shows.
LATEST_TIME = 253_402_300_799.0
# A moment (seconds since 1970) a viewer can show as a date or an age.
MOMENT = Rule(least=0, most=LATEST_TIME, means="a moment kforge wrote")


def moment(default: Any = dataclasses.MISSING) -> Any:
    """A field holding a ``MOMENT``; required unless a ``default`` is given."""
    return checked(default, **vars(MOMENT))


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


def stored(cls: type[T], row: Mapping[str, Any], *, json_columns: Mapping[str, Any] = {},
           flags: Iterable[str] = (), built: Mapping[str, Any] | None = None,
           rules: Mapping[str, Rule] | None = None) -> T:
    """A ``cls`` read from a stored row as what kforge wrote (SQLite keeps whatever was written,
    whatever a column's declared type): each column a field names of the field's type and
    rules, the ``json_columns`` decoded from their text (an empty or NULL one is the default
    given there), the ``flags`` (whole numbers) as true or false; ``built``: fields read
    already. A SchemaError names the column at fault."""
    table = {name: row[name] for name in row.keys()}
    for name, default in json_columns.items():
        table[name] = _json(name, table[name], default)
    for name in flags:
        if not isinstance(table[name], int):
            raise SchemaError.wrong(None, name, "", table[name], "a whole number")
        table[name] = bool(table[name])
    return schema.read(cls, table, Origin.record(), built=built, rules=rules, what="columns")


def _json(name: str, text: Any, default: Any) -> Any:
    if text is None or text == "":
        return default
    if not isinstance(text, str):
        raise SchemaError.wrong(None, name, "", text, "JSON text")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise SchemaError.of(None, name, "", f"is not valid JSON: {exc}") from None


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
    created_at: float = moment()
    updated_at: float = moment()
    engine_pid: int | None = None
    engine_host: str | None = None
    heartbeat_at: float | None = moment(None)
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
    last_activity: float = moment()


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
    action: str = checked(choices=tuple(Action))
    status: str
    meta: dict
    reward: float | None
    speedup: float | None
    median_us: float | None
    repairable: bool
    pruned: bool
    summary: str
    usd: float
    created_at: float = moment()
    finished_at: float | None = moment()
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


@dataclass(frozen=True, kw_only=True)
class LlmCallRow(LlmCall):
    """One of a node's language-model calls as stored: the call, and when it was made."""

    created_at: float = moment()


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
    created_at: float = moment()
    done_at: float | None = moment()
    result: str
