"""The prompts sent to the model: a fixed system prompt teaching the candidate format, and a user
prompt describing one request (the op card, the GPU, the parent kernel and what the search learned).

Pure text building: the same request always gives the same prompt.
"""

from __future__ import annotations

import json

from kforge.core.candidate import EvalOutcome, EvalStatus
from kforge.core.gpu import GpuInfo
from kforge.core.mcts import Action
from kforge.core.opcard import OpCard, is_contiguous
from kforge.core.protocols import NodeView, ProposalRequest
from kforge.propose.llm.text import head_and_tail, one_line

COMPILE_LOG_CHARS = 6000  # a repair needs the first errors; later ones are mostly knock-on
REPORT_CHARS = 1500  # ptxas' register and spill report of a working kernel
CORRECTNESS_CHARS = 3000
SUMMARY_CHARS = 200
LIST_ITEMS = 20  # entries shown of the tried and failed lists

EXAMPLE_SOURCE = r"""// Warp-level reductions with shuffles: every lane ends with the result.
__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(~0u, v, offset));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(~0u, v, offset);
    return v;
}

// Block-wide reduction; every thread gets the result. `scratch` holds one float per warp.
template <bool IS_MAX>
__device__ float block_reduce(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = IS_MAX ? warp_max(v) : warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? scratch[lane] : (IS_MAX ? -INFINITY : 0.0f);
    v = IS_MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();  // scratch is reused by the next reduction
    return v;
}

// One block per row of a contiguous [rows, cols] float tensor.
extern "C" __global__ void softmax_rows_f32(const float* __restrict__ x, float* __restrict__ out,
                                            int rows, int cols) {
    __shared__ float scratch[32];
    if (blockIdx.x >= rows) return;
    const float* in = x + (long long)blockIdx.x * cols;
    float* dst = out + (long long)blockIdx.x * cols;
    float row_max = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) row_max = fmaxf(row_max, in[c]);
    row_max = block_reduce<true>(row_max, scratch);
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(in[c] - row_max);
    const float inv_sum = 1.0f / block_reduce<false>(sum, scratch);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = expf(in[c] - row_max) * inv_sum;
}
"""

EXAMPLE_LAUNCHER = """def launch(kernels, *args, **kwargs):
    x, dim, half_to_float = args  # exactly the aten op's arguments
    cols = x.shape[-1]
    rows = x.numel() // cols
    out = torch.empty_like(x)
    kernels.softmax_rows_f32((rows,), (256,), x, out, np.int32(rows), np.int32(cols), shared_mem=0)
    return out  # exactly what the aten op returns
"""

REPLY_FORMAT = """Reply with, in this order:
1. one line `Approach: <a few words naming the technique>`;
2. one ```cuda block with the complete CUDA source;
3. one ```python block with the complete launcher.
A few lines of notes may follow. Always send complete code, never a diff or an excerpt."""

SYSTEM_PROMPT = f"""You are an expert CUDA performance engineer. You write a kernel that replaces one \
PyTorch aten operator call, for the exact shapes, dtypes and strides given, on the GPU described. \
It must compute exactly what the operator computes, and be as fast as the hardware allows.

# The candidate format
A candidate has two parts.

CUDA source, compiled with NVRTC for the GPU's architecture:
- Kernels the launcher calls are declared `extern "C" __global__`. Templates are fine inside; \
instantiate them through `extern "C"` wrappers.
- Do not #include anything. A prelude already includes cuda_fp16.h and cuda_bf16.h and defines \
INFINITY, NAN, FLT_MAX, FLT_MIN and the fixed-width integer types (int32_t, uint64_t, ...).
- half is `__half` (__half2float, __float2half), bfloat16 is `__nv_bfloat16` (__bfloat162float, \
__float2bfloat16). Accumulate reductions of half and bfloat16 data in float.

Python launcher, defining `launch(kernels, *args, **kwargs)`:
- It receives exactly the aten operator's arguments and returns exactly what the operator returns: \
a tensor or tuple of tensors with eager PyTorch's shapes, dtypes and strides.
- `torch`, `np` (numpy) and `math` are already in scope; do not import anything.
- `kernels.NAME(grid, block, *params, shared_mem=0)` launches kernel NAME on PyTorch's current \
stream; grid and block are an int or a tuple of up to 3 ints. A tensor parameter is passed as its data \
pointer (storage offset included). Scalars must be numpy scalars of the width the kernel declares \
(np.int32, np.int64, np.uint32, np.float32, np.float64); a bare Python int or float is refused.
- It may only allocate (torch.empty, empty_like, empty_strided, new_empty), read metadata (shape, \
stride(), dtype, numel(), is_contiguous()) and make views. Any other torch operation (.contiguous() \
on a non-contiguous tensor, copy_, fill_, zero_, matmul, torch.nn.functional) and any vendor library \
is refused at run time. No state kept between calls, no threads, no other streams.

# How the candidate is judged
It must match eager PyTorch on the captured inputs and on fresh random inputs, at per-dtype \
tolerances, with NaN and Inf in the same places. Outputs are filled with garbage before each run, so \
write every output element. Inputs must stay unchanged. Then it is timed against eager PyTorch; a time \
below the physical floor (the memory traffic at the measured bandwidth) is treated as cheating.

# Reply format
{REPLY_FORMAT}

# Example
Task: aten._softmax.default with arguments f32[8192,4096], -1, False (contiguous).
Reply:
Approach: one block per row, two passes with warp-shuffle reductions

```cuda
{EXAMPLE_SOURCE}```

```python
{EXAMPLE_LAUNCHER}```
"""

