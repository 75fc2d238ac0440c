"""Amdahl-aware budgeting, reward arithmetic and op-card identity."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kforge.core import budget
from kforge.core.argspec import is_contiguous
from kforge.core.budget import OpBudget
from kforge.core.describe import describe_args
from kforge.core.opcard import OpCard, rank_cards, variant_key
from kforge.core.reward import reward_from_speedup, significant_win, speedup_from_reward
from tests.doubles import tensor


def test_allocation_follows_share_and_keeps_a_minimum():
    ops = [OpBudget(1, share=0.6), OpBudget(2, share=0.3), OpBudget(3, share=0.01)]
    plan = budget.allocate(ops, total=60, min_each=2)
    assert sum(plan.values()) == 60
    assert plan[1] > plan[2] > plan[3] >= 2


def test_op_near_its_floor_yields_to_one_with_headroom():
    near = OpBudget(1, share=0.5, best_speedup=3.5, ceiling=4.0)
    open_ = OpBudget(2, share=0.2, best_speedup=1.0, ceiling=4.0)
    plan = budget.allocate([near, open_], total=40)
    assert plan[2] > plan[1]


def test_vendor_ops_get_less_than_native_ops_of_equal_share():
    plan = budget.allocate([OpBudget(1, share=0.3, vendor=True), OpBudget(2, share=0.3)], 40)
    assert plan[2] > plan[1]


@given(st.lists(st.floats(0, 1), min_size=1, max_size=12), st.integers(0, 500))
def test_allocation_always_sums_to_total(shares, total):
    ops = [OpBudget(i, share=s) for i, s in enumerate(shares)]
    plan = budget.allocate(ops, total)
    assert sum(plan.values()) == total
    assert all(v >= 0 for v in plan.values())


def test_pick_next_spreads_iterations_over_a_whole_run():
    ops = {1: OpBudget(1, share=0.6), 2: OpBudget(2, share=0.3), 3: OpBudget(3, share=0.1)}
    counts = {1: 0, 2: 0, 3: 0}
    for _ in range(30):
        pick = budget.pick_next(list(ops.values()), total=30)
        assert pick is not None
        counts[pick] += 1
        o = ops[pick]
        ops[pick] = OpBudget(o.card_id, o.share, spent=o.spent + 1)
    assert budget.pick_next(list(ops.values()), total=30) is None
    assert counts[1] > counts[2] > counts[3] > 0


def test_stop_reasons():
    assert budget.stop_reason(OpBudget(1, 0.5, spent=10), limit=10, patience=5) == "budget spent"
    assert "no gain" in budget.stop_reason(OpBudget(1, 0.5, since_best=5), 10, 5)
    floor = OpBudget(1, 0.5, best_speedup=1.9, ceiling=2.0)
    assert budget.stop_reason(floor, 10, 5) == "at its physical floor"
    assert budget.stop_reason(OpBudget(1, 0.5), 10, 5) is None


def test_reward_is_scale_free():
    # a 2x win on a 3 us op and on a 3 ms op earn the same reward
    assert reward_from_speedup(3.0 / 1.5) == pytest.approx(reward_from_speedup(3000.0 / 1500.0))
    assert speedup_from_reward(reward_from_speedup(1.7)) == pytest.approx(1.7)
    assert reward_from_speedup(1.0) == 0.0
    with pytest.raises(ValueError):
        reward_from_speedup(0.0)


def test_a_win_must_exceed_the_timing_spread():
    assert significant_win(1.10, spread=0.05)
    assert not significant_win(1.04, spread=0.05)


def test_variant_key_tells_apart_shape_dtype_stride_and_scalars():
    base = OpCard(op="aten._softmax.default", args=[tensor([8, 64]), -1, False])
    same = OpCard(op="aten._softmax.default", args=[tensor([8, 64]), -1, False], calls=9)
    assert base.key == same.key
    variants = [
        OpCard(op="aten._softmax.default", args=[tensor([8, 65]), -1, False]),
        OpCard(op="aten._softmax.default", args=[tensor([8, 64], "bfloat16"), -1, False]),
        OpCard(op="aten._softmax.default", args=[tensor([8, 64]), 0, False]),
        OpCard(op="aten._softmax.default", args=[{**tensor([8, 64]), "stride": [1, 8]}, -1, False]),
        OpCard(op="aten._log_softmax.default", args=[tensor([8, 64]), -1, False]),
    ]
    assert len({base.key, *(v.key for v in variants)}) == 6
    assert variant_key("a", [1], {"x": 1}) != variant_key("a", [1], {"x": 2})


def test_card_descriptions_and_ranking():
    card = OpCard(op="aten.add.Tensor", args=[tensor([2, 3], "bfloat16"),
                                               {**tensor([3, 2]), "stride": [1, 3]}],
                  kwargs={"alpha": 1})
    assert card.short_op == "add"
    assert describe_args(card.args, card.kwargs) == "bf16[2,3], f16[3,2]*, alpha=1"
    assert card.io_bytes == 2 * 6 + 2 * 6
    assert is_contiguous([4, 1, 3], [3, 99, 1])
    assert not is_contiguous([3, 2], [1, 3])
    view = OpCard(op="aten.view.default", args=[], share=0.9, target=False)
    big, small = OpCard(op="a", args=[], share=0.5), OpCard(op="b", args=[], share=0.1)
    assert rank_cards([small, view, big]) == [big, small, view]
    assert OpCard.from_dict(card.to_dict()) == card
    assert math.isclose(card.with_(share=0.25).share, 0.25)
