"""Start a session's search: here, until it ends, or in a detached process that outlives the
terminal (a dropped SSH link or a closed TUI does not stop it)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kforge.app.database import with_store
from kforge.app.facts import SessionFacts, session_facts
from kforge.core.settings import Origin
from kforge.engine.plugins import PluginConsent, check_can_start
from kforge.errors import KforgeError
from kforge.store import SessionStatus
from kforge.store.config import load_config

if TYPE_CHECKING:
    from kforge.app.profile import Profiled
    from kforge.engine.engine import Snapshot

# The plug-in settings a search names that need the user's consent (``PluginConsent``).
PLUGINS = ("proposer", "evaluator", "cluster")


@dataclass(frozen=True)
class SearchRequest:
    """The search settings a caller names (None: the session's stored one, else the config
    file's), whether the plug-ins the session names are trusted, and whether the search runs
    detached."""

    proposer: str | None = None
    evaluator: str | None = None
    cluster: str | None = None  # "none" or "": this machine's GPUs
    iterations_per_op: int | None = None
    usd: float | None = None
    wall_s: float | None = None
    parallel: int | None = None
    patience: int | None = None
    seed: int | None = None
    focus: int | None = None
    top_ops: int | None = None
    trust_plugins: bool = False
    detach: bool = False

    def given(self) -> dict:
        """The search settings named, by their settings' names."""
        given = {
            "proposer": self.proposer, "evaluator": self.evaluator,
            "cluster": "" if self.cluster in ("none", "") else self.cluster,
            "iterations_per_op": self.iterations_per_op, "usd": self.usd, "wall_s": self.wall_s,
            "parallel": self.parallel, "patience": self.patience, "seed": self.seed,
            "focus": self.focus, "top_ops": self.top_ops,
        }
        return {k: v for k, v in given.items() if v is not None}

    def consent(self) -> PluginConsent:
        """The plug-ins and cluster named here are trusted, and with ``trust_plugins`` those the
        session names."""
        given = self.given()
        return PluginConsent(frozenset((k, given[k]) for k in PLUGINS if given.get(k)),
                             self.trust_plugins)


class SearchDisplay(Protocol):
    """What shows a search that runs here: entered as the search starts, given each snapshot,
    left as it ends."""

    def __enter__(self) -> object: ...

    def __exit__(self, *exc: object) -> None: ...

    def __call__(self, snap: Snapshot) -> None: ...


@dataclass(frozen=True)
class SearchStarted:
    """A search that ran here (``status``: how it ended) or was started detached (its process
    and log); the session's facts afterwards, and the profile that made the session where the
    same request made it."""

    facts: SessionFacts
    detached: bool
    engine_pid: int | None = None
    log: Path | None = None
    status: SessionStatus | None = None
    profiled: Profiled | None = None

    @property
    def ended_well(self) -> bool:
        """Whether the search is running detached, or ran here to its end or a stop."""
        return self.detached or self.status in (SessionStatus.DONE, SessionStatus.STOPPED)

    def to_dict(self) -> dict:
        answer = {**self.facts.to_dict(), "detached": self.detached}
        if self.detached:
            answer.update(engine_pid=self.engine_pid, log=str(self.log))
        return {**answer, **(self.profiled.figures() if self.profiled else {})}


def check_new_search(request: SearchRequest) -> None:
    """Refuse, before anything is profiled or stored, settings a new session could not search
    with: the request's and the config file's, as its search would settle them."""
    given = request.given()
    if "focus" in given:
        raise KforgeError("--focus names an op card of a profiled session: profile first, then "
                          "`kforge search --session N --focus CARD`")
    config = load_config()
    check_can_start(config.search.updated(given, Origin("on the command line")), config.llm)


def start_search(db: Path, session_id: int, request: SearchRequest,
                 display: SearchDisplay | None = None, *,
                 profiled: Profiled | None = None) -> SearchStarted:
    """Settle and store the session's search settings, then run its search here until it ends
    (shown on ``display``) or, with ``request.detach``, start it in a process of its own."""
    from kforge.engine.runner import (  # the engine brings in torch
        log_path,
        prepare_session,
        run_session,
        spawn_detached,
    )

    given, config, consent = request.given(), load_config(), request.consent()
    with_store(db, lambda store: prepare_session(store, session_id, given, config, consent))
    if request.detach:
        pid = spawn_detached(db, session_id, consent)
        return SearchStarted(session_facts(db, session_id), detached=True, engine_pid=pid,
                             log=log_path(db, session_id), profiled=profiled)
    with display or contextlib.nullcontext():
        status = asyncio.run(run_session(db, session_id, display, consent))
    return SearchStarted(session_facts(db, session_id), detached=False, status=status,
                         profiled=profiled)
