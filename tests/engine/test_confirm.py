"""Confirmation beside the search: a would-be best is provisional (``confirming``) while the search
goes on; a faster one supersedes it; a failure demotes it and the previous best stands; a resume
confirms what was pending; the search's end waits for confirmations within its time budget."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import replace

from kforge.core.candidate import Candidate, EvalOutcome, Proposal
from kforge.core.opcard import OpCard
from kforge.core.settings import SearchSettings
from kforge.engine.engine import Engine
from kforge.store import NodeStatus, SessionStatus, Store
from kforge.store.events import LogLine
from tests.doubles import FakeEvaluator, FakeProposer
from tests.engine.test_engine import session


class ScriptedProposer(FakeProposer):
    """Kernels at the given speeds, in order (the last one repeated); those in ``racy`` fail the
    sanitizer."""

    def __init__(self, speeds: list[float], racy: tuple[float, ...] = ()) -> None:
        super().__init__()
        self.script = list(speeds)
        self.racy = set(racy)

    async def propose(self, request):
        proposal = await super().propose(request)
        speed = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        return Proposal([replace(c, meta={**c.meta, "speed": speed, "racy": speed in self.racy})
                         for c in proposal.candidates], proposal.calls, proposal.error)


class GatedEvaluator(FakeEvaluator):
    """A confirmation of the kernel at speed ``s`` waits until ``open(s)``; evaluations never
    wait. Records which confirmations began and which were cancelled."""

    def __init__(self, closed: tuple[float, ...] = ()) -> None:
        super().__init__()
        self.gates: dict[float, asyncio.Event] = {}
        self.closed = set(closed)
        self.began: list[float] = []
        self.cancelled: list[float] = []

    def open(self, speed: float) -> None:
        self.closed.discard(speed)
        self.gates.setdefault(speed, asyncio.Event()).set()

    async def confirm(self, card: OpCard, candidate: Candidate,
                      outcome: EvalOutcome) -> EvalOutcome:
        speed = candidate.meta["speed"]
        self.began.append(speed)
        if speed in self.closed:
            try:
                await self.gates.setdefault(speed, asyncio.Event()).wait()
            except asyncio.CancelledError:
                self.cancelled.append(speed)
                raise
        return await super().confirm(card, candidate, outcome)


def engine(store: Store, sid: int, proposer, evaluator, **settings) -> Engine:
    # one op (the largest share), one proposal at a time, one evaluation slot
    defaults = {"iterations_per_op": 4, "parallel": 1, "patience": 100, "top_ops": 1}
    return Engine(store, sid, proposer, evaluator,
                  SearchSettings.from_dict({**defaults, **settings}))


async def until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


async def by_speed(store: Store, sid: int) -> dict:
    """The searched op's nodes by their kernel's speed (first of equals)."""
    nodes = {}
    for n in await store.list_nodes(sid):
        if n.meta.get("speed") is not None:
            nodes.setdefault(n.meta["speed"], n)
    return nodes


async def logs(store: Store, sid: int) -> list[str]:
    return [e.record.message for e in await store.events_since(0, sid)
            if isinstance(e.record, LogLine)]


async def test_the_slot_is_released_while_a_would_be_best_is_confirmed(store: Store):
    sid = await session(store)
    evaluator = GatedEvaluator(closed=(1.5,))
    run = asyncio.create_task(engine(store, sid, ScriptedProposer([1.5, 1.2, 1.3, 1.1]),
                                     evaluator).run())

    async def all_evaluated() -> bool:
        return evaluator.started == 4

    await until(all_evaluated)  # one slot, held by nobody while 1.5 is confirmed
    nodes = await by_speed(store, sid)
    assert nodes[1.5].status == NodeStatus.CONFIRMING and nodes[1.5].speedup == 1.5
    card = await store.get_card(nodes[1.5].card_id)
    assert card.best_node is None  # nothing is a best before it is confirmed
    assert evaluator.began == [1.5]
    assert not run.done()  # the search waits for its confirmation at the end
    evaluator.open(1.5)
    assert await run == SessionStatus.DONE
    nodes = await by_speed(store, sid)
    card = await store.get_card(nodes[1.5].card_id)
    assert (card.best_node, card.best_speedup) == (nodes[1.5].id, 1.5)
    assert nodes[1.5].confirmed and nodes[1.5].status == NodeStatus.OK
    # the slower would-be bests queued behind it no longer lead: settled, never confirmed
    assert evaluator.began == [1.5]
    assert all(nodes[s].status == NodeStatus.OK and not nodes[s].confirmed
               for s in (1.2, 1.3, 1.1))
    detail = await store.get_node(nodes[1.5].id)
    confirmation = detail.outcome.confirmation
    assert None not in (confirmation.waited_s, confirmation.ran_s, confirmation.at)
    said = await logs(store, sid)  # every speedup the log gives says it is over eager
    assert f"node {nodes[1.5].id} confirmed at 1.50x over eager on new inputs" in said
    assert all("x over eager" in m for m in said if re.search(r"\d\.\d\dx", m)), said


async def test_a_refinement_chain_is_confirmed_once_where_it_settles(store: Store):
    """Would-be bests that keep improving beyond the noise are not confirmed one by one: the
    op's fastest is, once a newer one improves on it by less than the noise."""
    sid = await session(store)
    evaluator = GatedEvaluator()
    run = asyncio.create_task(engine(store, sid, ScriptedProposer([1.5, 2.0, 3.0, 3.05, 1.1]),
                                     evaluator, iterations_per_op=5).run())

    async def settled() -> bool:
        return evaluator.began != []

    await until(settled)
    assert evaluator.began == [3.05] and evaluator.started == 4  # after 3.05x, not before
    assert await run == SessionStatus.DONE
    nodes = await by_speed(store, sid)
    card = await store.get_card(nodes[3.05].card_id)
    assert card.best_node == nodes[3.05].id and nodes[3.05].confirmed
    # 3.0x is within the noise of the confirmed 3.05x, the others slower: none confirmed
    assert evaluator.began == [3.05]
    assert all(nodes[s].status == NodeStatus.OK and not nodes[s].confirmed
               for s in (1.5, 2.0, 3.0, 1.1))


