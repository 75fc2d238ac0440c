"""Operator names and region nodes read from a database are data: each shape of payload found
by an audit (attribute walks under torch.ops, dunder access, callables or objects as arguments,
a chain of calls reaching os.system) is refused before anything is called."""

from __future__ import annotations

import os
import re

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from kforge.core.argspec import ArgSpecError, check_call, checked_op, resolve_op
from kforge.core.candidate import EvalStatus
from kforge.core.region import Region
from kforge.runtime.device import CpuRuntime
from kforge.runtime.regions import region_function, register


def t(shape=(4,)) -> dict:
    return {"t": "tensor", "shape": list(shape), "stride": [1], "dtype": "float32", "offset": 0}


def ref(name: str) -> dict:
    return {"t": "ref", "v": name}


def node(op: str, *args, **kwargs) -> dict:
    return {"op": op, "args": list(args), "kwargs": kwargs}


@pytest.fixture
def no_shell(monkeypatch):
    """os.system and os.popen fail the test if anything reaches them."""
    calls = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a) or 0)
    monkeypatch.setattr(os, "popen", lambda *a: calls.append(a))
    yield calls
    assert calls == []


@pytest.mark.parametrize("name", [
    "import_module.__call__.__call__",  # torch.ops.import_module: an attribute walk
    "__class__.__init__.__globals__",
    "aten.__class__.__call__",  # dunder access
    "aten.add.__call__",
    "aten.add.overloads",  # attributes of a packet that are no overloads
    "aten.add._dir",
    "aten.name.upper",  # an attribute of the namespace object
    "aten.add.Tensor.__call__",
    "os.system.default",  # a namespace that is not allowed
    "builtins.eval.default",
    "debugprims.load_tensor.default",  # another loaded library's: it reads a host file
    "higher_order.cond.default",  # a higher-order op: it calls the callables it is given
    "",
    "aten..default",
    # real overloads of aten whose effects reach past their tensors
    "aten.from_file.default",  # maps a host file: reads it, and with shared=True writes it
    "aten.from_file.out",
    "aten._print.default",  # writes raw text to the terminal
    # TorchScript builtins under torch.ops.aten, no dispatcher operators
    "aten.save.default",
    "aten.warn.default",
    "aten.format.default",
])
def test_an_operator_name_resolves_only_to_an_allowed_overload(name):
    with pytest.raises(ArgSpecError):
        resolve_op(name)


def test_real_operators_still_resolve():
    assert resolve_op("aten._softmax.default") is torch.ops.aten._softmax.default
    assert resolve_op("prims.add.default") is torch.ops.prims.add.default


@pytest.mark.parametrize("args, message", [
    ([t(), {"t": "other", "v": "function"}], "not a value"),
    ([t(), {"t": "callable", "v": "os:system"}], "not a value"),
    ([t(), {"t": "dtype", "v": 1}], "not a value"),
    ([t(), "rm -rf /"], "string where"),
    ([t(), t()], None),
])
def test_call_arguments_must_fit_the_schema(args, message):
    if message is None:
        check_call("aten.add.Tensor", args, {})
        return
    with pytest.raises(ArgSpecError, match=message):
        check_call("aten.add.Tensor", args, {})


def region(*nodes, inputs=1, outputs=("n0",)) -> Region:
    return Region(tuple(nodes), tuple(t() for _ in range(inputs)), tuple(outputs))


@pytest.mark.parametrize("bad", [
    # the audit's chain: import os, read os.system off it, call it with a string
    region(node("import_module.__call__.__call__", "os"),
           node("__class__.__getattribute__.__call__", ref("n0"), "system"),
           node("aten.add.__call__", ref("n1"), "echo owned"), outputs=("n2",)),
    # real operators, but a node result that is no tensor passed on as an argument
    region(node("aten.sym_size.int", ref("x0"), 0), node("aten.add.Tensor", ref("x0"), ref("n0")),
           outputs=("n1",)),
    # a reference where the schema takes a number, one to a later node, one to nothing
    region(node("aten.sum.dim_IntList", ref("x0"), [ref("x0")])),
    region(node("aten.relu.default", ref("n1")), node("aten.relu.default", ref("x0"))),
    region(node("aten.relu.default", ref("__builtins__"))),
    # a tensor spec, an object or a callable inside a node; nodes that are no calls
    region(node("aten.relu.default", t())),
    region(node("aten.add.Tensor", ref("x0"), {"t": "other", "v": "builtin_function"})),
    region({"op": "aten.relu.default", "args": [ref("x0")], "kwargs": {}, "call": "os.system"}),
    region("aten.relu.default"),
    # outputs that are no tensor results
    region(node("aten.relu.default", ref("x0")), outputs=("n0.__class__",)),
    region(node("aten.relu.default", ref("x0")), outputs=()),
], ids=["chain-to-os-system", "non-tensor-result", "ref-as-number", "forward-ref", "unknown-ref",
        "tensor-spec", "object-arg", "extra-key", "not-a-call", "bad-output", "no-output"])
