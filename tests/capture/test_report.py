"""The profile's op table: its last line on the cards it leaves out."""

from __future__ import annotations

from kforge.capture.profiler import Profile
from kforge.capture.report import format_table
from kforge.core.opcard import OpCard


def t(shape: list[int]) -> dict:
    return {"t": "tensor", "shape": shape, "stride": [shape[1], 1], "dtype": "float32",
            "device": "cuda"}


def profile_with_a_region() -> Profile:
    """Op cards of 100% of the time, and a region calling the first two (60% of it)."""
    add = OpCard(op="aten.add.Tensor", args=[t([4, 8]), t([4, 8])], share=0.35)
    softmax = OpCard(op="aten._softmax.default", args=[t([4, 8]), -1, False], share=0.25)
    relu = OpCard(op="aten.relu.default", args=[t([4, 8])], share=0.3)
    mul = OpCard(op="aten.mul.Tensor", args=[t([4, 8]), t([4, 8])], share=0.1)
    region = OpCard(op="kforge_region.r_0123456789ab.default", args=[t([4, 8]), t([4, 8])],
                    share=0.6, region={"nodes": [{"op": "aten.add.Tensor"},
                                                 {"op": "aten._softmax.default"}],
                                       "members": [add.key, softmax.key]})
    return Profile([region, add, softmax, relu, mul], 100.0, {}, "cuda")


def last_line(top: int) -> str:
    return format_table(profile_with_a_region(), top=top).splitlines()[-1]


def test_the_left_out_share_counts_each_ops_time_once():
    # Shown: the region (60%), add (inside it): left out relu and mul, 40% (not 75%).
    assert last_line(2) == "... 3 more op variants (40.0% of the time)"
    # Shown: the region, its two ops and relu: left out mul, 10%.
    assert last_line(4) == "... 1 more op variant (10.0% of the time)"


def test_an_op_card_shown_without_its_region_covers_its_own_time():
    profile = profile_with_a_region()
    profile.cards = [c for c in profile.cards if c.region is None]
    # Shown: add (35%); left out softmax, relu and mul: 65%.
    assert format_table(profile, top=1).splitlines()[-1] == \
        "... 3 more op variants (65.0% of the time)"
