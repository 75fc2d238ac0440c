"""Benchmark the evaluator on ops and shapes taken from real models, and print a table.

For each case: eager and torch.compile times (and compile time), the reference candidate's time
and speedup, the memory floor, NVRTC compile time (cold) and the candidate's full turnaround
(cold compile + verification + timing, median of --reps). Once: torch's load_inline build time
for the same softmax kernel, the path this evaluator avoids.

Run on a GPU machine from the repository root:
    python3 bench/bench_evaluator.py [--reps 3] [--no-load-inline] [--budget-s 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kforge.core.candidate import Candidate
from kforge.core.opcard import OpCard
from kforge.eval.process.local import baseline_local, device_context, evaluate_local
from kforge.runtime.nvrtc import Compiler
from tests.eval import candidates as C

CASES = [
    ("softmax", "Gemma-style attention scores [1,8,2048,2048] bf16",
     OpCard("aten._softmax.default", [C.tensor([1, 8, 2048, 2048], "bfloat16"), -1, False])),
    ("softmax", "Qwen-style attention scores [1,16,1024,1024] bf16",
     OpCard("aten._softmax.default", [C.tensor([1, 16, 1024, 1024], "bfloat16"), -1, False])),
    ("softmax", "[8192,4096] fp32",
     OpCard("aten._softmax.default", [C.tensor([8192, 4096]), -1, False])),
    ("layer_norm", "SD3.5 Medium joint block [2,4096,1536] bf16, no affine",
     OpCard("aten.native_layer_norm.default",
            [C.tensor([2, 4096, 1536], "bfloat16"), [1536], None, None, 1e-6])),
    ("add", "ResNet-50 residual add [32,256,56,56] fp16", C.add_card([32, 256, 56, 56], "float16")),
    ("relu", "ResNet-50 stem relu [32,64,112,112] fp16",
     C.relu_card([32, 64, 112, 112], "float16")),
]

LOAD_INLINE = textwrap.dedent(r'''
    import sys, time
    from torch.utils.cpp_extension import load_inline
    kernel = open(sys.argv[1]).read()
    wrapper = """
    torch::Tensor softmax(torch::Tensor x) {
        auto y = torch::empty_like(x);
        int cols = x.size(-1);
        softmax_plain<<<x.numel() / cols, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), cols);
        return y;
    }
    """
    start = time.perf_counter()
    load_inline(name="kforge_bench_softmax", cpp_sources="torch::Tensor softmax(torch::Tensor x);",
                cuda_sources="#include <torch/extension.h>\n" + kernel + wrapper,
                functions=["softmax"])
    print(f"{time.perf_counter() - start:.2f}")
''')

PLAIN_SOFTMAX = C.REDUCE + r"""
__global__ void softmax_plain(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float red[32];
    const float* row = x + (long long)blockIdx.x * cols;
    float* out = y + (long long)blockIdx.x * cols;
    float m = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
    m = block_max(m, red);
    float s = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(row[c] - m);
    s = block_sum(s, red);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) out[c] = expf(row[c] - m) / s;
}
"""


def cold(candidate: Candidate) -> Candidate:
    """The same candidate with a source no cache has seen."""
    return replace(candidate, source=candidate.source + f"\n// {uuid.uuid4()}\n")


def nvrtc_seconds(compiler: Compiler, source: str, arch: str) -> float:
    result = compiler.compile(source + f"\n// {uuid.uuid4()}\n", arch)
    if not result.ok:
        raise RuntimeError(result.log)
    return result.seconds


def load_inline_seconds(timeout_s: float) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        kernel = Path(tmp) / "kernel.cu"
        kernel.write_text(PLAIN_SOFTMAX)
        env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(Path(tmp) / "ext")}
        try:
            done = subprocess.run([sys.executable, "-c", LOAD_INLINE, str(kernel)], env=env,
                                  capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return f"> {timeout_s:.0f}"
        if done.returncode != 0:
            return "failed: " + (done.stderr.strip().splitlines() or ["?"])[-1][:120]
        return done.stdout.strip().splitlines()[-1]


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="turnarounds measured per case")
    parser.add_argument("--no-load-inline", action="store_true")
    parser.add_argument("--budget-s", type=float, default=300.0,
                        help="stop starting new cases after this many seconds")
    args = parser.parse_args()
    started = time.perf_counter()
    ctx = device_context(0)
    gpu = ctx.gpu
    print(f"GPU: {gpu.name} ({gpu.arch}), {gpu.sm_count} SMs, {gpu.memory_gb} GiB, "
          f"L2 {gpu.l2_mb} MiB, copy {gpu.bandwidth_gbs} GB/s, driver {gpu.driver}, "
          f"torch {gpu.torch}", flush=True)
    evaluate_local(C.softmax_card(), C.softmax())  # warm-up: CUDA, NVRTC, allocator

    nvrtc_plain = nvrtc_seconds(ctx.loader.compiler, PLAIN_SOFTMAX, gpu.arch)
    inline = "skipped" if args.no_load_inline else load_inline_seconds(240)
    print(f"compile the same softmax kernel: NVRTC {nvrtc_plain:.3f} s, torch load_inline "
          f"{inline} s", flush=True)

    rows = []
    for op, what, card in CASES:
        if time.perf_counter() - started > args.budget_s:
            print(f"budget spent: skipping {op} {what}")
            continue
        base = baseline_local(card)
        outcomes = [evaluate_local(card, cold(C.reference(card))) for _ in range(args.reps)]
        failed = [o for o in outcomes if not o.ok]
        if failed:
            print(f"{op} {what}: {failed[0].status} {failed[0].summary}", flush=True)
            continue
        best = min(outcomes, key=lambda o: o.timing.median_us)
        row = {
            "op": op, "shape": what,
            "eager": base.eager.median_us,
            "compiled": base.compiled.median_us if base.compiled else None,
            "compile_s": base.compile_s,
            "cand": best.timing.median_us,
            "spread": best.timing.spread,
            "vs_eager": best.speedup,
            "vs_compiled": base.compiled.median_us / best.timing.median_us if base.compiled else None,
            "floor": base.floor_us,
            "gbs": best.bandwidth_gbs,
            "nvrtc": statistics.median(o.compile.seconds for o in outcomes if o.compile),
            "turnaround": statistics.median(o.wall_s for o in outcomes),
        }
        rows.append(row)
        print(f"{op} {what}: {best.summary}; turnaround {row['turnaround']:.3f} s; "
              f"{base.note}", flush=True)

    header = ("op", "shape", "eager us", "compile us", "compile s", "cand us", "spread",
              "vs eager", "vs compile", "floor us", "cand GB/s", "nvrtc s", "turnaround s")
    table = [header] + [(r["op"], r["shape"], fmt(r["eager"]), fmt(r["compiled"]),
                         fmt(r["compile_s"], 2), fmt(r["cand"]), fmt(r["spread"], 2),
                         fmt(r["vs_eager"], 2), fmt(r["vs_compiled"], 2), fmt(r["floor"]),
                         fmt(r["gbs"], 0), fmt(r["nvrtc"], 3), fmt(r["turnaround"], 3))
                        for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    print()
    for i, line in enumerate(table):
        print(" | ".join(cell.ljust(w) for cell, w in zip(line, widths)))
        if i == 0:
            print("-+-".join("-" * w for w in widths))
    quick = [r["turnaround"] for r in rows if r["eager"] < 1000]
    if quick:
        median = statistics.median(quick)
        print(f"\nmedian turnaround for ops under 1 ms eager: {median:.3f} s "
              f"(goal < 0.5 s: {'met' if median < 0.5 else 'missed'})")
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