async def test_a_faster_would_be_best_supersedes_the_one_being_confirmed(store: Store):
    sid = await session(store)
    evaluator = GatedEvaluator(closed=(1.5,))
    status = await engine(store, sid, ScriptedProposer([1.5, 1.4, 3.0, 1.1]), evaluator).run()
    assert status == SessionStatus.DONE
    assert evaluator.cancelled == [1.5] and evaluator.began[:2] == [1.5, 3.0]
    nodes = await by_speed(store, sid)
    card = await store.get_card(nodes[3.0].card_id)
    assert card.best_node == nodes[3.0].id and nodes[3.0].confirmed
    assert nodes[1.5].status == NodeStatus.OK and not nodes[1.5].confirmed
    assert any("gave way to a faster node" in m for m in await logs(store, sid))


async def test_a_would_be_best_faster_within_the_noise_waits_for_the_confirmation_under_way(
        store: Store):
    sid = await session(store)
    evaluator = GatedEvaluator(closed=(1.5,))
    run = asyncio.create_task(engine(store, sid, ScriptedProposer([1.5, 1.2, 1.55, 1.05]),
                                     evaluator).run())

    async def faster_one_waiting() -> bool:
        nodes = await by_speed(store, sid)
        return 1.55 in nodes and nodes[1.55].status == NodeStatus.CONFIRMING

    await until(faster_one_waiting)
    evaluator.open(1.5)
    assert await run == SessionStatus.DONE
    assert evaluator.cancelled == []  # 1.55x is 1.5x within the noise: no confirmation lost
    nodes = await by_speed(store, sid)
    assert nodes[1.5].confirmed and not nodes[1.55].confirmed
    card = await store.get_card(nodes[1.5].card_id)
    assert card.best_node == nodes[1.5].id
    assert evaluator.began == [1.5]  # the one it could not tell apart was never run again


