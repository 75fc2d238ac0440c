"""The prompts sent to the model: a fixed system prompt teaching the candidate format (CUDA source
and launch plan), and a user prompt describing one request (the op card as a plan sees it, what
the op computes, eager's own kernels, the GPU and its limits, the parent kernel with the evidence
of its failure or its profile, and what the search learned).

Pure text building: the same request always gives the same prompt.
"""

from __future__ import annotations

import json

from kforge.core.argspec import is_contiguous, resolve_op
from kforge.core.candidate import EvalOutcome, EvalStatus
from kforge.core.gpu import NO_GPU, GpuInfo
from kforge.core.launch_plan import ArgValue, TensorMeta
from kforge.core.mcts import Action
from kforge.core.opcard import OpCard
from kforge.core.protocols import NodeView, ProposalRequest
from kforge.core.report import CORRECTNESS, EVIDENCE, outcome_sections, section
from kforge.core.text import head_and_tail, one_line
from kforge.propose.llm.feedback import eager_section
from kforge.propose.llm.variant import variant_view
from kforge.propose.semantics import op_meaning

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

// One block per row of a contiguous [rows, cols] bfloat16 tensor, accumulating in float.
extern "C" __global__ void softmax_rows_bf16(const __nv_bfloat16* __restrict__ x,
                                             __nv_bfloat16* __restrict__ out, int rows, int cols) {
    __shared__ float scratch[32];
    if (blockIdx.x >= rows) return;
    const __nv_bfloat16* in = x + (long long)blockIdx.x * cols;
    __nv_bfloat16* dst = out + (long long)blockIdx.x * cols;
    float row_max = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        row_max = fmaxf(row_max, __bfloat162float(in[c]));
    row_max = block_reduce<true>(row_max, scratch);
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        sum += expf(__bfloat162float(in[c]) - row_max);
    const float inv_sum = 1.0f / block_reduce<false>(sum, scratch);
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        dst[c] = __float2bfloat16(expf(__bfloat162float(in[c]) - row_max) * inv_sum);
}
"""

EXAMPLE_PLAN = {
    "let": {"cols": "self.shape[-1]", "rows": "self.numel // cols"},
    "requires": ["self.dtype == 'bfloat16'", "self.is_contiguous", "self.numel > 0",
                 "dim == -1 or dim == self.dim - 1", "not half_to_float"],
    "outputs": [{"name": "out", "like": "self"}],
    "launches": [{"kernel": "softmax_rows_bf16", "grid": ["rows"], "block": [256],
                  "params": [{"ptr": "self"}, {"ptr": "out"}, {"i32": "rows"}, {"i32": "cols"}]}],
}


def plan_json(plan: dict) -> str:
    """A plan as compact JSON for a prompt: one line per field, and per item of a list of
    objects (outputs, scratch buffers, launches)."""

    def compact(value: object) -> str:
        return json.dumps(value, separators=(", ", ": "))

    fields = []
    for key, value in plan.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            items = ",\n".join(f"    {compact(v)}" for v in value)
            fields.append(f"  {compact(key)}: [\n{items}\n  ]")
        else:
            fields.append(f"  {compact(key)}: {compact(value)}")
    return "{\n" + ",\n".join(fields) + "\n}"


REPLY_FORMAT = """Reply with, in this order:
1. one line `Approach: <a few words naming the technique>`;
2. one ```cuda block with the complete CUDA source;
3. one ```json block with the complete launch plan.
A few lines of notes may follow. Always send the complete source and plan, never a diff or an \
excerpt."""

PLAN_FORMAT = """The launch plan is a JSON object that kforge checks and interprets itself: no \
host code of yours runs. It covers exactly the variant shown (shapes, dtypes, strides, scalar \
arguments) and is evaluated once for it. Arguments are named by the operator's schema (shown in \
the task: `self`, `dim`, `weight`, `eps`, ...). Unknown fields are errors.
- "let": {"name": expr, ...}, evaluated in order; each may use arguments and earlier lets, and \
may not reuse an argument's name.
- "requires": [bool expr, ...]: every assumption your kernels make (dtype, contiguity, the \
reduced dimension, sizes that divide evenly). If one is false the candidate is not used. Order \
them so that later ones only matter where earlier ones hold.
- "outputs": what the op returns, in its return order, each one of
  {"name": N, "like": ARG}: a new tensor with tensor argument ARG's shape, dtype and (dense) \
strides;
  {"name": N, "shape": [expr, ...], "dtype": "float32", "stride": [expr, ...]}: a new tensor; \
