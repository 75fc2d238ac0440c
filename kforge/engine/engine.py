"""The asyncio engine: runs one session's search over its op cards.

A thin shell around the pure pieces. ``kforge.core.budget`` picks the op, ``kforge.core.mcts`` picks
the node and action, the proposer writes a candidate, the evaluator judges it, and the store records
each step in its own transaction. Several proposals may be in flight; evaluations are limited to the
evaluator's capacity (one per GPU). Viewer commands (pause, resume, stop, prune, unprune, focus) are
read from the store between steps.

Crash safety: a node is stored before its work starts and finished in one transaction with its
result. After a crash, finished nodes are kept as they are, nodes whose candidate was stored are
evaluated again, and nodes still waiting on the proposer are dropped and re-proposed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kforge.core import budget
from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus, Proposal
from kforge.core.mcts import ROOT, Action, Decision, Tree
from kforge.core.opcard import OpCard
from kforge.core.protocols import Evaluator, NodeView, ProposalRequest, Proposer
from kforge.core.reward import reward_from_speedup
from kforge.engine.settings import SearchSettings
from kforge.errors import KforgeError
from kforge.store import CardStatus, CommandKind, NodeStatus, SessionStatus, Store
from kforge.store.records import CardRow, Command

log = logging.getLogger("kforge.engine")

HEARTBEAT_S = 2.0
COMMAND_POLL_S = 0.25
LINEAGE_DEPTH = 4  # the parent and up to three ancestors, as Kernel Forge's prompts carry
FAILED_KEPT = 8  # failed approaches listed in a request
INFRA_RETRIES = 1  # an evaluator hiccup is retried once before the node is written off


@dataclass
class CardState:
    """The engine's in-memory view of one op card during a search."""

    row: CardRow
    tree: Tree
    metas: dict[int, dict] = field(default_factory=dict)  # node id -> candidate meta
    failed: list[str] = field(default_factory=list)
    spent: int = 0
    best_node: int | None = None
    best_speedup: float | None = None
    done: bool = False

    @property
    def card(self) -> OpCard:
        return self.row.card

    def op_budget(self) -> budget.OpBudget:
        c = self.card
        ceiling = c.eager_us / c.floor_us if c.eager_us and c.floor_us else None
        return budget.OpBudget(
            card_id=self.row.id, share=c.share, vendor=c.vendor,
            best_speedup=max(self.best_speedup or 1.0, 1.0), ceiling=ceiling,
            spent=self.spent + self.tree.inflight(), since_best=self.tree.since_improvement)


@dataclass(frozen=True)
class Snapshot:
    """What a progress display shows; built on every change."""

    session_id: int
    status: str
    iterations: int
    total: int
    inflight: int
    usd: float
    elapsed_s: float
    cards: list[tuple[str, str, int, float | None, str]]  # op, signature, spent, best, status
    message: str = ""


