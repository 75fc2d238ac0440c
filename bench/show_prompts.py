"""Print the complete prompts kforge's LLM agent sends for three realistic op cards, built by its
own prompt builder on the CPU: a new approach for a group_norm card, a refine of a working
softmax kernel, and a new approach for a fusion-region card (a Llama-style RMSNorm chain). The
system prompt is printed once, then each user prompt. docs/llm.md quotes the output.

    .venv/bin/python bench/show_prompts.py > prompts.md
"""

from __future__ import annotations

from kforge.core.candidate import Baseline, Candidate, EvalOutcome, EvalStatus, Timing
from kforge.core.gpu import GpuInfo
from kforge.core.mcts import Action
from kforge.core.opcard import OpCard
from kforge.core.outcome import CompileFacts, CounterFigures, LaunchCounters
from kforge.core.protocols import NodeView, ProposalRequest
from kforge.core.region import Region
from kforge.propose.llm.prompt import (
    EXAMPLE_PLAN,
    EXAMPLE_SOURCE,
    SYSTEM_PROMPT,
    user_prompt,
)
from kforge.runtime.regions import register
from kforge_tui.demo.recording import tensor  # an arg spec of a contiguous tensor

H200 = GpuInfo(name="NVIDIA H200", arch="sm_90", sm_count=132, memory_gb=141.0, l2_mb=50.0,
               bandwidth_gbs=4300.0, smem_per_block_kb=48.0, smem_per_block_optin_kb=227.0,
               smem_per_sm_kb=228.0, regs_per_sm=65536, regs_per_block=65536,
               max_threads_per_sm=2048, max_blocks_per_sm=32, sm_clock_mhz=1980,
               mem_clock_mhz=3201, bus_width_bits=6144, cluster_launch=True, tensor_maps=True)


def timing(us: float) -> Timing:
    return Timing(us, us * 0.98, us * 1.03, 200)


def baseline(eager_us: float, compiled_us: float, floor_us: float,
             kernels: list[tuple[str, float]]) -> Baseline:
    return Baseline(eager=timing(eager_us), compiled=timing(compiled_us), floor_us=floor_us,
                    eager_kernels=[{"name": name, "us": us, "calls": 1} for name, us in kernels])


def group_norm_request() -> ProposalRequest:
    """A diffusion UNet's GroupNorm: 32 groups over 512 channels of a 64x64 bfloat16 image."""
    card = OpCard(op="aten.native_group_norm.default",
                  args=[tensor([2, 512, 64, 64]), tensor([512]), tensor([512]), 2, 512, 4096, 32,
                        1e-06],
                  calls=30, total_us=1710.0, share=0.041, eager_us=57.0, compiled_us=41.0,
                  floor_us=15.6)
    base = baseline(57.0, 41.0, 15.6, [
        ("void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<c10::BFloat16>"
         "(long, float, c10::BFloat16 const*, float*, float*)", 21.0),
        ("void at::native::(anonymous namespace)::ComputeFusedParamsCUDAKernel<c10::BFloat16>"
         "(long, long, long, float const*, float const*, c10::BFloat16 const*, "
         "c10::BFloat16 const*, float*, float*)", 2.1),
        ("void at::native::elementwise_kernel<128, 2, ...>(int, ...)", 31.5)])
    return ProposalRequest(card=card, action=Action.NEW, gpu=H200, baseline=base, seed=1)


def softmax_request() -> ProposalRequest:
    """A refine of a working one-block-per-row softmax over an LLM's vocabulary-sized rows."""
    card = OpCard(op="aten._softmax.default", args=[tensor([8192, 4096]), -1, False], calls=24,
                  total_us=2760.0, share=0.059, eager_us=115.0, compiled_us=148.0, floor_us=31.2)
    outcome = EvalOutcome(
        status=EvalStatus.OK, speedup=1.31, timing=timing(87.8), eager=timing(115.0),
        bandwidth_gbs=1530.0, floor_fraction=31.2 / 87.8,
        compile_log="ptxas info    : Used 18 registers, 128 bytes smem, used 1 barriers",
        compile=CompileFacts(registers={"softmax_rows_bf16": 18}, spills=False),
        counters=CounterFigures("CUPTI range profiler", kernels=(LaunchCounters(
            "softmax_rows_bf16", duration_ns=86900, dram_read_bytes=67_400_000,
            dram_write_bytes=67_100_000, dram_gbs=1548.0, dram_peak_pct=36.0,
            occupancy_pct=71.0, sm_peak_pct=44.0, l2_hit_pct=49.0),)))
    meta = {"proposer": "llm", "model": "kernel-writer",
            "approach": "one block per row, two-pass reductions"}
    parent = NodeView(id=7, action=Action.NEW,
                      candidate=Candidate(EXAMPLE_SOURCE, plan=EXAMPLE_PLAN, meta=meta),
                      outcome=outcome)
    base = baseline(115.0, 148.0, 31.2, [
        ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::BFloat16, float, "
         "c10::BFloat16, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>"
         "(c10::BFloat16*, c10::BFloat16 const*, int)", 113.0)])
    return ProposalRequest(card=card, action=Action.REFINE, gpu=H200, parent=parent,
                           lineage=[parent], tried=[meta], best=parent, baseline=base, seed=2,
                           failed=["vectorised 16-byte loads: mismatch: output 0 differs at 412 "
                                   "of 33554432 elements"])


def rms_norm_region() -> dict:
    """The chain a Llama-style RMSNorm runs in eager PyTorch: cast to float32, mean of squares,
    rsqrt, scale, cast back, times the weight."""
    def ref(name: str) -> dict:
        return {"t": "ref", "v": name}

    def node(op: str, *args: object, **kwargs: object) -> dict:
        return {"op": op, "args": list(args), "kwargs": kwargs}

    return {
        "inputs": [tensor([4, 2048, 4096]), tensor([4096])],
        "nodes": [node("aten._to_copy.default", ref("x0"), dtype={"t": "dtype", "v": "float32"}),
                  node("aten.pow.Tensor_Scalar", ref("n0"), 2),
                  node("aten.mean.dim", ref("n1"), [-1], True),
                  node("aten.add.Tensor", ref("n2"), 1e-06),
                  node("aten.rsqrt.default", ref("n3")),
                  node("aten.mul.Tensor", ref("n0"), ref("n4")),
                  node("aten._to_copy.default", ref("n5"), dtype={"t": "dtype", "v": "bfloat16"}),
                  node("aten.mul.Tensor", ref("x1"), ref("n6"))],
        "outputs": ["n7"],
    }


def region_request() -> ProposalRequest:
    region = rms_norm_region()
    found = Region.from_dict(region)
    register(found)  # the region's operator, so its outputs can be found on meta tensors
    card = OpCard(op=found.op, args=list(found.inputs), region=region, calls=65,
                  total_us=9100.0, share=0.11, eager_us=140.0, compiled_us=46.0, floor_us=16.9)
    return ProposalRequest(card=card, action=Action.NEW, gpu=H200, seed=3)


def main() -> None:
    print("### The system prompt (the same for every request)\n")
    print(f"````text\n{SYSTEM_PROMPT.rstrip()}\n````")
    for title, request in (("a group_norm card, a new approach", group_norm_request()),
                           ("a softmax card, a refine of a working kernel", softmax_request()),
                           ("a region card (RMSNorm), a new approach", region_request())):
        print(f"\n### The user prompt for {title}\n")
        print(f"````text\n{user_prompt(request).rstrip()}\n````")


if __name__ == "__main__":
    main()
