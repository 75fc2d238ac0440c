"""Which cards get their kernel, and the reasons the others stay on eager (pure decisions)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus, Timing
from kforge.core.opcard import OpCard
from kforge.core.outcome import HostCost
from kforge.integrate.winners import (
    CardChoice,
    best_nodes,
    card_label,
    combined_spread,
    decide,
    projected_speedup,
    worth_routing,
)
from kforge.store.records import CardRow, NodeDetail, NodeRow

SOFTMAX = OpCard("aten._softmax.default",
                 [{"t": "tensor", "shape": [8, 1024], "stride": [1024, 1], "dtype": "float16",
                   "offset": 0}, -1, False], share=0.2, id=3)
VIEW = OpCard("aten.view.default", [{"t": "tensor", "shape": [8, 1024], "stride": [1024, 1],
                                     "dtype": "float16", "offset": 0}, [8192]],
              library="view", target=False, id=4)
CODE = Candidate(source="extern \"C\" __global__ void k() {}",
                 plan={"outputs": [{"name": "out", "like": "self"}],
                       "launches": [{"kernel": "k", "grid": [1], "block": [1]}]})


def timing(us: float, spread: float) -> Timing:
    return Timing(us, us * (1 - spread / 2), us * (1 + spread / 2), 50)


def row(card: OpCard = SOFTMAX, spent: int = 5) -> CardRow:
    return CardRow(card=card, status="done", stop_reason="", spent=spent, best_node=None,
                   best_speedup=None, modules=["model.attn"], baseline=None)


def node(node_id: int = 10, card_id: int = 3, parent: int | None = None, status: str = "ok",
         speedup: float | None = 1.5, pruned: bool = False, confirmed: bool = True) -> NodeRow:
    return NodeRow(id=node_id, session_id=1, card_id=card_id, parent_id=parent, action="new",
                   status=status, meta={}, reward=None, speedup=speedup, median_us=None,
                   repairable=False, pruned=pruned, summary="", usd=0.0, created_at=0.0,
                   finished_at=1.0, confirmed=confirmed)


def detail(speedup: float, spread: float = 0.02, status: EvalStatus = EvalStatus.OK,
           candidate: Candidate | None = CODE, host: HostCost | None = None) -> NodeDetail:
    outcome = EvalOutcome(status, timing=timing(100 / speedup, spread), eager=timing(100, spread),
                          speedup=speedup if status is EvalStatus.OK else None, host=host)
    return NodeDetail(row=node(speedup=speedup), candidate=candidate, outcome=outcome)


def test_a_verified_significant_win_replaces_eager_with_its_code():
    d = decide(row(), detail(1.5), made_on="sm_90", runs_on="sm_90")
    assert d.replaced and d.candidate is CODE and d.node_id == 10 and d.speedup == 1.5
    assert d.reason == "1.50x faster than eager (noise ±3%)"
    assert d.modules == ["model.attn"]


@pytest.mark.parametrize(("card_row", "best", "runs_on", "made_on", "reason"), [
    (row(VIEW), None, None, "sm_90", "not a target (view/copy)"),
    (row(spent=0), None, None, "sm_90", "not searched yet"),
    (row(), None, None, "sm_90", "no verified kernel"),
    (row(), detail(2.0, status=EvalStatus.MISMATCH), None, "sm_90", "no verified kernel"),
    (row(), detail(2.0, candidate=None), None, "sm_90", "no verified kernel"),
    (row(), detail(0.8), None, "sm_90", "slower than eager (0.80x)"),
    (row(), detail(1.03, spread=0.03), None, "sm_90", "1.03x is inside the timing noise (±4%)"),
    (row(), detail(1.5), "sm_121", "sm_90", "made for sm_90, this GPU is sm_121"),
    (row(), detail(1.5), None, "none", "made without a GPU"),
])
def test_the_reasons_a_card_stays_on_eager(card_row, best, runs_on, made_on, reason):
    d = decide(card_row, best, made_on=made_on, runs_on=runs_on)
    assert not d.replaced and d.candidate is None
    assert d.reason == reason


def test_noise_is_the_spread_of_both_timings_combined():
    assert combined_spread(timing(50, 0.03), timing(100, 0.04)) == pytest.approx(0.05)
    assert combined_spread(None, timing(100, 0.04)) == math.inf
    # 1.04x with 3% on each side is inside sqrt(2) * 3% = 4.2%; with 2% on each side it is out
    assert not decide(row(), detail(1.04, 0.03), made_on="sm_90").replaced
    assert decide(row(), detail(1.04, 0.02), made_on="sm_90").replaced


def test_best_nodes_skips_failures_and_pruned_subtrees():
    nodes = [node(1, speedup=1.2), node(2, parent=1, speedup=3.0, pruned=True),
             node(3, parent=2, speedup=4.0), node(4, speedup=None, status="mismatch"),
             node(5, parent=1, speedup=1.6), node(6, card_id=7, speedup=0.9)]
    best = best_nodes(nodes)
    assert best[3].id == 5  # 2 is pruned, and 3 lies below it
    assert best[7].id == 6


def test_a_kernel_not_confirmed_is_never_a_best_node():
    nodes = [node(1, speedup=1.2), node(2, speedup=3.0, confirmed=False),
             node(3, speedup=4.0, status="confirming", confirmed=False)]
    assert best_nodes(nodes)[3].id == 1


def test_projected_speedup_is_amdahl_over_the_replaced_cards():
    replaced = decide(row(), detail(2.0), made_on="sm_90")  # share 0.2 at 2x
    other = decide(row(OpCard(**{**SOFTMAX.to_dict(), "key": "", "share": 0.3, "id": 9})),
                   detail(4.0), made_on="sm_90")  # share 0.3 at 4x
    kept = decide(row(), detail(0.5), made_on="sm_90")
    assert projected_speedup([replaced, other, kept]) == pytest.approx(
        1 / (1 - 0.2 * 0.5 - 0.3 * 0.75))
    assert projected_speedup([kept]) == 1.0


def test_a_region_and_its_ops_count_the_larger_saving_once():
    def card(key: str, share: float, members: list[str] | None = None) -> OpCard:
        region = None if members is None else {"nodes": [], "inputs": [], "outputs": [],
                                                 "members": members}
        return OpCard(op="aten.mul.Tensor", args=[], share=share, key=key, region=region)

    a, b = card("a", 0.2), card("b", 0.2)
    region = card("r", 0.4, ["a", "b"])

    def won(c: OpCard, speedup: float) -> CardChoice:
        return CardChoice(c, True, "faster", speedup=speedup)

    ops_only = 1 / (1 - 0.2 * 0.5 - 0.2 * 0.5)
    assert projected_speedup([won(a, 2.0), won(b, 2.0)]) == pytest.approx(ops_only)
    fused = 1 / (1 - 0.4 * 0.75)  # the region at 4x saves more than its ops at 2x
    assert projected_speedup([won(a, 2.0), won(b, 2.0), won(region, 4.0)]) == pytest.approx(fused)
    assert projected_speedup([won(a, 2.0), won(b, 2.0), won(region, 1.5)]) == pytest.approx(
        ops_only)


def test_card_labels_are_short():
    assert card_label(SOFTMAX) == "#3 _softmax(f16[8,1024], -1, False)"
    long = OpCard("aten.cat.default", [{"t": "list", "items": [SOFTMAX.args[0]] * 6}, 0], id=1)
    assert len(card_label(long)) == 60 and card_label(long).endswith("...)")


def test_outside_cuda_graphs_an_op_keeps_its_kernels_only_when_they_pay_for_the_guard():
    def winner(card: OpCard, speedup: float) -> CardChoice:
        return decide(row(card), detail(speedup), made_on="sm_90", runs_on="sm_90")

    # softmax: 12 calls of 200 us each at 2x saves 1200 us, far more than 12 calls cost
    big = winner(SOFTMAX.with_(calls=12, eager_us=200.0), 2.0)
    # mean: one 3 us variant at 1.5x saves 1 us a call, but 176 calls of mean pass the guard
    small_card = OpCard("aten.mean.dim", [{"t": "tensor", "shape": [1, 1, 1536],
                                           "stride": [1536, 1536, 1], "dtype": "float32",
                                           "offset": 0}, [-1], True], calls=120, eager_us=3.0,
                        id=7)
    other_mean = OpCard("aten.mean.dim", [{"t": "tensor", "shape": [1, 8, 256],
                                           "stride": [2048, 256, 1], "dtype": "float32",
                                           "offset": 0}, [-1], True], calls=56, eager_us=2.0,
                        id=8)
    small = winner(small_card, 1.5)
    kept = decide(row(other_mean), None, made_on="sm_90", runs_on="sm_90")
    decisions = worth_routing([big, small, kept], miss_us=10.0, call_us=15.0)
    assert decisions[0].replaced
    assert not decisions[1].replaced
    assert "routing mean through the guard costs about 2360 us" in decisions[1].reason
    assert "save (120 us)" in decisions[1].reason
    assert decisions[2] == kept
    assert projected_speedup(decisions) == pytest.approx(projected_speedup([big]))


MEAN = OpCard("aten.mean.dim", [{"t": "tensor", "shape": [1, 1, 1536], "stride": [1536, 1536, 1],
                                 "dtype": "float32", "offset": 0}, [-1], True],
              calls=100, eager_us=4.0, id=7)


def host_costs(host_us: float, eager_host_us: float) -> HostCost:
    return HostCost(host_us, eager_host_us)


def test_the_measured_host_cost_of_the_launch_path_is_carried_into_the_decision():
    measured = decide(row(MEAN), detail(2.0, host=host_costs(9.5, 7.0)), made_on="sm_90")
    assert measured.host_extra_us == pytest.approx(2.5)
    assert decide(row(MEAN), detail(2.0), made_on="sm_90").host_extra_us is None
    stored = {**detail(2.0).outcome.to_dict(), "extra": {"host_us": "fast", "eager_host_us": 7.0}}
    broken = replace(detail(2.0), outcome=EvalOutcome.from_dict(stored))
    assert decide(row(MEAN), broken, made_on="sm_90").host_extra_us is None


@pytest.mark.parametrize(("host", "replaced", "cost"), [
    # 100 calls at 4 us and 2x save 200 us; the guard alone costs 100 x 1 us
    (host_costs(6.0, 7.0), True, None),     # a launch path cheaper than eager's adds nothing
    (host_costs(7.5, 7.0), True, None),     # 100 + 100 x 0.5 = 150 us < 200 us
    (host_costs(8.5, 7.0), False, 250),     # 100 + 100 x 1.5 = 250 us > 200 us
    (None, False, 300),                       # recorded before: the estimate, 100 + 100 x 2
])
def test_routing_weighs_the_measured_launch_path_against_eagers_own_call(host, replaced, cost):
    winner = decide(row(MEAN), detail(2.0, host=host), made_on="sm_90")
    assert winner.replaced
    decision, = worth_routing([winner], miss_us=1.0, call_us=3.0)
    assert decision.replaced is replaced
    if not replaced:
        assert decision.reason == (f"2.00x, but routing mean through the guard costs about {cost} "
                                   "us per forward outside CUDA graphs, more than its kernels "
                                   "save (200 us)")


def test_each_kernel_of_an_op_is_charged_its_own_launch_path():
    cheap = decide(row(MEAN), detail(2.0, host=host_costs(7.0, 7.0)), made_on="sm_90")
    wide = {**MEAN.args[0], "shape": [1, 2, 768], "stride": [1536, 768, 1]}
    other = OpCard(**{**MEAN.to_dict(), "key": "", "args": [wide, [-1], True], "id": 8})
    dear = decide(row(other), detail(2.0, host=host_costs(17.0, 7.0)), made_on="sm_90")
    assert worth_routing([cheap], miss_us=1.0, call_us=3.0)[0].replaced
    # together, per op: saved 2 x 200 us = 400; cost 200 calls x 1 us + 100 x 0 + 100 x 10 = 1200
    decisions = worth_routing([cheap, dear], miss_us=1.0, call_us=3.0)
    assert [d.replaced for d in decisions] == [False, False]
    assert "costs about 1200 us" in decisions[0].reason and "save (400 us)" in decisions[0].reason