class Engine:
    def __init__(self, store: Store, session_id: int, proposer: Proposer, evaluator: Evaluator,
                 settings: SearchSettings,
                 on_change: Callable[[Snapshot], None] | None = None) -> None:
        self.store = store
        self.session_id = session_id
        self.proposer = proposer
        self.evaluator = evaluator
        self.settings = settings
        self.on_change = on_change
        self.cards: dict[int, CardState] = {}
        self.paused = False
        self.stopping = False
        self.focus = settings.focus
        self._usd = 0.0
        self._run_s_before = 0.0
        self._started = time.monotonic()
        self._slots: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task] = set()
        self._done_queue: list[tuple[CardState, str]] = []
        self._baseline_locks: dict[int, asyncio.Lock] = {}
        self._status = SessionStatus.RUNNING
        self._message = ""
        self._end_reason = ""  # why the search ended, for the ops it leaves unfinished
        self._searched: set[int] = set()  # the cards this run may search (targets, top shares)

    # ----- the run -----

    async def run(self) -> SessionStatus:
        """Search until the budget is spent, every op is done, or a stop command arrives."""
        await self.store.claim_engine(self.session_id)
        status, error = SessionStatus.FAILED, ""
        beat = asyncio.create_task(self._heartbeat())
        try:
            await self.evaluator.start()
            self._slots = asyncio.Semaphore(max(1, self.evaluator.capacity))
            await self._load()
            await self._set_status(SessionStatus.RUNNING)
            await self._redo_inflight()
            status = await self._loop()
        except KforgeError as exc:
            error = str(exc)
            await self._log(f"search failed: {error}", "error")
        except Exception as exc:  # a bug in a plugin: keep the session consistent, report it
            log.exception("engine failed")
            error = f"{type(exc).__name__}: {exc}"
            await self._log(f"search failed: {error}", "error")
        finally:
            await self._cancel_tasks()
            await self._park_cards(error or self._end_reason or str(status))
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            with contextlib.suppress(Exception):
                await self.evaluator.close()
            with contextlib.suppress(Exception):
                await self.proposer.close()
            await self.store.heartbeat(self.session_id, self._take_run_seconds())
            await self.store.release_engine(self.session_id, status, error)
            self._notify(status)
        if error:
            raise KforgeError(error)
        return status

    def request_stop(self) -> None:
        """Stop soon (a signal handler calls this): in-flight work is dropped and redone on resume."""
        self.stopping = True
        self._end_reason = "stopped"

    async def _loop(self) -> SessionStatus:
        while True:
            await self._apply_commands()
            if self.stopping:
                return SessionStatus.STOPPED
            if not self.paused:
                while len(self._tasks) < self.settings.parallel:
                    started = await self._start_next()
                    if not started:
                        break
            if not self._tasks and not self.paused:
                return SessionStatus.DONE
            await self._wait_for_work()

    async def _wait_for_work(self) -> None:
        if self._tasks:
            done, _ = await asyncio.wait(self._tasks, timeout=COMMAND_POLL_S,
                                         return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                self._tasks.discard(task)
                task.result()  # re-raise a plugin failure here, in the engine's own frame
        else:
            await asyncio.sleep(COMMAND_POLL_S)

    async def _cancel_tasks(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    # ----- loading and resuming -----

    async def _load(self) -> None:
        session = await self.store.get_session(self.session_id)
        self._usd = session.usd_spent
        self._run_s_before = session.run_seconds
        rows = await self.store.list_cards(self.session_id)
        nodes = await self.store.list_nodes(self.session_id)
        for stale in [n for n in nodes if n.status == NodeStatus.PROPOSING]:
            await self.store.delete_node(stale.id)
        kept = [n for n in nodes if n.status != NodeStatus.PROPOSING]
        rows = [await self._screen(row) for row in rows]
        targets = sorted((r for r in rows if r.card.target and r.status != CardStatus.SKIPPED),
                         key=lambda r: -r.card.share)
        self._searched = {r.id for r in targets[:self.settings.top_ops]}
        for row in rows:
            mine = [n for n in kept if n.card_id == row.id]
            tree = Tree.from_records([n.record() for n in mine], self.settings.mcts,
                                     seed=self.settings.seed * 1_000_003 + row.id)
            state = CardState(row=row, tree=tree, spent=tree.completed,
                              best_node=row.best_node, best_speedup=row.best_speedup,
                              done=row.status in (CardStatus.DONE, CardStatus.SKIPPED)
                              or row.id not in self._searched)
            for n in mine:
                state.metas[n.id] = n.meta
                if not n.ok and not n.in_flight:
                    state.failed.append(_failure_line(n.meta, n.status, n.summary))
            self.cards[row.id] = state
        if self.focus is not None and self.focus not in self.cards:
            self.focus = None
        self._refresh_done()

    async def _screen(self, row: CardRow) -> CardRow:
        """Skip the target ops this proposer cannot write kernels for (with its reason), and
        take up again those a previous proposer skipped but this one can handle."""
        if not row.card.target:
            return row
        reason = self.proposer.declines(row.card)
        if reason and row.status != CardStatus.SKIPPED:
            await self.store.update_card(row.id, status=CardStatus.SKIPPED,
                                         stop_reason=f"{self.proposer.name}: {reason}")
        elif not reason and row.status == CardStatus.SKIPPED:
            await self.store.update_card(row.id, status=CardStatus.PENDING, stop_reason="")
        else:
            return row
        return await self.store.get_card(row.id)

    async def _ensure_baseline(self, state: CardState) -> bool:
        """Time eager (and torch.compile) for a card before its first candidate; False if the op
        cannot be run on its own, in which case the card is skipped with the reason."""
        lock = self._baseline_locks.setdefault(state.row.id, asyncio.Lock())
        async with lock:
            if state.row.baseline is not None:
                return True
            if state.done:
                return False
            assert self._slots is not None
            try:
                async with self._slots:
                    base = await self.evaluator.baseline(state.card)
            except KforgeError as exc:
                state.done = True
                await self.store.update_card(state.row.id, status=CardStatus.SKIPPED,
                                             stop_reason=f"cannot time eager: {exc}")
                state.row = await self.store.get_card(state.row.id)
                await self._log(f"{state.card.short_op}: skipped, cannot time eager: {exc}",
                                "warning")
                return False
            await self.store.update_card(
                state.row.id, eager_us=base.eager.median_us, floor_us=base.floor_us,
                compiled_us=base.compiled.median_us if base.compiled else None,
                baseline=base.to_dict())
            state.row = await self.store.get_card(state.row.id)
            self._notify()
            return True

    async def _redo_inflight(self) -> None:
        """Evaluate again the candidates that were stored but not judged when the engine stopped."""
        for state in self.cards.values():
            pending = [n for n in await self.store.list_nodes(self.session_id, state.row.id)
                       if n.status == NodeStatus.EVALUATING]
            for n in pending:
                detail = await self.store.get_node(n.id)
                assert detail.candidate is not None
                await self._log(f"re-evaluating node {n.id}, in flight when the engine stopped")
                self._spawn(self._evaluate(state, n.id, detail.candidate))

    # ----- scheduling -----

    def _refresh_done(self) -> None:
        for state in self.cards.values():
            if not state.done and (reason := self._stop_reason(state)):
                state.done = True
                self._done_queue.append((state, reason))

    def _stop_reason(self, state: CardState) -> str | None:
        return budget.stop_reason(state.op_budget(), self.settings.per_op_limit,
                                  self.settings.patience)

    def _total_iterations(self) -> int:
        return self.settings.iterations_per_op * len(self._searched)

    def _budget_left(self) -> str | None:
        """Why no new work may start, or None."""
        spent = sum(s.spent + s.tree.inflight() for s in self.cards.values())
        if spent >= self._total_iterations():
            return "iteration budget spent"
        if self.settings.usd is not None and self._usd >= self.settings.usd:
            return f"USD budget of ${self.settings.usd:.2f} spent"
        if self.settings.wall_s is not None and self._run_seconds() >= self.settings.wall_s:
            return f"time budget of {self.settings.wall_s:.0f} s spent"
        return None

    async def _start_next(self) -> bool:
        await self._flush_card_done()
        if (reason := self._budget_left()) is not None:
            if reason != self._end_reason and not self._tasks:
                self._end_reason = reason
                await self._log(reason)
            return False
        active = [s for s in self.cards.values()
                  if not s.done and (self.focus is None or s.row.id == self.focus)]
        if not active:
            return False
        spent_elsewhere = sum(s.spent + s.tree.inflight() for s in self.cards.values()
                              if s not in active)
        pick = budget.pick_next([s.op_budget() for s in active],
                                self._total_iterations() - spent_elsewhere)
        if pick is None:
            return False
        state = self.cards[pick]
        decision = state.tree.select()
        parent_id = None if decision.parent == ROOT else decision.parent
        node_id = await self.store.add_node(self.session_id, pick, parent_id, decision.action)
        state.tree.add(node_id, decision.parent, decision.action)
        if state.row.status in (CardStatus.PENDING, CardStatus.STOPPED):
            await self.store.update_card(pick, status=CardStatus.SEARCHING, stop_reason="")
            state.row = await self.store.get_card(pick)
        self._spawn(self._work(state, node_id, decision))
        self._notify()
        return True

    def _spawn(self, coro) -> None:
        self._tasks.add(asyncio.create_task(coro))

    # ----- one iteration -----

    async def _work(self, state: CardState, node_id: int, decision: Decision) -> None:
        if not await self._ensure_baseline(state):
            await self.store.delete_node(node_id)
            state.tree.discard(node_id)
            return
        request = await self._request(state, decision, node_id)
        proposal = await self.proposer.propose(request)
        self._usd += proposal.usd
        if not proposal.candidates:
            await self._record(state, node_id, None, proposal)
            return
        await self.store.set_candidate(node_id, proposal.candidates[0], proposal.calls)
        state.metas[node_id] = proposal.candidates[0].meta
        await self._evaluate(state, node_id, proposal.candidates[0])

    async def _evaluate(self, state: CardState, node_id: int, candidate: Candidate) -> None:
        assert self._slots is not None
        for attempt in range(INFRA_RETRIES + 1):
            async with self._slots:
                outcome = await self.evaluator.evaluate(state.card, candidate)
            if outcome.status is not EvalStatus.INFRA:
                break
            await self._log(f"evaluator problem on node {node_id} (try {attempt + 1}): "
                            f"{outcome.summary}", "warning")
        await self._record(state, node_id, outcome, None)

    async def _record(self, state: CardState, node_id: int, outcome: EvalOutcome | None,
                      proposal: Proposal | None) -> None:
        """Store the node's result and the card's new state in one transaction, then update the
        tree: a crash between the two replays the stored result on restart."""
        ok = outcome is not None and outcome.ok and outcome.speedup is not None
        reward = reward_from_speedup(outcome.speedup) if ok else None  # type: ignore[union-attr]
        best_node, best_speedup = state.best_node, state.best_speedup
        if ok and (best_speedup is None or outcome.speedup > best_speedup):  # type: ignore[union-attr]
            best_node, best_speedup = node_id, outcome.speedup  # type: ignore[union-attr]
        changes = {"spent": state.spent + 1, "best_node": best_node, "best_speedup": best_speedup}
        if outcome is None:
            assert proposal is not None
            await self.store.fail_proposal(node_id, proposal.error or "no candidate",
                                           proposal.calls, changes)
            state.failed.append(f"(no candidate) {proposal.error}"[:200])
        else:
            await self.store.finish_node(node_id, outcome, reward, changes)
            if not ok:
                state.failed.append(_failure_line(state.metas.get(node_id, {}),
                                                  outcome.status.value, outcome.summary))
        state.tree.complete(node_id, reward, repairable=bool(
            outcome is not None and outcome.status.repairable))
        state.spent += 1
        state.best_node, state.best_speedup = best_node, best_speedup
        if not state.done and (reason := self._stop_reason(state)):
            state.done = True
            self._done_queue.append((state, reason))
        await self._flush_card_done()
        self._notify()

    async def _park_cards(self, reason: str) -> None:
        """Ops still being searched when the session's search ends are marked stopped (with the
        session's reason); a resume picks them up again."""
        await self._flush_card_done()
        for state in self.cards.values():
            if state.row.status == CardStatus.SEARCHING:
                await self.store.update_card(state.row.id, status=CardStatus.STOPPED,
                                             stop_reason=reason)

    async def _flush_card_done(self) -> None:
        while self._done_queue:
            state, reason = self._done_queue.pop(0)
            await self.store.update_card(state.row.id, status=CardStatus.DONE, stop_reason=reason)
            state.row = await self.store.get_card(state.row.id)
            await self._log(f"{state.card.short_op} [{state.card.signature[:60]}]: {reason}")

    async def _request(self, state: CardState, decision: Decision, node_id: int) -> ProposalRequest:
        tree = state.tree
        parent = None if decision.parent == ROOT else decision.parent
        chain = tree.lineage(parent)[-LINEAGE_DEPTH:] if parent is not None else []
        views = {v.id: v for v in await self._views(chain)}
        best = tree.best()
        best_view = views.get(best) if best in views else (
            (await self._views([best]))[0] if best is not None else None)
        return ProposalRequest(
            card=state.card, action=decision.action, gpu=self.evaluator.gpu,
            parent=views.get(parent) if parent is not None else None,
            lineage=[views[i] for i in chain], tried=list(state.metas.values()),
            failed=state.failed[-FAILED_KEPT:], best=best_view,
            seed=self.settings.seed * 1_000_003 + node_id)

    async def _views(self, node_ids: list[int]) -> list[NodeView]:
        views = []
        for node_id in node_ids:
            detail = await self.store.get_node(node_id)
            views.append(NodeView(id=node_id, action=Action(detail.row.action),
                                  candidate=detail.candidate, outcome=detail.outcome))
        return views

    # ----- commands from viewers -----

    async def _apply_commands(self) -> None:
        for command in await self.store.pending_commands(self.session_id):
            result = await self._apply(command)
            await self.store.ack_command(command.id, result)
            self._notify()

    async def _apply(self, command: Command) -> str:
        kind = command.kind
        if kind == CommandKind.PAUSE:
            self.paused = True
            await self._set_status(SessionStatus.PAUSED)
            return "paused"
        if kind == CommandKind.RESUME:
            self.paused = False
            await self._set_status(SessionStatus.RUNNING)
            return "resumed"
        if kind == CommandKind.STOP:
            self.request_stop()
            return "stopping"
        if kind in (CommandKind.PRUNE, CommandKind.UNPRUNE):
            return await self._prune(command.arg, kind == CommandKind.PRUNE)
        if kind == CommandKind.FOCUS:
            if command.arg is not None and command.arg not in self.cards:
                return f"no op card {command.arg} in this session"
            self.focus = command.arg
            session = await self.store.get_session(self.session_id)
            search = {**session.settings.get("search", {}), "focus": self.focus}
            await self.store.update_settings(self.session_id, {"search": search})
            return "focus cleared" if self.focus is None else f"focused on card {self.focus}"
        return f"unknown command {kind!r}"

    async def _prune(self, node_id: object, prune: bool) -> str:
        if not isinstance(node_id, int):
            return "prune needs a node id"
        for state in self.cards.values():
            if node_id in state.tree:
                if prune:
                    state.tree.prune(node_id)
                else:
                    state.tree.unprune(node_id)
                await self.store.set_pruned(node_id, prune)
                return f"{'pruned' if prune else 'unpruned'} node {node_id}"
        return f"no node {node_id} in this search"

    # ----- bookkeeping -----

    async def _set_status(self, status: SessionStatus) -> None:
        await self.store.set_session_status(self.session_id, status)
        self._status = status

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            await self.store.heartbeat(self.session_id, self._take_run_seconds())

    def _take_run_seconds(self) -> float:
        now = time.monotonic()
        elapsed, self._started = now - self._started, now
        self._run_s_before += elapsed
        return elapsed

    def _run_seconds(self) -> float:
        return self._run_s_before + (time.monotonic() - self._started)

    async def _log(self, message: str, level: str = "info") -> None:
        log.log(logging.getLevelName(level.upper()), message)
        self._message = message
        await self.store.log(self.session_id, message, level)

    def _notify(self, status: SessionStatus | None = None) -> None:
        if self.on_change is None:
            return
        status = status or self._status
        rows = sorted(self.cards.values(), key=lambda s: -s.card.share)
        self.on_change(Snapshot(
            session_id=self.session_id, status=str(status),
            iterations=sum(s.spent for s in self.cards.values()),
            total=self._total_iterations(),
            inflight=sum(s.tree.inflight() for s in self.cards.values()),
            usd=self._usd, elapsed_s=self._run_seconds(),
            cards=[(s.card.short_op, s.card.signature, s.spent, s.best_speedup,
                    "done" if s.done else ("searching" if s.spent or s.tree.inflight() else "pending"))
                   for s in rows if s.row.id in self._searched],
            message=self._message))


def _failure_line(meta: dict, status: str, summary: str) -> str:
    """One line on a failed attempt, as listed to the proposer under 'approaches that failed'."""
    return f"{meta.get('approach', '?')}: {status}: {summary}"[:200]