def test_a_crafted_region_is_refused_before_any_node_runs(bad, no_shell):
    with pytest.raises(ArgSpecError):
        bad.check()
    with pytest.raises(ArgSpecError):
        register(bad)
    with pytest.raises(ArgSpecError):
        region_function(bad)


def from_file_region(path, *writes) -> Region:
    """A host file mapped shared as a tensor, then written by in-place nodes: each call a real
    aten overload whose arguments fit its schema."""
    return region(node("aten.from_file.default", str(path), True, 5,
                       dtype={"t": "dtype", "v": "uint8"}),
                  *writes, node("aten.add.Tensor", ref("x0"), ref("x0")),
                  outputs=(f"n{len(writes) + 1}",))


@pytest.mark.parametrize("bad", [
    lambda victim: from_file_region(victim, node("aten.fill_.Scalar", ref("n0"), 65)),
    lambda victim: from_file_region(victim),
    # nodes no region holds: in-place writes to an input, factories, another kind of op
    lambda _: region(node("aten.fill_.Scalar", ref("x0"), 65), outputs=("n0",)),
    lambda _: region(node("aten.copy_.default", ref("x0"), ref("x0"))),
    lambda _: region(node("aten.empty.memory_format", [4])),
    lambda _: region(node("aten.full.default", [4], 1.0)),
    lambda _: region(node("aten.nonzero.default", ref("x0"))),
    lambda _: region(node("aten.index_put.default", ref("x0"), [ref("x0")], ref("x0"))),
], ids=["from-file-write", "from-file-read", "in-place-input", "copy-into-input", "factory",
        "full", "nonzero", "index-put"])
