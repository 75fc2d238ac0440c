"""kforge as a torch.compile backend, on the CPU: Inductor compiles the toy model, and stand-in
kernels (CPU table entries whose runner computes the op with PyTorch and counts its calls) replace
the op calls whose exact variant they were made for, chosen once at compile time."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

import kforge
from kforge.errors import KforgeError
from kforge.integrate.api import backend
from kforge.integrate.backend import (
    GRADIENTS,
    OTHER_DEVICE,
    OTHER_VARIANT,
    SYMBOLIC,
    VIEW_OFFSET,
    KernelPass,
    KforgeWarning,
    inductor_fuses,
    tensor_paths,
)
from kforge.runtime.guard import Patch
from kforge.runtime.table import Entry, KernelTable
from tests.integrate.helpers import WINNING_OPS, profile_toy
from tests.integrate.standins import Counting
from tests.integrate.toy_model import build

CALLS_PER_FORWARD = 2  # the toy has two blocks, each calling every winning op once


@pytest.fixture(scope="module")
def cards():
    """The toy's op cards as profiling records them on the CPU (the winning ops only)."""
    _, result = profile_toy("cpu")
    return [c for c in result.cards if c.op in WINNING_OPS]


def table_of(cards, calls: Counter, *, device: str = "cpu", fail: bool = False) -> KernelTable:
    return KernelTable(Entry(op=c.op, args=c.args, kwargs=c.kwargs, device=torch.device(device),
                             runner=Counting(c.op, calls, fail), label=c.short_op, key=c.key)
                       for c in cards)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Every test compiles the same model code: start each from empty Dynamo caches, and
    compile it (kforge's pass runs) rather than take Inductor's cached graph."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        yield
    torch._dynamo.reset()


@pytest.fixture
def toy():
    model, (x,) = build()
    return model.eval(), x


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to the rounding of Inductor's fused code."""
    return torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def kforge_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, KforgeWarning)]


def test_each_call_of_a_winning_variant_runs_its_kernel_and_the_output_is_eager_s(cards, toy):
    model, x = toy
    calls: Counter = Counter()
    chosen = backend(table_of(cards, calls))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        expected = model(x)
        compiled = torch.compile(model, backend=chosen)
        got = compiled(x)
        again = compiled(x)
    assert kforge_warnings(caught) == []
    assert close(got, expected)
    assert torch.equal(got, again)
    assert calls == {op: 2 * CALLS_PER_FORWARD for op in WINNING_OPS}  # two forwards
    report = chosen.report
    assert report.graphs == 1 and report.nodes == 3 * CALLS_PER_FORWARD
    assert set(report.replaced.values()) == {CALLS_PER_FORWARD}
    assert f"{report.nodes} node(s) run a kforge kernel in 1 compiled graph(s)" in str(report)
    assert {k.op: k.hits for k in chosen.table.report().kernels} == dict(calls)


def test_calls_of_other_shapes_keep_inductors_code_and_warn_once(cards, toy):
    model, x = toy
    calls: Counter = Counter()
    chosen = backend(table_of(cards, calls))
    compiled = torch.compile(model, backend=chosen, dynamic=False)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in (3, 4):  # two graphs, neither with the profiled shapes
            other = torch.randn(batch, *x.shape[1:])
            assert close(compiled(other), model(other))
    assert calls == {}
    assert chosen.report.graphs == 2 and chosen.report.nodes == 0
    (message,) = kforge_warnings(caught)
    assert f"call(s) shaped like a kernel's: {OTHER_VARIANT}" in message
    assert chosen.report.kept[OTHER_VARIANT] == 2 * 3 * CALLS_PER_FORWARD


def test_symbolic_sizes_keep_inductors_code(cards, toy):
    model, x = toy
    calls: Counter = Counter()
    chosen = backend(table_of(cards, calls))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(model, backend=chosen, dynamic=True)(x)
    assert close(got, model(x))
    assert calls == {} and chosen.report.kept[SYMBOLIC] == 3 * CALLS_PER_FORWARD
    (message,) = kforge_warnings(caught)
    assert SYMBOLIC in message


def test_kernels_on_another_device_are_left_out_with_one_warning(cards, toy):
    model, x = toy
    chosen = backend(table_of(cards, Counter(), device="cuda:0"))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.compile(model, backend=chosen)(x)
    assert chosen.report.nodes == 0 and chosen.report.kept[OTHER_DEVICE] == 6
    (message,) = kforge_warnings(caught)
    assert OTHER_DEVICE in message


