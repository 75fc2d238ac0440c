"""How the tree values its nodes: the best value in a subtree (kernel search wants the maximum),
on the card's own normalised scale (the same exploration for a 2 us and a 2 ms op)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kforge.core.mcts import ROOT, Action, MctsParams, NodeRecord, NodeState, Tree
from kforge.core.reward import RewardScale

OK, FAILED = NodeState.OK, NodeState.FAILED


def two_branches(params: MctsParams, seed: int) -> Tree:
    """Branch 1: a 2.0x kernel whose three refinements failed to compile. Branch 2: a 1.05x
    kernel with three refinements of about 1.0x."""
    records = [NodeRecord(1, ROOT, Action.NEW, OK, math.log(2.0)),
               NodeRecord(2, ROOT, Action.NEW, OK, math.log(1.05))]
    records += [NodeRecord(i, 1, Action.REFINE, FAILED, None, repairable=True)
                for i in (3, 4, 5)]
    records += [NodeRecord(i, 2, Action.REFINE, OK, math.log(r))
                for i, r in ((6, 1.0), (7, 1.01), (8, 0.99))]
    return Tree.from_records(records, params, seed=seed)


def branch_of(tree: Tree, node_id: int) -> int:
    lineage = tree.lineage(node_id) if node_id != ROOT else [ROOT]
    return lineage[0]


# The root may not widen further: it must choose between its two branches.
TWO = MctsParams(widen_k=1.0, widen_alpha=0.5)


def test_the_branch_holding_the_best_kernel_is_chosen_whatever_failed_under_it():
    chosen = []
    for seed in range(200):
        tree = two_branches(TWO, seed)
        chosen.append(branch_of(tree, tree.select().parent))
    assert chosen == [1] * 200


def test_a_mean_backup_would_choose_the_branch_of_mediocre_kernels():
    params = replace(TWO, backup_mean=1.0)
    chosen = {branch_of(tree, tree.select().parent)
              for tree in (two_branches(params, seed) for seed in range(50))}
    assert chosen == {2}


def test_a_node_is_worth_the_best_value_below_it():
    tree = two_branches(MctsParams(), 0)
    assert tree.value(1) == pytest.approx(1.0)  # the fastest kernel of the card
    low = math.log(0.99)  # the slowest kernel, below eager, is the scale's 0
    assert tree.value(2) == pytest.approx((math.log(1.05) - low) / (math.log(2.0) - low))
    assert tree.value(3) == MctsParams().failure_reward
    # the mean, for comparison: one 2x kernel and three failures
    assert tree.mean_value(1) == pytest.approx((1.0 + 3 * MctsParams().failure_reward) / 4)


def test_pruning_takes_a_subtree_out_of_its_ancestors_value_and_back():
    tree = Tree(MctsParams(widen_k=10.0))
    tree.add(1, ROOT, Action.NEW)
    tree.complete(1, math.log(1.2))
    tree.add(2, 1, Action.REFINE)
    tree.complete(2, math.log(3.0))
    tree.add(3, 2, Action.REFINE)
    tree.complete(3, math.log(1.1))
    assert tree.value(1) == pytest.approx(1.0)
    tree.prune(2)
    assert tree.value(1) == pytest.approx(math.log(1.2) / math.log(3.0))
    tree.add(4, 1, Action.REFINE)  # a later result under a pruned part still does not count
    tree.complete(4, math.log(1.3))
    assert tree.value(1) == pytest.approx(math.log(1.3) / math.log(3.0))
    tree.unprune(2)
    assert tree.value(1) == pytest.approx(1.0)


def test_a_rebuilt_tree_values_its_nodes_as_the_live_one():
    live = Tree(seed=5)
    records = []
    for i, r in enumerate([0.3, None, 0.1, 0.7, None, -0.2, 0.4], start=1):
        d = live.select()
        live.add(i, d.parent, d.action)
        live.complete(i, r, repairable=True)
        records.append(NodeRecord(i, d.parent, d.action, OK if r is not None else FAILED, r,
                                  True))
    rebuilt = Tree.from_records(records, seed=5)
    for i in range(1, 8):
        assert rebuilt.value(i) == pytest.approx(live.value(i))


def grow(tree: Tree, rewards: list[float | None]) -> list[tuple[int, str]]:
    decisions = []
    for i, reward in enumerate(rewards, start=1):
        d = tree.select()
        decisions.append((d.parent, d.action.value))
        tree.add(i, d.parent, d.action)
        tree.complete(i, reward, repairable=True)
    return decisions


@settings(max_examples=80, deadline=None)
@given(rewards=st.lists(st.one_of(st.none(), st.floats(-1.0, 1.5)), min_size=1, max_size=40),
       factor=st.floats(0.01, 100.0), seed=st.integers(0, 9))
def test_decisions_do_not_depend_on_the_scale_of_a_cards_rewards(rewards, factor, seed):
    """A 2 us op whose kernels differ by a few percent is searched as a 2 ms op whose kernels
    differ by the same factors raised to a power: only the card's own spread matters."""
    params = MctsParams(min_span=1e-12)
    scaled = [None if r is None else r * factor for r in rewards]
    assert grow(Tree(params, seed), rewards) == grow(Tree(params, seed), scaled)


@given(rewards=st.lists(st.floats(-3, 3), min_size=1, max_size=20),
       span=st.floats(0.0, 0.5))
def test_the_reward_scale_spans_eager_and_every_reward(rewards, span):
    scale = RewardScale(min_span=span)
    for r in rewards:
        scale = scale.including(r)
    assert scale.low == min(0.0, *rewards) and scale.high == max(0.0, *rewards)
    values = [scale.value(r) for r in sorted(rewards)]
    assert values == sorted(values)
    assert all(-1e-9 <= v <= 1 + 1e-9 for v in values)
    if scale.high - scale.low >= span and scale.high > scale.low:
        assert scale.value(scale.low) == 0.0 and scale.value(scale.high) == pytest.approx(1.0)
    assert scale.including(rewards[0]) is scale
