"""The asyncio engine: runs one session's search over its op cards.

A thin shell around the pure pieces. ``kforge.core.schedule`` holds each op's search state and
decides which op goes next and when an op or the session is done, ``kforge.core.mcts`` picks the
node and action, the proposer writes a candidate, the evaluator judges it, and the store records
each step in its own transaction. Several proposals may be in flight; evaluations are limited to the
evaluator's capacity (its workers). Viewer commands (pause, resume, stop, prune, unprune, focus) are
read from the store between steps.

A would-be best is *provisional* (``confirming``) until the evaluator confirms it: its evaluation
slot is released at once and the search goes on (it may refine the node). Only a kernel that could
be used is confirmed: one faster than a baseline beyond the timing noise, and of those only an
op's fastest, once that op's search has settled on it (the op is done or gets no more iterations,
or a newer would-be best improved on it by less than the noise), not every step of a refinement
chain. Confirmations run in their own queue, at most ``confirmations`` at once and one per op; a
would-be best faster beyond the noise supersedes the one under way. A node that passes becomes the
op's best; one that fails is demoted (the previous best stands) and its failure goes to the
proposer like any other. At the end the search waits for the confirmations in flight (within its
time budget).

Crash safety: a node is stored before its work starts and finished in one transaction with its
result. After a crash, finished nodes are kept as they are, nodes whose candidate was stored are
evaluated again, confirming nodes are queued for confirmation again, and nodes still waiting on
the proposer are dropped and re-proposed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from kforge.core.argspec import ArgSpecError, resolve_op
from kforge.core.candidate import Baseline, Candidate, EvalOutcome, EvalStatus, Proposal
from kforge.core.mcts import ROOT, Action, Decision, Tree
from kforge.core.opcard import OpCard
from kforge.core.outcome import Confirmation
from kforge.core.protocols import Evaluator, NodeView, ProposalRequest, Proposer
from kforge.core.reward import short_of_baselines, significant_win
from kforge.core.schedule import (
    FAILURE_LINE_CHARS,
    Best,
    CardProgress,
    CardSearch,
    NodeResult,
    Schedule,
    derived_seed,
    failure_line,
    searched_cards,
)
from kforge.core.settings import SearchSettings
from kforge.core.text import one_line
from kforge.errors import KforgeError
from kforge.eval.process.cluster import WORKERS_KEY
from kforge.eval.process.pool import EvaluatorLost
from kforge.runtime.regions import register_cards
from kforge.store import CardStatus, CommandKind, NodeStatus, SessionStatus, Store
from kforge.store.commands import BadCommand, checked, save_focus, save_pruned
from kforge.store.lease import LeaseLost
from kforge.store.records import CardRow, Command, reading

log = logging.getLogger("kforge.engine")
T = TypeVar("T")

HEARTBEAT_S = 2.0
COMMAND_POLL_S = 0.25
LINEAGE_DEPTH = 4  # the parent and up to three ancestors, as Kernel Forge's prompts carry
FAILED_KEPT = 8  # failed approaches listed in a request
INFRA_RETRIES = 1  # an evaluator hiccup is retried once before the node is written off


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
    cards: list[CardProgress]  # the searched ops, largest time share first
    message: str = ""
    confirming: int = 0  # would-be bests waiting for or under confirmation


@dataclass(eq=False)
class Provisional:
    """A would-be best waiting for (or under) its confirmation."""

    search: CardSearch
    node_id: int
    candidate: Candidate
    first: EvalOutcome  # the evaluation that made it a would-be best
    queued_at: float  # time.monotonic()
    superseded: bool = False  # its confirmation was cancelled for a faster node's
    judged: bool = False  # its confirmation has a verdict (being recorded): too late to cancel

    @property
    def speedup(self) -> float:
        return self.first.speedup or 0.0

    def beats(self, other: Provisional | float, spread: float | None = None) -> bool:
        """Whether this node is faster than ``other`` (a node, or a speedup whose timing spread
        is taken to be this node's) beyond the two timings' noise."""
        mine = self.first.timing.spread if self.first.timing else 0.0
        if isinstance(other, Provisional):
            speedup = other.speedup
            theirs = other.first.timing.spread if other.first.timing else 0.0
        else:
            speedup, theirs = other, mine if spread is None else spread
        return speedup > 0 and significant_win(self.speedup / speedup, math.hypot(mine, theirs))


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
        self.rows: dict[int, CardRow] = {}
        self.schedule = Schedule(settings, [], set())  # made again from the store by _load
        self.paused = False
        self.stopping = False
        self._usd = 0.0
        self._run_s_before = 0.0
        self._started = time.monotonic()
        self._slots: asyncio.Semaphore | None = None
        self._tasks: set[asyncio.Task] = set()
        self._done_queue: list[tuple[CardSearch, str]] = []
        self._baseline_locks: dict[int, asyncio.Lock] = {}
        self._status = SessionStatus.RUNNING
        self._message = ""
        self._end_reason = ""  # why the search ended, for the ops it leaves unfinished
        self._workers_shown: list[dict] = []  # the evaluator's workers as last stored
        self._waiting: dict[int, dict[int, Provisional]] = {}  # card id -> node id -> queued
        self._confirming: dict[int, tuple[Provisional, asyncio.Task]] = {}  # card id -> running
        self._confirm_tasks: set[asyncio.Task] = set()
        self._closing = False  # the search is over: no confirmation starts any more
        self._settled: set[int] = set()  # cards whose search settled on a would-be best
        self._winding_down = False  # no new work can start: every would-be best may be confirmed

    # ----- the run -----

    async def run(self) -> SessionStatus:
        """Search until the budget is spent, every op is done, or a stop command arrives."""
        await self.store.claim_engine(self.session_id)
        # each heartbeat stores the session's whole searched time: count on from the stored one
        session = await self.store.get_session(self.session_id)
        self._run_s_before = session.run_seconds
        self._workers_shown = session.settings.get(WORKERS_KEY) or []
        self._started = time.monotonic()
        status, error = SessionStatus.FAILED, ""
        beat = asyncio.create_task(self._heartbeat())
        try:
            await self.evaluator.start()
            self._slots = asyncio.Semaphore(max(1, self.evaluator.capacity))
            await self._load()
            await self._set_status(SessionStatus.RUNNING)
            await self._redo_inflight()
            status = await self._loop()
        except LeaseLost as exc:
            error = str(exc)  # the session is another engine's now: nothing more is written
        except KforgeError as exc:
            error = str(exc)
            await self._log(f"search failed: {error}", "error", raised=True)
        except Exception as exc:  # a bug in a plugin: keep the session consistent, report it
            log.info("engine failed", exc_info=True)  # the traceback, for --verbose
            error = f"{type(exc).__name__}: {exc}"
            await self._log(f"search failed: {error}", "error", raised=True)
        finally:
            await self._cancel_tasks()
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            with contextlib.suppress(Exception):
                await self.evaluator.close()
            with contextlib.suppress(Exception):
                await self.proposer.close()
            try:
                await self._park_cards(error or self._end_reason or str(status))
                await self._report_workers(ending=True)
                await self.store.heartbeat(self.session_id, self._run_seconds())
                await self.store.release_engine(self.session_id, status, error)
            except LeaseLost as exc:
                error = str(exc)  # taken over meanwhile: the session is left to its new engine
            self._notify(status)
        if error:
            raise KforgeError(error)
        return status

    def request_stop(self) -> None:
        """Stop soon (a signal handler calls this): in-flight work is dropped and redone on
        resume."""
        self.stopping = True
        self._end_reason = "stopped"

    async def add_given(self, card_id: int, candidate: Candidate, decision: Decision) -> int:
        """Evaluate a kernel written outside the search (a user's own) for one card as the search
        evaluates its candidates (eager timed first, a would-be best confirmed) and add it to the
        card's tree as ``decision`` says, where a later search builds on it like on any node.
        Holds the session's engine lease meanwhile, so it never runs beside a search, and leaves
        the session's status as it found it; returns the new node's id."""
        await self.store.claim_engine(self.session_id)
        before = await self.store.get_session(self.session_id)
        self._run_s_before, self._started = before.run_seconds, time.monotonic()
        status = (SessionStatus.STOPPED if before.status in (SessionStatus.RUNNING,
                                                              SessionStatus.PAUSED)
                  else SessionStatus(before.status))  # held by an engine that died
        beat = asyncio.create_task(self._heartbeat())
        try:
            await self.evaluator.start()
            self._slots = asyncio.Semaphore(max(1, self.evaluator.capacity))
            await self._load()
            search = self.schedule.cards.get(card_id)
            if search is None:
                raise KforgeError(f"no op card {card_id} in session {self.session_id}")
            search.done = False  # a given kernel is judged even where the search would stop
            if not await self._ensure_baseline(search):
                raise KforgeError(f"card {card_id}: {self.rows[card_id].stop_reason}")
            try:  # the decision is checked before anything is stored, under an id never used
                search.tree.add(-1, decision.parent, decision.action)
            except ValueError as exc:
                raise KforgeError(f"card {card_id}: {exc}") from None
            search.tree.discard(-1)
            parent_id = None if decision.parent == ROOT else decision.parent
            node_id = await self.store.add_node(self.session_id, card_id, parent_id,
                                                decision.action)
            search.tree.add(node_id, decision.parent, decision.action)
            await self.store.set_candidate(node_id, candidate)
            search.metas[node_id] = candidate.meta
            under = f" of node {parent_id}" if parent_id is not None else ""
            await self._log(f"node {node_id} for {search.card.short_op}, given from outside "
                            f"the search ({decision.action}{under}): {candidate.approach}")
            await self._evaluate(search, node_id, candidate)
            await self._drain_confirmations()
            return node_id
        finally:
            await self._cancel_tasks()
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            with contextlib.suppress(Exception):
                await self.evaluator.close()
            await self.store.heartbeat(self.session_id, self._run_seconds())
            await self.store.release_engine(self.session_id, status, before.error)

    async def _loop(self) -> SessionStatus:
        while True:
            await self._apply_commands()
            if self.stopping:
                if self._unconfirmed():
                    await self._still_confirming("the search was stopped")
                return SessionStatus.STOPPED
            if not self.paused:
                while len(self._tasks) < self.settings.parallel:
                    started = await self._start_next()
                    if not started:
                        break
            if not self._tasks and not self.paused:
                if not self._unconfirmed():
                    await self._say_nothing_left()
                    return SessionStatus.DONE
                self._winding_down = True  # nothing else to do: confirm what waits
                if (why := self._out_of_time()) is not None:
                    await self._still_confirming(why)
                    return SessionStatus.DONE
            self._pump()
            await self._wait_for_work()

    async def _wait_for_work(self) -> None:
        tasks = self._tasks | self._confirm_tasks
        if tasks:
            done, _ = await asyncio.wait(tasks, timeout=COMMAND_POLL_S,
                                         return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                self._tasks.discard(task)
                self._confirm_tasks.discard(task)
                if not task.cancelled():
                    task.result()  # re-raise a plugin failure here, in the engine's own frame
        else:
            await asyncio.sleep(COMMAND_POLL_S)

    async def _cancel_tasks(self) -> None:
        """End the search's work and the confirmations under way (a confirming node stays so in
        the store: a resume confirms it)."""
        self._closing = True
        tasks = self._tasks | self._confirm_tasks
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._confirm_tasks.clear()

    # ----- loading and resuming -----

    async def _load(self) -> None:
        session = await self.store.get_session(self.session_id)
        self._usd = session.usd_spent
        rows = await self.store.list_cards(self.session_id)
        refused = {row.id: reason for row in rows if (reason := _refusal(row.card))}
        nodes = await self.store.list_nodes(self.session_id)
        for stale in [n for n in nodes if n.status == NodeStatus.PROPOSING]:
            await self.store.delete_node(stale.id)
        kept = [n for n in nodes if n.status != NodeStatus.PROPOSING]
        rows = [await self._screen(row, refused.get(row.id, "")) for row in rows]
        searched = searched_cards(
            [(r.id, r.card) for r in rows if r.status != CardStatus.SKIPPED],
            self.settings.top_ops)
        searches = []
        for row in rows:
            mine = [n for n in kept if n.card_id == row.id]
            with reading(f"the search tree of op card {row.id}"):  # nodes as stored link up
                tree = Tree.from_records([n.record() for n in mine], self.settings.mcts,
                                         seed=derived_seed(self.settings.seed, row.id))
            search = CardSearch(card_id=row.id, card=row.card, tree=tree, spent=tree.completed,
                                best=Best(row.best_node, row.best_speedup),
                                done=row.status in (CardStatus.DONE, CardStatus.SKIPPED))
            for n in mine:
                search.metas[n.id] = n.meta
                if not n.ok and not n.in_flight and not n.confirming:
                    search.failed.append(failure_line(n.meta, n.status, n.summary))
            self.rows[row.id] = row
            searches.append(search)
        self.schedule = Schedule(self.settings, searches, searched)
        self._done_queue += self.schedule.conclude_all()

    async def _screen(self, row: CardRow, refusal: str) -> CardRow:
        """Skip the cards whose operator kforge will not call (``refusal``) and the target ops
        this proposer cannot write kernels for (with the reason), and take up again those a
        previous proposer skipped but this one can handle."""
        if refusal:
            if row.status == CardStatus.SKIPPED and row.stop_reason == refusal:
                return row
            await self.store.update_card(row.id, status=CardStatus.SKIPPED, stop_reason=refusal)
            return await self.store.get_card(row.id)
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

    async def _reload_card(self, card_id: int) -> None:
        """Read the card's row again after writing it; its search sees the new card too."""
        row = await self.store.get_card(card_id)
        self.rows[card_id] = row
        self.schedule.cards[card_id].card = row.card

    async def _ensure_baseline(self, search: CardSearch) -> bool:
        """Time eager (and torch.compile) for a card before its first candidate; False if the op
        cannot be run on its own, in which case the card is skipped with the reason."""
        card_id = search.card_id
        lock = self._baseline_locks.setdefault(card_id, asyncio.Lock())
        async with lock:
            if self.rows[card_id].baseline is not None:
                return True
            if search.done:
                return False
            assert self._slots is not None
            try:
                async with self._slots:
                    base = await self.evaluator.baseline(search.card)
            except EvaluatorLost:
                raise  # no op is at fault: the search stops, and the card is timed on resume
            except KforgeError as exc:
                search.done = True
                await self.store.update_card(card_id, status=CardStatus.SKIPPED,
                                             stop_reason=f"cannot time eager: {exc}")
                await self._reload_card(card_id)
                await self._log(f"{search.card.short_op}: skipped, cannot time eager: {exc}",
                                "warning")
                return False
            # timed (torch.compile's may have taken minutes): stored even if the search is
            # stopped meanwhile, not timed again on resume
            await _completed(self.store.update_card(
                card_id, eager_us=base.eager.median_us, floor_us=base.floor_us,
                compiled_us=base.compiled.median_us if base.compiled else None,
                baseline=base.to_dict()))
            await self._reload_card(card_id)
            self._notify()
            return True

    async def _redo_inflight(self) -> None:
        """Evaluate again the candidates that were stored but not judged when the engine stopped."""
        for search in self.schedule.cards.values():
            pending = [n for n in await self.store.list_nodes(self.session_id, search.card_id)
                       if n.status == NodeStatus.EVALUATING]
            for n in pending:
                detail = await self.store.get_node(n.id)
                with reading(f"search node {n.id}"):
                    if detail.candidate is None:
                        raise ValueError("it was being evaluated but holds no kernel")
                await self._log(f"re-evaluating node {n.id}, in flight when the engine stopped")
                self._spawn(self._evaluate(search, n.id, detail.candidate))
        await self._requeue_confirming()

    async def _requeue_confirming(self) -> None:
        """Queue again the would-be bests whose confirmation had not ended when the engine
        stopped."""
        for n in await self.store.list_nodes(self.session_id):
            if not n.confirming or n.card_id not in self.schedule.cards:
                continue
            detail = await self.store.get_node(n.id)
            with reading(f"search node {n.id}"):
                if detail.candidate is None or detail.outcome is None:
                    raise ValueError("it was being confirmed but holds no kernel or no "
                                     "evaluation")
            await self._log(f"confirming node {n.id} again, pending when the engine stopped")
            self._waiting.setdefault(n.card_id, {})[n.id] = Provisional(
                self.schedule.cards[n.card_id], n.id, detail.candidate, detail.outcome,
                time.monotonic())
        self._pump()

    # ----- scheduling -----

    async def _start_next(self) -> bool:
        await self._flush_card_done()
        await self._release_focus()
        if (reason := self.schedule.exhausted(self._usd, self._run_seconds())) is not None:
            if reason != self._end_reason and not self._tasks:
                self._end_reason = reason
                await self._log(reason)
            return False
        search = self.schedule.next_card()
        if search is None:
            return False
        card_id = search.card_id
        decision = search.tree.select()
        parent_id = None if decision.parent == ROOT else decision.parent
        node_id = await self.store.add_node(self.session_id, card_id, parent_id, decision.action)
        search.tree.add(node_id, decision.parent, decision.action)
        if self.rows[card_id].status in (CardStatus.PENDING, CardStatus.STOPPED):
            await self.store.update_card(card_id, status=CardStatus.SEARCHING, stop_reason="")
            await self._reload_card(card_id)
        self._spawn(self._work(search, node_id, decision))
        self._winding_down = False
        self._notify()
        return True

    async def _release_focus(self) -> None:
        """A focused op with nothing left to search hands the search back to every op (a focus
        narrows the search, never ends it): the focus is cleared in the store too, and the log
        says why."""
        search = self.schedule.focus_ended()
        if search is None:
            return
        self.schedule.focus = None
        await save_focus(self.store, self.session_id, None)
        await self._log(f"focus cleared: the focused op {search.card.label} "
                        f"{self._nothing_left(search.card_id)}; the search goes on with every op")

    def _nothing_left(self, card_id: int) -> str:
        """Why a card has nothing left to search, as words after its name."""
        row = self.rows[card_id]
        if (card_id not in self.schedule.searched and row.status != CardStatus.SKIPPED
                and self.settings.top_ops is not None):
            return f"is not among the {self.settings.top_ops} largest ops searched (top_ops)"
        return f"is {row.status}" + (f" ({row.stop_reason})" if row.stop_reason else "")

    async def _say_nothing_left(self) -> None:
        """Log why a search ends with nothing left to search, unless a budget's end said it
        already: a resumed search that has nothing to do ends at once, with this line."""
        if self._end_reason:
            return
        counts = Counter(self.rows[card_id].status for card_id in self.schedule.searched)
        listed = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        self._end_reason = "no op left to search"
        await self._log(f"search done: no op left to search ({listed or 'no target ops'})")

    def _spawn(self, coro) -> None:
        self._tasks.add(asyncio.create_task(coro))

    # ----- one iteration -----

    async def _work(self, search: CardSearch, node_id: int, decision: Decision) -> None:
        if not await self._ensure_baseline(search):
            await self.store.delete_node(node_id)
            search.tree.discard(node_id)
            return
        request = await self._request(search, decision, node_id)
        proposal = await self.proposer.propose(request)
        self._usd += proposal.usd
        if not proposal.candidates:
            await self._record(search, node_id, None, proposal)
            return
        # the reply is paid for: its cost is stored even if the engine is stopped meanwhile
        await _completed(self.store.set_candidate(node_id, proposal.candidates[0],
                                                  proposal.calls))
        search.metas[node_id] = proposal.candidates[0].meta
        await self._evaluate(search, node_id, proposal.candidates[0])

    async def _evaluate(self, search: CardSearch, node_id: int, candidate: Candidate) -> None:
        outcome = await self._evaluation(search, node_id, candidate)
        # the result is in hand: a stop meanwhile must not drop it (the node would be evaluated
        # again on resume), however long the writes that store it wait for the database
        await _completed(self._take(search, node_id, candidate, outcome))

    async def _evaluation(self, search: CardSearch, node_id: int,
                          candidate: Candidate) -> EvalOutcome:
        """The evaluator's judgement of ``candidate``, an evaluator hiccup retried."""
        assert self._slots is not None
        for attempt in range(INFRA_RETRIES + 1):
            async with self._slots:
                outcome = await self.evaluator.evaluate(search.card, candidate)
            if outcome.status is not EvalStatus.INFRA:
                break
            await self._log(f"evaluator problem on node {node_id} (try {attempt + 1}): "
                            f"{outcome.summary}", "warning")
        return outcome

    async def _take(self, search: CardSearch, node_id: int, candidate: Candidate,
                    outcome: EvalOutcome) -> None:
        """Record an evaluation: a would-be best is stored as confirming and queued for its
        confirmation, any other result is stored as it is."""
        if outcome.ok and search.would_lead(outcome.speedup):
            why = self._short_of_baselines(search, outcome)
            provisional = Provisional(search, node_id, candidate, outcome, time.monotonic())
            if why is None and search.best.speedup is not None \
                    and not provisional.beats(search.best.speedup):
                why = (f"within the timing noise of the confirmed best "
                       f"({search.best.speedup:.2f}x over eager)")
            if why is None:
                ahead = self._pending_leader(search.card_id)
                await self._log(
                    f"node {node_id} would lead {search.card.op} at {outcome.speedup:.2f}x over "
                    "eager: " + ("confirming it once the op's search settles"
                                 if ahead is None or ahead.speedup < outcome.speedup else
                                 f"a spare in case node {ahead.node_id} "
                                 f"({ahead.speedup:.2f}x) is not confirmed"))
                await self._record(search, node_id, outcome, None, confirming=True)
                if search.would_lead(outcome.speedup):
                    self._queue(provisional)
                else:  # a confirmation settled the op while this result was being stored
                    await self._settle_unconfirmed(provisional)
                return
            await self._log(f"node {node_id} ({outcome.speedup:.2f}x over eager) is not "
                            f"confirmed: {why}")
        await self._record(search, node_id, outcome, None)

    def _short_of_baselines(self, search: CardSearch, outcome: EvalOutcome) -> str | None:
        stored = self.rows[search.card_id].baseline
        return short_of_baselines(outcome.timing, outcome.eager,
                                  Baseline.from_dict(stored) if stored else None)

    # ----- confirmations -----

    def _queue(self, p: Provisional) -> None:
        """Queue a would-be best for its confirmation. A newer one that improves on its op's
        leader by less than the noise (or not at all) says the op's search has settled on the
        leader: it may be confirmed now."""
        card_id = p.search.card_id
        leader = self._pending_leader(card_id)
        if leader is not None and not p.beats(leader):
            self._settled.add(card_id)
        self._waiting.setdefault(card_id, {})[p.node_id] = p
        self._pump()

    def _pending_leader(self, card_id: int) -> Provisional | None:
        """The fastest would-be best of an op that waits for its confirmation or is in it."""
        leaders = list(self._waiting.get(card_id, {}).values())
        if card_id in self._confirming:
            leaders.append(self._confirming[card_id][0])
        return max(leaders, key=lambda q: q.speedup, default=None)

    def _may_confirm(self, search: CardSearch) -> bool:
        """Whether ``search``'s would-be best may be confirmed now: its search has settled
        (improving by less than the noise, or done or owed no more iterations with none in
        flight), or no new work can start at all."""
        if self._winding_down or search.card_id in self._settled:
            return True
        over = (search.done or not self.schedule.owes(search)
                or self.schedule.exhausted(self._usd, self._run_seconds()) is not None)
        return over and not search.tree.inflight()

    def _pump(self) -> None:
        """Start the confirmations the queue allows: per op its fastest would-be best once the
        op's search has settled on it, ops in the order they queued, up to ``confirmations`` at
        once; a confirmation under way gives way to a would-be best of its op faster beyond the
        noise."""
        if self._closing or self.stopping:
            return
        for card_id, (running, task) in self._confirming.items():
            waiting = self._waiting.get(card_id)
            if waiting and max(waiting.values(), key=lambda p: p.speedup).beats(running) \
                    and not running.superseded and not running.judged:
                running.superseded = True
                task.cancel()
        started = False
        while len(self._confirming) < self.settings.confirmations:
            heads = [max(w.values(), key=lambda p: (p.speedup, -p.node_id))
                     for card_id, w in self._waiting.items()
                     if w and card_id not in self._confirming
                     and self._may_confirm(self.schedule.cards[card_id])]
            if not heads:
                break
            head = min(heads, key=lambda p: p.queued_at)
            del self._waiting[head.search.card_id][head.node_id]
            task = asyncio.create_task(self._run_confirmation(head))
            self._confirming[head.search.card_id] = (head, task)
            self._confirm_tasks.add(task)
            started = True
        if started:
            self._notify()

    def _unconfirmed(self) -> list[Provisional]:
        return ([p for _, (p, _) in self._confirming.items()]
                + [p for w in self._waiting.values() for p in w.values()])

    async def _run_confirmation(self, p: Provisional) -> None:
        card_id = p.search.card_id
        started = time.monotonic()
        try:
            outcome = await self._confirm(p)
            p.judged = True
            outcome = replace(outcome, confirmation=replace(
                outcome.confirmation or Confirmation(), waited_s=round(started - p.queued_at, 2),
                ran_s=round(time.monotonic() - started, 2), at=time.time()))
            await _completed(self._settle(p, outcome))
        except asyncio.CancelledError:
            if not p.superseded or p.judged or self._closing:
                raise
            p.superseded = False
            self._waiting.setdefault(card_id, {})[p.node_id] = p
            await self._log(f"node {p.node_id}'s confirmation gave way to a faster node of "
                            f"{p.search.card.short_op}")
        finally:
            if self._confirming.get(card_id, (None, None))[0] is p:
                del self._confirming[card_id]
            self._pump()

    async def _confirm(self, p: Provisional) -> EvalOutcome:
        for attempt in range(INFRA_RETRIES + 1):
            outcome = await self.evaluator.confirm(p.search.card, p.candidate, p.first)
            if outcome.status is not EvalStatus.INFRA:
                break
            await self._log(f"evaluator problem confirming node {p.node_id} (try "
                            f"{attempt + 1}): {outcome.summary}", "warning")
        return outcome

    async def _settle(self, p: Provisional, outcome: EvalOutcome) -> None:
        """Record a confirmation's verdict: a pass makes the node its op's best (if it still
        beats the baselines re-timed); a failure demotes it, the previous best standing, and
        tells the proposer; an evaluator that could not confirm leaves it unconfirmed. Would-be
        bests of the op that no longer lead are settled unconfirmed."""
        search, node_id = p.search, p.node_id
        meta = search.metas.get(node_id, p.candidate.meta)
        if outcome.ok:
            why = self._short_of_baselines(search, outcome)
            if why is None:
                self._settled.discard(search.card_id)  # what comes next must settle again
                await self._log(f"node {node_id} confirmed at {outcome.speedup:.2f}x over eager "
                                f"on new inputs")
            else:
                await self._log(f"node {node_id} re-timed at {outcome.speedup:.2f}x over eager: "
                                f"{why}; kept unconfirmed")
            card = await self.store.finish_node(
                node_id, outcome, _result(node_id, outcome, None, meta).reward,
                confirmed=why is None)
        elif outcome.status is EvalStatus.INFRA:
            await self._log(f"node {node_id} could not be confirmed: {outcome.summary}; kept "
                            f"unconfirmed", "warning")
            first = p.first.confirmation or Confirmation()
            kept = replace(p.first, confirmation=replace(
                outcome.confirmation or first, held=first.held, error=outcome.summary))
            card = await self.store.finish_node(node_id, kept,
                                                _result(node_id, kept, None, meta).reward)
        else:
            await self._log(f"node {node_id} failed its confirmation: {outcome.summary}",
                            "warning")
            card = await self.store.finish_node(node_id, outcome, None)
            search.tree.demote(node_id, repairable=outcome.status.repairable)
            search.failed.append(_result(node_id, outcome, None, meta).failure)
        self.rows[search.card_id] = card
        search.best = Best(card.best_node, card.best_speedup)
        for q in list(self._waiting.get(search.card_id, {}).values()):
            if not search.would_lead(q.speedup) or (
                    search.best.node == node_id and not q.beats(p)):
                del self._waiting[search.card_id][q.node_id]
                await self._settle_unconfirmed(q)
        if reason := self.schedule.conclude(search):
            self._done_queue.append((search, reason))
        await self._flush_card_done()
        self._notify()

    async def _settle_unconfirmed(self, p: Provisional) -> None:
        """A would-be best that no longer leads its op keeps its result, unconfirmed."""
        meta = p.search.metas.get(p.node_id, p.candidate.meta)
        self.rows[p.search.card_id] = await self.store.finish_node(
            p.node_id, p.first, _result(p.node_id, p.first, None, meta).reward)

    async def _drain_confirmations(self) -> None:
        """Confirm every would-be best now, and wait until each is confirmed or not."""
        self._winding_down = True
        self._pump()
        while self._unconfirmed():
            await self._wait_for_work()
            self._pump()

    def _out_of_time(self) -> str | None:
        """Why the search may not wait for its confirmations any longer (its time budget)."""
        wall = self.settings.wall_s
        if wall is not None and self._run_seconds() >= wall:
            return f"time budget of {wall:.0f} s spent"
        return None

    async def _still_confirming(self, why: str) -> None:
        for p in sorted(self._unconfirmed(), key=lambda p: p.node_id):
            await self._log(f"node {p.node_id} ({p.search.card.short_op} at {p.speedup:.2f}x "
                            f"over eager) is still confirming: {why}; `kforge resume` confirms "
                            "it",
                            "warning")

    async def _record(self, search: CardSearch, node_id: int, outcome: EvalOutcome | None,
                      proposal: Proposal | None, confirming: bool = False) -> None:
        """Store the node's result with the card's new count and best in one transaction (the
        store derives them from the card's finished nodes, so parallel results never overwrite
        each other's), then take both into memory: a crash between the two replays the stored
        result on restart. A result in hand (and a reply's cost) is stored even if the engine
        is stopped meanwhile."""
        result = _result(node_id, outcome, proposal, search.metas.get(node_id, {}))
        if outcome is None:
            assert proposal is not None
            card = await _completed(self.store.fail_proposal(
                node_id, proposal.error or "no candidate", proposal.calls))
        else:
            card = await _completed(self.store.finish_node(node_id, outcome, result.reward,
                                                           confirming=confirming))
        self.rows[search.card_id] = card
        search.finish(result, card.spent, Best(card.best_node, card.best_speedup))
        if reason := self.schedule.conclude(search):
            self._done_queue.append((search, reason))
        await self._flush_card_done()
        self._notify()

    async def _park_cards(self, reason: str) -> None:
        """Ops still being searched when the session's search ends are marked stopped (with the
        session's reason); a resume picks them up again."""
        await self._flush_card_done()
        for row in self.rows.values():
            if row.status == CardStatus.SEARCHING:
                await self.store.update_card(row.id, status=CardStatus.STOPPED,
                                             stop_reason=reason)

    async def _flush_card_done(self) -> None:
        while self._done_queue:
            search, reason = self._done_queue.pop(0)
            await self.store.update_card(search.card_id, status=CardStatus.DONE,
                                         stop_reason=reason)
            await self._reload_card(search.card_id)
            shown = one_line(search.card.signature, 60)
            await self._log(f"{search.card.short_op} [{shown}]: {reason}")

    async def _request(self, search: CardSearch, decision: Decision,
                       node_id: int) -> ProposalRequest:
        tree = search.tree
        parent = None if decision.parent == ROOT else decision.parent
        chain = tree.lineage(parent)[-LINEAGE_DEPTH:] if parent is not None else []
        views = {v.id: v for v in await self._views(chain)}
        best = tree.best()
        baseline = self.rows[search.card_id].baseline
        best_view = views.get(best) if best in views else (
            (await self._views([best]))[0] if best is not None else None)
        return ProposalRequest(
            card=search.card, action=decision.action, gpu=self.evaluator.gpu,
            parent=views.get(parent) if parent is not None else None,
            lineage=[views[i] for i in chain], tried=list(search.metas.values()),
            failed=search.failed[-FAILED_KEPT:], best=best_view,
            seed=derived_seed(self.settings.seed, node_id),
            baseline=Baseline.from_dict(baseline) if baseline else None)

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
        try:
            kind, arg = checked(command.kind, command.arg)
        except BadCommand as exc:
            return str(exc)
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
            assert arg is not None  # checked: a node id
            return await self._prune(arg, kind == CommandKind.PRUNE)
        if arg is not None and arg not in self.schedule.cards:  # focus
            return f"no op card {arg} in this session"
        if arg is not None and self.schedule.cards[arg].done:
            return (f"not focused: {self.schedule.cards[arg].card.label} "
                    f"{self._nothing_left(arg)}")
        self.schedule.focus = arg
        return await save_focus(self.store, self.session_id, arg)

    async def _prune(self, node_id: int, prune: bool) -> str:
        for search in self.schedule.cards.values():
            if node_id in search.tree:
                if prune:
                    search.tree.prune(node_id)
                else:
                    search.tree.unprune(node_id)
                return await save_pruned(self.store, node_id, prune)
        return f"no node {node_id} in this search"

    # ----- bookkeeping -----

    async def _set_status(self, status: SessionStatus) -> None:
        await self.store.set_session_status(self.session_id, status)
        self._status = status

    async def _heartbeat(self) -> None:
        """Beat until cancelled. A beat that fails (the database locked for long, a full disk)
        does not end the beating: the engine still runs, and the next beat may get through. A
        lost lease stops the search."""
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                await self.store.heartbeat(self.session_id, self._run_seconds())
                await self._report_workers()
            except LeaseLost as exc:
                log.error("%s", exc)
                self.request_stop()
                return
            except Exception as exc:  # noqa: BLE001 - whatever failed, the next beat may pass
                log.warning("heartbeat of session %d failed, beating on: %s", self.session_id,
                            exc)

    async def _report_workers(self, ending: bool = False) -> None:
        """Store the evaluator's workers as they are now, for viewers, when they changed (an
        evaluator that runs on a cluster reports them with ``workers()``); none once the search
        ends."""
        report = getattr(self.evaluator, "workers", None)
        table = [w.to_dict() for w in report()] if report is not None and not ending else []
        if table != self._workers_shown:
            await self.store.update_settings(self.session_id, {WORKERS_KEY: table})
            self._workers_shown = table

    def _run_seconds(self) -> float:
        return self._run_s_before + (time.monotonic() - self._started)

    async def _log(self, message: str, level: str = "info", *, raised: bool = False) -> None:
        """Tell the session's log (and this process's logger) ``message``; one the run also
        ends with as its error (``raised``: its caller reports it) is logged at INFO only."""
        log.log(logging.INFO if raised else logging.getLevelName(level.upper()), message)
        self._message = message
        await self.store.log(self.session_id, message, level)

    def _notify(self, status: SessionStatus | None = None) -> None:
        if self.on_change is None:
            return
        status = status or self._status
        self.on_change(Snapshot(
            session_id=self.session_id, status=str(status),
            iterations=self.schedule.iterations(), total=self.schedule.total_iterations,
            inflight=self.schedule.in_flight(), usd=self._usd, elapsed_s=self._run_seconds(),
            cards=self.schedule.progress(), message=self._message,
            confirming=len(self._unconfirmed())))


async def _completed(write: Awaitable[T]) -> T:
    """Await a store write to its end even when the caller is cancelled meanwhile (the
    cancellation is passed on once the write is done): a reply paid for or a result measured is
    never dropped half-way by a stop."""
    task = asyncio.ensure_future(write)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task.result()


def _result(node_id: int, outcome: EvalOutcome | None, proposal: Proposal | None,
            meta: dict) -> NodeResult:
    """A finished node as the schedule takes it: its speedup when its kernel is correct, else
    the line that tells the proposer what failed."""
    if outcome is None:
        assert proposal is not None
        return NodeResult(node_id, failure=f"(no candidate) {proposal.error}"[:FAILURE_LINE_CHARS])
    if outcome.ok and outcome.speedup is not None:
        return NodeResult(node_id, speedup=outcome.speedup)
    return NodeResult(node_id, repairable=outcome.status.repairable,
                      failure=failure_line(meta, outcome.status.value, outcome.summary))


def _refusal(card: OpCard) -> str:
    """Why kforge will not call ``card``'s operator (a name or region from the database that is
    no allowed operator, or whose calls do not fit their schemas); "" when it will. Region
    cards' operators are registered here, for the proposers."""
    try:
        if card.region is not None:
            register_cards([card])
        else:
            resolve_op(card.op)
    except ArgSpecError as exc:
        return f"not an operator kforge calls: {exc}"
    return ""
