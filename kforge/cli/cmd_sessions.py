"""`kforge sessions`, `kforge show SESSION` and `kforge delete SESSION`: browse what is stored."""

from __future__ import annotations

import argparse
import sys
import time
from operator import attrgetter
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from kforge.cli.common import (
    EAGER_SOURCES,
    LINE_CHARS,
    add_db_option,
    cells,
    out,
    row_id,
    session_id,
    whole,
    with_store,
)
from kforge.core.candidate import EvalOutcome
from kforge.core.fmt import (
    fmt_age,
    fmt_best_over_eager,
    fmt_headline,
    fmt_left_out,
    fmt_mode_gains,
    fmt_projection,
    fmt_speedup,
    fmt_us,
)
from kforge.core.inert import capped, inert
from kforge.core.region import folded
from kforge.core.settings import SessionSettings
from kforge.core.text import one_line
from kforge.errors import KforgeError
from kforge.store import Store
from kforge.store.commands import is_alive, shown_status
from kforge.store.config import db_path
from kforge.store.events import ModelMeasured
from kforge.store.records import CardRow, reading
from kforge.store.store import MAX_CARDS

if TYPE_CHECKING:
    from kforge.cli.main import Commands


def register(sub: Commands) -> None:
    p = sub.add_parser("sessions")
    add_db_option(p)
    p.set_defaults(func=cmd_sessions)

    p = sub.add_parser("show")
    p.add_argument("session", type=session_id)
    p.add_argument("--targets", action="store_true", help="hide views and copies")
    p.add_argument("--top", type=whole(1, MAX_CARDS), metavar="N",
                   help="only the table's first N op cards (targets by time share, then views "
                        "and copies; a fusion region's op cards under it), and a line on the "
                        "rest (default: all)")
    p.add_argument("--node", type=row_id, metavar="N",
                   help="show search node N in full: its outcome, kernel, plan and LLM calls")
    p.add_argument("--no-prompt", action="store_true",
                   help="with --node: leave out the LLM calls' prompts and replies")
    add_db_option(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("delete")
    p.add_argument("session", type=session_id)
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    add_db_option(p)
    p.set_defaults(func=cmd_delete)


def cmd_sessions(args: argparse.Namespace) -> int:
    if not db_path(args.db).exists():
        out.print(f"no sessions yet (database {db_path(args.db)} does not exist)")
        return 0
    summaries = with_store(args, lambda store: store.list_sessions(), reads_only=True)
    if not summaries:
        out.print("no sessions yet")
        return 0
    table = Table(box=None, header_style="bold")
    for name in ("id", "model", "gpu", "status", "ops", "nodes", "improved", "best vs eager",
                 "cost", "last activity"):
        table.add_column(name, justify="right" if name in ("id", "ops", "nodes", "improved",
                                                            "best vs eager", "cost") else "left")
    now = time.time()
    for s in summaries:
        table.add_row(str(s.session.id), *cells(s.session.model, s.session.gpu_label,
                                                 shown_status(s.session)),
                      f"{s.targets}/{s.cards}", str(s.nodes), str(s.improved),
                      fmt_best_over_eager(s.best_speedup), f"${s.session.usd_spent:.2f}",
                      fmt_age(now - s.last_activity))
    out.print(table)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    if args.node is not None:
        from kforge.cli.node_view import cmd_show_node  # brings in torch: not for `show --help`

        return cmd_show_node(args)

    async def work(store: Store):
        cards = await store.list_cards(args.session)
        best = {row.id: (await store.get_node(row.best_kernel)).outcome for row in cards
                if row.best_kernel is not None}
        confirming: dict[int, list] = {}
        for node in await store.list_nodes(args.session):
            if node.confirming:
                confirming.setdefault(node.card_id, []).append(node)
        return (await store.get_session(args.session), cards, best, confirming,
                await store.latest_model_measurement(args.session))

    session, cards, best, confirming, measured = with_store(args, work, reads_only=True)
    settings = session.settings
    search = SessionSettings.from_stored(settings).search
    model, gpu, status = cells(session.model, session.gpu_label, shown_status(session))
    out.print(Text.assemble((f"session {session.id}", "bold"), f"  {model}  on {gpu}  [{status}]"))
    details = {k: settings[k] for k in ("dtype", "batch", "seq_len", "seq_lengths", "mode")
               if k in settings}
    if details:
        out.print("  " + "  ".join(f"{k}={cells(str(v))[0]}"
                                   for k, v in details.items()))
    out.print(f"  proposer={cells(search.proposer)[0]}  "
              f"spent ${session.usd_spent:.2f}  ran {session.run_seconds / 60:.1f} min")
    if measured is not None:
        out.print(f"  {measured_line(measured.record, time.time() - measured.at)}")
    if session.error:
        out.print(Text.assemble("  ", ("error:", "red"), f" {capped(session.error, LINE_CHARS)}"))
    table = Table(box=None, header_style="bold")
    # range cards (kforge.core.ranges) cover a range of sizes: a column says which
    ranged = any(row.card.ranges is not None for row in cards)
    sources = {EAGER_SOURCES[row.eager_source] for row in cards if row.card.eager_us is not None}
    mixed = len(sources) > 1  # each eager figure then names its source
    for name, right in (("card", True), ("op", False), ("arguments", False),
                        *((("range", False),) if ranged else ()), ("calls", True),
                        ("share", True), ("kind", False),
                        ("eager" if len(sources) != 1 else f"eager {next(iter(sources))}", True),
                        ("compile device", True), ("best vs eager", True),
                        ("kernel device", True), ("host issue", True), ("tries", True),
                        ("status", False)):
        table.add_column(name, justify="right" if right else "left", overflow="fold")
    rows = folded(cards, attrgetter("card"))
    hidden = {row.id for row, _ in rows if args.targets and not row.card.target}
    rows = [(row, region) for row, region in rows if row.id not in hidden]
    shown = first_cards(rows, args.top)
    shown_ids = {row.id for row, _ in shown}
    untrusted = [f"card {row.id}: {check}" for row in cards
                 if row.id in shown_ids and (check := profile_check(row))]
    for row, region in shown:
        c = row.card
        status = row.status + (f": {row.stop_reason}" if row.stop_reason else "")
        status += "".join(f"; confirming node {n.id} ({fmt_speedup(n.speedup)} over eager)"
                          for n in confirming.get(row.id, []))
        with reading(f"the evaluation of search node {row.best_node}"):  # as the table shows it
            kernel, host = kernel_times(best.get(row.id))
        eager = fmt_us(c.eager_us)
        if mixed and c.eager_us is not None:
            eager += f" {EAGER_SOURCES[row.eager_source]}"
        table.add_row(str(row.id), ("└ " if region is not None else "") + cells(c.short_op)[0],
                      one_line(c.signature, 70),
                      *(cells(c.range_text or "-") if ranged else ()), str(c.calls),
                      f"{100 * c.share:.1f}%", *cells(c.library), eager, fmt_us(c.compiled_us),
                      best_cell(row), kernel, host, str(row.spent), *cells(status),
                      style=None if c.target and region is None else "dim")
    out.print(table)
    if len(shown) < len(rows):
        out.print("  " + left_out_line(rows, shown))
    if any(region is not None for _, region in shown):
        out.print("  (└: an op card inside the fusion region above it; the region's share "
                  "includes its ops')")
    if "profile" in sources:
        out.print("  (eager profile: the op's time per call in the profiled model run, before "
                  "the evaluator times it alone; eager device: the evaluator's device time per "
                  "call)")
    if hidden:
        out.print(f"  ({len(hidden)} views and copies hidden: they are never targets)")
    for line in untrusted:  # docs/evaluation.md, "Baselines against the profile"
        out.print(f"  no speedup shown for {capped(line, LINE_CHARS)}")
    if shown_ids & confirming.keys():
        out.print("  (confirming: a would-be best under compute-sanitizer and re-timing; 'best vs "
                  "eager' counts confirmed kernels only, and `kforge resume` finishes a "
                  "confirmation a stop cut short)")
    return 0


def first_cards(rows: list[tuple[CardRow, CardRow | None]], top: int | None
                ) -> list[tuple[CardRow, CardRow | None]]:
    """The first ``top`` (None: all) of the table's rows (``folded``) that stand on their own,
    each region's with the rows of its op cards under it."""
    standing = [index for index, (_, region) in enumerate(rows) if region is None]
    return rows if top is None or top >= len(standing) else rows[:standing[top]]


def left_out_line(rows: list[tuple[CardRow, CardRow | None]],
                  shown: list[tuple[CardRow, CardRow | None]]) -> str:
    """The line under a table cut to its first cards (``first_cards``): how many op cards it
    leaves out, and their share of the time (that of the rows standing on their own: a region's
    includes its op cards')."""
    left = {row.id for row, _ in rows} - {row.id for row, _ in shown}
    share = sum(row.card.share for row, region in rows[len(shown):] if region is None)
    return fmt_left_out(len(left), share, "op card")


def measured_line(measured: ModelMeasured, age_s: float) -> str:
    """The whole model as `kforge e2e` last measured it: kforge's best mode against the best
    mode without kforge (the session's headline, as the TUI's bar shows it), what kforge gains
    in each mode, and the op cards' projection."""
    headline = measured.headline()
    lead = (fmt_headline(headline, checked=bool(measured.kernels))[0] if headline is not None
            else "e2e timed no mode both with and without kforge")
    parts = [f"{lead}, measured {fmt_age(max(0.0, age_s))}", fmt_mode_gains(measured),
             fmt_projection(measured.projected, measured.gains)]
    return "; ".join(part for part in parts if part)


def profile_check(row: CardRow) -> str:
    """Why the card's baseline disagrees with its profile (it then shows no speedup), or ''."""
    return (row.baseline or {}).get("profile_check") or ""


def best_cell(row: CardRow) -> str:
    """The card's best kernel's speedup over eager, and over torch.compile where only that one
    is beaten; '-' where no kernel beats either."""
    if profile_check(row):
        return "- (profile)"
    if row.best_beats == "compile":
        return (f"{fmt_speedup(row.best_over_eager)} "
                f"({fmt_speedup(row.best_over_compiled)} vs compile)")
    return fmt_speedup(row.best_over_eager)


def kernel_times(outcome: EvalOutcome | None) -> tuple[str, str]:
    """The best kernel's device time per call, and its launch path's host time to issue one
    call next to eager's dispatch ("-" where not measured)."""
    if outcome is None or outcome.timing is None:
        return "-", "-"
    cost = outcome.host
    host = f"{fmt_us(cost.host_us)} vs {fmt_us(cost.eager_host_us)}" if cost is not None else "-"
    return fmt_us(outcome.timing.median_us), host


def cmd_delete(args: argparse.Namespace) -> int:
    async def work(store: Store) -> None:
        session = await store.get_session(args.session)
        if is_alive(session):
            raise KforgeError(f"session {args.session} is being searched right now: "
                              f"`kforge stop {args.session}` first")
        if not args.yes:
            if not sys.stdin.isatty():
                raise KforgeError(f"not deleting session {args.session} without a terminal to "
                                  f"confirm on: add --yes")
            answer = input(inert(f"delete session {args.session} ({cells(session.model)[0]}) "
                                 "and all its "
                                 "kernels? [y/N] "))
            if answer.strip().lower() not in ("y", "yes"):
                raise KforgeError("nothing deleted")
        await store.delete_session(args.session)

    with_store(args, work)
    out.print(f"deleted session {args.session}")
    return 0
