"""The demo's recording: a short LLM search of three ops of a small language model on an H100, as
plain data (op cards, the search tree with each node's kernel, verdict and model exchange, and
the session log). ``kforge_tui.demo`` replays it into a database."""

from __future__ import annotations

from dataclasses import dataclass

MODEL = "gemma4-tiny"
GPU = {"name": "NVIDIA H100 80GB HBM3", "arch": "sm_90", "sm_count": 132,
       "bandwidth_gbs": 3350.0}
SETTINGS = {"search": {"proposer": "llm", "evaluator": "gpu", "iterations_per_op": 8,
                       "usd": 2.0},
            "llm_model": "demo-coder", "dtype": "bfloat16", "batch": 8, "seq_len": 512}
RUN_SECONDS = 754.0
LLM_MODEL = "demo-coder"


def tensor(shape: list[int], dtype: str = "bfloat16") -> dict:
    """An argument spec as the profiler records a contiguous tensor."""
    stride, step = [], 1
    for size in reversed(shape):
        stride.insert(0, step)
        step *= size
    return {"t": "tensor", "shape": shape, "stride": stride, "dtype": dtype, "offset": 0}


@dataclass(frozen=True)
class Card:
    """One op card as profiled: its op, arguments and where its time goes (microseconds)."""

    op: str
    args: list
    calls: int
    share: float
    eager_us: float
    compiled_us: float
    floor_us: float
    target: bool = True


CARDS = (
    Card("aten._softmax.default", [tensor([8, 4, 512, 512]), -1, False], calls=4, share=0.31,
         eager_us=41.0, compiled_us=37.6, floor_us=10.1),
    Card("aten.mul.Tensor", [tensor([8, 512, 2048]), tensor([8, 512, 2048])], calls=4,
         share=0.22, eager_us=28.4, compiled_us=27.9, floor_us=15.0),
    Card("aten.add.Tensor", [tensor([8, 512, 1024]), tensor([8, 512, 1024])], calls=8,
         share=0.14, eager_us=14.6, compiled_us=14.1, floor_us=7.5),
    Card("aten.rsqrt.default", [tensor([8, 512, 1], "float32")], calls=8, share=0.03,
         eager_us=3.1, compiled_us=3.0, floor_us=0.1),
    Card("aten.view.default", [tensor([8, 512, 1024]), [4096, 1024]], calls=16, share=0.0,
         eager_us=0.0, compiled_us=0.0, floor_us=0.0, target=False),
)


@dataclass(frozen=True)
class Step:
    """One search node: what was asked, the kernel that came back and its verdict. ``parent``
    and ``card`` index this recording's steps and cards; ``speedup`` None means it failed with
    ``status`` (its log in ``log``)."""

    card: int
    parent: int | None
    action: str
    approach: str
    kernel: str
    speedup: float | None
    status: str = "ok"
    log: str = ""
    pruned: bool = False
    max_abs: float = 0.0039  # the largest error over its checked input sets


SOFTMAX_WARP = """#include <cuda_bf16.h>
// One warp per row: running max and sum in one pass over the row (online softmax).
extern "C" __global__ void softmax_warp_row(const __nv_bfloat16* __restrict__ x,
                                            __nv_bfloat16* __restrict__ y, int rows, int cols) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const __nv_bfloat16* in = x + (size_t)row * cols;
  float m = -INFINITY, s = 0.f;
  for (int c = lane; c < cols; c += 32) {
    float v = __bfloat162float(in[c]);
    float m2 = fmaxf(m, v);
    s = s * __expf(m - m2) + __expf(v - m2);
    m = m2;
  }
  for (int o = 16; o > 0; o /= 2) {
    float mo = __shfl_xor_sync(0xffffffff, m, o), so = __shfl_xor_sync(0xffffffff, s, o);
    float m2 = fmaxf(m, mo);
    s = s * __expf(m - m2) + so * __expf(mo - m2);
    m = m2;
  }
  for (int c = lane; c < cols; c += 32)
    y[(size_t)row * cols + c] = __float2bfloat16(__expf(__bfloat162float(in[c]) - m) / s);
}
"""

SOFTMAX_VEC = SOFTMAX_WARP.replace(
    "// One warp per row: running max and sum in one pass over the row (online softmax).",
    "// One warp per row, 8 bf16 per load (16-byte vectors): the row is read twice, not thrice.",
).replace("for (int c = lane; c < cols; c += 32) {", "#pragma unroll 4\n"
          "  for (int c = lane; c < cols; c += 32) {")

SOFTMAX_TWO_ROWS = SOFTMAX_VEC.replace(
    "// One warp per row, 8 bf16 per load (16-byte vectors): the row is read twice, not thrice.",
    "// Two rows per warp, 16-byte loads, shuffles only: no shared memory, no __syncthreads.")

SOFTMAX_SHARED = """#include <cuda_bf16.h>
// Stage the row in shared memory, reduce max and sum there.
extern "C" __global__ void softmax_smem(const __nv_bfloat16* __restrict__ x,
                                        __nv_bfloat16* __restrict__ y, int cols) {
  extern __shared__ float row[];
  float m = -INFINITY
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    row[c] = __bfloat162float(x[(size_t)blockIdx.x * cols + c]);
    m = fmaxf(m, row[c]);
  }
  __syncthreads();
}
"""