"dtype" is a dtype name or an expression such as "self.dtype"; "stride" is optional \
(default contiguous);
  {"name": N, "arg": ARG}: the op returns tensor argument ARG itself (in-place ops, out= variants).
  New outputs must have eager's shapes, dtypes and strides (shown in the task).
- "scratch": [{"name": N, "bytes": expr, "zero": true}, ...]: global memory for one call, \
16-byte aligned; "zero": true zero-fills it first.
- "launches": 1 to 64 launches, run in order on one stream, each {"kernel": NAME, \
"grid": [expr, ...], "block": [expr, ...], "shared_mem": expr, "params": [...]}: 1 to 3 grid and \
block dimensions (missing ones are 1), dynamic shared memory in bytes (default 0). Optionally \
"align": A with "unaligned_kernel": NAME2: on a call where a pointer parameter of the launch is \
not a multiple of A bytes, NAME2 runs instead.
- "params": the kernel's parameters in order, each an object with one key: {"ptr": NAME} for a \
tensor argument, output or scratch buffer (an element of a list argument: "tensors[1]"; an \
optional argument that is None passes a null pointer), or a scalar typed as the kernel declares \
it: "i32" (int), "u32" (unsigned), "i64" (long long, int64_t), "u64", "f32" (float), "f64" \
(double), "bool", e.g. {"i32": "rows"}.
- "returns": "single" (the default for one output), "tuple" (the default for several) or "list".

