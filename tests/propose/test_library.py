"""The kernel library on the CPU: which cards it takes and why it declines the others, the moves
NEW / REFINE / REPAIR make in its spaces, and its launch plans: parsed, resolved for their cards
and run by kforge's plan runner against a backend that records launches instead of running them."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from kforge.core.argspec import bind
from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus, Proposal
from kforge.core.gpu import GpuInfo
from kforge.core.launch_plan import DeviceLimits, ResolvedPlan, parse_plan, resolve
from kforge.core.mcts import Action
from kforge.core.opcard import OpCard
from kforge.core.protocols import NodeView, ProposalRequest, Proposer, SearchContext
from kforge.propose.library import LibraryProposer, make_library_proposer, supports
from kforge.propose.library.cards import TensorArg, read_call
from kforge.propose.library.examples import DTYPES, example_cards, tensor
from kforge.propose.library.families import FAMILIES
from kforge.propose.library.proposer import build_candidate, make_plan
from kforge.propose.library.space import point_key
from kforge.runtime.plan import PlanRunner, arg_value, check_kernels, check_widths

GPU = GpuInfo(name="H200", arch="sm_90", sm_count=132)
PROPOSER = LibraryProposer()
CPU = torch.device("cpu")


def propose(card: OpCard, action: Action = Action.NEW, *, tried: list[dict] | None = None,
            parent: NodeView | None = None, lineage: list[NodeView] | None = None,
            seed: int = 0) -> Proposal:
    return PROPOSER.propose_now(ProposalRequest(card=card, action=action, gpu=GPU, parent=parent,
                                                lineage=lineage or [], tried=tried or [], seed=seed))


def node(candidate: Candidate, speedup: float | None = 1.0, status: EvalStatus = EvalStatus.OK,
         node_id: int = 1) -> NodeView:
    return NodeView(node_id, Action.NEW, candidate, EvalOutcome(status, speedup=speedup))


def key(candidate: Candidate) -> str:
    meta = candidate.meta
    return point_key(meta["family"], meta["approach"], meta["params"])


# ----- what the library takes -----


FAMILY_OF = {
    "softmax": "softmax", "layer_norm": "layer_norm", "rms_norm": "rms_norm", "group_norm": "group_norm",
    "relu_": "elementwise", "add_bias": "elementwise", "addcmul": "elementwise", "to_float": "elementwise",
    "mean_rows": "reduce", "mean_channels_last": "reduce", "adaptive_avg_pool": "adaptive_avg_pool2d",
    "max_pool": "max_pool2d", "embedding": "embedding", "conv1d_depthwise": "depthwise_conv1d",
    "batch_norm": "batch_norm", "batch_norm_channels_last": "batch_norm", "cat": "cat",
    "cat_rotary": "cat", "sum_interleaved": "reduce", "sum_all": "reduce", "amax": "reduce",
    "layer_norm_columns": "layer_norm", "softmax_middle": "softmax",
}


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_example_card_is_supported(dtype):
    cards = example_cards(dtype)
    for name, card in cards.items():
        support = supports(card)
        assert support, f"{name}: {support.reason}"
        assert support.approaches
        if name in FAMILY_OF:
            assert support.family == FAMILY_OF[name]


def test_supports_lists_variants_by_promise():
    cards = example_cards("bfloat16")
    assert supports(cards["softmax"]).approaches == ("registers", "online", "two_pass")
    assert supports(cards["softmax_long"]).approaches == ("online", "two_pass")
    group_norm = supports(cards["group_norm_split"]).approaches
    assert group_norm[0] == "resident"  # a group fits in one block's shared memory: one read
    assert group_norm.index("split") < group_norm.index("block_welford")  # 8 groups: split them
    assert supports(cards["mean_channels_last"]).approaches == ("columns", "general")
    assert supports(cards["sum_interleaved"]).approaches == ("general",)
    assert supports(cards["sum_all"]).approaches[0] == "split"  # one long row: split it
    assert supports(cards["layer_norm_columns"]).approaches == ("columns",)
    assert supports(cards["mean_rows"]).approaches[0] == "tile"  # rows of 49 elements


@pytest.mark.parametrize("card, reason", [
    (OpCard("aten.cumsum.default", [tensor([4, 4], "float32"), 1]), "no kernel family"),
    (OpCard("aten._softmax.default", [tensor([8, 128], "float32", stride=[1, 16]), 0, False]),
     "nor along a kept one"),
    (OpCard("aten.native_layer_norm.default",
            [tensor([4, 96], "float32", stride=[192, 2]), [96], None, None, 1e-5]), "not contiguous along"),
    (OpCard("aten.relu.default", [tensor([4, 4], "int64")]), "dtype int64 is not supported"),
    (OpCard("aten.amax.default", [tensor([5, 3], "int32"), [1]]), "dtype int32 is not supported"),
    (OpCard("aten.native_batch_norm.default", [tensor([2, 4, 3, 3], "float32"), None, None,
                                               tensor([4], "float32"), tensor([4], "float32"),
                                               True, 0.1, 1e-5]), "training-mode"),
    (OpCard("aten.cat.default", [[tensor([2, 3], "float32"), tensor([2, 3], "float16")]]),
     "different dtypes"),
    (OpCard("aten.convolution.default", [tensor([1, 8, 8, 8], "float16"), tensor([8, 8, 3, 3], "float16"),
                                         None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1]), "1-d"),
    (OpCard("aten.convolution.default", [tensor([2, 64, 10], "float32"), tensor([32, 64, 3], "float32"),
                                         None, [1], [1], [1], False, [0], 1]), "not a depthwise"),
    (OpCard("aten.native_group_norm.default",
            [tensor([2, 64, 4, 4], "float32", stride=[1024, 1, 256, 64]), None, None, 2, 64, 16, 32, 1e-5]),
     "not contiguous"),
    (OpCard("aten.embedding.default", [tensor([10, 8], "float32"), tensor([3, 4], "int64", stride=[1, 3])]),
     "not contiguous"),
    (OpCard("aten.add.Tensor", [tensor([4, 5], "float32"), tensor([3], "float32")]), "eager PyTorch rejects"),
])
def test_declines_say_why(card, reason):
    support = supports(card)
    assert not support and support.family is None
    assert reason in support.reason
    proposal = propose(card)
    assert not proposal.candidates and reason in proposal.error and not proposal.calls


def test_a_variant_that_needs_packed_rows_is_left_out_with_its_reason():
    # Rows 64 elements apart in memory: the shared-memory tile would need them packed.
    card = OpCard("aten.mean.dim", [tensor([6, 49], "float16", stride=[64, 1]), [-1], True])
    plan = make_plan(card, GPU)
    assert [v.approach for v in plan.available] == ["rows", "general"]
    tile = next(v for v in plan.variants if v.approach == "tile")
    assert not tile.available and "packed" in tile.why_not


# ----- the three actions -----


def test_new_takes_each_variant_once_then_restarts():
    card = example_cards("bfloat16")["softmax"]
    plan = make_plan(card, GPU)
    tried, approaches = [], []
    for variant in plan.available:
        candidate = propose(card, tried=tried).candidates[0]
        assert candidate.meta["params"] == variant.space.default
        approaches.append(candidate.meta["approach"])
        tried.append(candidate.meta)
    assert approaches == ["registers", "online", "two_pass"]
    restart = propose(card, tried=tried).candidates[0]
    assert key(restart) not in {key(Candidate("", meta=m)) for m in tried}
    assert "restart" in restart.meta["notes"]


def test_new_stops_with_an_error_when_the_space_is_exhausted():
    # Sixteen outputs: only 64-thread blocks fit, a handful of points in all.
    card = OpCard("aten.max_pool2d_with_indices.default", [tensor([1, 1, 8, 8], "float32"), [2, 2]])
    points = sum(len(v.space.points()) for v in make_plan(card, GPU).available)
    assert points <= 12
    tried = []
    for _ in range(points):
        proposal = propose(card, tried=tried)
        assert proposal.candidates, proposal.error
        tried.append(proposal.candidates[0].meta)
    assert len({key(Candidate("", meta=m)) for m in tried}) == points
    final = propose(card, tried=tried)
    assert not final.candidates and "has been tried" in final.error


def test_refine_moves_one_step_to_an_untried_neighbour():
    card = example_cards("float16")["layer_norm"]
    parent = propose(card).candidates[0]
    space = make_plan(card, GPU).variant(parent.meta["approach"]).space
    tried = [parent.meta]
    seen = set()
    for seed in range(3):
        child = propose(card, Action.REFINE, tried=tried, parent=node(parent), seed=seed).candidates[0]
        assert child.meta["approach"] == parent.meta["approach"]
        assert space.distance(parent.meta["params"], child.meta["params"]) == 1
        tried.append(child.meta)
        seen.add(key(child))
    assert len(seen) == 3 and key(parent) not in seen


def test_refine_repeats_a_step_that_made_the_parent_faster():
    card = example_cards("bfloat16")["add_bias"]
    grand = propose(card).candidates[0]
    moved = {**grand.meta["params"], "unroll": 2}
    assert moved != grand.meta["params"] and grand.meta["params"]["unroll"] == 1
    parent = Candidate("", meta={**grand.meta, "params": moved})
    lineage = [node(grand, speedup=1.1, node_id=1), node(parent, speedup=1.4, node_id=2)]
    child = propose(card, Action.REFINE, tried=[grand.meta, parent.meta], parent=lineage[-1],
                    lineage=lineage).candidates[0]
    assert child.meta["params"] == {**moved, "unroll": 4}
    assert "repeat" in child.meta["notes"]


def test_refine_and_repair_need_a_library_parent():
    card = example_cards("float32")["softmax"]
    foreign = Candidate("src", meta={"model": "some-llm"})
    refine = propose(card, Action.REFINE, parent=node(foreign))
    assert not refine.candidates and "parent kernel from the library" in refine.error
    # A repair of someone else's kernel still gets the library's own safe kernel.
    repair = propose(card, Action.REPAIR, parent=node(foreign, None, EvalStatus.COMPILE_ERROR))
    assert repair.candidates[0].meta["approach"] == "two_pass"


def test_repair_goes_back_to_safe_parameters_then_to_the_reference():
    card = example_cards("bfloat16")["softmax"]
    plan = make_plan(card, GPU)
    broken = propose(card).candidates[0]
    failing = node(broken, None, EvalStatus.MISMATCH)
    first = propose(card, Action.REPAIR, tried=[broken.meta], parent=failing).candidates[0]
    assert first.meta["approach"] == broken.meta["approach"]
    assert first.meta["params"] == plan.variant("registers").space.safe
    assert first.meta["params"]["vec"] == 1
    second = propose(card, Action.REPAIR, tried=[broken.meta, first.meta], parent=failing).candidates[0]
    assert second.meta["approach"] == "two_pass"
    assert second.meta["params"] == plan.variant("two_pass").space.safe


@pytest.mark.parametrize("name", ["softmax", "group_norm", "mean_rows", "embedding"])
def test_a_search_never_proposes_the_same_kernel_twice(name):
    card = example_cards("float16")[name]
    tried: list[dict] = []
    candidates: list[Candidate] = []
    actions = [Action.NEW, Action.REFINE, Action.REFINE, Action.REPAIR] * 10
    for step, action in enumerate(actions):
        parent = node(candidates[-1], 1.0 + step / 100) if candidates and action is not Action.NEW else None
        if action is Action.REPAIR and parent is not None:
            parent = node(candidates[-1], None, EvalStatus.LAUNCH_ERROR)
        proposal = propose(card, action, tried=tried, parent=parent, seed=step)
        if not proposal.candidates:
            assert proposal.error
            continue
        candidates.append(proposal.candidates[0])
        tried.append(proposal.candidates[0].meta)
    keys = [key(c) for c in candidates]
    points = sum(len(v.space.points()) for v in make_plan(card, GPU).available)
    assert len(keys) == len(set(keys)) >= min(20, points)
    assert len({c.digest for c in candidates}) == len(candidates)


def test_proposals_are_deterministic_and_free():
    card = example_cards("bfloat16")["rms_norm"]
    parent = propose(card).candidates[0]
    first = propose(card, Action.REFINE, tried=[parent.meta], parent=node(parent), seed=7)
    again = propose(card, Action.REFINE, tried=[parent.meta], parent=node(parent), seed=7)
    assert first.candidates[0] == again.candidates[0]
    assert first.calls == [] and first.usd == 0


async def test_factory_builds_a_proposer():
    proposer = make_library_proposer(SearchContext(session_id=1, samples_dir=None, gpu=GPU))
    assert isinstance(proposer, Proposer) and proposer.name == "library"
    card = example_cards("float32")["relu_"]
    proposal = await proposer.propose(ProposalRequest(card=card, action=Action.NEW, gpu=GPU))
    await proposer.close()
    meta = proposal.candidates[0].meta
    assert meta["family"] == "elementwise" and meta["op"] == "aten.relu_.default"
    assert set(meta) >= {"family", "approach", "params", "notes"}


# ----- launch plans, resolved and run against a recording backend -----

_KERNEL = re.compile(r'extern "C" __global__ void (?:__cluster_dims__\([^)]*\) )?'
                     r'__launch_bounds__\((\d+)\) (\w+)\(([^)]*)\)', re.DOTALL)


def kernel_signatures(source: str) -> dict[str, tuple[int, list[int]]]:
    """Per extern "C" kernel: its launch bound and the byte width of each parameter."""
    found = {}
    for bound, name, params in _KERNEL.findall(source):
        widths = []
        for param in (p.strip() for p in params.split(",")):
            widths.append(8 if "*" in param or param.startswith(("int64_t", "double")) else 4)
        found[name] = (int(bound), widths)
    return found


def resolved(card: OpCard, candidate: Candidate) -> ResolvedPlan:
    """The candidate's plan parsed and resolved for its card, under the default device limits."""
    bound = {name: arg_value(spec) for name, spec in bind(card.op, card.args, card.kwargs).items()}
    return resolve(parse_plan(candidate.plan), bound, DeviceLimits())


