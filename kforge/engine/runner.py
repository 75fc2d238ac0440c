"""Start a session's engine: in this process (foreground) or as a detached process that outlives
the terminal, so a dropped SSH link or a closed TUI does not stop the search."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from kforge.store.config import load_config
from kforge.core.gpu import GpuInfo
from kforge.core.protocols import SearchContext
from kforge.engine.engine import Engine, Snapshot
from kforge.engine.plugins import (
    BUILTIN_EVALUATORS,
    BUILTIN_PROPOSERS,
    check_spec,
    make_evaluator,
    make_proposer,
)
from kforge.engine.settings import SearchSettings
from kforge.errors import KforgeError
from kforge.store import SessionStatus, Store
from kforge.store.store import engine_alive


async def prepare_session(store: Store, session_id: int, overrides: dict) -> SearchSettings:
    """Merge ``overrides`` into the session's stored search settings and save them, so a resume
    (or a detached engine) runs with the same settings."""
    session = await store.get_session(session_id)
    if engine_alive(session.engine_pid, session.engine_host, session.heartbeat_at):
        raise KforgeError(f"session {session_id} is already being searched by process "
                          f"{session.engine_pid} on {session.engine_host}")
    merged = {**session.settings.get("search", {}),
              **{k: v for k, v in overrides.items() if v is not None}}
    settings = SearchSettings.from_dict(merged)
    check_spec(settings.proposer, BUILTIN_PROPOSERS, "proposer")
    check_spec(settings.evaluator, BUILTIN_EVALUATORS, "evaluator")
    await store.update_settings(session_id, {"search": merged})
    return settings


async def run_session(db_path: Path, session_id: int,
                      on_change: Callable[[Snapshot], None] | None = None) -> SessionStatus:
    """Run the session's search here until it ends; SIGINT/SIGTERM stop it cleanly."""
    store = await Store.open(db_path, create=False)
    try:
        session = await store.get_session(session_id)
        settings = SearchSettings.from_dict(session.settings.get("search", {}))
        ctx = SearchContext(session_id=session_id, samples_dir=store.samples_dir(session_id),
                            settings=session.settings, config=load_config(),
                            gpu=GpuInfo.from_dict(session.gpu) if session.gpu else None)
        evaluator = make_evaluator(settings.evaluator, ctx)
        _check_same_gpu(session.gpu, evaluator.gpu, session_id)
        proposer = make_proposer(settings.proposer, ctx)
        engine = Engine(store, session_id, proposer, evaluator, settings, on_change)
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


def _check_same_gpu(recorded: dict, gpu: GpuInfo, session_id: int) -> None:
    arch = recorded.get("arch")
    if arch and arch != "none" and gpu.arch != "none" and arch != gpu.arch:
        raise KforgeError(f"session {session_id} was profiled on {recorded.get('name')} ({arch}) "
                          f"but this GPU is {gpu.label}: profile the model again here")


def log_path(db_path: Path, session_id: int) -> Path:
    return db_path.parent / "logs" / f"session-{session_id}.log"


def spawn_detached(db_path: Path, session_id: int) -> int:
    """Start ``kforge resume`` for the session in a new process session (immune to the
    terminal's hang-up) and return its pid. Output goes to the session's log file."""
    log_file = log_path(db_path, session_id)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kforge", "resume", str(session_id), "--db", str(db_path),
             "--quiet"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc.pid