SOFTMAX_SHARED_FIXED = SOFTMAX_SHARED.replace("float m = -INFINITY\n", "float m = -INFINITY;\n")

SOFTMAX_BLOCK = """#include <cuda_bf16.h>
// One block of 256 threads per row, tree reduction in shared memory.
extern "C" __global__ void softmax_block(const __nv_bfloat16* __restrict__ x,
                                         __nv_bfloat16* __restrict__ y, int cols) {
  __shared__ float red[256];
  const __nv_bfloat16* in = x + (size_t)blockIdx.x * cols;
  float m = -INFINITY;
  for (int c = threadIdx.x; c < cols; c += 256) m = fmaxf(m, __bfloat162float(in[c]));
  red[threadIdx.x] = m;
  __syncthreads();
  for (int s = 128; s > 0; s /= 2) {
    if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
}
"""

SOFTMAX_HALF_ACC = SOFTMAX_WARP.replace(
    "// One warp per row: running max and sum in one pass over the row (online softmax).",
    "// One pass, accumulating the sum in bf16 to save registers.")

MUL_BF16X2 = """#include <cuda_bf16.h>
// Grid-stride loop over bf16 pairs.
extern "C" __global__ void mul_bf16x2(const __nv_bfloat162* __restrict__ a,
                                      const __nv_bfloat162* __restrict__ b,
                                      __nv_bfloat162* __restrict__ out, size_t pairs) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < pairs;
       i += (size_t)gridDim.x * blockDim.x)
    out[i] = __hmul2(a[i], b[i]);
}
"""

MUL_VEC8 = """#include <cuda_bf16.h>
// 16-byte loads: 8 bf16 of each input per thread, four vectors in flight.
extern "C" __global__ void mul_vec8(const uint4* __restrict__ a, const uint4* __restrict__ b,
                                    uint4* __restrict__ out, size_t vectors) {
  size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * 4;
  #pragma unroll
  for (int k = 0; k < 4; ++k, ++i) {
    if (i >= vectors) return;
    uint4 x = a[i], w = b[i], r;
    const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&x);
    const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&w);
    __nv_bfloat162* rp = reinterpret_cast<__nv_bfloat162*>(&r);
    for (int j = 0; j < 4; ++j) rp[j] = __hmul2(xp[j], wp[j]);
    out[i] = r;
  }
}
"""

ADD_SIMPLE = MUL_BF16X2.replace("mul_bf16x2", "add_bf16x2").replace("__hmul2", "__hadd2")
ADD_UNROLLED = ADD_SIMPLE.replace("// Grid-stride loop over bf16 pairs.",
                                  "// Grid-stride loop over bf16 pairs, unrolled by four.")

STEPS = (
    Step(0, None, "new", "one warp per row, online max and sum", SOFTMAX_WARP, 1.21),
    Step(0, 0, "refine", "16-byte vector loads", SOFTMAX_VEC, 1.58),
    Step(0, 1, "refine", "two rows per warp, shuffles only", SOFTMAX_TWO_ROWS, 1.74),
    Step(0, 1, "refine", "row staged in shared memory", SOFTMAX_SHARED, None, "compile_error",
         'kernel.cu(6): error: expected a ";"\n  float m = -INFINITY\n'
         '                      ^\n1 error detected in the compilation of "kernel.cu".'),
    Step(0, 3, "repair", "row staged in shared memory (fixed)", SOFTMAX_SHARED_FIXED, 1.49),
    Step(0, None, "new", "block per row, tree reduction", SOFTMAX_BLOCK, 0.93, pruned=True),
    Step(0, None, "new", "bf16 accumulation", SOFTMAX_HALF_ACC, None, "mismatch",
         "output differs from eager: max abs error 0.118 (tolerance 0.0156) at [3, 1, 77, 401]"),
    Step(1, None, "new", "grid-stride over bf16 pairs", MUL_BF16X2, 1.12),
    Step(1, 7, "refine", "16-byte vectors, four per thread", MUL_VEC8, 1.37),
    Step(1, 7, "refine", "2048 threads per block", MUL_VEC8.replace("four vectors", "wide blocks"),
         None, "launch_error", "launch refused: block of 2048 threads exceeds the limit of 1024"),
    Step(2, None, "new", "grid-stride over bf16 pairs", ADD_SIMPLE, 1.04),
    Step(2, 10, "refine", "unrolled by four", ADD_UNROLLED, 0.98),
)

# (card index, status, why the search of the op ended)
CARD_ENDS = ((0, "done", "patience"), (1, "done", "budget"), (2, "stopped", "by the user"),
             (3, "pending", ""))

LOG = (
    ("info", "profiled gemma4-tiny (bf16, batch 8, 512 tokens): 5 op variants, 4 targets"),
    ("info", "searching 4 ops with proposer llm (demo-coder), 8 iterations per op"),
    ("info", "_softmax: new best 1.21x over eager (node 1)"),
    ("warning", "_softmax: node 4 failed to compile; asking for a repair"),
    ("info", "_softmax: new best 1.58x over eager (node 2)"),
    ("info", "_softmax: new best 1.74x over eager (node 3), confirmed on new inputs"),
    ("info", "_softmax: no better kernel in 4 iterations (patience)"),
    ("info", "mul: new best 1.37x over eager (node 9)"),
    ("info", "stopped by the user after 12m 34s; resume with `kforge resume 1`"),
)