def test_a_region_node_must_be_one_capture_puts_in_a_region(bad, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("hello world")
    crafted = bad(victim)
    with pytest.raises(ArgSpecError):
        crafted.check()
    with pytest.raises(ArgSpecError):
        region_function(crafted)
    assert victim.read_text() == "hello world"


def test_the_library_proposer_runs_no_node_of_a_crafted_region(tmp_path):
    """Matching a region to the library's families runs its nodes on meta tensors (a factory
    with no device would run on the host): a crafted one is declined first."""
    from kforge.propose.library.regions.match import Declined, region_outputs

    victim = tmp_path / "victim.txt"
    victim.write_text("hello world")
    crafted = from_file_region(victim, node("aten.fill_.Scalar", ref("n0"), 65))
    with pytest.raises(Declined, match="not an operator kforge may call"):
        region_outputs(crafted)
    assert victim.read_text() == "hello world"


def test_a_region_from_a_dict_that_is_no_region_is_a_typed_error():
    with pytest.raises(ArgSpecError, match="not a region"):
        Region.from_dict({"nodes": 3})


def test_a_recorded_region_passes_and_computes():
    good = region(node("aten.mul.Tensor", ref("x0"), ref("x1")),
                  node("aten.native_layer_norm.default", ref("n0"), [4], None, None, 1e-5),
                  node("aten.relu.default", ref("n1.0")), inputs=2, outputs=("n2",))
    good.check()
    x, y = torch.randn(4), torch.randn(4)
    out = region_function(good)(x, y)
    expected = torch.relu(torch.nn.functional.layer_norm(x * y, [4], eps=1e-5))
    torch.testing.assert_close(out, expected)


async def test_the_engine_skips_a_crafted_card_with_the_reason_and_calls_nothing(tmp_path,
                                                                                  no_shell):
    from dataclasses import replace

    from kforge.core.settings import SearchSettings
    from kforge.engine.engine import Engine
    from kforge.store import CardStatus, Store
    from tests.doubles import FakeEvaluator, FakeProposer, sample_cards

    chain = region(node("import_module.__call__.__call__", "os"), outputs=("n0",))
    victim = tmp_path / "victim.txt"
    victim.write_text("hello world")
    writes = from_file_region(victim, node("aten.fill_.Scalar", ref("n0"), 65))
    cards = sample_cards()
    crafted = [replace(cards[2], op="kforge_region.r_0.default", region=chain.to_dict()),
               replace(cards[2], op=writes.op, region=writes.to_dict(), key="k-writes"),
               replace(cards[1], op="__class__.__init__.__globals__"),
               replace(cards[1], op="aten.from_file.default", key="k-file",
                       args=[str(victim), True, 5])]
    store = await Store.open(tmp_path / "k.db")
    try:
        sid = await store.create_profiled_session("toy", {}, {"name": "Fake GPU"},
                                                  [cards[0], *crafted])
        await Engine(store, sid, FakeProposer(), FakeEvaluator(), SearchSettings.from_dict(
            {"iterations_per_op": 1, "parallel": 1})).run()
        rows = await store.list_cards(sid)
    finally:
        await store.close()
    skipped = [row for row in rows if row.status == CardStatus.SKIPPED]
    assert len(skipped) == 4 and victim.read_text() == "hello world"
    assert all("not an operator kforge calls" in row.stop_reason for row in skipped)
    assert rows[0].status != CardStatus.SKIPPED


def test_a_namespace_is_allowed_once_capture_records_one_of_its_operators():
    from kforge.capture.recorder import _KeyedMode

    @torch.library.custom_op("kforge_test_model::double", mutates_args=())
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    with pytest.raises(ArgSpecError, match="not one of"):
        resolve_op("kforge_test_model.double.default")
    op = torch.ops.kforge_test_model.double.default
    _KeyedMode()._describe(op, (torch.ones(2),), {})
    assert resolve_op("kforge_test_model.double.default") is op


@pytest.mark.parametrize("bad", [
    region(node(["aten", "relu", "default"], ref("x0"))),  # an op name that is no string
    region(node("aten.sum.dim_IntList", ref("x0"), {"t": "list", "items": 3})),
    region(node("aten.sum.dim_IntList", ref("x0"), {"t": "list"})),
], ids=["op-not-a-string", "items-not-a-list", "no-items"])
def test_malformed_nodes_are_a_typed_error(bad):
    with pytest.raises(ArgSpecError):
        bad.check()


def test_a_view_past_its_storage_is_refused_when_the_region_runs():
    """``_reshape_alias`` takes any size and strides unchecked: as a region node it runs through
    ``as_strided``, which refuses a view reaching past the input's memory."""
    small = region(node("aten._reshape_alias.default", ref("x0"), [4], [1]),
                   node("aten.relu.default", ref("n0")), outputs=("n1",))
    past = region(node("aten._reshape_alias.default", ref("x0"), [1 << 20], [1]),
                  node("aten.relu.default", ref("n0")), outputs=("n1",))
    x = torch.randn(4)
    torch.testing.assert_close(region_function(small)(x), torch.relu(x))
    with pytest.raises(RuntimeError, match="out of bounds"):
        region_function(past)(x)


@pytest.mark.parametrize("op, args, kwargs, shape", [
    ("aten.full.default", [[1 << 30, 1 << 30], 1.0], {}, (1 << 30, 1 << 30)),  # 4 EiB
    ("aten.ones.default", [[1 << 30, 1 << 30]], {"device": None}, (1 << 30, 1 << 30)),
    ("aten.arange.default", [1 << 58], {}, (1 << 58,)),
], ids=["full", "ones-device-none", "arange"])
def test_a_factory_a_card_names_makes_nothing_on_the_host(op, args, kwargs, shape):
    """Reading a card's call runs eager on meta tensors, a factory too: given no device it
    filled memory of any size the card says in the engine's own process."""
    from kforge.core.opcard import OpCard
    from kforge.propose.library.cards import read_call

    card = OpCard(op=op, args=args, kwargs=kwargs, calls=1, total_us=1.0, share=1.0,
                  library="", target=True)
    (output,) = read_call(card).outputs
    assert output.shape == shape


# ----- what a card's call may make, and where -----


class MadeForReal(TorchDispatchMode):
    """Records every operator call that makes a tensor anywhere but on meta: building a card's
    inputs or running its call for real."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.device.type != "meta"
               for t in tree_leaves(result)):
            self.calls.append(str(func))
        return result


class TightCpu(CpuRuntime):
    """The CPU with 1 MiB free."""

    def free_bytes(self) -> int:
        return 1 << 20


def op_card(op: str, args: list, kwargs: dict | None = None, region: Region | None = None):
    from kforge.core.opcard import OpCard

    if region is not None:
        return OpCard(op=region.op, args=list(region.inputs), kwargs={}, calls=1, total_us=1.0,
                      share=1.0, library="", target=True, region=region.to_dict())
    return OpCard(op=op, args=args, kwargs=kwargs or {}, calls=1, total_us=1.0, share=1.0,
                  library="", target=True)


def moved_then_repeated(times: list[int]) -> Region:
    """A copy of the input to the host (a device is data), repeated ``times``, then summed:
    a result of one element, made through a tensor of the repeat's size."""
    return region(node("aten._to_copy.default", ref("x0"), device={"t": "device", "v": "cpu"}),
                  node("aten.repeat.default", ref("n0"), times),
                  node("aten.sum.default", ref("n1")), outputs=("n2",))


def test_a_region_runs_where_its_inputs_are_whatever_device_its_nodes_name():
    """A node that names another device (``_to_copy(device="cpu")``, as CPU profiles record it)
    makes its result beside the region's inputs: on a GPU, a crafted region's copy to the host
    then grew there, of whatever size its later nodes said."""
    out = region_function(moved_then_repeated([2, 3]))(torch.empty(4, device="meta"))
    assert out.device.type == "meta"
    x = torch.randn(4)
    torch.testing.assert_close(region_function(moved_then_repeated([2, 3]))(x), x.sum() * 6)


@pytest.mark.parametrize("card, runtime, needle", [
    # factories with no device or the host's: they made their tensor in the GPU worker's memory
    (op_card("aten.ones.default", [[2048, 2048]]), TightCpu(), r"needs 16\.0 MiB"),
    (op_card("aten.full.default", [[1 << 30, 1 << 30], 1.0],
             {"device": {"t": "device", "v": "cpu"}}), CpuRuntime(), "needs 4,294,967,296.0 GiB"),
    (op_card("aten.arange.default", [1 << 22]), TightCpu(), r"needs 32\.0 MiB"),
    # a region whose result is small, made through a repeat of any size
    (op_card("", [], region=moved_then_repeated([1024, 1024])), TightCpu(),
     r"needs 16\.0 MiB \(0\.0 MiB of inputs, 16\.0 MiB made\)"),
    (op_card("", [], region=moved_then_repeated([1 << 28, 1 << 28])), CpuRuntime(), "needs"),
    # operators that copy to the host whatever device their call runs on
    (op_card("aten._to_cpu.default", [{"t": "list", "items": [t()]}]), CpuRuntime(),
     "would make a tensor on cpu"),
    (op_card("aten._pin_memory.default", [t()]), CpuRuntime(), "eager PyTorch rejects"),
    # growth in place: a 16-byte input resized to 2 TiB, as `full` of the same size is refused
    (op_card("aten.resize_.default", [t(), [1 << 39]]), CpuRuntime(),
     r"needs 2,048\.0 GiB \(0\.0 MiB of inputs, 2,048\.0 GiB made\)"),
    (op_card("aten.full.default", [[1 << 39], 1.0]), CpuRuntime(), r"needs 2,048\.0 GiB"),
    (op_card("aten.resize_as_.default", [t(), {"t": "tensor", "shape": [1 << 39], "stride": [0],
                                               "dtype": "float32", "offset": 0}]),
     CpuRuntime(), r"needs 2,048\.0 GiB"),
], ids=["ones", "full-4EiB-cpu", "arange", "region-repeat", "region-repeat-4EiB", "to-cpu",
        "pin-memory", "resize-2TiB", "full-2TiB", "resize-as-2TiB"])
def test_a_card_is_refused_before_anything_of_it_is_made_or_run(card, runtime, needle):
    """The evaluator runs a card's call on meta tensors first: one that makes a tensor elsewhere
    than where it runs, or needs more memory (inputs, results, a region's intermediates) than the
    device has free, is refused with the reason before any input is built or node run."""
    from kforge.errors import KforgeError
    from kforge.eval.verify.baseline import measure_baseline
    from kforge.eval.verify.evaluate import evaluate_candidate
    from tests.eval import candidates as C
    from tests.eval.fakes import CPU_GPU, PyLoader
    from tests.eval.redteam import FAST

    with MadeForReal() as made:
        with pytest.raises(KforgeError, match=needle):
            measure_baseline(card, runtime=runtime, gpu=CPU_GPU, settings=FAST)
        outcome = evaluate_candidate(card, C.relu(), runtime=runtime, loader=PyLoader(),
                                     gpu=CPU_GPU, settings=FAST)
    assert outcome.status is EvalStatus.INFRA and re.search(needle, outcome.summary)
    assert made.calls == []


def test_a_card_whose_results_depend_on_values_is_bounded_by_its_inputs():
    """Meta tensors cannot tell what ``nonzero`` or a boolean mask makes: such a card runs, on
    the evaluation's device, when its inputs fit."""
    from kforge.eval.verify.baseline import measure_baseline
    from tests.eval.fakes import CPU_GPU
    from tests.eval.redteam import FAST

    mask = {"t": "tensor", "shape": [64], "stride": [1], "dtype": "bool", "offset": 0}
    card = op_card("aten.index.Tensor", [t([64]), {"t": "list", "items": [mask]}])
    assert measure_baseline(card, runtime=TightCpu(), gpu=CPU_GPU, settings=FAST).eager


def test_a_card_of_an_operator_with_no_meta_kernel_is_bounded_by_its_inputs():
    """An operator a model's own library registered for its device alone has no meta kernel:
    meta tensors cannot size what it makes, so its card runs when its inputs fit (as before
    meta tensors sized calls), and one whose inputs do not fit is refused."""
    from kforge.capture.recorder import _KeyedMode
    from kforge.errors import KforgeError
    from kforge.eval.verify.baseline import measure_baseline
    from tests.eval.fakes import CPU_GPU
    from tests.eval.redteam import FAST

    lib = torch.library.Library("kforge_test_nometa", "DEF")
    lib.define("triple(Tensor x) -> Tensor")
    lib.impl("triple", lambda x: x * 3, "CPU")
    op = torch.ops.kforge_test_nometa.triple.default
    _KeyedMode()._describe(op, (torch.ones(2),), {})  # capture allows its namespace
    card = op_card("kforge_test_nometa.triple.default", [t([64])])
    assert measure_baseline(card, runtime=TightCpu(), gpu=CPU_GPU, settings=FAST).eager
    with pytest.raises(KforgeError, match=r"needs 4\.0 MiB \(4\.0 MiB of inputs"):
        measure_baseline(op_card("kforge_test_nometa.triple.default", [t([1 << 20])]),
                         runtime=TightCpu(), gpu=CPU_GPU, settings=FAST)


def test_a_plain_reshape_alias_card_runs_as_the_checked_as_strided():
    """``_reshape_alias`` takes any size and strides unchecked: a card of it (not only a region's
    node) runs through ``as_strided``, which refuses a view past its input's memory, so eager's
    baseline never reads past it."""
    from kforge.errors import KforgeError
    from kforge.eval.verify.baseline import measure_baseline
    from tests.eval.fakes import CPU_GPU
    from tests.eval.redteam import FAST

    assert checked_op("aten._reshape_alias.default") is torch.ops.aten.as_strided.default
    assert checked_op("aten._reshape_alias_copy.out") is torch.ops.aten.as_strided_copy.out
    assert checked_op("aten.add.Tensor") is torch.ops.aten.add.Tensor
    fits = op_card("aten._reshape_alias.default", [t([16]), [4, 4], [4, 1]])
    assert measure_baseline(fits, runtime=CpuRuntime(), gpu=CPU_GPU, settings=FAST).eager
    for op in ("aten._reshape_alias.default", "aten._reshape_alias_copy.default"):
        past = op_card(op, [t([4]), [1 << 10], [1]])
        with pytest.raises(KforgeError, match="out of bounds"):
            measure_baseline(past, runtime=CpuRuntime(), gpu=CPU_GPU, settings=FAST)


async def test_the_engine_skips_a_card_too_large_for_its_device_with_the_reason(tmp_path):
    from kforge.core.settings import SearchSettings
    from kforge.engine.engine import Engine
    from kforge.eval.verify.baseline import measure_baseline
    from kforge.store import CardStatus, Store
    from tests.doubles import FakeEvaluator, FakeProposer, sample_cards
    from tests.eval.fakes import CPU_GPU
    from tests.eval.redteam import FAST

    class TightEvaluator(FakeEvaluator):
        async def baseline(self, card):
            return measure_baseline(card, runtime=TightCpu(), gpu=CPU_GPU, settings=FAST)

    big = op_card("aten.ones.default", [[2048, 2048]])
    store = await Store.open(tmp_path / "k.db")
    try:
        sid = await store.create_profiled_session("toy", {}, {"name": "Fake GPU"},
                                                  [sample_cards()[0], big])
        await Engine(store, sid, FakeProposer(), TightEvaluator(), SearchSettings.from_dict(
            {"iterations_per_op": 1, "parallel": 1})).run()
        rows = await store.list_cards(sid)
    finally:
        await store.close()
    [skipped] = [row for row in rows if row.card.op == "aten.ones.default"]
    assert skipped.status == CardStatus.SKIPPED
    assert skipped.stop_reason.startswith("cannot time eager: one call of aten.ones.default "
                                          "needs 16.0 MiB")