def check_plan(candidate: Candidate, plan: ResolvedPlan) -> None:
    """Every kernel the plan may launch is an extern "C" kernel of the source, called with the
    parameter widths it declares and a block within its launch bounds."""
    signatures = kernel_signatures(candidate.source)
    check_kernels(plan, signatures.__contains__, sorted(signatures))
    check_widths(plan, lambda name: signatures[name][1])
    for launch in plan.launches:
        for name in filter(None, (launch.kernel, launch.unaligned_kernel)):
            assert math.prod(launch.block) <= signatures[name][0], f"{name}: block {launch.block}"


def candidates_for(card: OpCard) -> list[Candidate]:
    """Every variant of the card at its default point, and the reference at its safe point."""
    plan = make_plan(card, GPU)
    points = [(v, v.space.default) for v in plan.available]
    points.append((plan.reference, plan.reference.space.safe))
    return [build_candidate(plan, v, params, GPU, card, "") for v, params in points]


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_candidate_plan_parses_and_resolves_for_its_card(dtype):
    families = set()
    for card in example_cards(dtype).values():
        for candidate in candidates_for(card):
            plan = resolved(card, candidate)
            check_plan(candidate, plan)
            assert parse_plan(parse_plan(candidate.plan).to_dict()) == parse_plan(candidate.plan)
            families.add(candidate.meta["family"])
    assert families == {family.name for family in FAMILIES}