def test_a_graph_that_needs_gradients_keeps_inductors_code(cards, toy):
    model, x = toy
    calls: Counter = Counter()
    chosen = backend(table_of(cards, calls))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(model, backend=chosen)(x)
        out.sum().backward()
    assert calls == {} and chosen.report.nodes == 0
    assert all(p.grad is not None for p in model.parameters())
    (message,) = kforge_warnings(caught)
    assert GRADIENTS in message


def test_a_kernel_that_fails_at_run_time_leaves_its_op_to_pytorch(cards, toy):
    model, x = toy
    calls: Counter = Counter()
    chosen = backend(table_of(cards, calls, fail=True))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = torch.compile(model, backend=chosen)
        for _ in range(2):
            assert close(compiled(x), model(x))
    assert calls == {op: 1 for op in WINNING_OPS}  # each failed once, then is off
    assert all(e.disabled for e in chosen.table.entries)
    assert sum(issubclass(w.category, RuntimeWarning) for w in caught) == 3


def test_kernels_whose_op_cannot_be_a_custom_op_stay_out_with_one_warning(cards, toy):
    model, x = toy
    calls: Counter = Counter()
    table = table_of(cards, calls)
    spec = {"t": "tensor", "shape": [2], "stride": [1], "dtype": "float32", "offset": 0}
    table.add(Entry(op="aten.add_.Tensor", args=[spec, spec], kwargs={}, label="add_",
                    runner=Counting("aten.add_.Tensor", calls), device=torch.device("cpu")))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = backend(table)
    (message,) = kforge_warnings(caught)
    assert message.startswith("kforge kernels that cannot be called from compiled code stay out:")
    assert "add_: aten.add_.Tensor writes to or returns a view of its inputs" in message
    with torch.no_grad():
        torch.compile(model, backend=chosen)(x)
    assert calls == {op: CALLS_PER_FORWARD for op in WINNING_OPS}


def test_a_failure_in_kforges_part_compiles_with_inductor_alone(cards, toy, monkeypatch):
    model, x = toy
    calls: Counter = Counter()

    def broken(self, graph):
        raise ValueError("a pass that breaks")

    monkeypatch.setattr(KernelPass, "__call__", broken)
    chosen = backend(table_of(cards, calls))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(model, backend=chosen)(x)
    assert close(got, model(x))
    assert calls == {} and chosen.report.notes
    (message,) = kforge_warnings(caught)
    assert "failed to compile with them" in message and "Inductor alone compiles it" in message


def test_a_session_that_cannot_load_here_leaves_inductor_alone_with_one_warning(toy, tmp_path,
                                                                                monkeypatch):
    import asyncio

    from kforge.store import Store

    async def empty_database() -> None:
        async with await Store.open(tmp_path / "k.db"):
            pass

    asyncio.run(empty_database())
    model, x = toy
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = kforge.compile(model, 1, db=tmp_path / "k.db")
    (message,) = kforge_warnings(caught)
    assert "kforge has no kernel to put in compiled graphs (kforge.patch needs a CUDA GPU" in message
    assert message.endswith("Inductor alone compiles the model")
    with torch.no_grad():
        assert close(compiled(x), model(x))
    assert compiled.kforge_backend.report.nodes == 0


def test_a_patch_with_notes_and_no_kernels_says_why():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend(Patch(KernelTable(), ["kernels were exported for sm_90 and this GPU is sm_121"]))
    (message,) = kforge_warnings(caught)
    assert "(kernels were exported for sm_90 and this GPU is sm_121)" in message


def test_compile_modes_and_options_are_checked_when_the_backend_is_made():
    with pytest.raises(KforgeError, match="unknown torch.compile mode 'fastest': use one of "
                                          "default, reduce-overhead, max-autotune"):
        backend(KernelTable(), mode="fastest")
    with pytest.raises(KforgeError, match="bad Inductor options: Unexpected optimization "
                                          "option no_such_option"):
        backend(KernelTable(), options={"no_such_option": True})
    with pytest.warns(KforgeWarning, match="the kernel table is empty"):
        chosen = backend(KernelTable(), mode="max-autotune", options={"epilogue_fusion": False})
    assert chosen.inductor.config["max_autotune"] is True
    assert chosen.inductor.config["epilogue_fusion"] is False


