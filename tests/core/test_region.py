"""Fusion regions from hand-made traces: which chains become regions, and how they read."""

from __future__ import annotations

from kforge.core.region import Region, TraceCall, find_regions


def t(shape=(4, 8), dtype="float32") -> dict:
    stride = [8, 1] if len(shape) == 2 else [1]
    return {"t": "tensor", "shape": list(shape), "stride": stride, "dtype": dtype, "offset": 0}


def call(op, reads, writes, scope="norm#1", fusible=True, view=False, args=None, key=""):
    args = args if args is not None else [t() for _ in reads]
    return TraceCall(f"aten.{op}", args, {}, tuple(reads), tuple(writes), scope, fusible, view,
                     key or op)


def test_a_chain_in_one_module_call_is_one_region():
    trace = [call("mul", [0, 1], [2]), call("add", [2, 1], [3]), call("relu", [3], [4]),
             call("mm", [4, 5], [6], scope="lin#2", fusible=False)]
    (found,) = find_regions(trace)
    region = found.region
    assert region.ops == ["aten.mul", "aten.add", "aten.relu"]
    assert region.outputs == ("n2",)
    assert len(region.inputs) == 2 and found.calls == (0, 1, 2)
    assert region.nodes[1]["args"] == [{"t": "ref", "v": "n0"}, {"t": "ref", "v": "x1"}]
    assert found.input_reads == ((0, 0), (0, 1))
    assert "n1 = aten.add(n0, x1)" in region.source()


def test_an_intermediate_used_outside_the_chain_forms_no_region():
    trace = [call("mul", [0, 1], [2]), call("add", [2, 1], [3]),
             call("mm", [2, 5], [6], scope="lin#2", fusible=False)]
    assert find_regions(trace) == []


def test_module_calls_are_not_joined_and_one_op_is_not_a_region():
    trace = [call("mul", [0, 1], [2], scope="a#1"), call("add", [2, 1], [3], scope="b#2"),
             call("view", [3], [4], scope="b#2", view=True)]
    assert find_regions(trace) == []


def test_a_matmul_between_two_parts_of_a_chain_keeps_it_apart():
    trace = [call("silu", [0], [1]), call("mm", [1, 9], [2], fusible=False),
             call("mul", [1, 2], [3]), call("add", [3, 0], [4])]
    (found,) = find_regions(trace)
    assert found.calls == (2, 3)  # the part after the matmul; the silu alone is no region


def test_a_residual_chain_through_a_norm_in_a_loop_is_one_region_per_step():
    """``h = norm(h + relu(linear(h)))`` four times in one module call: the norm (a module of
    fusible ops alone) joins each step's chain to the next step's, through the matmul that
    reads it; each step's relu and add are still a region of their own."""
    trace, h = [], 0
    for step in range(4):
        base = 10 * (step + 1)
        trace += [call("mm", [h, 99], [base], fusible=False, scope=f"blk#{step}"),
                  call("relu", [base], [base + 1], scope=""),
                  call("add", [h, base + 1], [base + 2], scope=""),
                  call("norm", [base + 2], [base + 3], scope=f"n#{step}")]
        h = base + 3
    found = find_regions(trace)
    assert [r.calls for r in found] == [(1, 2), (5, 6), (9, 10), (13, 14)]
    assert len({r.region.name for r in found}) == 1


def test_the_same_chain_at_two_shapes_is_one_operator_at_two_variants():
    def chain(shape, base):
        return [call("mul", [base, base + 1], [base + 2], scope=f"n#{base}",
                     args=[t(shape), t(shape)]),
                call("exp", [base + 2], [base + 3], scope=f"n#{base}", args=[t(shape)])]

    first, second = find_regions(chain((4, 8), 0) + chain((16,), 10))
    assert first.region.name == second.region.name
    assert first.region.inputs != second.region.inputs


def test_a_region_round_trips_through_its_dict():
    (found,) = find_regions([call("mul", [0, 1], [2]), call("add", [2, 1], [3])])
    again = Region.from_dict(found.region.to_dict())
    assert again == found.region and again.schema().endswith("(Tensor x0, Tensor x1) -> Tensor")