_INSTRUCTIONS = {
    Action.NEW: (
        "Write a new kernel for this operator, with an approach different from those already tried "
        "or failed (listed below). Correctness comes first; then speed: aim for the physical floor."),
    Action.REFINE: (
        "Make the parent kernel below faster while keeping its output the same. Study its metrics and "
        "compiler report and change what limits it: the width of memory accesses, the number of "
        "passes over memory, occupancy, synchronisation, work per thread. Name the change in the "
        "Approach line."),
    Action.REPAIR: (
        "The parent kernel below failed. Fix the cause shown in its log with the smallest change that "
        "does it, keeping its approach unless that approach cannot work."),
}

_REPAIR_HINTS = {
    EvalStatus.COMPILE_ERROR: "NVRTC rejected the source: fix every error in the compiler log.",
    EvalStatus.LAUNCH_ERROR: (
        "The launcher raised or a launch was refused: check that scalars are numpy scalars of the "
        "declared width, the grid and block limits (at most 1024 threads a block, 48 KB of shared "
        "memory without opting in), and that it only allocates, reads metadata and makes views."),
    EvalStatus.CRASH: (
        "The kernel crashed the CUDA context (an out-of-bounds or misaligned access, or a trap): check "
        "every index against its bound and the alignment of vector loads and stores."),
    EvalStatus.TIMEOUT: (
        "The kernel never finished: look for a loop that does not end or a __syncthreads() that not "
        "every thread of the block reaches."),
    EvalStatus.MISMATCH: (
        "The output differs from eager PyTorch where the summary below says: check the maths, the "
        "precision (accumulate in float), the tensor strides and that every output element is written."),
}


def effective_action(request: ProposalRequest) -> Action:
    """The request's action, or NEW when a refine or repair comes without a parent kernel."""
    if request.action in (Action.REFINE, Action.REPAIR) and (
            request.parent is None or request.parent.candidate is None):
        return Action.NEW
    return request.action


def build_messages(request: ProposalRequest) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": user_prompt(request)}]


def render_messages(messages: list[dict[str, str]]) -> str:
    """The prompt as one text, for the record of the call."""
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)


def user_prompt(request: ProposalRequest) -> str:
    action = effective_action(request)
    sections = [f"# Task: {action.value}\n{_INSTRUCTIONS[action]}",
                card_section(request.card), gpu_section(request.gpu)]
    parent = request.parent if action is not Action.NEW else None
    if parent is not None:
        sections.append(node_section(parent, repair=action is Action.REPAIR))
    if request.lineage:
        sections.append(lineage_section(request.lineage))
    if request.best is not None and (parent is None or request.best.id != parent.id):
        sections.append(f"# Best so far for this operator\nnode {request.best.id}: "
                        f"{node_label(request.best)}; {describe_outcome(request.best.outcome)}")
    if tried := _tried_lines(request.tried):
        sections.append("# Already tried for this operator (do not repeat)\n" + tried)
    if request.failed:
        failed = request.failed[-LIST_ITEMS:]
        sections.append("# Approaches that failed for this operator\n"
                        + "\n".join(f"- {one_line(f, SUMMARY_CHARS)}" for f in failed))
    sections.append("# Your reply\n" + REPLY_FORMAT)
    return "\n\n".join(sections) + "\n"


def card_section(card: OpCard) -> str:
    lines = ["# The operator", f"op: {card.op}", f"call: {card.op}({card.signature})"]
    tensors = list(_tensor_args(card))
    if tensors:
        lines.append("tensor arguments:")
        for path, spec in tensors:
            layout = "contiguous" if is_contiguous(spec["shape"], spec["stride"]) else "NOT contiguous"
            lines.append(f"- {path}: {spec['dtype']}, shape {list(spec['shape'])}, stride "
                         f"{list(spec['stride'])}, storage offset {spec.get('offset', 0)}, {layout}")
    lines.append(f"per model run: {card.calls} call{'s' if card.calls != 1 else ''}, "
                 f"{card.share:.1%} of the model's operator time")
    lines.append(f"eager PyTorch: {_us(card.eager_us)} per call; torch.compile: "
                 f"{_us(card.compiled_us)}; physical floor: {_us(card.floor_us)}")
    lines.append("The kernel serves exactly these shapes, dtypes and strides; "
                 "it may specialise for them.")
    return "\n".join(lines)