class Recorder:
    """A backend that records launches instead of running them."""

    def __init__(self) -> None:
        self.launches: list[tuple[str, tuple[int, ...], tuple[int, ...], list]] = []

    def launch(self, name, grid, block, shared_mem, params) -> None:
        self.launches.append((name, grid, block, list(params)))

    def has_kernel(self, name: str) -> bool:
        return True

    def param_widths(self, name: str) -> list[int] | None:
        return None


def materialize(spec, generator: torch.Generator):
    """CPU values for an arg spec, tensors laid out exactly as the spec says."""
    if isinstance(spec, dict) and spec.get("t") == "tensor":
        arg = TensorArg.from_spec(spec)
        span = arg.offset + sum((n - 1) * s for n, s in zip(arg.shape, arg.stride)) + 1
        dtype = getattr(torch, arg.dtype)
        base = (torch.zeros(span, dtype=dtype) if not dtype.is_floating_point
                else torch.randn(span, generator=generator).to(dtype))
        return base.as_strided(arg.shape, arg.stride, arg.offset)
    if isinstance(spec, dict) and spec.get("t") == "list":
        return [materialize(item, generator) for item in spec["items"]]
    if isinstance(spec, dict) and spec.get("t") == "dtype":
        return getattr(torch, spec["v"])
    if isinstance(spec, list):
        return [materialize(item, generator) for item in spec]
    return spec


