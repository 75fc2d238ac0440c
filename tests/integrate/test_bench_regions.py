"""bench/bench_regions.py without a GPU: what a region computes, read from its ops, and its table
from region records (the goals marked where they apply)."""

from __future__ import annotations

from bench import bench_regions


def test_regions_are_named_by_what_they_compute():
    kind = bench_regions.kind_of
    assert kind(["aten._to_copy.default", "aten.pow.Tensor_Scalar", "aten.mean.dim",
                 "aten.add.Tensor", "aten.rsqrt.default", "aten.mul.Tensor"]) == "norm"
    assert kind(["aten.silu.default", "aten.mul.Tensor"]) == "gated"
    assert kind(["aten.slice.Tensor", "aten.neg.default", "aten.cat.default",
                 "aten.mul.Tensor", "aten.add.Tensor"]) == "rotary"
    assert kind(["aten.mul.Tensor", "aten._softmax.default"]) == "softmax"
    assert kind(["aten.add.Tensor", "aten.mul.Tensor"]) == "other"


def region(name: str, kind: str, eager: float, compiled: float, kernel: float | None,
           floor: float | None, searched: bool = True) -> dict:
    return {"card": 1, "region": name, "kind": kind, "share": 0.2, "calls": 8,
            "searched": searched, "eager_us": eager, "compiled_us": compiled,
            "kernel_us": kernel, "floor_fraction": floor}


def test_the_table_marks_the_goals_of_norm_gated_and_rotary_regions():
    text = bench_regions.table([
        {"model": "llama", "regions": [
            region("region(pow,mean,add,rsqrt,mul)", "norm", 30.0, 12.0, 9.0, 0.9),
            region("region(silu,mul)", "gated", 12.0, 5.0, 6.0, 0.5),
            region("region(mul,_softmax)", "softmax", 20.0, 8.0, 10.0, 0.7),
            region("region(add,mul)", "other", 5.0, 3.0, None, None, searched=False)]},
        {"model": "sd35", "error": "RuntimeError: kforge profile failed"}])
    rows = text.splitlines()
    norm = next(r for r in rows if "rsqrt" in r)
    assert "3.33x" in norm and "90%" in norm and norm.endswith("| met |")
    gated = next(r for r in rows if "silu" in r)
    assert gated.endswith("| missed |")  # 2x its eager chain
    softmax = next(r for r in rows if "_softmax" in r)
    assert softmax.endswith("|  |")  # no goal for softmax regions
    assert not any("region(add,mul)" in r for r in rows)  # not searched: no row
    assert any("kforge profile failed" in r for r in rows)
