"""`kforge add-kernel`: a user's own kernel is evaluated with the session's evaluator (the test
double here) and joins the card's search tree, where a later search builds on it; bad input ends
in one line and stores nothing."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from pathlib import Path

import pytest

from kforge.cli.main import main
from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus
from kforge.core.mcts import Tree
from kforge.store import SessionStatus, Store
from tests.doubles import sample_cards

DOUBLES = {"search": {"proposer": "tests.doubles:make_proposer",
                      "evaluator": "tests.doubles:make_evaluator"}}
SOURCE = """extern "C" __global__ void add_f16(const __half* a, const __half* b, __half* out,
                                   int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __hadd(a[i], b[i]);
}
"""
PLAN = {"requires": ["self.is_contiguous", "other.is_contiguous"],
        "outputs": [{"name": "out", "like": "self"}],
        "launches": [{"kernel": "add_f16", "grid": ["ceil_div(self.numel, 256)"], "block": [256],
                      "params": [{"ptr": "self"}, {"ptr": "other"}, {"ptr": "out"},
                                 {"i32": "self.numel"}]}]}


def run(coro_fn, db: Path):
    async def go():
        async with await Store.open(db) as store:
            return await coro_fn(store)

    return asyncio.run(go())


@pytest.fixture
def session(tmp_path: Path) -> tuple[Path, int, int]:
    """A profiled session searched by the test doubles, and its add card's id."""
    db = tmp_path / "k.db"

    async def make(store: Store) -> tuple[int, int]:
        sid = await store.create_profiled_session("toy", DOUBLES, {"name": "Fake GPU",
                                                                   "arch": "sm_90"},
                                                  sample_cards())
        card = next(r.id for r in await store.list_cards(sid) if r.card.op == "aten.add.Tensor")
        return sid, card

    sid, card = run(make, db)
    return db, sid, card


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    source, plan = tmp_path / "kernel.cu", tmp_path / "plan.json"
    source.write_text(SOURCE)
    plan.write_text(json.dumps(PLAN))
    return source, plan


def add(db: Path, sid: int, card: int, source: Path, plan: Path, *more: str) -> int:
    return main(["add-kernel", str(sid), "--card", str(card), "--source", str(source),
                 "--plan", str(plan), "--db", str(db), "--trust-plugins", *more])


def nodes_of(db: Path, sid: int, card: int):
    return run(lambda store: store.list_nodes(sid, card), db)


def test_a_users_kernel_is_evaluated_and_joins_the_tree_as_a_new_approach(session, files,
                                                                         capsys):
    db, sid, card = session
    assert add(db, sid, card, *files, "--approach", "one thread per element") == 0
    said = capsys.readouterr().out
    (node,) = nodes_of(db, sid, card)
    assert f"node {node.id} (user, new) for card {card}: ok, 1.00x over eager" in said
    # 1.00x eager, but faster than the double's torch.compile (1.1x eager): the compiled modes
    # could use it, so it is confirmed
    assert "confirmed" in said and "not confirmed" not in said
    assert (node.parent_id, node.action, node.status) == (None, "new", "ok")
    assert node.meta["proposer"] == "user" and node.meta["approach"] == "one thread per element"
    detail = run(lambda store: store.get_node(node.id), db)
    assert detail.candidate.source == SOURCE and detail.candidate.plan["launches"][0][
        "kernel"] == "add_f16"
    assert detail.outcome.ok and detail.llm_calls == []

    async def state(store: Store):
        return await store.get_session(sid), await store.get_card(card)

    after, row = run(state, db)
    assert after.status == SessionStatus.READY and after.engine_pid is None  # lease given back
    assert row.baseline is not None  # eager was timed first, as a search does
    # confirmed (it beats the double's torch.compile), so the card's best
    assert row.best_node == node.id


def test_a_parent_makes_it_a_refine_or_a_repair(session, files):
    db, sid, card = session

    async def two_parents(store: Store) -> tuple[int, int]:
        ids = []
        for status in (EvalStatus.OK, EvalStatus.COMPILE_ERROR):
            node = await store.add_node(sid, card, None, "new")
            await store.set_candidate(node, Candidate(SOURCE, PLAN, {"approach": "x"}))
            await store.finish_node(node, EvalOutcome(status, speedup=1.5 if status == "ok"
                                                      else None, summary=status.value),
                                    0.4 if status == "ok" else None)
            ids.append(node)
        return ids[0], ids[1]

    working, failed = run(two_parents, db)
    assert add(db, sid, card, *files, "--parent", str(working)) == 0
    assert add(db, sid, card, *files, "--parent", str(failed)) == 0
    added = {n.parent_id: n for n in nodes_of(db, sid, card) if n.meta.get("proposer") == "user"}
    assert added[working].action == "refine" and added[failed].action == "repair"
    assert added[working].meta["parent"] == working


def test_a_later_search_takes_the_users_node_into_its_tree(session, files):
    db, sid, card = session
    assert add(db, sid, card, *files) == 0
    assert main(["resume", str(sid), "--db", str(db), "--quiet", "--iterations", "3",
                 "--trust-plugins"]) == 0
    nodes = nodes_of(db, sid, card)
    tree = Tree.from_records([n.record() for n in nodes])
    user = next(n for n in nodes if n.meta.get("proposer") == "user")
    assert user.id in tree and tree.visits(user.id) >= 1


@pytest.mark.parametrize("change, message", [
    (lambda source, plan: source.unlink(), "no CUDA source file"),
    (lambda source, plan: plan.write_text("{outputs: ["), "is not valid JSON: Expecting"),
    (lambda source, plan: plan.write_text("[" * 100_000 + "]" * 100_000),
     "nests its JSON too deeply"),
    (lambda source, plan: plan.write_text(json.dumps(
        {**PLAN, "launches": [{**PLAN["launches"][0], "blok": [256]}]})),
     "launches[0].blok: unknown field 'blok'"),
    (lambda source, plan: plan.write_text(json.dumps(
        {**PLAN, "requires": ["self.dtype == 'float32'"]})),
     "the launch plan does not cover card"),
    (lambda source, plan: source.write_text(SOURCE.replace("add_f16", "add_half")),
     "the plan launches add_f16, which the source does not declare"),
])
def test_bad_files_end_in_one_line_and_store_nothing(session, files, capsys, change, message):
    db, sid, card = session
    change(*files)
    assert add(db, sid, card, *files) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kforge: ") and message in err[0], err
    assert nodes_of(db, sid, card) == []


def test_an_unknown_card_or_parent_is_refused(session, files, capsys):
    db, sid, card = session
    assert add(db, sid, 999, *files) == 1
    assert f"no op card 999 in session {sid}" in capsys.readouterr().err
    assert add(db, sid, card, *files, "--parent", "77") == 1
    assert f"no search node 77 in session {sid}" in capsys.readouterr().err

    async def other_card_node(store: Store) -> int:
        other = next(r.id for r in await store.list_cards(sid) if r.id != card and r.card.target)
        node = await store.add_node(sid, other, None, "new")
        await store.fail_proposal(node, "no candidate")
        return node

    node = run(other_card_node, db)
    assert add(db, sid, card, *files, "--parent", str(node)) == 1
    assert f"node {node} belongs to card" in capsys.readouterr().err


def test_a_session_being_searched_is_left_alone(session, files, capsys):
    db, sid, card = session
    run(lambda store: store.claim_engine(sid, os.getpid(), socket.gethostname()), db)
    assert add(db, sid, card, *files) == 1
    assert f"session {sid} is being searched right now" in capsys.readouterr().err
    assert nodes_of(db, sid, card) == []
