"""`kforge add-kernel SESSION --card N --source kernel.cu --plan plan.json [--parent NODE]`: a
user's own kernel, evaluated for one op card with the session's evaluator as the search evaluates
its candidates, and added to the card's search tree as the user's (proposer "user"), where a later
`kforge resume` refines or repairs it like any node."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from kforge.cli.common import (
    add_db_option,
    add_trust_plugins_option,
    out,
    row_id,
    session_id,
    with_store,
)
from kforge.core.candidate import Candidate, Proposal
from kforge.core.files import regular_file
from kforge.core.launch_plan import PlanError, PlanNotApplicable, parse_plan
from kforge.core.mcts import ROOT, Action, Decision
from kforge.core.opcard import OpCard
from kforge.core.protocols import ProposalRequest
from kforge.engine.plugins import PluginConsent
from kforge.errors import KforgeError
from kforge.store import CardStatus, Store
from kforge.store.commands import is_alive
from kforge.store.records import NodeRow

if TYPE_CHECKING:
    from kforge.cli.main import Commands

USER = "user"  # the proposer a user's own kernel is marked with


class UserKernels:
    """The proposer an engine is given while it adds a user's kernel: it writes nothing, and it
    declines exactly the cards the session's search skipped (for the reasons stored with them),
    so loading the session for the kernel changes no card."""

    name = USER

    def __init__(self, skipped: dict[int, str]) -> None:
        self._skipped = skipped

    def declines(self, card: OpCard) -> str | None:
        return self._skipped.get(card.id) if card.id is not None else None

    async def propose(self, request: ProposalRequest) -> Proposal:
        return Proposal(error="a user's kernels are added with `kforge add-kernel`")

    async def close(self) -> None:
        pass


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


def read_source(path: Path) -> str:
    """The CUDA source at ``path``; KforgeError when it is missing or declares no kernel."""
    from kforge.propose.llm.parse import extern_c_kernels  # brings in torch: not for --help

    source = _read(path, "CUDA source")
    if not extern_c_kernels(source):
        raise KforgeError(f'{path} declares no extern "C" __global__ kernel for a plan to launch')
    return source


def read_plan(path: Path) -> dict:
    """The launch plan at ``path`` in its canonical form; KforgeError naming the JSON error or
    the plan field at fault."""
    text = _read(path, "launch plan")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KforgeError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column "
                          f"{exc.colno}") from None
    except RecursionError:
        raise KforgeError(f"{path} nests its JSON too deeply to be a launch plan") from None
    try:
        return parse_plan(data).to_dict()
    except PlanError as exc:
        raise KforgeError(f"{path}: {exc}") from None


# A kernel's source or launch plan is kilobytes: a larger file is neither (a log, an archive).
MAX_FILE_CHARS = 1 << 20


def _read(path: Path, what: str) -> str:
    regular_file(path, f"{what} file")
    try:
        with path.open() as fh:
            text = fh.read(MAX_FILE_CHARS + 1)
    except FileNotFoundError:
        raise KforgeError(f"no {what} file {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KforgeError(f"cannot read the {what} {path}: {exc}") from None
    if len(text) > MAX_FILE_CHARS:
        raise KforgeError(f"{path} holds more than {MAX_FILE_CHARS} characters: too long to be "
                          f"a {what}")
    return text


def decision_under(parent: NodeRow | None, card_id: int) -> Decision:
    """Where a kernel goes in the card's tree: a new approach without a parent, a refine of a
    working parent, a repair of a failed one. KforgeError for a parent of another card or one
    still in flight."""
    if parent is None:
        return Decision(ROOT, Action.NEW)
    if parent.card_id != card_id:
        raise KforgeError(f"node {parent.id} belongs to card {parent.card_id}, not card {card_id}")
    if parent.in_flight:
        raise KforgeError(f"node {parent.id} is still {parent.status}: wait until its search "
                          "finishes it")
    return Decision(parent.id, Action.REFINE if parent.ok else Action.REPAIR)


def given_candidate(source: str, plan: dict, card: OpCard, decision: Decision,
                    approach: str | None) -> Candidate:
    """The user's kernel as a candidate for ``card``; KforgeError when its plan does not cover
    the card's variant or launches a kernel the source does not declare."""
    from kforge.propose.llm.parse import extern_c_kernels
    from kforge.runtime.plan import resolve_for

    try:
        resolve_for(plan, card.op, card.args, card.kwargs)
    except PlanNotApplicable as exc:
        raise KforgeError(f"the launch plan does not cover card {card.id}'s variant "
                          f"({card.signature}): {exc}") from None
    except PlanError as exc:
        raise KforgeError(f"the launch plan cannot be resolved for card {card.id}: {exc}") from None
    declared = extern_c_kernels(source)
    launched = list(dict.fromkeys(launch["kernel"] for launch in plan["launches"]))
    if missing := [name for name in launched if name not in declared]:
        raise KforgeError(f'the plan launches {", ".join(missing)}, which the source does not '
                          f'declare extern "C" __global__ (declared: {", ".join(declared)})')
    meta = {"proposer": USER, "approach": approach or f"the user's own kernel ({decision.action})",
            "action": decision.action.value, "kernels": launched}
    if decision.parent != ROOT:
        meta["parent"] = decision.parent
    return Candidate(source=source, plan=plan, meta=meta)


async def add_kernel(store: Store, session: int, card_id: int, source: str, plan: dict,
                     parent_id: int | None, approach: str | None,
                     consent: PluginConsent = PluginConsent()) -> int:
    """Check the request against the session, then evaluate and add the kernel; its node id."""
    from kforge.engine.runner import add_given_kernel

    found = await store.get_session(session)
    if is_alive(found):
        raise KforgeError(f"session {session} is being searched right now (process "
                          f"{found.engine_pid}): `kforge stop {session}` first")
    rows = {row.id: row for row in await store.list_cards(session)}
    if card_id not in rows:
        raise KforgeError(f"no op card {card_id} in session {session} "
                          f"(`kforge show {session}` lists them)")
    parent = None
    if parent_id is not None:
        nodes = await store.get_nodes([parent_id])
        if not nodes or nodes[0].session_id != session:
            raise KforgeError(f"no search node {parent_id} in session {session}")
        parent = nodes[0]
    decision = decision_under(parent, card_id)
    candidate = given_candidate(source, plan, rows[card_id].card, decision, approach)
    skipped = {row.id: row.stop_reason or "skipped" for row in rows.values()
               if row.status == CardStatus.SKIPPED}
    return await add_given_kernel(store, session, card_id, candidate, decision,
                                  UserKernels(skipped), consent)


def cmd_add_kernel(args: argparse.Namespace) -> int:
    source, plan = read_source(args.source), read_plan(args.plan)

    async def work(store: Store):
        node_id = await add_kernel(store, args.session, args.card, source, plan, args.parent,
                                   args.approach, PluginConsent(every=args.trust_plugins))
        return await store.get_node(node_id)

    detail = with_store(args, work)
    row, outcome = detail.row, detail.outcome
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
