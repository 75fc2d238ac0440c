"""`kforge search`, `kforge resume` and `kforge stop`: run a session's search, here or detached."""

from __future__ import annotations

import argparse
import asyncio

from kforge.cli.cmd_profile import add_model_options, profile_to_session
from kforge.cli.common import (
    add_db_option,
    err,
    out,
    resolve_db,
    session_id,
    with_store,
)
from kforge.cli.progress import Progress
from kforge.store.config import load_config
from kforge.engine.runner import log_path, prepare_session, run_session, spawn_detached
from kforge.engine.settings import parse_duration
from kforge.errors import KforgeError
from kforge.store import CommandKind, SessionStatus, Store
from kforge.store.store import engine_alive


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="profile a model (or take a session) and search kernels")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("model", nargs="?", help="built-in model name or path/to/file.py:factory")
    target.add_argument("--session", type=session_id, help="continue this session instead")
    add_model_options(p)
    _add_search_options(p)
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("resume", help="continue a session's search where it stopped")
    p.add_argument("session", type=session_id)
    _add_search_options(p)
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("stop", help="ask a running search to stop (it can be resumed)")
    p.add_argument("session", type=session_id)
    add_db_option(p)
    p.set_defaults(func=cmd_stop)




def _add_search_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("search budget and plug-ins")
    g.add_argument("--proposer", help="library | llm | both | module:factory (default: library)")
    g.add_argument("--evaluator", help="gpu | module:factory (default: gpu)")
    g.add_argument("--iterations", type=int, dest="iterations_per_op", metavar="N",
                   help="average iterations per op; spread by time share (default 24)")
    g.add_argument("--usd", type=float, help="total LLM spend allowed, in US dollars")
    g.add_argument("--time", dest="wall", metavar="DURATION",
                   help="total search time allowed, e.g. 30m or 2h")
    g.add_argument("--parallel", type=int, help="proposals in flight at once (default 2)")
    g.add_argument("--patience", type=int,
                   help="stop an op after N iterations without improvement (default 12)")
    g.add_argument("--seed", type=int, help="random seed of the search (default 0)")
    g.add_argument("--focus", type=int, metavar="CARD", help="search only this op card")
    g.add_argument("--top", type=int, dest="top_ops", metavar="N",
                   help="search only the N ops with the largest time shares")
    g.add_argument("--detach", action="store_true",
                   help="run in the background, surviving the terminal; follow with kforge-tui")
    g.add_argument("--quiet", action="store_true", help="no live progress display")
    add_db_option(p)


def _given(args: argparse.Namespace) -> dict:
    """The search settings named on the command line."""
    given = {
        "proposer": args.proposer, "evaluator": args.evaluator,
        "iterations_per_op": args.iterations_per_op, "usd": args.usd,
        "wall_s": parse_duration(args.wall) if args.wall else None,
        "parallel": args.parallel, "patience": args.patience, "seed": args.seed,
        "focus": args.focus, "top_ops": args.top_ops,
    }
    return {k: v for k, v in given.items() if v is not None}


def cmd_search(args: argparse.Namespace) -> int:
    if args.session is not None:
        return _start(args, args.session)
    evaluator = args.evaluator or load_config().get("search", {}).get("evaluator", "gpu")
    if evaluator == "gpu":  # say so before a long profile, not after it
        from kforge.eval.gpuinfo import require_cuda

        require_cuda()
    sid = profile_to_session(args)
    return _start(args, sid)


def cmd_resume(args: argparse.Namespace) -> int:
    return _start(args, args.session)


def _start(args: argparse.Namespace, sid: int) -> int:
    db = resolve_db(args)
    given = _given(args)
    defaults = load_config().get("search", {})

    async def prepare(store: Store) -> None:
        # the config file's [search] values fill in only what neither the command line nor
        # the session already says
        stored = (await store.get_session(sid)).settings.get("search", {})
        fill = {k: v for k, v in defaults.items() if k not in stored and k not in given}
        await prepare_session(store, sid, {**fill, **given})

    with_store(args, prepare)
    if args.detach:
        pid = spawn_detached(db, sid)
        out.print(f"session {sid} is searching in the background (process {pid}); "
                  f"log: {log_path(db, sid)}")
        out.print(f"follow it with `kforge-tui`, stop it with `kforge stop {sid}`")
        return 0
    with Progress(quiet=args.quiet) as progress:
        status = asyncio.run(run_session(db, sid, progress))
    if not args.quiet:
        out.print(f"session {sid}: {status}; see `kforge show {sid}`")
    return 0 if status in (SessionStatus.DONE, SessionStatus.STOPPED) else 1


def cmd_stop(args: argparse.Namespace) -> int:
    async def work(store: Store) -> str:
        session = await store.get_session(args.session)
        if engine_alive(session.engine_pid, session.engine_host, session.heartbeat_at):
            await store.send_command(args.session, CommandKind.STOP)
            return f"asked the engine of session {args.session} (process {session.engine_pid}) to stop"
        if session.status in (SessionStatus.RUNNING, SessionStatus.PAUSED):
            await store.release_engine(args.session, SessionStatus.STOPPED,
                                       "the engine had died; marked stopped")
            return f"session {args.session} had no live engine; marked stopped"
        raise KforgeError(f"session {args.session} is not running (status: {session.status})")

    message = with_store(args, work)
    err.print(message)
    return 0
