"""The native guard on the CPU: built from source, put in front of CPU ops, serving plans whose
launches are none (their outputs are arguments or fresh tensors), so that which calls it serves is
visible without a GPU. A call is served exactly when it matches a variant: dtypes, shapes,
strides, offsets, devices and scalar values, however the call passed them."""

from __future__ import annotations

import pytest
import torch

from kforge.core.argspec import encode_call, resolve_op
from kforge.core.launch_plan import ResolvedOutput, ResolvedPlan, ResolvedScratch
from kforge.runtime import native
from kforge.runtime.guard import Patch, active_routes
from kforge.runtime.table import Entry, KernelTable

CPU = torch.device("cpu")
MUL = "aten.mul.Tensor"


@pytest.fixture(autouse=True)
def _native_guard():
    if (why := native.available()) is not None:
        pytest.skip(f"the native guard cannot be built here: {why}")


class NoLaunches:
    """A backend of no kernels: the plans here launch nothing."""

    def function_address(self, name: str, shared_mem: int = 0) -> int:
        raise AssertionError("no kernel is launched")


class Runner:
    """A plan on the backend; never called from Python while the native guard serves it."""

    def __init__(self, plan: ResolvedPlan) -> None:
        self.plan = plan
        self.backend = NoLaunches()

    def __call__(self, args: tuple, kwargs: dict):
        raise AssertionError("the Python guard ran a kernel the native guard serves")


def returns_self(shape: tuple[int, ...], stride: tuple[int, ...]) -> ResolvedPlan:
    return ResolvedPlan(outputs=(ResolvedOutput("out", "arg", shape, stride, "float32",
                                                arg="self"),),
                        scratch=(), launches=(), returns="single")


def entry(op: str, args: tuple, kwargs: dict, plan: ResolvedPlan, label: str = "") -> Entry:
    args_spec, kwargs_spec = encode_call(resolve_op(op), args, kwargs)
    return Entry(op, args_spec, kwargs_spec, Runner(plan), CPU, label=label)


def test_a_call_is_served_exactly_when_it_matches_the_variant():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    table = KernelTable([entry(MUL, (x, y), {}, returns_self((4, 8), (8, 1)), "mul")])
    with Patch(table) as patch:
        assert torch.mul(x, y) is x  # served: the plan returns its first argument
        assert torch.mul(torch.randn(4, 8), torch.randn(4, 8)).shape == (4, 8)
        served = [torch.mul(a, b) is a for a, b in [
            (x, y),
            (x.double(), y.double()),  # dtype
            (torch.randn(8, 4).t(), y),  # strides
            (torch.randn(4, 9)[:, 1:], y),  # storage offset (and strides)
            (torch.randn(2, 8), torch.randn(2, 8)),  # shape
            (x, y.half()),  # a second argument's dtype
        ]]
        report = patch.report()
    assert served == [True, False, False, False, False, False]
    assert report.kernels[0].hits == 3
    assert report.misses[MUL] == 5
    x2 = torch.randn(4, 8)
    assert torch.equal(torch.mul(x2, y), x2 * y)  # removed: the op's own kernel again
    assert active_routes() == []


def test_python_numbers_match_by_type_and_value():
    x = torch.randn(16)
    plan = returns_self((16,), (1,))
    table = KernelTable([entry(MUL, (x, 0.5), {}, plan), entry(MUL, (x, 2), {}, plan)])
    with Patch(table):
        served = [x * 0.5 is x, x * 2 is x, x * 2.0 is x, x * 0.25 is x, x * True is x]
        assert torch.equal(x * 0.25, x.clone() * 0.25)
    assert served == [True, True, False, False, False]


