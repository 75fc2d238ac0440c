"""Viewer commands: the routing rule (engine, store, release, refusal), the argument check, and
``issue`` carrying each out against a real store."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kforge.store import CommandKind, SessionStatus, Store
from kforge.store.commands import (
    HELD_STATUSES,
    STORE_KINDS,
    BadCommand,
    NoRunningSearch,
    Route,
    checked,
    issue,
    route,
)
from tests.doubles import sample_cards

kinds = st.sampled_from(list(CommandKind))
statuses = st.sampled_from(list(SessionStatus))


@given(kinds, statuses)
def test_a_live_engine_carries_out_every_command(kind, status):
    assert route(kind, True, status) is Route.ENGINE


@given(kinds, statuses)
def test_without_an_engine_the_store_takes_prune_and_focus_and_a_stop_releases_a_dead_one(
        kind, status):
    how = route(kind, False, status)
    if kind in STORE_KINDS:
        assert how is Route.DIRECT
    elif kind is CommandKind.STOP and status in HELD_STATUSES:
        assert how is Route.RELEASE
    else:
        assert how is Route.NO_ENGINE


@pytest.mark.parametrize(("kind", "arg", "expected"), [
    ("pause", None, (CommandKind.PAUSE, None)), ("stop", None, (CommandKind.STOP, None)),
    ("prune", 7, (CommandKind.PRUNE, 7)), ("unprune", 7, (CommandKind.UNPRUNE, 7)),
    ("focus", 3, (CommandKind.FOCUS, 3)), ("focus", None, (CommandKind.FOCUS, None)),
])
def test_checked_reads_a_command_as_the_search_does(kind, arg, expected):
    assert checked(kind, arg) == expected


@pytest.mark.parametrize(("kind", "arg", "says"), [
    ("jump", None, "unknown command 'jump'"), ("prune", None, "prune needs a node id"),
    ("prune", "7", "not '7'"), ("unprune", 0, "unprune needs a node id"),
    ("prune", True, "not True"), ("focus", 2.5, "focus needs a card id"),
    ("pause", 3, "pause takes no argument"),
])
def test_checked_names_what_is_wrong(kind, arg, says):
    with pytest.raises(BadCommand, match=says):
        checked(kind, arg)


async def session_with_a_node(store: Store) -> tuple[int, int, int]:
    sid = await store.create_profiled_session("toy", {}, {"name": "GPU", "arch": "sm_90"},
                                              sample_cards())
    card = (await store.list_cards(sid))[0].id
    return sid, card, await store.add_node(sid, card, None, "new")


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


async def test_without_an_engine_prune_and_focus_write_the_store(store: Store):
    sid, card, node = await session_with_a_node(store)
    assert await issue(store, sid, CommandKind.PRUNE, node) == f"pruned node {node}"
    assert (await store.get_nodes([node]))[0].pruned
    assert await issue(store, sid, "unprune", node) == f"unpruned node {node}"
    assert not (await store.get_nodes([node]))[0].pruned
    said = await issue(store, sid, CommandKind.FOCUS, card)
    assert said.startswith("focused on _softmax 8x1024;")  # the op as the op list names it
    assert (await store.get_session(sid)).settings["search"]["focus"] == card
    assert (await issue(store, sid, CommandKind.FOCUS)).startswith("focus cleared")
    assert (await store.get_session(sid)).settings["search"]["focus"] is None
    assert await store.pending_commands(sid) == []


async def test_a_node_or_card_of_another_session_is_refused_and_nothing_changes(store: Store):
    sid, _, _ = await session_with_a_node(store)
    _, other_card, other_node = await session_with_a_node(store)
    before = await store.last_seq()
    with pytest.raises(BadCommand, match=f"no search node {other_node} in session {sid}"):
        await issue(store, sid, CommandKind.PRUNE, other_node)
    with pytest.raises(BadCommand, match=f"no op card {other_card} in session {sid}"):
        await issue(store, sid, CommandKind.FOCUS, other_card)
    assert await store.last_seq() == before


async def test_pause_without_an_engine_is_refused(store: Store):
    sid, _, _ = await session_with_a_node(store)
    with pytest.raises(NoRunningSearch, match=f"no search is running for session {sid} "
                                              r"\(status: ready\)"):
        await issue(store, sid, CommandKind.PAUSE)
    assert await store.pending_commands(sid) == []


async def test_a_live_engine_gets_the_command_queued(store: Store):
    sid, card, node = await session_with_a_node(store)
    await store.claim_engine(sid)  # this process, beating now: alive
    said = await issue(store, sid, CommandKind.PRUNE, node)
    assert said.startswith(f"asked the engine of session {sid}") and "prune node" in said
    (queued,) = await store.pending_commands(sid)
    assert (queued.kind, queued.arg) == (CommandKind.PRUNE, node)
    assert not (await store.get_nodes([node]))[0].pruned  # the engine prunes, not the viewer
    said = await issue(store, sid, CommandKind.FOCUS, card)
    assert said.endswith("to focus on _softmax 8x1024")


async def test_stop_marks_a_session_whose_engine_died_as_stopped(store: Store):
    sid, _, _ = await session_with_a_node(store)
    await store.claim_engine(sid, pid=dead_pid())
    await store.set_session_status(sid, SessionStatus.RUNNING)
    assert "marked stopped" in await issue(store, sid, CommandKind.STOP)
    session = await store.get_session(sid)
    assert session.status == SessionStatus.STOPPED and session.engine_pid is None
