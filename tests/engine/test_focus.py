"""A focus narrows a search and never ends it: an op focused on that converges hands the search
back to every op, a focus on an op with nothing left to search is refused or cleared with a line
saying why, and a resumed search with nothing to do says so in its log."""

from __future__ import annotations

import asyncio

from kforge.store import CardStatus, SessionStatus, Store
from kforge.store.events import CommandDone, LogLine
from tests.engine.test_engine import engine, run_with_viewer, session


async def log_lines(store: Store, sid: int) -> list[str]:
    return [e.record.message for e in await store.events_since(0, sid)
            if isinstance(e.record, LogLine)]


async def card_ids(store: Store, sid: int) -> dict[str, int]:
    return {row.card.short_op: row.id for row in await store.list_cards(sid)}


async def focus_said(store: Store, sid: int, card_id: int) -> list[str]:
    """What a running search answers a viewer's focus on ``card_id``."""

    async def script(viewer: Store):
        await viewer.send_command(sid, "focus", card_id)
        while await viewer.pending_commands(sid):
            await asyncio.sleep(0.01)

    await run_with_viewer(store, sid, script, iterations_per_op=4)
    return [e.record.result for e in await store.events_since(0, sid)
            if isinstance(e.record, CommandDone)]


async def test_a_focused_op_that_converges_hands_the_search_back_to_the_others(store: Store):
    sid = await session(store)
    ids = await card_ids(store, sid)
    await store.update_settings(sid, {"search": {"focus": ids["relu"]}})
    status = await engine(store, sid, iterations_per_op=6, patience=2, focus=ids["relu"]).run()
    assert status == SessionStatus.DONE
    nodes = sorted(await store.list_nodes(sid), key=lambda n: n.id)
    relu = await store.get_card(ids["relu"])
    assert relu.status == CardStatus.DONE and relu.stop_reason.startswith("no gain")
    # relu alone until it converged, then the other ops
    first_other = next(i for i, n in enumerate(nodes) if n.card_id != ids["relu"])
    assert first_other == relu.spent and {n.card_id for n in nodes[:first_other]} == {ids["relu"]}
    assert {ids["_softmax"], ids["add"]} <= {n.card_id for n in nodes[first_other:]}
    assert (await store.get_session(sid)).settings["search"]["focus"] is None
    lines = await log_lines(store, sid)
    assert any(line.startswith("focus cleared: the focused op relu 64 is done (no gain in 2 "
                               "iterations); the search goes on with every op")
               for line in lines), lines
    assert not any("card" in line for line in lines)  # ops by name, never by card id


async def test_a_stored_focus_on_a_finished_op_is_cleared_when_the_search_resumes(store: Store):
    sid = await session(store)
    ids = await card_ids(store, sid)
    await store.update_card(ids["relu"], status=CardStatus.DONE, stop_reason="budget spent")
    await store.update_settings(sid, {"search": {"focus": ids["relu"]}})
    await engine(store, sid, iterations_per_op=2, focus=ids["relu"]).run()
    searched = {n.card_id for n in await store.list_nodes(sid)}
    assert searched == {ids["_softmax"], ids["add"]}
    assert "focus cleared: the focused op relu 64 is done (budget spent); the search goes on " \
           "with every op" in await log_lines(store, sid)


async def test_a_resumed_search_with_nothing_left_says_why_in_one_line(store: Store):
    sid = await session(store)
    for card_id in (await card_ids(store, sid)).values():
        row = await store.get_card(card_id)
        if row.card.target:
            await store.update_card(card_id, status=CardStatus.DONE,
                                    stop_reason="no gain in 12 iterations")
    before = len(await log_lines(store, sid))
    assert await engine(store, sid).run() == SessionStatus.DONE
    assert await store.list_nodes(sid) == []
    assert (await log_lines(store, sid))[before:] == [
        "search done: no op left to search (3 done)"]


async def test_a_budget_that_ends_the_search_is_its_one_line(store: Store):
    sid = await session(store)
    await engine(store, sid, iterations_per_op=1).run()
    before = len(await log_lines(store, sid))
    assert await engine(store, sid, iterations_per_op=1).run() == SessionStatus.DONE
    assert (await log_lines(store, sid))[before:] == ["iteration budget spent"]


async def test_focusing_on_an_op_with_nothing_left_is_refused_with_why(store: Store):
    sid = await session(store)
    ids = await card_ids(store, sid)
    await store.update_card(ids["relu"], status=CardStatus.DONE, stop_reason="budget spent")

    assert await focus_said(store, sid, ids["relu"]) == [
        "not focused: relu 64 is done (budget spent)"]
    assert (await store.get_session(sid)).settings.get("search", {}).get("focus") is None


async def test_a_focus_names_its_op_as_the_op_list_does(store: Store):
    sid = await session(store)
    ids = await card_ids(store, sid)
    assert await focus_said(store, sid, ids["add"]) == ["focused on add 8x1024 8x1024"]
