"""Canned model replies and proposal requests for the LLM proposer's tests."""

from __future__ import annotations

from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus, Timing
from kforge.core.gpu import GpuInfo
from kforge.core.mcts import Action
from kforge.core.opcard import OpCard
from kforge.core.protocols import NodeView, ProposalRequest
from kforge.propose.llm.prompt import EXAMPLE_PLAN, EXAMPLE_SOURCE, plan_json


def reply(source: str, plan: dict | str, notes: str = "",
          approach: str = "one block per row, two-pass reductions") -> str:
    """A well-laid-out reply: the approach line, the CUDA block, the plan block, notes."""
    plan_text = plan if isinstance(plan, str) else plan_json(plan)
    return (f"Approach: {approach}\n\n```cuda\n{source}```\n\n```json\n{plan_text}\n```\n\n"
            f"{notes}\n")


def with_launch(plan: dict, **changes) -> dict:
    """``plan`` with fields of its first launch changed (None removes one)."""
    launch = {**plan["launches"][0], **changes}
    launch = {key: value for key, value in launch.items() if value is not None}
    return {**plan, "launches": [launch, *plan["launches"][1:]]}


GOOD_REPLY = reply(EXAMPLE_SOURCE, EXAMPLE_PLAN, notes="Notes: uses expf for accuracy.")

# Structurally complete, but NVRTC would reject it (a missing semicolon): still a candidate.
BROKEN_SOURCE = """extern "C" __global__ void copy_bf16(const __nv_bfloat16* x, __nv_bfloat16* out,
                                     int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x
    if (i < n) out[i] = x[i];
}
"""
BROKEN_PLAN = {"outputs": [{"name": "out", "like": "self"}],
               "launches": [{"kernel": "copy_bf16", "grid": ["ceil_div(self.numel, 256)"],
                             "block": [256],
                             "params": [{"ptr": "self"}, {"ptr": "out"}, {"i32": "self.numel"}]}]}
BROKEN_CODE_REPLY = f"""Approach: grid-stride copy
```cu
{BROKEN_SOURCE}```
```
{plan_json(BROKEN_PLAN)}
```
"""

# The example plan with a field misspelt, an expression that tries to reach Python, and a
# requirement the softmax card's bfloat16 input does not meet.
MISSPELT_PLAN_REPLY = reply(EXAMPLE_SOURCE, with_launch(EXAMPLE_PLAN, block=None, blok=[256]))
INJECTION_REPLY = reply(EXAMPLE_SOURCE, with_launch(
    EXAMPLE_PLAN, grid=["__import__('os').system('touch /tmp/kforge-pwned') or rows"]))
FLOAT32_ONLY_REPLY = reply(EXAMPLE_SOURCE,
                           {**EXAMPLE_PLAN, "requires": ["self.dtype == 'float32'"]})

NO_CODE_REPLY = "The eager kernel is already at the memory floor; I would not change it."

SECRET_KEY = "sk-test-0123456789abcdefSECRET"


def softmax_card() -> OpCard:
    x = {"t": "tensor", "shape": [8192, 4096], "stride": [4096, 1], "dtype": "bfloat16", "offset": 0}
    return OpCard(op="aten._softmax.default", args=[x, -1, False], calls=24, total_us=2760.0,
                  share=0.059, eager_us=115.0, compiled_us=148.0, floor_us=62.0)


def h200() -> GpuInfo:
    return GpuInfo(name="NVIDIA H200", arch="sm_90", sm_count=132, memory_gb=141.0, l2_mb=50.0,
                   bandwidth_gbs=4300.0)


def ok_outcome(speedup: float, median_us: float = 80.0) -> EvalOutcome:
    return EvalOutcome(status=EvalStatus.OK, speedup=speedup,
                       timing=Timing(median_us, median_us * 0.98, median_us * 1.03, 200),
                       compile_log="ptxas info    : Used 16 registers, used 1 barriers",
                       floor_fraction=62.0 / median_us)


def node(node_id: int, action: Action, outcome: EvalOutcome | None,
         candidate: Candidate | None = None) -> NodeView:
    meta = {"proposer": "llm", "model": "m", "approach": f"variant {node_id}"}
    candidate = candidate or Candidate(EXAMPLE_SOURCE, plan=EXAMPLE_PLAN, meta=meta)
    return NodeView(id=node_id, action=action, candidate=candidate, outcome=outcome)


def request(action: Action = Action.NEW, parent: NodeView | None = None,
            lineage: list[NodeView] | None = None, **fields) -> ProposalRequest:
    return ProposalRequest(card=softmax_card(), action=action, gpu=h200(), parent=parent,
                           lineage=lineage or ([parent] if parent else []), **fields)