def test_a_kernels_inputs_are_its_calls_tensors_in_schema_order():
    x, w = torch.randn(2, 3), torch.randn(3)
    norm = "aten.native_layer_norm.default"
    assert tensor_paths(norm, [x, [3], w, None, 1e-5], {}) == [("input", ""), ("weight", "")]
    assert tensor_paths("aten.cat.default", [[x, x]], {"dim": 0}) == [("tensors", "[0]"),
                                                                      ("tensors", "[1]")]


def test_measured_choice_needs_a_session(toy):
    model, x = toy
    with pytest.raises(KforgeError, match="chooses among a session's kernels"):
        kforge.compile(model, KernelTable(), example_inputs=x)


def test_inductors_fx_graph_cache_serves_the_kernels_graph_again(cards, toy, tmp_path):
    from torch._inductor.utils import fresh_cache

    model, x = toy
    calls: Counter = Counter()
    table = table_of(cards, calls)
    torch._dynamo.reset()
    # a cache of its own, on disk and in memory: what earlier tests compiled is not in it
    with torch.no_grad(), fresh_cache(dir=str(tmp_path)), \
            torch._inductor.config.patch(fx_graph_cache=True):
        first = backend(table)
        torch.compile(model, backend=first)(x)
        torch._dynamo.reset()  # (clears the counters too)
        again = backend(table)
        got = torch.compile(model, backend=again)(x)
    assert torch._dynamo.utils.counters["inductor"]["fxgraph_cache_hit"] == 1
    assert first.report.nodes == 3 * CALLS_PER_FORWARD and again.report.cached == 1
    assert close(got, model(x)) and calls == {op: 2 * CALLS_PER_FORWARD for op in WINNING_OPS}


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune-no-cudagraphs"])
def test_the_graph_holds_a_kforge_node_for_each_kernel_the_report_names_and_no_other(cards, toy,
                                                                                     mode):
    from torch._inductor.utils import is_cudagraph_unsafe_fx_node

    model, x = toy
    kept = [c for c in cards if c.op != "aten.gelu.default"]  # a selection left gelu out
    chosen = backend(table_of(kept, Counter()), mode=mode)
    graphs = []
    with torch.no_grad(), torch._inductor.config.patch(
            post_grad_custom_post_pass=_Spy(graphs)):
        torch.compile(model, backend=chosen)(x)
    (graph,) = graphs
    nodes = [n for n in graph.nodes if str(n.target).startswith("kforge.")]
    labels = {str(k.overload): k.label for k in chosen.kernels}
    assert {labels[str(n.target)] for n in nodes} == chosen.report.kernels() == {
        c.short_op for c in kept}
    # What CUDA graph capture needs of them (without a GPU): a torch.library operator with no
    # aliasing or mutation in its schema, inputs at the traced strides, nothing Inductor counts
    # as unsafe to capture (the GPU test checks no cudagraph_skips in reduce-overhead).
    for node in nodes:
        op = node.target
        assert isinstance(op, torch._ops.OpOverload) and not op._schema.is_mutable
        assert all(a.alias_info is None for a in (*op._schema.arguments, *op._schema.returns))
        assert torch.Tag.needs_exact_strides in op.tags and not is_cudagraph_unsafe_fx_node(node)
        assert op.name() not in torch._library.custom_ops.OPDEFS  # no custom_op wrapper


class _Spy(CustomGraphPass):
    """A user's own post-grad pass: it sees the graph after kforge's."""

    def __init__(self, graphs: list) -> None:
        self.graphs = graphs

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.graphs.append(graph)

    def uuid(self) -> str:
        return "spy"


def test_ops_inductor_fuses_are_told_from_those_it_calls_as_they_are():
    fused = ["aten._softmax.default", "aten.native_layer_norm.default", "aten.gelu.default",
             "aten.mul.Tensor"]
    called = ["aten.mm.default", "aten.addmm.default", "aten.convolution.default",
              "aten._scaled_dot_product_flash_attention.default"]
    assert [inductor_fuses(op) for op in fused + called] == [True] * 4 + [False] * 4


