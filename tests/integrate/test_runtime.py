"""The runtime's guard on the CPU: entries run real launch plans on the CPU, with stand-in kernels
(Python functions over the launch's parameters) in place of a cubin. A kernel runs for its exact
variant only; everything else, and any failure, runs the original op with eager's exact result."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kforge.core.argspec import encode_call, freeze, resolve_op
from kforge.core.opcard import canonical_json
from kforge.errors import KforgeError
from kforge.runtime.guard import Patch, active_routes
from kforge.runtime.plan import NULL, PlanRunner, resolve_for
from kforge.runtime.table import Entry, KernelTable
from tests.integrate.standins import PyKernels

CPU = torch.device("cpu")
SOFTMAX = "aten._softmax.default"
MARK = 7.0  # what the stand-in kernels write, so a hit is visible in the output


def spec_of(func, *args, **kwargs) -> tuple[list, dict]:
    return encode_call(func, args, kwargs)


def mark(out: torch.Tensor, *rest) -> None:
    """A stand-in kernel: fills its first parameter with MARK (an op the guard does not serve)."""
    out.fill_(MARK)


def marking_plan(op: str) -> dict:
    """A plan for ``op``: one output shaped like the first argument, which ``mark`` fills."""
    first = resolve_op(op)._schema.arguments[0].name
    return {"outputs": [{"name": "out", "like": first}],
            "launches": [{"kernel": "mark", "grid": [1], "block": [32],
                          "params": [{"ptr": "out"}, {"ptr": first}, {"i64": f"{first}.numel"}]}]}


def plan_entry(op: str, args: list, kwargs: dict, plan: dict, kernels: PyKernels,
               label: str = "") -> Entry:
    """An entry as integration builds one: the plan resolved for the variant, run on the CPU."""
    runner = PlanRunner(resolve_for(plan, op, args, kwargs), op, kernels, CPU)
    return Entry(op, args, kwargs, runner, CPU, label=label)


def marking_entry(op: str, args: list, kwargs: dict, kernels: PyKernels | None = None,
                  label: str = "") -> Entry:
    return plan_entry(op, args, kwargs, marking_plan(op), kernels or PyKernels(mark=mark), label)


def softmax_entry(x: torch.Tensor, dim: int = -1, kernels: PyKernels | None = None) -> Entry:
    args, kwargs = spec_of(torch.ops.aten._softmax.default, x, dim, False)
    return marking_entry(SOFTMAX, args, kwargs, kernels, label="softmax")


def is_marked(t: torch.Tensor) -> bool:
    return bool((t == MARK).all())


# ----- naming a variant -----


def test_freeze_equals_exactly_when_the_canonical_json_does():
    specs = [1, 1.0, True, None, "1", [1, 2], (1, 2), {"a": 1, "b": [1.5]}, {"b": [1.5], "a": 1},
             math.nan, -0.0, 0.0, {"t": "list", "items": [1, 2.0]}]
    for a in specs:
        for b in specs:
            same_json = canonical_json(a) == canonical_json(b)
            assert (freeze(a) == freeze(b)) == same_json, (a, b)
            if same_json:
                assert hash(freeze(a)) == hash(freeze(b))


# ----- exact variants -----


def test_the_kernel_runs_for_its_exact_variant_and_nothing_else():
    x = torch.randn(4, 16)
    kernels = PyKernels(mark=mark)
    table = KernelTable([softmax_entry(x, kernels=kernels)])
    others = {
        "shape": torch.randn(4, 8),
        "dtype": torch.randn(4, 16, dtype=torch.float64),
        "stride": torch.randn(16, 4).t(),
        "offset": torch.randn(5, 16)[1:],
    }
    expected = {what: torch.softmax(y, -1) for what, y in others.items()}
    with torch.no_grad(), Patch(table) as patch:
        assert is_marked(torch.softmax(x, -1))
        assert is_marked(torch.softmax(torch.randn(4, 16), -1))  # same variant, new values
        for what, y in others.items():
            assert torch.equal(torch.softmax(y, -1), expected[what]), what
        assert torch.allclose(torch.softmax(x, 0), torch.exp(x) / torch.exp(x).sum(0)), "dim"
        # the same softmax, but the scalar argument is spelled differently: another variant
        assert not is_marked(torch.softmax(x, 1))
    report = patch.report()
    assert [k.hits for k in report.kernels] == [2]
    assert report.misses == {SOFTMAX: 6}
    # the plan's parameters: the fresh output, the call's own input, a scalar of its declared width
    first = kernels.launches[0]
    assert (first.kernel, first.grid, first.block, first.shared_mem) == ("mark", (1, 1, 1),
                                                                          (32, 1, 1), 0)
    out, given, numel = first.params
    assert out.shape == x.shape and given.data_ptr() == x.data_ptr()
    assert type(numel) is np.int64 and numel == 64


def test_a_keyword_argument_is_part_of_the_variant():
    x = torch.randn(3, 10)
    args, kwargs = spec_of(torch.ops.aten.gelu.default, x, approximate="tanh")
    table = KernelTable([marking_entry("aten.gelu.default", args, kwargs)])
    with torch.no_grad(), Patch(table):
        assert is_marked(F.gelu(x, approximate="tanh"))
        assert torch.equal(F.gelu(x), torch.ops.aten.gelu.default(x.clone()))
        assert not is_marked(F.gelu(x))


def test_scalar_arguments_must_match_in_value_and_type():
    x = torch.randn(3, 5)
    args, kwargs = spec_of(torch.ops.aten.mul.Tensor, x, 2.0)
    table = KernelTable([marking_entry("aten.mul.Tensor", args, kwargs)])
    tripled, doubled = x * 3.0, x * 2
    with torch.no_grad(), Patch(table) as patch:
        assert is_marked(x * 2.0)
        assert torch.equal(x * 3.0, tripled)
        assert torch.equal(x * 2, doubled)  # the int 2 is another variant than 2.0
    assert patch.report().kernels[0].hits == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
@pytest.mark.parametrize("scalar", [2, 2.5, 0.1, True, 1 + 2j])
@pytest.mark.parametrize("zero_dim", [False, True])
def test_missed_calls_with_python_numbers_give_eager_results(dtype, scalar, zero_dim):
    """The original kernel is called with the number as a tensor that promotes the same way."""
    decoy = spec_of(torch.ops.aten.mul.Tensor, torch.randn(9), torch.randn(9))
    table = KernelTable([marking_entry(op, *decoy)
                         for op in ("aten.mul.Tensor", "aten.add.Tensor", "aten.div.Tensor")])
    a = (torch.ones(()) if zero_dim else torch.ones(3)).mul(3).to(dtype)

    def ops(a):
        return [lambda: a * scalar, lambda: scalar * a, lambda: a + scalar, lambda: a / scalar]

    expected = []
    for op in ops(a):
        try:
            expected.append(op())
        except RuntimeError as exc:
            expected.append(type(exc))
    with Patch(table):
        for op, want in zip(ops(a), expected, strict=True):
            if isinstance(want, type):
                with pytest.raises(want):
                    op()
                continue
            got = op()
            assert got.dtype == want.dtype
            assert torch.equal(got.to(torch.complex128) if got.is_complex() else got,
                               want.to(torch.complex128) if want.is_complex() else want)


# ----- failures -----


def test_an_exception_falls_back_disables_the_kernel_and_is_reported():
    x = torch.randn(4, 16)
    tries = []

    def broken(*params):
        tries.append(1)
        raise NotImplementedError("misaligned input")

    args, kwargs = spec_of(torch.ops.aten._softmax.default, x, -1, False)
    table = KernelTable([marking_entry(SOFTMAX, args, kwargs, PyKernels(mark=broken),
                                       label="softmax#1")])
    with torch.no_grad(), Patch(table) as patch:
        with pytest.warns(RuntimeWarning, match="softmax#1 failed"):
            first = torch.softmax(x, -1)
        second = torch.softmax(x, -1)
    expected = torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)
    assert torch.allclose(first, expected) and torch.allclose(second, expected)
    assert len(tries) == 1  # disabled after the first failure
    kernel = patch.report().kernels[0]
    assert (kernel.hits, kernel.fallbacks) == (0, 2)
    assert kernel.disabled == "NotImplementedError: misaligned input"
    assert "off: NotImplementedError: misaligned input" in str(patch.report())


# ----- where calls come from -----


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        return F.softmax(self.norm(self.linear(x)), dim=-1)


def test_composite_ops_reach_the_guard_under_no_grad_inference_mode_and_autograd():
    """F.softmax, F.layer_norm and F.linear are composite: they reach the device as _softmax,
    native_layer_norm and addmm however the model is run."""
    torch.manual_seed(0)
    model, x = Small(), torch.randn(4, 16)
    seen: dict[str, list] = {}

    class Recorder(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.setdefault(str(func), list(encode_call(func, args, kwargs or {})))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Recorder():
        model(x)
    plans = {"aten.addmm.default": ADDMM_PLAN, "aten.native_layer_norm.default": LAYER_NORM_PLAN,
             SOFTMAX: marking_plan(SOFTMAX)}
    kernels = PyKernels(mark=mark, fill=fill_layer_norm, ones=lambda out, *rest: out.fill_(1.0))
    table = KernelTable(plan_entry(op, *seen[op], plan, kernels, label=op)
                        for op, plan in plans.items())
    with Patch(table) as patch:
        with torch.no_grad():
            assert is_marked(model(x))
        with torch.inference_mode():
            assert is_marked(model(x))
        out = model(x)  # grad mode: the kernel sits below autograd, whose graph is eager's
        assert is_marked(out)
    assert [k.hits for k in patch.report().kernels] == [3, 3, 3]


# addmm(self, mat1, mat2): a new [rows, cols] output
ADDMM_PLAN = {"outputs": [{"name": "out", "shape": ["mat1.shape[0]", "mat2.shape[1]"],
                           "dtype": "self.dtype"}],
              "launches": [{"kernel": "ones", "grid": [1], "block": [32],
                            "params": [{"ptr": "out"}, {"ptr": "mat1"}, {"ptr": "mat2"}]}]}
# native_layer_norm(input, normalized_shape, weight, bias, eps) -> (out, mean, rstd)
LAYER_NORM_PLAN = {
    "let": {"cols": "normalized_shape[0]", "rows": "input.numel // cols"},
    "outputs": [{"name": "out", "like": "input"},
                {"name": "mean", "shape": ["rows", 1], "dtype": "float32"},
                {"name": "rstd", "shape": ["rows", 1], "dtype": "float32"}],
    "launches": [{"kernel": "fill", "grid": ["rows"], "block": [32],
                  "params": [{"ptr": "input"}, {"ptr": "weight"}, {"ptr": "bias"}, {"ptr": "out"},
                             {"ptr": "mean"}, {"ptr": "rstd"}, {"i32": "cols"}, {"f32": "eps"},
                             {"bool": "defined(weight)"}]}],
    "returns": "tuple"}


def fill_layer_norm(x, weight, bias, out, mean, rstd, cols, eps, affine) -> None:
    out.fill_(MARK)
    mean.zero_()
    rstd.fill_(1.0)


def test_nothing_is_registered_for_an_empty_table_and_all_is_removed_after():
    with Patch(KernelTable()) as patch:
        assert active_routes() == []
        assert patch.report().hits == 0
    x = torch.randn(2, 8)
    with Patch(KernelTable([softmax_entry(x)])):
        assert active_routes() == [(SOFTMAX, "CPU")]
    assert active_routes() == []
    assert torch.allclose(torch.softmax(x, -1).sum(-1), torch.ones(2))


def test_patches_nest_and_may_end_in_any_order():
    x, y = torch.randn(2, 8), torch.randn(3, 8)
    first, second = Patch(KernelTable([softmax_entry(x)])), Patch(KernelTable([softmax_entry(y)]))
    first.install()
    second.install()
    assert is_marked(torch.softmax(x, -1)) and is_marked(torch.softmax(y, -1))
    first.remove()
    assert not is_marked(torch.softmax(x, -1)) and is_marked(torch.softmax(y, -1))
    second.remove()
    assert active_routes() == [] and not is_marked(torch.softmax(y, -1))


def test_a_patch_in_a_with_block_of_its_own_stays_until_the_outermost_ends():
    x = torch.randn(2, 8)
    patch = Patch(KernelTable([softmax_entry(x)]))
    with patch:
        with patch:
            assert is_marked(torch.softmax(x, -1))
        assert is_marked(torch.softmax(x, -1))  # the inner block's end left it in place
    assert active_routes() == [] and not is_marked(torch.softmax(x, -1))


def test_a_patch_cannot_be_copied_or_pickled_and_stays_sound():
    import copy
    import pickle

    x = torch.randn(2, 8)
    with Patch(KernelTable([softmax_entry(x)])) as patch:
        for attempt in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(KforgeError, match="cannot be copied or pickled"):
                attempt(patch)
        assert is_marked(torch.softmax(x, -1))
    assert active_routes() == []


def test_two_kernels_for_one_variant_are_refused():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="two kernels"):
        KernelTable([softmax_entry(x), softmax_entry(x)])


# ----- launch plans -----


def test_scalars_reach_the_kernel_at_their_declared_widths_and_a_missing_tensor_as_null():
    x = torch.randn(2, 6)
    args, kwargs = spec_of(torch.ops.aten.native_layer_norm.default, x, [6], None, None, 1e-5)
    kernels = PyKernels(fill=fill_layer_norm)
    entry = plan_entry("aten.native_layer_norm.default", args, kwargs, LAYER_NORM_PLAN, kernels)
    with torch.no_grad(), Patch(KernelTable([entry])) as patch:
        out = F.layer_norm(x, [6])
    assert is_marked(out) and patch.report().kernels[0].hits == 1
    launch, = kernels.launches
    assert launch.grid == (2, 1, 1)
    weight, bias, cols, eps, affine = (launch.params[i] for i in (1, 2, 6, 7, 8))
    assert weight is NULL and bias is NULL
    assert type(cols) is np.int32 and cols == 6
    assert type(eps) is np.float32 and eps == np.float32(1e-5)
    assert type(affine) is np.bool_ and not affine


def test_an_in_place_op_returns_its_own_argument_written_by_the_kernel():
    x = torch.randn(3, 4)
    args, kwargs = spec_of(torch.ops.aten.mul_.Tensor, x, 2.0)
    plan = {"outputs": [{"name": "result", "arg": "self"}],
            "launches": [{"kernel": "mark", "grid": [1], "block": [32],
                          "params": [{"ptr": "self"}, {"f32": "other"}]}]}
    entry = plan_entry("aten.mul_.Tensor", args, kwargs, plan, PyKernels(mark=mark))
    with torch.no_grad(), Patch(KernelTable([entry])) as patch:
        result = x.mul_(2.0)
    assert result.data_ptr() == x.data_ptr() and is_marked(x)
    assert patch.report().kernels[0].hits == 1


def test_a_launch_with_a_misaligned_pointer_runs_its_unaligned_kernel():
    plan = marking_plan(SOFTMAX)
    plan["launches"][0].update(align=16, unaligned_kernel="mark_scalar")
    kernels = PyKernels(mark=mark, mark_scalar=mark)
    aligned, shifted = torch.randn(16), torch.randn(17)[1:]  # 4 bytes past an aligned start
    table = KernelTable(plan_entry(SOFTMAX, *spec_of(torch.ops.aten._softmax.default, t, -1,
                                                     False), plan, kernels)
                        for t in (aligned, shifted))
    with torch.no_grad(), Patch(table):
        assert is_marked(torch.softmax(aligned, -1)) and is_marked(torch.softmax(shifted, -1))
    assert [launch.kernel for launch in kernels.launches] == ["mark", "mark_scalar"]


def test_a_transformer_with_every_op_guarded_and_no_kernel_matching_runs_as_eager():
    """Every target op of a small Gemma 4 decode step goes through the guard (a decoy variant
    per op, one storage offset away from a real call) and falls back: bitwise eager output."""
    pytest.importorskip("transformers", reason="the built-in language models need transformers")
    from kforge.capture import ModelOptions, load_model
    from kforge.capture.recorder import CallRecorder, ModuleTracker
    from kforge.integrate.measure import output_tensors

    loaded = load_model("gemma4-tiny", ModelOptions(device="cpu", mode="decode"))
    recorder = CallRecorder(ModuleTracker(loaded.model))
    loaded.prepare()
    with recorder.tracker, recorder:
        expected = output_tensors(loaded.step())
    decoys = {}
    for spec in recorder.specs.values():
        first = spec.args[0] if spec.args else None
        if not spec.view_or_copy and isinstance(first, dict) and "offset" in first:
            decoys.setdefault(spec.op, Entry(spec.op, [{**first, "offset": first["offset"] + 1},
                                                       *spec.args[1:]], spec.kwargs, never, CPU))
    assert {"aten.mul.Tensor", "aten.add.Tensor", "aten.mm.default"} <= set(decoys)
    with Patch(KernelTable(decoys.values())) as patch:
        got = output_tensors(loaded.run())
    assert all(map(torch.equal, expected, got))
    report = patch.report()
    assert report.hits == 0 and sum(report.misses.values()) > 100
    assert not any(k.fallbacks or k.disabled for k in report.kernels)


def never(args: tuple, kwargs: dict) -> None:
    raise AssertionError("a decoy kernel ran")


class PreparingKernels(PyKernels):
    """A backend that packs each launch once (as ``KernelModule.prepare`` does): a call passes
    only the pointers, as integers; the first launch of ``refused`` fails before it runs."""

    def __init__(self, refused: str = "", **kernels) -> None:
        super().__init__(**kernels)
        self.prepared: list[tuple[str, tuple]] = []
        self.calls: list[tuple[str, list[int]]] = []
        self.refused = refused

    def prepare(self, name, grid, block, shared_mem, template):
        self.prepared.append((name, tuple(template)))

        def call(pointers):
            if name == self.refused:
                self.refused = ""
                raise RuntimeError("cuLaunchKernel failed: CUDA_ERROR_INVALID_VALUE")
            self.calls.append((name, list(pointers)))

        return call


def test_prepared_launches_pack_scalars_once_and_pass_pointers_per_call():
    x = torch.randn(2, 6)
    args, kwargs = spec_of(torch.ops.aten.native_layer_norm.default, x, [6], None, None, 1e-5)
    kernels = PreparingKernels(fill=fill_layer_norm)
    plan = resolve_for(LAYER_NORM_PLAN, "aten.native_layer_norm.default", args, kwargs)
    runner = PlanRunner(plan, "aten.native_layer_norm.default", kernels, x.device)
    out, mean, rstd = runner((x, [6], None, None, 1e-5), {})
    (name, template), = kernels.prepared
    assert template[1] is None and template[2] is None  # pointers, filled per call
    assert type(template[6]) is np.int32 and template[6] == 6
    (called, pointers), = kernels.calls
    assert pointers[0] == x.data_ptr() and pointers[1] == 0 and pointers[2] == 0  # null: None
    assert out.data_ptr() in pointers and not kernels.launches  # the generic path stayed idle


def test_a_prepared_launch_that_is_refused_falls_back_to_the_generic_path():
    x = torch.randn(16)
    args, kwargs = spec_of(torch.ops.aten._softmax.default, x, -1, False)
    kernels = PreparingKernels(refused="mark", mark=mark)
    runner = PlanRunner(resolve_for(marking_plan(SOFTMAX), SOFTMAX, args, kwargs), SOFTMAX,
                        kernels, x.device)
    assert is_marked(runner((x, -1, False), {}))  # refused, then launched the generic way
    assert [launch.kernel for launch in kernels.launches] == ["mark"]


def test_a_kernel_s_function_is_taken_in_its_own_gpu_s_context(monkeypatch):
    # A CUkernel's CUfunction belongs to the context current when it is asked for: a module
    # loaded on cuda:1 asked from a caller on cuda:0 must still give cuda:1's function.
    import contextlib
    from types import SimpleNamespace

    from cuda.bindings import driver

    from kforge.runtime.cubin import KernelModule

    current = [0]
    seen = []

    @contextlib.contextmanager
    def device(index):
        before, current[0] = current[0], index
        try:
            yield
        finally:
            current[0] = before

    def get_function(handle):
        seen.append(current[0])
        return driver.CUresult.CUDA_SUCCESS, driver.CUfunction(init_value=1000 + current[0])

    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(driver, "cuKernelGetFunction", get_function)
    module = object.__new__(KernelModule)
    module.device_index = 1
    module._kernels = {"k": SimpleNamespace(handle=driver.CUkernel(init_value=42))}
    module._shared_allowed = {}
    assert module.function_address("k") == 1001
    assert seen == [1] and current == [0]
