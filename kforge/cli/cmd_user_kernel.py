"""`kforge add-kernel SESSION --card N --source kernel.cu --plan plan.json [--parent NODE]`: its
command line, and the line it prints of the node a user's own kernel became
(``kforge.app.kernel`` evaluates it for the op card with the session's evaluator and adds it to
the card's search tree, where a later `kforge resume` refines or repairs it like any node)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from kforge.app.kernel import USER, KernelRequest, add_kernel, read_launch_plan, read_source
from kforge.cli.common import (
    add_db_option,
    add_trust_plugins_option,
    out,
    resolve_db,
    row_id,
    session_id,
)

if TYPE_CHECKING:
    from kforge.cli.main import Commands


def register(sub: Commands) -> None:
    p = sub.add_parser("add-kernel")
    p.add_argument("session", type=session_id)
    p.add_argument("--card", type=row_id, required=True, metavar="N",
                   help="the op card (`kforge show SESSION` lists them)")
    p.add_argument("--source", type=Path, required=True, metavar="FILE",
                   help='the CUDA source: extern "C" __global__ kernels, compiled by NVRTC')
    p.add_argument("--plan", type=Path, required=True, metavar="FILE",
                   help="the launch plan, as JSON (docs/launch-plan.md)")
    p.add_argument("--parent", type=row_id, metavar="NODE",
                   help="the node the kernel improves (a refine of a working one, a repair of a "
                        "failed one); without it, a new approach")
    p.add_argument("--approach", metavar="TEXT",
                   help="a few words naming the technique (later LLM prompts list it)")
    add_trust_plugins_option(p)
    add_db_option(p)
    p.set_defaults(func=cmd_add_kernel)


def cmd_add_kernel(args: argparse.Namespace) -> int:
    request = KernelRequest(args.session, args.card, read_source(args.source),
                            read_launch_plan(args.plan), parent=args.parent,
                            approach=args.approach, trust_plugins=args.trust_plugins)
    added = add_kernel(resolve_db(args), request)
    row, outcome = added.node, added.outcome
    result = (f"ok, {outcome.speedup:.2f}x over eager" if outcome is not None and outcome.ok
              and outcome.speedup is not None else row.status)
    summary = f": {row.summary}" if row.summary and not row.ok else ""
    if row.ok:  # only a confirmed kernel is ever used
        summary = (", confirmed" if row.confirmed else
                   ", not confirmed (no faster than the card's baselines and best beyond the "
                   "timing noise): never used")
    out.print(f"node {row.id} ({USER}, {row.action}) for card {row.card_id}: {result}{summary}")
    out.print(f"  details: kforge show {args.session} --node {row.id}")
    return 0