Expressions are strings (a JSON number is fine too) in a small closed grammar:
- literals: ints, floats, True, False, None, 'strings' (to compare with dtype names); names: the \
arguments and lets;
- tensor attributes, without (): x.shape[i], x.stride[i] (negative i counts from the end), \
x.numel, x.dim, x.itemsize, x.offset (storage offset in elements), x.is_contiguous, x.dtype (a \
name such as 'bfloat16'); list arguments index as normalized_shape[0] or tensors[1].shape[0];
- operators: + - * // % and / (gives a float), unary -, not, and, or, == != < <= > >= \
(chainable), is None, is not None, a if cond else b;
- functions: min, max, abs, ceil_div(a, b), len(list), defined(x) (x is not None);
- types are strict: conditions need bools; grid, block, sizes, strides and byte counts need ints \
(write cols // 4, not cols / 4);
- nothing else: no **, no bit operators, no method calls or other attributes and functions, no \
imports, comprehensions or list literals.

Limits: at most 1024 threads per block, block at most (1024, 1024, 64), grid at most \
(2^31-1, 65535, 65535), shared memory at most 227 KiB (above 48 KiB is opted into for you), \
scalars within their type's range. A plan breaking a rule is refused with the path of the field at \
fault, such as `launches[0].grid[0]`."""

SYSTEM_PROMPT = f"""You are an expert CUDA performance engineer. You write a kernel that replaces one \
PyTorch aten operator call, for the exact shapes, dtypes and strides given, on the GPU described. \
It must compute exactly what the operator computes, and be as fast as the hardware allows.

# The candidate format
A candidate has two parts: CUDA source and a launch plan.

CUDA source, compiled with NVRTC for the GPU's architecture:
- Kernels the plan launches are declared `extern "C" __global__`. Templates are fine inside; \
instantiate them through `extern "C"` wrappers.
- Do not #include anything. A prelude already includes cuda_fp16.h and cuda_bf16.h and defines \
INFINITY, NAN, FLT_MAX, FLT_MIN and the fixed-width integer types (int32_t, uint64_t, ...).
- half is `__half` (__half2float, __float2half), bfloat16 is `__nv_bfloat16` (__bfloat162float, \
__float2bfloat16). Accumulate reductions of half and bfloat16 data in float.
- A tensor parameter points at the tensor's first element (storage offset included); index it \
with the strides shown.

{PLAN_FORMAT}

# How the candidate is judged
It must match eager PyTorch on the captured inputs and on fresh random inputs, at per-dtype \
tolerances, with NaN and Inf in the same places. Outputs are filled with garbage before each run, so \
write every output element. Inputs must stay unchanged. Then it is timed against eager PyTorch; a time \
below the physical floor (the memory traffic at the measured bandwidth) is treated as cheating.

# Reply format
{REPLY_FORMAT}

# Example
Task: aten._softmax.default, schema aten::_softmax(Tensor self, int dim, bool half_to_float) -> \
Tensor, with self a contiguous bfloat16 tensor of shape [8192, 4096], dim = -1, \
half_to_float = False; eager returns bfloat16 [8192, 4096] with stride [4096, 1].
Reply:
Approach: one block per row, two passes with warp-shuffle reductions

```cuda
{EXAMPLE_SOURCE}```

```json
{plan_json(EXAMPLE_PLAN)}
```
"""

_INSTRUCTIONS = {
    Action.NEW: (
        "Write a new kernel for this operator, with an approach different from those already tried "
        "or failed (listed below). Correctness comes first; then speed: aim for the physical floor."),
    Action.REFINE: (
        "Make the parent kernel below faster while keeping its output the same. Study its metrics and "
        "compiler report and change what limits it: the width of memory accesses, the number of "
        "passes over memory, occupancy, synchronisation, work per thread, the launch "
        "configuration. Name the change in the Approach line."),
    Action.REPAIR: (
        "The parent kernel below failed. Fix the cause shown in its log with the smallest change that "
        "does it, keeping its approach unless that approach cannot work."),
}

_REPAIR_HINTS = {
    EvalStatus.COMPILE_ERROR: "NVRTC rejected the source: fix every error in the compiler log.",
    EvalStatus.LAUNCH_ERROR: (
        "The launch plan was refused or a launch failed: the summary names the plan field at "
        "fault. Check that every kernel the plan launches is declared extern \"C\" __global__, that the "
        "params match the kernel's parameters in number and width (ptr for pointers, i32 for int, "
        "i64 for long long, f32 for float), and the grid, block and shared memory limits."),
    EvalStatus.CRASH: (
        "The kernel crashed the CUDA context (an out-of-bounds or misaligned access, or a trap): check "
        "every index against its bound, the alignment of vector loads and stores, and that the "
        "plan's grid, block and scratch sizes match what the kernel assumes."),
    EvalStatus.TIMEOUT: (
        "The kernel never finished: look for a loop that does not end or a __syncthreads() that not "
        "every thread of the block reaches."),
    EvalStatus.MISMATCH: (
        "The output differs from eager PyTorch where the summary below says: check the maths, the "
        "precision (accumulate in float), the tensor strides, that every output element is "
        "written, and that the plan's outputs have eager's shapes, dtypes and strides."),
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
                card_section(request.card)]
    sections += [s for s in (meaning_section(request.card), eager_section(request.baseline))
                 if s is not None]
    sections.append(gpu_section(request.gpu))
    parent = request.parent if action is not Action.NEW else None
    if parent is not None:
        sections.append(node_section(parent, repair=action is Action.REPAIR, gpu=request.gpu))
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
    """The operator, its arguments by the names a plan uses, eager's outputs and the times.
    Raises KforgeError when the arguments cannot be given to a plan (see ``variant_view``)."""
    view = variant_view(card)
    lines = ["# The operator", f"op: {card.op}"]
    if view.region_source is None:
        lines.append(f"schema: {view.schema}")
    else:
        lines += ["This operator is a chain of aten ops, fused into one: it computes this "
                  "function, which the kernel replaces whole (intermediate values need not be "
                  "kept):", f"```python\n{view.region_source}\n```"]
    lines += [f"call: {card.op}({card.signature})",
              "arguments, by the schema names the plan uses:"]
    for name, value in view.arguments.items():
        lines += _argument_lines(name, value)
    if view.outputs is None:
        lines.append(f"eager's outputs could not be derived ({view.outputs_note}): follow the "
                     "schema's return type")
    else:
        lines.append("eager returns (the plan's outputs, in this order):")
        names = output_names(card)
        lines += [f"- output {i}{f' ({names[i]})' if i < len(names) else ''}: {t.dtype}, "
                  f"shape {list(t.shape)}, stride {list(t.stride)}"
                  for i, t in enumerate(view.outputs)]
    lines.append(f"per model run: {card.calls} call{'s' if card.calls != 1 else ''}, "
                 f"{card.share:.1%} of the model's operator time")
    lines.append(f"eager PyTorch: {_us(card.eager_us)} per call; torch.compile: "
                 f"{_us(card.compiled_us)}; physical floor: {_us(card.floor_us)}")
    lines.append("The kernel serves exactly these shapes, dtypes and strides; "
                 "it may specialise for them.")
    return "\n".join(lines)


def _argument_lines(name: str, value: ArgValue) -> list[str]:
    """One line per argument, and per tensor of a list argument."""
    if isinstance(value, TensorMeta):
        contiguous = is_contiguous(list(value.shape), list(value.stride))
        return [f"- {name}: tensor {value.dtype}, shape {list(value.shape)}, stride "
                + f"{list(value.stride)}, storage offset {value.offset}, "
                + ("contiguous" if contiguous else "NOT contiguous")]
    if isinstance(value, tuple) and any(isinstance(item, TensorMeta) for item in value):
        return [line for i, item in enumerate(value)
                for line in _argument_lines(f"{name}[{i}]", item)]
    return [f"- {name} = {_literal(value)}"]


def _literal(value: ArgValue) -> str:
    """A value as a plan expression writes it (lists with brackets)."""
    if isinstance(value, tuple):
        return "[" + ", ".join(_literal(item) for item in value) + "]"
    return repr(value)


def output_names(card: OpCard) -> list[str]:
    """The names of an op's outputs: the schema's where it names them, else the op semantics'
    (``native_group_norm`` returns out, mean, rstd); none for a region card."""
    if card.region is not None:
        return []
    names = [r.name for r in resolve_op(card.op)._schema.returns]
    if names and all(names):
        return names
    meaning = op_meaning(card.op)
    return list(meaning.returns) if meaning is not None else []


def meaning_section(card: OpCard) -> str | None:
    """What the operator computes (the op family's statement), or for a region card, what each
    aten op of its chain computes."""
    if card.region is not None:
        families: dict[str, tuple[str, list[str], list[str]]] = {}  # statement, ops, notes
        for op in dict.fromkeys(node["op"] for node in card.region["nodes"]):
            if (m := op_meaning(op)) is not None:
                _, ops, notes = families.setdefault(m.family, (m.meaning, [], []))
                ops.append(op)
                notes += [f"{op}: {m.note}"] if m.note else []
        if not families:
            return None
        return "# What the chain's ops compute\n" + "\n".join(
            f"- {', '.join(ops)}: {meaning}" + "".join(f"\n  {note}" for note in notes)
            for meaning, ops, notes in families.values())
    meaning = op_meaning(card.op)
    if meaning is None:
        return None
    lines = ["# What the operator computes", meaning.meaning]
    if meaning.note:
        lines.append(meaning.note)
    return "\n".join(lines)


def gpu_section(gpu: GpuInfo) -> str:
    """The GPU: its size, the limits a kernel plans around, clocks, memory and what its
    architecture offers."""
    facts = [f"{gpu.sm_count} SMs" if gpu.sm_count else "",
             f"{gpu.memory_gb:g} GB memory" if gpu.memory_gb else "",
             f"{gpu.l2_mb:g} MB L2" if gpu.l2_mb else "",
             f"measured copy bandwidth {gpu.bandwidth_gbs:.0f} GB/s" if gpu.bandwidth_gbs else ""]
    details = ", ".join(f for f in facts if f)
    lines = [f"# The GPU\n{gpu.name}, architecture {gpu.arch}"
             + (f": {details}" if details else "")]
    if gpu.smem_per_sm_kb or gpu.regs_per_sm or gpu.max_threads_per_sm:
        lines.append(f"- per SM: {gpu.smem_per_sm_kb:g} KiB shared memory, {gpu.regs_per_sm} "
                     f"32-bit registers, {gpu.max_threads_per_sm} threads, "
                     f"{gpu.max_blocks_per_sm} blocks at most")
    if gpu.smem_per_block_kb or gpu.regs_per_block:
        lines.append(f"- per block: {gpu.smem_per_block_kb:g} KiB shared memory, up to "
                     f"{gpu.smem_per_block_optin_kb:g} KiB with a plan's shared_mem (opted into "
                     f"for you), {gpu.regs_per_block} registers, 1024 threads")
    if gpu.sm_clock_mhz or gpu.mem_clock_mhz:
        clocks = f"- clocks: SM up to {gpu.sm_clock_mhz} MHz, memory {gpu.mem_clock_mhz} MHz"
        if gpu.bus_width_bits:
            clocks += f" over a {gpu.bus_width_bits}-bit bus"
        if peak := gpu.peak_bandwidth_gbs:
            clocks += f" (theoretical {peak:.0f} GB/s; the measured copy rate is the floor used)"
        lines.append(clocks)
    if gpu.integrated:
        lines.append("- unified memory: an integrated GPU sharing one physical memory (LPDDR) with "
                     "the CPU; tensors live in that shared memory, so DRAM bandwidth is the "
                     "measured copy rate above, far below an HBM GPU's, and every byte saved "
                     "counts" + ("; kernels may also read pageable host memory coherently"
                                 if gpu.pageable_memory_access else ""))
    features = list(gpu.features)
    if gpu.cluster_launch and not any("cluster" in f for f in features):
        features.append("thread block clusters")
    lines += [f"- {feature}" for feature in features]
    return "\n".join(lines)


def node_section(node: NodeView, repair: bool, gpu: GpuInfo = NO_GPU) -> str:
    """The parent kernel: its result, the evidence a repair needs or the profile a refine needs,
    its source and plan."""
    assert node.candidate is not None
    lines = [f"# The parent kernel (node {node.id}, {node.action.value})",
             f"approach: {node_label(node)}", f"result: {describe_outcome(node.outcome)}"]
    outcome = node.outcome
    told = [] if outcome is None else outcome_sections(
        outcome, gpu=gpu, source=node.candidate.source, summary_shown=SUMMARY_CHARS)
    if outcome is not None and outcome.ok:
        lines += section(told, EVIDENCE)
    if repair and outcome is not None:
        if hint := _REPAIR_HINTS.get(outcome.status):
            lines.append(hint)
        if outcome.compile_log.strip():
            lines.append(_fenced("compiler log", "text",
                                 head_and_tail(outcome.compile_log, COMPILE_LOG_CHARS)))
        if not outcome.ok:
            lines += section(told, EVIDENCE)
        for details in section(told, CORRECTNESS):
            lines.append(_fenced("correctness details", "json",
                                 head_and_tail(details, CORRECTNESS_CHARS)))
    elif outcome is not None and outcome.compile_log.strip():
        report = head_and_tail(outcome.compile_log, REPORT_CHARS)
        lines.append(_fenced("compiler report", "text", report))
    lines.append(f"```cuda\n{node.candidate.source.rstrip()}\n```")
    plan = node.candidate.plan
    lines.append(_fenced("launch plan", "json", plan_json(plan)) if plan is not None
                 else "launch plan: none; write one")
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


def _fenced(title: str, tag: str, body: str) -> str:
    return f"{title}:\n```{tag}\n{body}\n```"


def _us(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.3g} us"
