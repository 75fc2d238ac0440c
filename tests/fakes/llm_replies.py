"""Canned model replies and proposal requests for the LLM proposer's tests."""

from __future__ import annotations

from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus, Timing
from kforge.core.gpu import GpuInfo
from kforge.core.mcts import Action
from kforge.core.opcard import OpCard
from kforge.core.protocols import NodeView, ProposalRequest
from kforge.propose.llm.prompt import EXAMPLE_LAUNCHER, EXAMPLE_SOURCE

GOOD_REPLY = f"""Approach: one block per row, two-pass reductions

```cuda
{EXAMPLE_SOURCE}```

```python
{EXAMPLE_LAUNCHER}```

Notes: uses expf for accuracy.
"""

# Structurally complete, but NVRTC would reject it (a missing semicolon): still a candidate.
BROKEN_SOURCE = """extern "C" __global__ void relu_f32(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x
    if (i < n) out[i] = fmaxf(x[i], 0.0f);
}
"""
BROKEN_LAUNCHER = """def launch(kernels, *args, **kwargs):
    (x,) = args
    out = torch.empty_like(x)
    n = x.numel()
    kernels.relu_f32(((n + 255) // 256,), (256,), x, out, np.int32(n))
    return out
"""
BROKEN_CODE_REPLY = f"""Approach: grid-stride relu
```cu
{BROKEN_SOURCE}```
```py
{BROKEN_LAUNCHER}```
"""

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
    candidate = candidate or Candidate(EXAMPLE_SOURCE, EXAMPLE_LAUNCHER, meta)
    return NodeView(id=node_id, action=action, candidate=candidate, outcome=outcome)


def request(action: Action = Action.NEW, parent: NodeView | None = None,
            lineage: list[NodeView] | None = None, **fields) -> ProposalRequest:
    return ProposalRequest(card=softmax_card(), action=action, gpu=h200(), parent=parent,
                           lineage=lineage or ([parent] if parent else []), **fields)