async def test_a_failed_confirmation_demotes_the_node_and_the_previous_best_stands(
        store: Store):
    sid = await session(store)
    evaluator = GatedEvaluator(closed=(3.0,))
    proposer = ScriptedProposer([1.5, 3.0, 1.1, 1.05, 1.02], racy=(3.0,))
    eng = engine(store, sid, proposer, evaluator, iterations_per_op=5)
    run = asyncio.create_task(eng.run())

    async def racy_under_way() -> bool:
        return evaluator.began == [3.0]

    await until(racy_under_way)
    evaluator.open(3.0)
    assert await run == SessionStatus.DONE
    nodes = await by_speed(store, sid)
    card = await store.get_card(nodes[1.5].card_id)
    assert (card.best_node, card.best_speedup) == (nodes[1.5].id, 1.5)
    assert nodes[1.5].confirmed and evaluator.began == [3.0, 1.5]
    assert nodes[3.0].status == "mismatch" and nodes[3.0].speedup is None
    search = eng.schedule.cards[card.id]
    assert any("compute-sanitizer racecheck" in line for line in search.failed)
    assert search.tree.best() == nodes[1.5].id
    assert any(f"node {nodes[3.0].id} failed its confirmation" in m
               for m in await logs(store, sid))


async def test_a_resume_confirms_what_was_confirming_when_the_engine_stopped(store: Store):
    sid = await session(store)
    evaluator = GatedEvaluator(closed=(1.5,))
    first = engine(store, sid, ScriptedProposer([1.5, 1.2]), evaluator, iterations_per_op=2)
    run = asyncio.create_task(first.run())

    async def waiting() -> bool:
        return evaluator.began == [1.5] and evaluator.started == 2

    await until(waiting)
    first.request_stop()
    assert await run == SessionStatus.STOPPED
    nodes = await by_speed(store, sid)
    assert nodes[1.5].status == NodeStatus.CONFIRMING  # nothing lost
    assert any("is still confirming: the search was stopped" in m
               for m in await logs(store, sid))
    again = FakeEvaluator()
    assert await engine(store, sid, ScriptedProposer([1.1]), again,
                        iterations_per_op=2).run() == SessionStatus.DONE
    assert len(again.confirmed) == 1 and again.evaluated == []  # confirmed, not re-evaluated
    nodes = await by_speed(store, sid)
    card = await store.get_card(nodes[1.5].card_id)
    assert card.best_node == nodes[1.5].id and nodes[1.5].confirmed


async def stopped_while_writing(engine: Engine, writing: asyncio.Event,
                                written: asyncio.Event) -> SessionStatus:
    """Run ``engine``, stop it once it is ``writing``, let the write finish (``written``) after
    the engine has begun cancelling its work, and return how the run ended."""
    run = asyncio.create_task(engine.run())
    await asyncio.wait_for(writing.wait(), 10)
    engine.request_stop()

    async def closing() -> bool:
        return engine._closing  # the engine is cancelling its work now

    await until(closing)
    written.set()
    return await run


async def test_a_stop_while_a_would_be_best_is_being_logged_keeps_its_evaluation(
        store: Store, monkeypatch):
    """The evaluation is in hand once the engine writes that the kernel would lead: a stop then
    (that write waiting, say, for another process's lock on the database) must still store the
    result, not leave the node to be evaluated again on resume."""
    sid = await session(store)
    first = engine(store, sid, ScriptedProposer([1.5]), FakeEvaluator(), iterations_per_op=2)
    writing, written = asyncio.Event(), asyncio.Event()
    real_log = store.log

    async def slow_log(session_id: int, message: str, level: str = "info") -> None:
        if "would lead" in message:
            writing.set()
            await written.wait()
        await real_log(session_id, message, level)

    monkeypatch.setattr(store, "log", slow_log)
    assert await stopped_while_writing(first, writing, written) == SessionStatus.STOPPED
    node = (await by_speed(store, sid))[1.5]
    assert node.status == NodeStatus.CONFIRMING  # its evaluation kept
    digest = (await store.get_node(node.id)).candidate.digest
    again = FakeEvaluator()
    assert await engine(store, sid, ScriptedProposer([1.1]), again,
                        iterations_per_op=2).run() == SessionStatus.DONE
    assert digest not in again.evaluated and digest in again.confirmed


