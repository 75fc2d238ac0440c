"""A card's count and best are derived from its finished nodes in the transaction that finishes one."""

from __future__ import annotations

import asyncio

import pytest

from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus
from kforge.store import Store
from kforge.store.events import CardUpdated
from tests.doubles import sample_cards


async def evaluating(store: Store, sid: int, card_id: int) -> int:
    node = await store.add_node(sid, card_id, None, "new")
    await store.set_candidate(node, Candidate(f"src{node}", "l"))
    return node


def ok(speedup: float) -> EvalOutcome:
    return EvalOutcome(EvalStatus.OK, f"{speedup}x", speedup=speedup)


async def test_results_stored_at_once_each_count_and_the_fastest_leads(store: Store):
    sid = await store.create_profiled_session("toy", {}, {}, sample_cards())
    card = (await store.list_cards(sid))[0].id
    nodes = [await evaluating(store, sid, card) for _ in range(4)]
    outcomes = [ok(1.5), EvalOutcome(EvalStatus.MISMATCH, "max error 3"), ok(2.5), ok(2.0)]
    rows = await asyncio.gather(*(store.finish_node(n, o, None, confirmed=True)
                                  for n, o in zip(nodes, outcomes)),
                                store.fail_proposal(await store.add_node(sid, card, None, "new"),
                                                    "no code block"))
    row = await store.get_card(card)
    assert (row.spent, row.best_node, row.best_speedup) == (5, nodes[2], 2.5)
    assert max(r.spent for r in rows) == 5  # each call returns the card as it stored it
    assert rows[2].best_node == nodes[2] and rows[2].spent >= 3


async def test_a_slower_kernel_keeps_the_best_and_a_tie_keeps_the_first(store: Store):
    sid = await store.create_profiled_session("toy", {}, {}, sample_cards())
    card = (await store.list_cards(sid))[0].id
    first, slower, tie = [await evaluating(store, sid, card) for _ in range(3)]
    assert (await store.finish_node(first, ok(2.0), None, confirmed=True)).best_node == first
    assert (await store.finish_node(slower, ok(1.2), None, confirmed=True)).best_node == first
    row = await store.finish_node(tie, ok(2.0), None, confirmed=True)
    assert (row.spent, row.best_node, row.best_speedup) == (3, first, 2.0)
    seq = await store.last_seq()
    records = [e.record for e in await store.events_since(seq - 2)]
    assert CardUpdated(card, {"spent": 3, "best_node": first, "best_speedup": 2.0}) in records


async def test_only_a_confirmed_node_is_a_best_and_a_failed_confirmation_restores_the_last(
        store: Store):
    sid = await store.create_profiled_session("toy", {}, {}, sample_cards())
    card = (await store.list_cards(sid))[0].id
    confirmed, faster = [await evaluating(store, sid, card) for _ in range(2)]
    await store.finish_node(confirmed, ok(1.5), None, confirmed=True)
    row = await store.finish_node(faster, ok(3.0), None, confirming=True)
    assert (row.spent, row.best_node) == (2, confirmed)  # counted, never the best meanwhile
    node = (await store.get_nodes([faster]))[0]
    assert node.confirming and node.speedup == 3.0 and not node.confirmed
    finished_at = node.finished_at
    row = await store.finish_node(faster, EvalOutcome(EvalStatus.MISMATCH, "race"), None)
    assert (row.spent, row.best_node, row.best_speedup) == (2, confirmed, 1.5)
    node = (await store.get_nodes([faster]))[0]
    assert node.status == "mismatch" and node.finished_at == finished_at


async def test_a_failed_finish_leaves_nothing_behind(store: Store, monkeypatch):
    sid = await store.create_profiled_session("toy", {}, {}, sample_cards())
    card = (await store.list_cards(sid))[0].id
    node = await evaluating(store, sid, card)
    seq = await store.last_seq()

    async def broken(*args):
        raise RuntimeError("disk gone")

    monkeypatch.setattr(Store, "_tally_card", broken)
    with pytest.raises(RuntimeError):
        await store.finish_node(node, ok(2.0), 0.69, confirmed=True)
    assert (await store.get_node(node)).outcome is None
    assert (await store.get_card(card)).spent == 0
    assert await store.last_seq() == seq
