"""The runtime's guard on the CPU: entries whose device is the CPU and whose "kernel" is a Python
function stand in for cubins. A kernel runs for its exact variant only; everything else, and any
failure, runs the original op with eager's exact result."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from kforge.core.argspec import encode_call, freeze
from kforge.core.opcard import canonical_json
from kforge.runtime.guard import Patch, active_routes
from kforge.runtime.table import Entry, KernelTable, load_launcher

CPU = torch.device("cpu")
SOFTMAX = "aten._softmax.default"
MARK = 7.0  # what the stand-in kernels write, so a hit is visible in the output


def spec_of(func, *args, **kwargs) -> tuple[list, dict]:
    return encode_call(func, args, kwargs)


def marking_kernel(calls: list | None = None):
    """A stand-in kernel: fills the output with MARK (through ops the guard does not serve)."""
    def launch(kernels, x, *rest, **kwargs):
        if calls is not None:
            calls.append((rest, kwargs))
        return torch.full_like(x, MARK)

    return launch


def softmax_entry(x: torch.Tensor, dim: int = -1, calls: list | None = None) -> Entry:
    args, kwargs = spec_of(torch.ops.aten._softmax.default, x, dim, False)
    return Entry(SOFTMAX, args, kwargs, marking_kernel(calls), None, CPU, label="softmax")


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
    calls: list = []
    table = KernelTable([softmax_entry(x, calls=calls)])
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
    assert calls[0] == ((-1, False), {})


def test_a_keyword_argument_is_part_of_the_variant():
    x = torch.randn(3, 10)
    args, kwargs = spec_of(torch.ops.aten.gelu.default, x, approximate="tanh")
    table = KernelTable([Entry("aten.gelu.default", args, kwargs, marking_kernel(), None, CPU)])
    with torch.no_grad(), Patch(table):
        assert is_marked(F.gelu(x, approximate="tanh"))
        assert torch.equal(F.gelu(x), torch.ops.aten.gelu.default(x.clone()))
        assert not is_marked(F.gelu(x))


def test_scalar_arguments_must_match_in_value_and_type():
    x = torch.randn(3, 5)
    args, kwargs = spec_of(torch.ops.aten.mul.Tensor, x, 2.0)
    table = KernelTable([Entry("aten.mul.Tensor", args, kwargs, marking_kernel(), None, CPU)])
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
    table = KernelTable([Entry(op, *decoy, marking_kernel(), None, CPU)
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

    def broken(kernels, x, dim, half):
        tries.append(1)
        raise NotImplementedError("misaligned input")

    args, kwargs = spec_of(torch.ops.aten._softmax.default, x, -1, False)
    table = KernelTable([Entry(SOFTMAX, args, kwargs, broken, None, CPU, label="softmax#1")])
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
    ops = ("aten.addmm.default", "aten.native_layer_norm.default", SOFTMAX)
    entries = {op: Entry(op, *seen[op], marking_kernel() if op == SOFTMAX else _passthrough(op),
                         None, CPU, label=op) for op in ops}
    table = KernelTable(entries.values())
    with Patch(table) as patch:
        with torch.no_grad():
            assert is_marked(model(x))
        with torch.inference_mode():
            assert is_marked(model(x))
        out = model(x)  # grad mode: the kernel sits below autograd, whose graph is eager's
        assert is_marked(out)
    assert [k.hits for k in patch.report().kernels] == [3, 3, 3]


def _passthrough(op: str):
    """A stand-in kernel returning outputs of the op's shapes (made without any guarded op)."""
    if op == "aten.addmm.default":
        return lambda kernels, bias, a, b, **kw: torch.ones(a.shape[0], b.shape[1])
    return lambda kernels, x, shape, w, b, eps: (torch.ones_like(x), torch.zeros(x.shape[0], 1),
                                                 torch.ones(x.shape[0], 1))


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


def test_two_kernels_for_one_variant_are_refused():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="two kernels"):
        KernelTable([softmax_entry(x), softmax_entry(x)])


# ----- launchers -----


def test_launchers_get_tuples_and_torch_np_math_in_scope():
    launch = load_launcher(
        "def launch(kernels, x, shape, w, b, eps):\n"
        "    assert isinstance(shape, tuple) and np.float32(eps) > 0 and math.pi > 3\n"
        "    return torch.full_like(x, 7.0), torch.empty(0), torch.empty(0)\n")
    x = torch.randn(2, 6)
    args, kwargs = spec_of(torch.ops.aten.native_layer_norm.default, x, [6], None, None, 1e-5)
    entry = Entry("aten.native_layer_norm.default", args, kwargs, launch, None, CPU)
    with torch.no_grad(), Patch(KernelTable([entry])) as patch:
        out = F.layer_norm(x, [6])
    assert is_marked(out) and patch.report().kernels[0].hits == 1


def test_a_launcher_keeping_module_state_runs_fresh_each_call_like_when_verified():
    stateless = load_launcher("N = 3\ndef launch(kernels, x):\n    return x\n")
    stateful = load_launcher("SEEN = []\ndef launch(kernels, x):\n    SEEN.append(x)\n"
                             "    return len(SEEN)\n")
    defaults = load_launcher("def launch(kernels, x, cache={}):\n    cache[len(cache)] = x\n"
                             "    return len(cache)\n")
    assert stateless(None, 5) == 5
    assert [stateful(None, 1), stateful(None, 2)] == [1, 1]
    assert [defaults(None, 1), defaults(None, 2)] == [1, 1]
    with pytest.raises(ValueError, match="no launch"):
        load_launcher("x = 1\n")


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
                                                       *spec.args[1:]], spec.kwargs,
                                             marking_kernel(), None, CPU))
    assert {"aten.mul.Tensor", "aten.add.Tensor", "aten.mm.default"} <= set(decoys)
    with Patch(KernelTable(decoys.values())) as patch:
        got = output_tensors(loaded.run())
    assert all(map(torch.equal, expected, got))
    assert patch.report().hits == 0 and sum(patch.report().misses.values()) > 100
