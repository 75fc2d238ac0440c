"""The pure schedule of a search: per-card state, the best result, stop rules, budgets, the pick
of the next card and the progress lines."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kforge.core.mcts import Tree
from kforge.core.opcard import OpCard
from kforge.core.reward import reward_from_speedup
from kforge.core.schedule import (
    Best,
    CardProgress,
    CardSearch,
    NodeResult,
    Phase,
    Schedule,
    derived_seed,
    failure_line,
    searched_cards,
)
from kforge.core.settings import SearchSettings

NODE_IDS = itertools.count(1)


def card(share: float, op: str = "aten.add.Tensor", target: bool = True, **times) -> OpCard:
    return OpCard(op=op, args=[], share=share, target=target, **times)


def search(card_id: int, share: float = 0.5, **fields) -> CardSearch:
    return CardSearch(card_id=card_id, card=card(share, op=f"aten.op{card_id}.default"),
                      tree=Tree(), **fields)


def schedule(*cards: CardSearch, **settings) -> Schedule:
    return Schedule(SearchSettings(**settings), cards, {c.card_id for c in cards})


def start(c: CardSearch) -> int:
    """Put one new node of ``c`` in flight, as the engine does; its id."""
    node_id = next(NODE_IDS)
    decision = c.tree.select()
    c.tree.add(node_id, decision.parent, decision.action)
    return node_id


def run(c: CardSearch, speedup: float | None) -> NodeResult:
    result = NodeResult(start(c), speedup=speedup, failure="" if speedup else "x: failed: no")
    finish(c, result)
    return result


def finish(c: CardSearch, result: NodeResult) -> None:
    """Finish ``result`` with the count and best a store derives, one result at a time."""
    c.finish(result, c.spent + 1, c.best.after(result.node_id, result.speedup))


# ----- one card -----


def test_the_best_moves_only_on_a_strictly_faster_kernel():
    best = Best().after(1, None)
    assert best == Best()
    best = best.after(2, 1.5).after(3, 1.2).after(4, None).after(5, 1.5)
    assert best == Best(2, 1.5)
    assert best.after(6, 1.6) == Best(6, 1.6)


def test_finishing_a_node_counts_it_and_backs_its_reward_up():
    c = search(1)
    node = start(c)
    result = NodeResult(node, speedup=2.0)
    assert result.reward == pytest.approx(reward_from_speedup(2.0))
    assert (c.spent, c.best, c.committed) == (0, Best(), 1)
    c.finish(result, 1, Best(node, 2.0))
    assert (c.spent, c.best, c.committed, c.tree.completed) == (1, Best(node, 2.0), 1, 1)
    assert c.failed == []


def test_a_failure_is_listed_for_the_proposer_and_keeps_the_best():
    c = search(1, best=Best(7, 1.3))
    node = start(c)
    finish(c, NodeResult(node, repairable=True, failure=failure_line(
        {"approach": "tiled"}, "mismatch", "max error 3.0")))
    assert c.best == Best(7, 1.3)
    assert c.failed == ["tiled: mismatch: max error 3.0"]
    assert failure_line({}, "crash", "x" * 500) == ("?: crash: " + "x" * 500)[:200]


@given(st.lists(st.none() | st.floats(0.01, 100), max_size=30))
def test_the_best_is_the_fastest_correct_kernel_whatever_the_order(speedups):
    c = search(1)
    results = [run(c, s) for s in speedups]
    correct = [r for r in results if r.speedup is not None]
    assert c.spent == len(speedups)
    assert c.best.speedup == max((r.speedup for r in correct), default=None)
    if correct:  # the first of the fastest
        assert c.best.node == next(r.node_id for r in correct if r.speedup == c.best.speedup)
    assert len(c.failed) == len(speedups) - len(correct)


def test_the_op_budget_uses_the_cards_times_and_what_is_in_flight():
    c = CardSearch(3, card(0.4, eager_us=100.0, floor_us=25.0), Tree(), spent=2,
                   best=Best(1, 1.5))
    start(c)
    op = c.op_budget()
    assert (op.card_id, op.share, op.ceiling, op.best_speedup, op.spent) == (3, 0.4, 4.0, 1.5, 3)
    assert search(4, best=Best(1, 0.5)).op_budget().best_speedup == 1.0  # never below parity


# ----- stop rules -----


def test_patience_ends_a_card_once_with_its_reason():
    c = search(1)
    s = schedule(c, patience=3, iterations_per_op=50)
    run(c, 0.9)  # the first correct kernel is a gain over nothing
    for _ in range(2):
        run(c, 0.9)
        assert s.conclude(c) is None
    run(c, 0.9)
    assert s.conclude(c) == "no gain in 3 iterations"
    assert c.done and s.conclude(c) is None


def test_the_per_op_limit_ends_a_card():
    c = search(1)
    s = schedule(c, iterations_per_op=2, max_op_factor=1.5, patience=100)  # limit: 3
    speed = 1.0
    for _ in range(3):
        assert s.conclude(c) is None
        speed *= 2
        run(c, speed)
    assert s.conclude(c) == "budget spent"


def test_a_card_at_its_physical_floor_ends():
    c = CardSearch(1, card(0.5, eager_us=100.0, floor_us=50.0), Tree())
    s = schedule(c, patience=100)
    run(c, 1.95)  # 0.9 x the ceiling of 2.0
    assert s.conclude(c) == "at its physical floor"


def test_conclude_all_reports_each_ended_card():
    ended, going = search(1), search(2)
    s = schedule(ended, going, patience=1)
    run(ended, 0.5)
    run(ended, 0.5)
    assert s.conclude_all() == [(ended, "no gain in 1 iterations")]
    assert s.conclude_all() == []


# ----- the session's budgets -----


def test_the_iteration_budget_counts_work_in_flight():
    a, b = search(1), search(2)
    s = schedule(a, b, iterations_per_op=1)
    assert s.total_iterations == 2 and s.exhausted(0.0, 0.0) is None
    run(a, 1.1)
    start(b)
    assert s.exhausted(0.0, 0.0) == "iteration budget spent"
    assert (s.iterations(), s.in_flight()) == (1, 1)


def test_money_and_time_budgets():
    s = schedule(search(1), usd=2.0, wall_s=600)
    assert s.exhausted(1.99, 599.0) is None
    assert s.exhausted(2.0, 0.0) == "USD budget of $2.00 spent"
    assert s.exhausted(0.0, 600.0) == "time budget of 600 s spent"
    assert schedule(search(1)).exhausted(1e9, 1e9) is None  # no money or time limit set


# ----- which card next -----


def test_the_next_card_follows_the_shares_and_skips_done_cards():
    big, small = search(1, share=0.9), search(2, share=0.1)
    s = schedule(big, small)
    assert s.next_card() is big
    big.done = True
    assert s.next_card() is small
    small.done = True
    assert s.next_card() is None


def test_a_focus_restricts_the_pick_and_an_unknown_focus_is_dropped():
    big, small = search(1, share=0.9), search(2, share=0.1)
    s = schedule(big, small, focus=2)
    assert s.focus == 2 and s.next_card() is small
    s.focus = None
    assert s.next_card() is big
    assert schedule(big, small, focus=99).focus is None


def test_only_target_ops_are_searched_the_largest_first():
    cards = [(1, card(0.1)), (2, card(0.5)), (3, card(0.3)), (4, card(0.9, target=False))]
    assert searched_cards(cards, None) == {1, 2, 3}
    assert searched_cards(cards, 2) == {2, 3}


def test_cards_outside_the_search_are_done_from_the_start():
    a, b = search(1), search(2)
    s = Schedule(SearchSettings(), [a, b], searched={1})
    assert not a.done and b.done
    assert s.total_iterations == SearchSettings().iterations_per_op


def test_seeds_differ_by_card_and_by_search_seed():
    seeds = {derived_seed(seed, salt) for seed in range(3) for salt in range(1, 100)}
    assert len(seeds) == 3 * 99


# ----- progress -----


def test_progress_lists_the_searched_cards_by_share_with_their_phase():
    pending, searching, done = search(1, share=0.1), search(2, share=0.5), search(3, share=0.3)
    outside = search(4, share=0.9)
    s = Schedule(SearchSettings(), [pending, searching, done, outside], searched={1, 2, 3})
    start(searching)
    result = run(done, 1.5)
    done.done = True
    assert s.progress() == [
        CardProgress(2, "op2", "", 0, None, Phase.SEARCHING),
        CardProgress(3, "op3", "", 1, 1.5, Phase.DONE),
        CardProgress(1, "op1", "", 0, None, Phase.PENDING),
    ]
    assert done.best.node == result.node_id