def test_keyword_positional_and_default_forms_of_one_call_are_one_variant():
    x = torch.randn(3, 5)
    op = "aten.sum.dim_IntList"
    plan = ResolvedPlan(outputs=(ResolvedOutput("out", "new", (3,), (1,), "float32"),),
                        scratch=(), launches=(), returns="single")
    table = KernelTable([entry(op, (x, [1]), {}, plan)])
    calls = {
        "positional": lambda: torch.ops.aten.sum.dim_IntList(x, [1]),
        "keyword": lambda: torch.ops.aten.sum.dim_IntList(x, dim=[1], keepdim=False),
        "default dtype": lambda: torch.ops.aten.sum.dim_IntList(x, [1], False, dtype=None),
    }
    with Patch(table) as patch:
        results = {name: call() for name, call in calls.items()}
        other = torch.ops.aten.sum.dim_IntList(x, [0])
        kept = torch.ops.aten.sum.dim_IntList(x, [1], True)
        report = patch.report()
    assert report.kernels[0].hits == 3
    assert all(r.shape == (3,) and r.stride() == (1,) for r in results.values())
    assert torch.allclose(other, x.sum(0)) and kept.shape == (3, 1)


def test_a_tensor_list_and_a_none_optional_are_compared():
    xs = [torch.randn(2, 3), torch.randn(2, 3)]
    op = "aten.cat.default"
    plan = ResolvedPlan(outputs=(ResolvedOutput("out", "new", (4, 3), (3, 1), "float32"),),
                        scratch=(ResolvedScratch("s", 64, True),), launches=(),
                        returns="single")
    table = KernelTable([entry(op, (xs, 0), {}, plan)])
    with Patch(table) as patch:
        torch.cat(xs, 0)
        torch.cat([xs[0], xs[1], xs[0]], 0)
        torch.cat(xs, 1)
        report = patch.report()
    assert report.kernels[0].hits == 1 and report.misses[op] == 2


class PythonRunner(Runner):
    """A plan the Python guard runs: it records its calls and returns the first argument."""

    def __init__(self, plan: ResolvedPlan) -> None:
        super().__init__(plan)
        self.calls = 0

    def __call__(self, args: tuple, kwargs: dict):
        self.calls += 1
        return args[0]


def test_an_argument_it_cannot_compare_leaves_the_op_to_the_python_guard():
    x = torch.randn(6)
    op = "aten.div.Tensor_mode"  # rounding_mode is a string: not something it compares
    runner = PythonRunner(returns_self((6,), (1,)))
    args_spec, kwargs_spec = encode_call(resolve_op(op), (x, x), {"rounding_mode": "floor"})
    table = KernelTable([Entry(op, args_spec, kwargs_spec, runner, CPU)])
    with Patch(table):
        assert torch.div(x, x, rounding_mode="floor") is x
    assert runner.calls == 1 and table.entries[0].native is None


def test_counts_reset_and_two_patches_share_one_op():
    x, y = torch.randn(5), torch.randn(5)
    first = KernelTable([entry(MUL, (x, y), {}, returns_self((5,), (1,)), "first")])
    z = torch.randn(7)
    second = KernelTable([entry(MUL, (z, z), {}, returns_self((7,), (1,)), "second")])
    with Patch(first) as a, Patch(second) as b:
        assert torch.mul(x, y) is x and torch.mul(z, z) is z
        assert a.report().kernels[0].hits == 1 and b.report().kernels[0].hits == 1
        first.reset_counts()
        assert a.report().kernels[0].hits == 0
    with Patch(second):  # the first table gone: its variant no longer serves
        assert torch.mul(x, y) is not x and torch.mul(z, z) is z


def test_a_malformed_description_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="ends early"):
        native.NativeVariant([0, -1, 3], "broken")


def test_a_route_keeps_its_kernels_loaded_after_the_table_is_dropped():
    import gc
    import weakref

    x, y = torch.randn(3), torch.randn(3)
    patch = Patch(KernelTable([entry(MUL, (x, y), {}, returns_self((3,), (1,)))]))
    runner = weakref.ref(patch.table.entries[0].runner)
    patch.install()
    del patch  # never removed: the route stays in front of the op
    gc.collect()
    assert runner() is not None and torch.mul(x, y) is x
    for slot in list(active_routes()):
        from kforge.runtime.guard import _routes

        _routes.pop(slot).close()