def test_a_kernel_operator_runs_its_kernel_only_for_its_variant_s_layout(cards):
    # The kernel's launch plan holds the variant's sizes and strides as constants: called on any
    # other layout it would read and write out of place, so the original op runs instead.
    from kforge.core.argspec import encode_call
    from kforge.integrate.backend import kernel_op

    calls: Counter = Counter()
    (entry,) = [e for e in table_of(cards, calls).entries if e.op == "aten.gelu.default"]
    op = kernel_op(entry)
    shape = tuple(entry.args[0]["shape"])  # (2, 32, 64), packed

    def gelu(t: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.gelu.default(t, approximate="tanh")

    x = torch.randn(shape)
    assert close(op.overload(x), gelu(x))
    assert calls[entry.op] == 1 and entry.fallbacks == 0
    others = {
        "another shape": torch.randn(2, 32, 32),
        "other strides": torch.randn(2, 64, 32).transpose(1, 2),
        "a storage offset": torch.randn(2 * 32 * 64 + 64)[64:].view(shape),
        "another dtype": torch.randn(shape, dtype=torch.float64),
        "a padded row": torch.randn(2, 32, 80)[:, :, :64],
    }
    for why, t in others.items():
        got = op.overload(t)
        assert calls[entry.op] == 1, f"the kernel ran on {why}"
        assert torch.equal(got, gelu(t)), why
    assert entry.fallbacks == len(others)

    # a stride along a dimension of size one addresses nothing: the variant still matches
    row = torch.randn(2, 1, 64)
    args, kwargs = encode_call(torch.ops.aten.gelu.default, [row], {"approximate": "tanh"})
    single = Entry(op=entry.op, args=args, kwargs=kwargs, device=torch.device("cpu"),
                   runner=Counting(entry.op, calls), label="gelu [2, 1, 64]", key="k1")
    kernel_op(single).overload(torch.randn(2, 64).unsqueeze(1))  # strides (64, 1, 1)
    kernel_op(single).overload(torch.randn(2, 64, 5)[:, :, 0].unsqueeze(1).contiguous())
    assert row.stride() == (64, 64, 1) and calls[entry.op] == 3 and single.fallbacks == 0


class Lookup(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(1000, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids) * 2.0


def test_an_index_op_s_kernel_is_traced_on_indices_in_bounds():
    # The pattern matcher runs a kernel's call on the tensors it traces it with (on the GPU, the
    # kernel's device): indices left uninitialized would read out of bounds there.
    from kforge.core.argspec import encode_call
    from kforge.integrate.backend import kernel_op

    model = Lookup().eval()
    ids = torch.randint(0, 1000, (4, 8))
    op = "aten.embedding.default"
    args, kwargs = encode_call(torch.ops.aten.embedding.default, [model.table.weight, ids], {})
    calls: Counter = Counter()

    def runner(call_args: tuple, call_kwargs: dict) -> torch.Tensor:
        calls[op] += 1
        return torch.ops.aten.embedding.default(*call_args, **call_kwargs)

    entry = Entry(op=op, args=args, kwargs=kwargs, device=torch.device("cpu"), runner=runner,
                  label="embedding", key="lookup")
    assert all(not t.any() for t in kernel_op(entry).example_inputs())
    chosen = backend(KernelTable([entry]))
    assert not chosen.report.notes, chosen.report.notes
    with torch.no_grad():
        got = torch.compile(model, backend=chosen)(ids)
        assert torch.equal(got, model(ids))
    assert chosen.report.replaced["embedding"] == 1 and calls[op] == 1 and not entry.disabled


def test_a_kernel_whose_outputs_are_not_laid_out_as_the_op_s_stays_out(cards):
    # Inductor plans buffers after the operator's fake outputs (the op's own layout) and reuses
    # them so: a kernel writing another layout, or handing back an input, stays out of the graph.
    from tests.integrate.standins import PyKernels
    from tests.integrate.test_runtime import SOFTMAX, mark, plan_entry, spec_of

    x = torch.randn(4, 8)
    args, kwargs = spec_of(torch.ops.aten._softmax.default, x, -1, False)
    launch = {"kernel": "mark", "grid": [1], "block": [32],
              "params": [{"ptr": "out"}, {"ptr": "self"}, {"i64": 32}]}

    def entry(output: dict, label: str) -> Entry:
        plan = {"outputs": [{"name": "out", **output}], "launches": [launch]}
        return plan_entry(SOFTMAX, args, kwargs, plan, PyKernels(mark=mark), label)

    good = entry({"like": "self"}, "packed")
    transposed = entry({"shape": [4, 8], "stride": [1, 4], "dtype": "float32"}, "transposed")
    wider = entry({"shape": [4, 8], "stride": [8, 1], "dtype": "float64"}, "float64")
    aliased = entry({"arg": "self"}, "aliased")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = backend(KernelTable([good]))
        for bad in (transposed, wider, aliased):
            refused = backend(KernelTable([bad]))
            assert not refused.kernels, bad.label
    notes = " ".join(kforge_warnings(caught))
    assert [k.label for k in chosen.kernels] == ["packed"]
    assert "transposed: its launch plan makes output 0 as float32[4, 8] with strides [1, 4], " \
           "where compiled code takes it to be float32[4, 8] with strides [8, 1]" in notes
    assert "float64: its launch plan makes output 0 as float64[4, 8]" in notes
    assert "aliased: its launch plan returns one of the op's inputs" in notes


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_every_library_kernel_makes_the_outputs_compiled_code_plans_for(dtype):
    # The fake outputs Inductor plans a kernel operator's buffers after (the op on fake CUDA
    # tensors) against what each library kernel's launch plan allocates, for every example card
    # and variant; in-place ops are not operators of compiled code at all.
    from types import SimpleNamespace

    from kforge.core.gpu import GpuInfo
    from kforge.integrate.backend import output_mismatch, unsupported
    from kforge.propose.library.examples import example_cards
    from kforge.propose.library.proposer import build_candidate, make_plan
    from kforge.runtime.plan import resolve_for

    gpu = GpuInfo(name="H200", arch="sm_90", sm_count=132)
    checked, refused = 0, {}
    for name, card in example_cards(dtype).items():
        plan = make_plan(card, gpu)
        for variant in plan.available:
            candidate = build_candidate(plan, variant, variant.space.default, gpu, card, "test")
            resolved = resolve_for(candidate.plan, card.op, card.args, card.kwargs)
            entry = Entry(op=card.op, args=card.args, kwargs=card.kwargs,
                          runner=SimpleNamespace(plan=resolved), device=torch.device("cuda", 0))
            if (why := unsupported(entry)) is not None:
                refused[name] = why
                continue
            assert output_mismatch(entry) is None, (name, variant.approach)
            checked += 1
    assert checked > 50 and set(refused) == {"relu_", "add_"}


def test_an_operator_keeps_each_entry_it_ran_once_however_often_tables_alternate(cards):
    # CUDA graphs captured while an entry served its operator may launch its kernel later: every
    # such entry stays loaded, once, however often two tables take turns.
    from kforge.integrate.backend import kernel_op

    first, second = (table_of(cards, Counter()).entries[0] for _ in range(2))
    for _ in range(5):
        op = kernel_op(first)
        op = kernel_op(second)
    assert op.entry is second
    assert sum(e is first for e in op.earlier) == 1 and sum(e is second for e in op.earlier) == 1


def test_a_kernel_for_a_view_with_a_storage_offset_is_left_to_inductor_and_said(tmp_path):
    """Inductor hands an operator of exact strides a fresh buffer: the view's storage offset,
    part of the kernel's variant, would be lost, so the call is not replaced (nor counted)."""
    from pathlib import Path

    from kforge.capture import ModelOptions, load_model, profile

    toy_file = Path(__file__).parents[1] / "capture" / "capture_toy.py"
    loaded = load_model(f"{toy_file}:build", ModelOptions(device="cpu"))
    sigmoid = next(c for c in profile(loaded, samples_per_card=0, staging_dir=tmp_path).cards
                   if c.op == "aten.sigmoid.default")
    assert sigmoid.args[0]["offset"] > 0  # the toy's sigmoid reads [:, 1:] of a result
    calls: Counter = Counter()
    chosen = backend(table_of([sigmoid], calls))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = torch.compile(loaded.model, backend=chosen)
        assert close(compiled(*loaded.args), loaded.model(*loaded.args))
    assert calls == {} and chosen.report.nodes == 0
    assert chosen.report.kept[VIEW_OFFSET] == 1
    assert any(VIEW_OFFSET in message for message in kforge_warnings(caught))


@pytest.mark.parametrize(("session", "db", "named"), [
    ("abc", None, "'abc' is not a session number"),
    (True, None, "True is not a session number"),
    (-1, None, "-1 is not a session number"),
    (1, 123, "db=123 is not a path"),
])
def test_a_wrong_session_or_database_argument_is_named_before_anything_else(session, db, named):
    for call in (lambda: kforge.patch(session, db=db), lambda: kforge.backend(session, db=db)):
        with pytest.raises(KforgeError, match=named):
            call()