def gpu_section(gpu: GpuInfo) -> str:
    facts = [f"{gpu.sm_count} SMs" if gpu.sm_count else "",
             f"{gpu.memory_gb:g} GB memory" if gpu.memory_gb else "",
             f"{gpu.l2_mb:g} MB L2" if gpu.l2_mb else "",
             f"measured copy bandwidth {gpu.bandwidth_gbs:.0f} GB/s" if gpu.bandwidth_gbs else ""]
    details = ", ".join(f for f in facts if f)
    return f"# The GPU\n{gpu.name}, architecture {gpu.arch}" + (f": {details}" if details else "")


def node_section(node: NodeView, repair: bool) -> str:
    """The parent kernel: its result, the logs a repair or refine needs, and its code."""
    assert node.candidate is not None
    lines = [f"# The parent kernel (node {node.id}, {node.action.value})",
             f"approach: {node_label(node)}", f"result: {describe_outcome(node.outcome)}"]
    outcome = node.outcome
    if repair and outcome is not None:
        if hint := _REPAIR_HINTS.get(outcome.status):
            lines.append(hint)
        if outcome.compile_log.strip():
            lines.append(_fenced("compiler log", "text",
                                 head_and_tail(outcome.compile_log, COMPILE_LOG_CHARS)))
        if outcome.correctness:
            details = json.dumps(outcome.correctness, indent=1, sort_keys=True, default=str)
            lines.append(_fenced("correctness details", "json",
                                 head_and_tail(details, CORRECTNESS_CHARS)))
    elif outcome is not None and outcome.compile_log.strip():
        report = head_and_tail(outcome.compile_log, REPORT_CHARS)
        lines.append(_fenced("compiler report", "text", report))
    lines.append(f"```cuda\n{node.candidate.source.rstrip()}\n```")
    lines.append(f"```python\n{node.candidate.launcher.rstrip()}\n```")
    return "\n".join(lines)


def lineage_section(lineage: list[NodeView]) -> str:
    """The ancestors, oldest first, each marked as an improvement or regression over the last
    working one before it."""
    lines = ["# How this line of kernels evolved (oldest first)"]
    previous: float | None = None
    for node in lineage:
        lines.append(f"- node {node.id} ({node.action.value}) {node_label(node)}: "
                     f"{describe_outcome(node.outcome)}{_trend(node.speedup, previous)}")
        previous = node.speedup if node.speedup is not None else previous
    return "\n".join(lines)


def _trend(speedup: float | None, previous: float | None) -> str:
    if speedup is None or previous is None:
        return ""
    if speedup == previous:
        return " (no change)"
    return " (improvement)" if speedup > previous else " (regression)"


def describe_outcome(outcome: EvalOutcome | None) -> str:
    if outcome is None:
        return "not evaluated"
    if not outcome.ok:
        summary = one_line(outcome.summary, SUMMARY_CHARS)
        return f"{outcome.status.value}" + (f": {summary}" if summary else "")
    parts = [f"ok, {outcome.speedup:.2f}x over eager" if outcome.speedup is not None else "ok"]
    if outcome.timing is not None:
        t = outcome.timing
        parts.append(f"{_us(t.median_us)} per call (p10 {_us(t.p10_us)}, p90 {_us(t.p90_us)})")
    if outcome.bandwidth_gbs is not None:
        parts.append(f"{outcome.bandwidth_gbs:.0f} GB/s")
    if outcome.floor_fraction is not None:
        parts.append(f"runs at {outcome.floor_fraction:.0%} of the physical floor's speed")
    return ", ".join(parts)


def node_label(node: NodeView) -> str:
    return _approach(node.candidate.meta) if node.candidate is not None else "(no code)"


def _approach(meta: dict) -> str:
    """A short name for what produced a candidate: an LLM's approach, or the library's family,
    variant and parameters."""
    name = str(meta.get("approach") or meta.get("family") or "unnamed")
    if meta.get("family") and meta.get("approach"):
        name = f"{meta['family']}/{meta['approach']}"
    if isinstance(params := meta.get("params"), dict) and params:
        name += " " + " ".join(f"{k}={v}" for k, v in sorted(params.items()))
    return f'"{one_line(name, SUMMARY_CHARS)}"'


def _tried_lines(tried: list[dict]) -> str:
    labels = list(dict.fromkeys(_approach(meta) for meta in tried))
    return "\n".join(f"- {label}" for label in labels[-LIST_ITEMS:])


def _tensor_args(card: OpCard):
    """(where, tensor spec) for each tensor argument, e.g. ``args[0]`` or ``kwargs['weight']``."""

    def walk(path: str, spec):
        if isinstance(spec, dict) and spec.get("t") == "tensor":
            yield path, spec
        elif isinstance(spec, dict) and spec.get("t") == "list":
            for i, item in enumerate(spec["items"]):
                yield from walk(f"{path}[{i}]", item)

    for i, spec in enumerate(card.args):
        yield from walk(f"args[{i}]", spec)
    for name, spec in sorted(card.kwargs.items()):
        yield from walk(f"kwargs[{name!r}]", spec)


def _fenced(title: str, tag: str, body: str) -> str:
    return f"{title}:\n```{tag}\n{body}\n```"


def _us(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.3g} us"