def run_plan(card: OpCard, candidate: Candidate):
    """Run the plan as kforge does, on CPU tensors laid out as the card says."""
    generator = torch.Generator().manual_seed(0)
    args = [materialize(a, generator) for a in card.args]
    kwargs = {k: materialize(v, generator) for k, v in card.kwargs.items()}
    recorder = Recorder()
    runner = PlanRunner(resolved(card, candidate), card.op, recorder, CPU)
    return args, runner(tuple(args), kwargs), recorder.launches


def check_outputs(card: OpCard, args, result) -> None:
    expected = read_call(card).outputs
    results = result if isinstance(result, tuple) else (result,)
    assert len(results) == len(expected)
    for got, want in zip(results, expected):
        layout = TensorArg.from_tensor(got)
        assert (layout.shape, layout.stride, layout.dtype) == (want.shape, want.stride, want.dtype)
    if card.op.split(".")[1].endswith("_"):
        assert result is args[0], "an in-place op returns its first argument"


@pytest.mark.parametrize("dtype", DTYPES)
def test_plans_return_eager_outputs_and_launch_with_tensors_and_scalars(dtype):
    for card in example_cards(dtype).values():
        for candidate in candidates_for(card):
            args, result, launches = run_plan(card, candidate)
            check_outputs(card, args, result)
            assert launches, "the plan launched nothing"
            inplace = card.op.split(".")[1].endswith("_")
            for name, _, _, params in launches:
                assert all(p is not None for p in params), f"{name}: a parameter is missing"
                if inplace:
                    assert any(p is args[0] for p in params), f"{name} never gets its output"


