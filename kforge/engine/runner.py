"""Start a session's engine: in this process (foreground) or as a detached process that outlives
the terminal, so a dropped SSH link or a closed TUI does not stop the search."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kforge.core.candidate import Candidate
from kforge.core.gpu import GpuInfo
from kforge.core.mcts import Decision
from kforge.core.protocols import Evaluator, Proposer, SearchContext
from kforge.core.settings import Origin, SearchSettings, SessionSettings, Settings
from kforge.engine.command import kforge_command, kforge_env
from kforge.engine.engine import Engine, Snapshot
from kforge.engine.plugins import (
    PluginConsent,
    check_can_start,
    make_evaluator,
    make_proposer,
    settled_search,
)
from kforge.errors import KforgeError
from kforge.store import SessionStatus, Store
from kforge.store.beside import open_log, own_folder
from kforge.store.config import load_config, store_options
from kforge.store.lease import engine_alive


async def prepare_session(store: Store, session_id: int, given: Mapping[str, Any],
                          config: Settings,
                          consent: PluginConsent = PluginConsent()) -> SearchSettings:
    """Settle the settings a session's search runs with and save them with the session, so a
    resume (or a detached engine) runs with the same ones: the search settings ``given`` on the
    command line over those the session stored, over the config file's; the session's stored
    evaluation settings over the config file's. A plug-in only the session names needs
    ``consent``."""
    session = await store.get_session(session_id)
    if engine_alive(session.engine_pid, session.engine_host, session.heartbeat_at):
        raise KforgeError(f"session {session_id} is already being searched by process "
                          f"{session.engine_pid} on {session.engine_host}")
    SearchSettings.from_dict(given, Origin("on the command line"))  # named as the user gave them
    stored = Origin.stored(session_id)
    search = settled_search(session.settings, given, config, stored)
    consent.check(search, session.settings.get("search") or {}, config.search)
    evaluation = config.eval.updated(session.settings.get("eval") or {}, stored)
    check_can_start(search, config.llm, session.settings.get("llm_model"))
    if given.get("focus") is not None:
        if given["focus"] not in {row.id for row in await store.list_cards(session_id)}:
            raise KforgeError(f"session {session_id} has no op card {given['focus']} to focus on "
                              f"(`kforge show {session_id}` lists them)")
    for note in stored.notes:
        await store.log(session_id, note, "warning")
    await store.update_settings(session_id, {"search": search.to_dict(),
                                             "eval": evaluation.to_dict()})
    return search


async def run_session(db_path: Path, session_id: int,
                      on_change: Callable[[Snapshot], None] | None = None,
                      consent: PluginConsent = PluginConsent()) -> SessionStatus:
    """Run the session's search here until it ends; SIGINT/SIGTERM stop it cleanly."""
    store = await Store.open(db_path, create=False, options=store_options())
    try:
        ctx, evaluator = await session_evaluator(store, session_id, consent)
        proposer = make_proposer(ctx.settings.search.proposer, ctx)
        engine = Engine(store, session_id, proposer, evaluator, ctx.settings.search, on_change)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, engine.request_stop)
        try:
            return await engine.run()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
    finally:
        await store.close()


async def session_evaluator(store: Store, session_id: int, consent: PluginConsent
                            ) -> tuple[SearchContext, Evaluator]:
    """The session's context for its plug-ins (its stored settings, the config file, its GPU;
    notes on stored settings go to its log) and its evaluator, refused on another GPU model;
    plug-ins only the session names need ``consent``."""
    session = await store.get_session(session_id)
    stored = Origin.stored(session_id)
    settings = SessionSettings.from_stored(session.settings, stored)
    config = load_config()
    consent.check(settings.search, session.settings.get("search") or {}, config.search)
    for note in stored.notes:
        await store.log(session_id, note, "warning")
    ctx = SearchContext(session_id=session_id, samples_dir=store.samples_to_read(session_id),
                        settings=settings, config=config,
                        gpu=session.gpu_info if session.gpu else None)
    evaluator = make_evaluator(settings.search.evaluator, ctx)
    _check_same_gpu(session.gpu, evaluator.gpu, session_id)
    return ctx, evaluator


async def add_given_kernel(store: Store, session_id: int, card_id: int, candidate: Candidate,
                           decision: Decision, screen: Proposer,
                           consent: PluginConsent = PluginConsent()) -> int:
    """Evaluate a kernel written outside the search for one card with the session's own
    evaluator and add it to the card's tree (``Engine.add_given``); ``screen`` stands in for
    the proposer where the engine asks which cards it declines. Returns the new node's id."""
    ctx, evaluator = await session_evaluator(store, session_id, consent)
    engine = Engine(store, session_id, screen, evaluator, ctx.settings.search)
    return await engine.add_given(card_id, candidate, decision)


def _check_same_gpu(recorded: dict, gpu: GpuInfo, session_id: int) -> None:
    arch = recorded.get("arch")
    if arch and arch != "none" and gpu.arch != "none" and arch != gpu.arch:
        raise KforgeError(f"session {session_id} was profiled on {recorded.get('name')} ({arch}) "
                          f"but this GPU is {gpu.label}: profile the model again here")


def log_path(db_path: Path, session_id: int) -> Path:
    """``logs/session-N.log`` beside the database (``logs`` may be no link)."""
    return own_folder(db_path.parent, "logs") / f"session-{session_id}.log"


def spawn_detached(db_path: Path, session_id: int,
                   consent: PluginConsent = PluginConsent()) -> int:
    """Start ``kforge resume`` for the session in a new process session (immune to the
    terminal's hang-up) and return its pid. Output goes to the session's log file. What
    ``consent`` confirmed (``prepare_session`` saved it as the session's) is confirmed to it
    too, as it was given (``PluginConsent.options``): a plug-in the database names by the time
    the engine reads it, and the user did not confirm, is refused there."""
    with open_log(log_path(db_path, session_id)) as out:
        proc = subprocess.Popen(
            # --verbose: the log file keeps the engine's details, and a failure's traceback
            [*kforge_command(), "--verbose", "resume", str(session_id), "--db", str(db_path),
             "--quiet", *consent.options()],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, env=kforge_env())
    return proc.pid

