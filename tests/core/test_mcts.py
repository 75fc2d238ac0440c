"""The pure MCTS core: decisions, repairs, pruning, virtual loss, and invariants under random use."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kforge.core.mcts import ROOT, Action, MctsParams, NodeRecord, NodeState, Tree


def grow(tree: Tree, node_id: int, reward: float | None, repairable: bool = True) -> int:
    d = tree.select()
    tree.add(node_id, d.parent, d.action)
    tree.complete(node_id, reward, repairable=repairable)
    return d.parent


def test_first_decision_is_a_new_approach_at_the_root():
    d = Tree().select()
    assert (d.parent, d.action) == (ROOT, Action.NEW)


def test_ok_leaf_is_refined():
    tree = Tree()
    tree.add(1, ROOT, Action.NEW)
    tree.complete(1, math.log(1.5))
    d = tree.select()
    assert (d.parent, d.action) == (1, Action.REFINE)


def test_progressive_widening_limits_root_children():
    tree = Tree(MctsParams(widen_k=1.0, widen_alpha=0.5))
    tree.add(1, ROOT, Action.NEW)
    tree.complete(1, 0.1)
    # root has 1 visit -> 1 child allowed, so the walk goes down to node 1
    assert tree.select().parent == 1
    for i in range(2, 5):  # three refinements of node 1: root visits reach 4 -> 2 children
        tree.add(i, 1 if i == 2 else i - 1, Action.REFINE)
        tree.complete(i, 0.1)
    assert tree.visits(ROOT) == 4
    d = tree.select()
    assert (d.parent, d.action) == (ROOT, Action.NEW)


NARROW = MctsParams(widen_k=1.0, widen_alpha=0.5)  # the root keeps one child for a while


def test_failed_node_is_repaired_then_closed_after_max_repairs():
    tree = Tree(replace(NARROW, max_repairs=2))
    tree.add(1, ROOT, Action.NEW)
    tree.complete(1, None, repairable=True)
    assert tree.select() == type(tree.select())(1, Action.REPAIR)
    tree.add(2, 1, Action.REPAIR)
    tree.complete(2, None, repairable=True)
    assert tree.select().parent == 2 and tree.select().action is Action.REPAIR
    tree.add(3, 2, Action.REPAIR)
    tree.complete(3, None, repairable=True)
    # chain of three failures = two repairs used: closed, so the root widens instead
    d = tree.select()
    assert (d.parent, d.action) == (ROOT, Action.NEW)


def test_unrepairable_failure_is_closed_at_once():
    tree = Tree()
    tree.add(1, ROOT, Action.NEW)
    tree.complete(1, None, repairable=False)
    assert tree.select() .parent == ROOT


def test_successful_repair_is_refined_like_any_good_kernel():
    tree = Tree(NARROW)
    tree.add(1, ROOT, Action.NEW)
    tree.complete(1, None, repairable=True)
    tree.add(2, 1, Action.REPAIR)
    tree.complete(2, math.log(1.3))
    d = tree.select()
    assert (d.parent, d.action) == (2, Action.REFINE)
    assert tree.best() == 2


def test_pruned_subtree_is_never_selected_and_not_best():
    tree = Tree(MctsParams(widen_k=10.0))
    tree.add(1, ROOT, Action.NEW)
    tree.complete(1, math.log(3.0))
    tree.add(2, ROOT, Action.NEW)
    tree.complete(2, math.log(1.1))
    assert tree.best() == 1
    tree.prune(1)
    assert tree.best() == 2
    assert tree.best_reward == pytest.approx(math.log(1.1))
    for i in range(3, 30):
        d = tree.select()
        assert not tree.is_pruned(d.parent) or d.parent == ROOT
        tree.add(i, d.parent, d.action)
        tree.complete(i, 0.0)
    tree.unprune(1)
    assert tree.best() == 1


def test_virtual_loss_spreads_parallel_expansions():
    tree = Tree(MctsParams(widen_k=1.0, widen_alpha=0.5, explore=0.1))
    for i, r in ((1, 0.5), (2, 0.45)):
        tree.add(i, ROOT, Action.NEW)
        tree.complete(i, r)
    # pile 3 nodes in flight under the better branch: virtual loss drags it below the other
    first = tree.select()
    assert first.parent == 1
    for i in range(10, 13):
        tree.add(i, 1, Action.REFINE)
    assert tree.inflight(ROOT) == 3
    assert tree.select().parent == 2


def test_stagnation_counts_evaluations_since_last_real_gain():
    tree = Tree(MctsParams(min_gain=0.05))
    tree.add(1, ROOT, Action.NEW)
    tree.complete(1, 0.5)
    for i in range(2, 6):
        d = tree.select()
        tree.add(i, d.parent, d.action)
        tree.complete(i, 0.5 + 0.001 * i)  # tiny gains do not count as progress
    assert tree.since_improvement == 4
    assert tree.stagnant(4) and not tree.stagnant(5)
    d = tree.select()
    tree.add(9, d.parent, d.action)
    tree.complete(9, 0.9)
    assert tree.since_improvement == 0


def test_same_seed_same_decisions():
    def run(seed: int) -> list[tuple[int, str]]:
        tree = Tree(MctsParams(explore=0.0), seed=seed)
        out = []
        for i in range(1, 40):
            d = tree.select()
            out.append((d.parent, d.action.value))
            tree.add(i, d.parent, d.action)
            tree.complete(i, 0.0)  # all ties: only the seed breaks them
        return out

    assert run(7) == run(7)


def test_rebuild_from_records_matches_live_tree():
    live = Tree(seed=3)
    records = []
    rewards = [0.2, None, 0.4, 0.1, None, 0.3, 0.6, -0.2]
    for i, r in enumerate(rewards, start=1):
        d = live.select()
        live.add(i, d.parent, d.action)
        live.complete(i, r, repairable=True)
        records.append(NodeRecord(i, d.parent, d.action,
                                  NodeState.OK if r is not None else NodeState.FAILED, r, True))
    rebuilt = Tree.from_records(records, seed=3)
    assert rebuilt.best() == live.best()
    assert rebuilt.completed == live.completed
    for i in range(len(rewards) + 1):
        assert rebuilt.visits(i) == live.visits(i)
        assert rebuilt.mean_value(i) == pytest.approx(live.mean_value(i))
    assert rebuilt.select() == live.select()


def test_a_demoted_node_counts_as_failed_and_its_refinements_stay():
    """A would-be best that fails its confirmation: the subtree's best and counts drop it, a
    refinement chosen before it failed is still added, and a rebuild from storage agrees."""
    tree = Tree()
    tree.add(1, ROOT, Action.NEW)
    tree.complete(1, math.log(1.2))
    tree.add(2, ROOT, Action.NEW)
    tree.complete(2, math.log(2.0))
    assert tree.best() == 2
    tree.demote(2, repairable=True)
    assert tree.best() == 1 and tree.best_reward == pytest.approx(math.log(1.2))
    assert tree.value(2) == tree.params.failure_reward
    tree.add(3, 2, Action.REFINE)  # chosen while 2 was still OK
    tree.complete(3, math.log(1.1))
    with pytest.raises(ValueError):
        tree.demote(2)  # already failed
    records = [NodeRecord(1, ROOT, Action.NEW, NodeState.OK, math.log(1.2)),
               NodeRecord(2, ROOT, Action.NEW, NodeState.FAILED, None, True),
               NodeRecord(3, 2, Action.REFINE, NodeState.OK, math.log(1.1))]
    rebuilt = Tree.from_records(records)
    assert rebuilt.best() == tree.best() == 1
    for i in range(4):  # (the live tree's value scale still spans the demoted reward)
        assert rebuilt.visits(i) == tree.visits(i)


def test_discard_forgets_in_flight_leaf():
    tree = Tree()
    tree.add(1, ROOT, Action.NEW)
    tree.discard(1)
    assert len(tree) == 0 and tree.inflight() == 0


def test_misuse_is_refused():
    tree = Tree()
    with pytest.raises(ValueError):
        tree.add(1, ROOT, Action.REFINE)  # the root has new approaches, not refinements
    tree.add(1, ROOT, Action.NEW)
    with pytest.raises(ValueError):
        tree.add(2, 1, Action.REFINE)  # parent still in flight
    tree.complete(1, 0.1)
    with pytest.raises(ValueError):
        tree.add(2, 1, Action.REPAIR)  # repairs are for failed nodes
    with pytest.raises(ValueError):
        tree.prune(ROOT)
    with pytest.raises(ValueError):
        tree.complete(1, 0.2)  # already complete


# ----- properties -----

ops = st.lists(
    st.one_of(
        st.tuples(st.just("eval"), st.one_of(st.none(), st.floats(-2, 2)), st.booleans()),
        st.tuples(st.just("inflight"), st.none(), st.booleans()),
        st.tuples(st.just("finish"), st.one_of(st.none(), st.floats(-2, 2)), st.booleans()),
        st.tuples(st.just("prune"), st.integers(1, 60), st.booleans()),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, seed=st.integers(0, 5), max_repairs=st.integers(0, 3))
def test_invariants_hold_under_random_use(ops, seed, max_repairs):
    params = MctsParams(max_repairs=max_repairs)
    tree = Tree(params, seed=seed)
    parent_of: dict[int, int] = {}
    state: dict[int, str] = {}
    reward: dict[int, float | None] = {}
    pruned: set[int] = set()
    pending: list[int] = []
    next_id = 1
    for kind, value, flag in ops:
        if kind in ("eval", "inflight"):
            d = tree.select()
            # a decision never points into a pruned subtree or at an unfinished node
            assert d.parent == ROOT or not tree.is_pruned(d.parent)
            assert d.parent == ROOT or state[d.parent] != "flight"
            if d.action is Action.REPAIR:
                assert state[d.parent] == "failed" and not tree.children(d.parent)
            tree.add(next_id, d.parent, d.action)
            parent_of[next_id] = d.parent
            state[next_id] = "flight"
            if kind == "eval":
                tree.complete(next_id, value, repairable=True)
                state[next_id] = "ok" if value is not None else "failed"
                reward[next_id] = value
            else:
                pending.append(next_id)
            next_id += 1
        elif kind == "finish" and pending:
            node = pending.pop(0)
            tree.complete(node, value, repairable=flag)
            state[node] = "ok" if value is not None else "failed"
            reward[node] = value
        elif kind == "prune" and value in state:
            (tree.prune if flag else tree.unprune)(value)
            (pruned.add if flag else pruned.discard)(value)

    def subtree(n: int) -> list[int]:
        kids = [c for c, p in parent_of.items() if p == n]
        return [n] + [x for k in kids for x in subtree(k)]

    def ancestors_pruned(n: int) -> bool:
        while n != ROOT:
            if n in pruned:
                return True
            n = parent_of[n]
        return False

    for n in [ROOT, *state]:
        members = [m for m in subtree(n) if m != ROOT]
        done = [m for m in members if state[m] != "flight"]
        assert tree.visits(n) == len(done)
        assert tree.inflight(n) == len(members) - len(done)
    for n, s in state.items():
        if s == "failed":  # a failed node has at most one child: its repair
            assert len(tree.children(n)) <= 1
    eligible = [n for n, s in state.items() if s == "ok" and not ancestors_pruned(n)]
    if eligible:
        assert reward[tree.best()] == max(reward[n] for n in eligible)
    else:
        assert tree.best() is None