def test_vector_kernels_fall_back_to_scalar_ones_on_misaligned_tensors():
    aligned = OpCard("aten._softmax.default", [tensor([6, 200], "bfloat16"), -1, False])
    shifted = OpCard("aten._softmax.default", [tensor([6, 200], "bfloat16", offset=1), -1, False])
    for card, expected in ((aligned, "softmax"), (shifted, "softmax_scalar")):
        candidate = propose(card).candidates[0]
        assert candidate.meta["params"]["vec"] == 8
        _, _, launches = run_plan(card, candidate)
        assert [launch[0] for launch in launches] == [expected]


def test_plans_name_the_ops_arguments_and_hold_the_variants_sizes():
    card = example_cards("float16")["layer_norm_plain"]  # no weight, no bias
    candidate = propose(card).candidates[0]
    (launch,) = candidate.plan["launches"]
    assert launch["params"][0] == {"ptr": "input"} and launch["params"][-1] == {"f32": "eps"}
    assert {"ptr": "weight"} not in launch["params"] and {"ptr": "bias"} not in launch["params"]
    assert [o["shape"] for o in candidate.plan["outputs"]] == [[5, 130], [5, 1], [5, 1]]
    assert "requires" not in candidate.plan and "let" not in candidate.plan
    no_eps = OpCard("aten._fused_rms_norm.default", [tensor([3, 64], "float32"), [64], None, None])
    (launch,) = propose(no_eps).candidates[0].plan["launches"]
    assert launch["params"][-1] == {"f32": float(np.finfo(np.float32).eps)}