async def test_a_stop_while_a_baseline_is_being_stored_keeps_it(store: Store, monkeypatch):
    """Eager and torch.compile were timed for an op when the search is stopped while their
    times are written: they are stored, not timed again on resume."""
    sid = await session(store)
    first = engine(store, sid, ScriptedProposer([1.5]), FakeEvaluator(), iterations_per_op=2)
    writing, written = asyncio.Event(), asyncio.Event()
    real_update = store.update_card

    async def slow_update(card_id: int, **changes) -> None:
        if "baseline" in changes:
            writing.set()
            await written.wait()
        await real_update(card_id, **changes)

    monkeypatch.setattr(store, "update_card", slow_update)
    assert await stopped_while_writing(first, writing, written) == SessionStatus.STOPPED
    timed = [c for c in await store.list_cards(sid) if c.baseline is not None]
    assert len(timed) == 1  # kept
    again = FakeEvaluator()
    assert await engine(store, sid, ScriptedProposer([1.1]), again,
                        iterations_per_op=2).run() == SessionStatus.DONE
    assert again.baselines == []


async def test_the_search_ends_at_its_time_budget_saying_what_is_still_confirming(
        store: Store):
    sid = await session(store)
    evaluator = GatedEvaluator(closed=(1.5,))
    started = time.monotonic()
    status = await engine(store, sid, ScriptedProposer([1.5, 1.2]), evaluator,
                          iterations_per_op=2, wall_s=0.5).run()
    assert status == SessionStatus.DONE and time.monotonic() - started < 5
    nodes = await by_speed(store, sid)
    assert nodes[1.5].status == NodeStatus.CONFIRMING
    assert any(f"node {nodes[1.5].id} (_softmax at 1.50x over eager) is still confirming: "
               "time budget" in m for m in await logs(store, sid))


async def test_only_kernels_faster_than_a_baseline_beyond_noise_are_confirmed(store: Store):
    sid = await session(store)
    evaluator = FakeEvaluator()  # eager 100 us, compiled 110 us, spreads of 4%
    status = await engine(store, sid, ScriptedProposer([1.03, 0.8]), evaluator,
                          iterations_per_op=2).run()
    assert status == SessionStatus.DONE
    nodes = await by_speed(store, sid)
    # 1.03x eager is inside the noise but 1.13x torch.compile is not: compiled modes can use it
    assert nodes[1.03].confirmed and len(evaluator.confirmed) == 1
    assert not nodes[0.8].confirmed


async def test_only_the_kernel_an_op_would_use_is_confirmed(store: Store):
    sid = await session(store)
    evaluator = FakeEvaluator()
    status = await engine(store, sid, ScriptedProposer([1.03, 1.2]), evaluator,
                          iterations_per_op=2).run()
    assert status == SessionStatus.DONE
    nodes = await by_speed(store, sid)
    assert nodes[1.2].confirmed and not nodes[1.03].confirmed
    assert len(evaluator.confirmed) == 1


async def test_a_slower_would_be_best_is_logged_as_the_spare_of_the_faster_one(store: Store):
    """Both wait for the op to settle; the log does not call the slower one the op's leader."""
    sid = await session(store)
    status = await engine(store, sid, ScriptedProposer([3.0, 2.0, 1.1]), FakeEvaluator(),
                          iterations_per_op=3).run()
    assert status == SessionStatus.DONE
    nodes = await by_speed(store, sid)
    leads = [m.split(": ", 1)[1] for m in await logs(store, sid) if "would lead" in m]
    assert leads == ["confirming it once the op's search settles",
                     f"a spare in case node {nodes[3.0].id} (3.00x) is not confirmed"]
    assert nodes[3.0].confirmed and not nodes[2.0].confirmed


def test_a_kernel_short_of_every_baseline_says_so_for_each():
    from kforge.core.candidate import Baseline, Timing
    from kforge.core.reward import short_of_baselines

    def timed(us: float) -> Timing:
        return Timing(median_us=us, p10_us=us * 0.98, p90_us=us * 1.02, reps=50)

    card = Baseline(eager=timed(100.0), compiled=timed(50.0))
    assert short_of_baselines(timed(80.0), None, card) is None  # usable in eager and graphs
    assert short_of_baselines(timed(40.0), None, card) is None
    why = short_of_baselines(timed(99.0), None, card)
    assert why == ("1.01x eager is not faster beyond the timing noise (±6%); 0.51x torch.compile "
                   "is slower")
