"""`kforge search`, `kforge resume` and `kforge stop`: their command lines, and what they print of
a session's search that ran here or was started detached (``kforge.app.search``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kforge.app.search import SearchRequest, check_new_search, start_search
from kforge.cli.cmd_profile import add_model_options, profile_to_session
from kforge.cli.common import (
    add_db_option,
    add_json_option,
    add_trust_plugins_option,
    duration,
    err,
    number,
    out,
    resolve_db,
    respond,
    session_id,
    whole,
    with_store,
)
from kforge.core.settings import SearchSettings
from kforge.store import CommandKind
from kforge.store.commands import issue

if TYPE_CHECKING:
    from kforge.app.profile import Profiled
    from kforge.cli.main import Commands


def register(sub: Commands) -> None:
    p = sub.add_parser("search")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("model", nargs="?", help="built-in model name or path/to/file.py:factory")
    target.add_argument("--session", type=session_id, help="continue this session instead")
    add_model_options(p)
    _add_search_options(p)
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("resume")
    p.add_argument("session", type=session_id)
    _add_search_options(p)
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("stop")
    p.add_argument("session", type=session_id)
    add_db_option(p)
    p.set_defaults(func=cmd_stop)


def _add_search_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("search budget and plug-ins")
    g.add_argument("--proposer", help="library | llm | both | module:factory (default: library)")
    g.add_argument("--evaluator", help="gpu | module:factory (default: gpu)")
    add_trust_plugins_option(g)
    g.add_argument("--cluster", metavar="ADDRESS",
                   help="evaluate on the GPUs of this Ray cluster: auto (the one `ray start` "
                        "joined this machine to), host:6379 or ray://host:10001; none: this "
                        "machine's GPUs (default: none)")
    ranges = SearchSettings.RANGES
    g.add_argument("--iterations", type=whole(*ranges["iterations_per_op"]),
                   dest="iterations_per_op", metavar="N",
                   help="average iterations per op; spread by time share (default 24)")
    g.add_argument("--usd", type=number(*ranges["usd"]),
                   help="total LLM spend allowed, in US dollars")
    g.add_argument("--time", type=duration(ranges["wall_s"][1]), dest="wall_s",
                   metavar="DURATION", help="total search time allowed, e.g. 30m or 2h")
    g.add_argument("--parallel", type=whole(*ranges["parallel"]),
                   help="proposals in flight at once (default 4)")
    g.add_argument("--patience", type=whole(*ranges["patience"]),
                   help="stop an op after N iterations without improvement (default 12)")
    g.add_argument("--seed", type=whole(*ranges["seed"]),
                   help="random seed of the search (default 0)")
    g.add_argument("--focus", type=whole(*ranges["focus"]), metavar="CARD",
                   help="search only this op card until it has nothing left to search, then "
                        "every op")
    g.add_argument("--top", type=whole(*ranges["top_ops"]), dest="top_ops", metavar="N",
                   help="search only the N ops with the largest time shares")
    g.add_argument("--detach", action="store_true",
                   help="run in the background, surviving the terminal; follow with kforge-tui")
    g.add_argument("--quiet", action="store_true", help="no live progress display")
    add_json_option(p)
    add_db_option(p)


def search_request(args: argparse.Namespace) -> SearchRequest:
    """The search settings, plug-in consent and --detach of the command line."""
    return SearchRequest(
        proposer=args.proposer, evaluator=args.evaluator, cluster=args.cluster,
        iterations_per_op=args.iterations_per_op, usd=args.usd, wall_s=args.wall_s,
        parallel=args.parallel, patience=args.patience, seed=args.seed, focus=args.focus,
        top_ops=args.top_ops, trust_plugins=args.trust_plugins, detach=args.detach)


def cmd_search(args: argparse.Namespace) -> int:
    def work() -> tuple[int, dict]:
        request = search_request(args)
        if args.session is not None:
            return _start(args, args.session, request)
        check_new_search(request)  # before a long profile, not after it
        profiled = profile_to_session(args)
        return _start(args, profiled.session, request, profiled)

    return respond(args, work)


def cmd_resume(args: argparse.Namespace) -> int:
    return respond(args, lambda: _start(args, args.session, search_request(args)))


def _start(args: argparse.Namespace, sid: int, request: SearchRequest,
           profiled: Profiled | None = None) -> tuple[int, dict]:
    """Run the session's search here or detached; its exit code and ``--json`` facts."""
    from kforge.cli.progress import Progress  # the engine brings in torch: not for --help

    started = start_search(resolve_db(args), sid, request, Progress(quiet=args.quiet),
                           profiled=profiled)
    if started.detached:
        out.print(f"session {sid} is searching in the background (process "
                  f"{started.engine_pid}); log: {started.log}")
        out.print(f"follow it with `kforge-tui`, stop it with `kforge stop {sid}`")
    else:
        if not args.quiet:
            out.print(f"session {sid}: {started.status}; see `kforge show {sid}`")
        # the search ended before these confirmations did (its log says why)
        if confirming := started.facts.confirming:
            err.print(f"session {sid}: node(s) {', '.join(map(str, confirming))} still "
                      f"confirming, not used until confirmed: `kforge resume {sid}` confirms "
                      "them")
    return (0 if started.ended_well else 1), started.to_dict()


def cmd_stop(args: argparse.Namespace) -> int:
    err.print(with_store(args, lambda store: issue(store, args.session, CommandKind.STOP)))
    return 0
