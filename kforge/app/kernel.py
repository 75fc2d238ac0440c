"""Add a user's own kernel to an op card's search tree: evaluated with the session's evaluator as
the search evaluates its candidates, and kept as the user's (proposer "user"), where a later
search refines or repairs it like any node."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kforge.app.database import with_store
from kforge.core.candidate import Candidate, EvalOutcome, Proposal
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

USER = "user"  # the proposer a user's own kernel is marked with
# A kernel's source or launch plan is kilobytes: a larger file is neither (a log, an archive).
MAX_FILE_CHARS = 1 << 20


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


@dataclass(frozen=True)
class KernelRequest:
    """A user's kernel for op card ``card`` of ``session``: its CUDA source and launch plan (as
    ``read_source`` and ``read_launch_plan`` give them), the node it improves (None: a new
    approach), a few words naming its technique, and whether the plug-ins the session names are
    trusted."""

    session: int
    card: int
    source: str
    plan: dict
    parent: int | None = None
    approach: str | None = None
    trust_plugins: bool = False


@dataclass(frozen=True)
class KernelAdded:
    """The node the kernel became, and its evaluation (None where it has none)."""

    session: int
    node: NodeRow
    outcome: EvalOutcome | None

    def to_dict(self) -> dict:
        row = self.node
        return {"session": self.session, "card": row.card_id, "node": row.id,
                "proposer": USER, "action": row.action, "status": row.status, "ok": row.ok,
                "confirmed": row.confirmed,
                "speedup": self.outcome.speedup if self.outcome is not None else None,
                "summary": row.summary or None}


def add_kernel(db: Path, request: KernelRequest) -> KernelAdded:
    """Check the request against the session, then evaluate the kernel and add it."""

    async def work(store: Store) -> KernelAdded:
        node_id = await _add(store, request)
        detail = await store.get_node(node_id)
        return KernelAdded(request.session, detail.row, detail.outcome)

    return with_store(db, work)


async def _add(store: Store, request: KernelRequest) -> int:
    """The kernel's node id, once evaluated and added."""
    from kforge.engine.runner import add_given_kernel

    session, card_id = request.session, request.card
    found = await store.get_session(session)
    if is_alive(found):
        raise KforgeError(f"session {session} is being searched right now (process "
                          f"{found.engine_pid}): `kforge stop {session}` first")
    rows = {row.id: row for row in await store.list_cards(session)}
    if card_id not in rows:
        raise KforgeError(f"no op card {card_id} in session {session} "
                          f"(`kforge show {session}` lists them)")
    parent = None
    if request.parent is not None:
        nodes = await store.get_nodes([request.parent])
        if not nodes or nodes[0].session_id != session:
            raise KforgeError(f"no search node {request.parent} in session {session}")
        parent = nodes[0]
    decision = decision_under(parent, card_id)
    candidate = given_candidate(request.source, request.plan, rows[card_id].card, decision,
                                request.approach)
    skipped = {row.id: row.stop_reason or "skipped" for row in rows.values()
               if row.status == CardStatus.SKIPPED}
    return await add_given_kernel(store, session, card_id, candidate, decision,
                                  UserKernels(skipped), PluginConsent(every=request.trust_plugins))


def read_source(path: Path) -> str:
    """The CUDA source at ``path``; KforgeError when it is missing or declares no kernel."""
    from kforge.propose.llm.parse import extern_c_kernels  # brings in torch: not for --help

    source = _read(path, "CUDA source")
    if not extern_c_kernels(source):
        raise KforgeError(f'{path} declares no extern "C" __global__ kernel for a plan to launch')
    return source


def read_launch_plan(path: Path) -> dict:
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
