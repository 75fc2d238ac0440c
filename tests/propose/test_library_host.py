"""The library's kernels run on the CPU: each candidate's CUDA compiled as host C++ by g++, every
launch of its plan carried out by kforge's plan runner, each block's threads run as real threads
(so that barriers, shared memory and warp shuffles behave as on a GPU), and the outputs compared
with eager's, in every dtype, at the default and the safe point of every variant, with aligned and
misaligned (scalar-twin) inputs.

What needs blocks running side by side (thread-block clusters of more than one block, chained
blocks waiting for one another) is left to the GPU tests."""

from __future__ import annotations

import ctypes
import hashlib
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from kforge.core.gpu import GpuInfo
from kforge.core.opcard import OpCard
from kforge.propose.library.examples import DTYPES, channels_last, tensor
from kforge.propose.library.families.base import cuda_text
from kforge.propose.library.proposer import make_plan
from kforge.runtime.plan import PlanRunner, resolve_for

from .test_library import materialize
from .test_region_families import host_headers

pytestmark = pytest.mark.slow

GPU = GpuInfo(name="H200", arch="sm_90", sm_count=132, smem_per_block_optin_kb=227.0,
              smem_per_sm_kb=228.0, max_threads_per_sm=2048)
CUDA_FILES = ("common.cuh", "cluster.cuh", "batch_norm.cu", "cat.cu", "reduce.cu", "rows.cu",
              "group_norm.cu", "pool.cu", "embedding.cu")
# Variants that need several blocks running at once.
NEEDS_CONCURRENT_BLOCKS = ("cluster", "chained")

# CUDA as host C++: each launch runs its block's threads as std::threads, one block after another
# (shared memory is a static per block); __syncthreads is a barrier of the block's threads, a warp
# shuffle goes through a per-warp table between two barriers of the warp's threads.
HOST_PRELUDE = r"""
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __shared__ static
#define __align__(n) alignas(n)
using std::isnan;
using std::min;
struct HostDim { unsigned x = 0, y = 0, z = 0; };
static thread_local HostDim threadIdx, blockIdx;
static HostDim blockDim, gridDim;
alignas(16) static unsigned char host_dynamic_shared[256 * 1024];
static std::unique_ptr<std::barrier<>> host_block;
static std::vector<std::unique_ptr<std::barrier<>>> host_warps;
static float host_exchange[32][32];
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline void __syncthreads() { host_block->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int mask) {
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  host_warps[warp]->arrive_and_wait();
  host_exchange[warp][lane] = v;
  host_warps[warp]->arrive_and_wait();
  return host_exchange[warp][lane ^ mask];
}
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float __ldcg(const float* p) { return *static_cast<const volatile float*>(p); }
inline void __nanosleep(unsigned) { std::this_thread::yield(); }
inline void __trap() { std::abort(); }
template <class... A, std::size_t... I>
void host_call(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
  kernel(*static_cast<A*>(args[I])...);
}
template <class... A>
void host_run(void (*kernel)(A...), unsigned gx, unsigned gy, unsigned block, void** args) {
  blockDim = {block, 1, 1};
  gridDim = {gx, gy, 1};
  host_block = std::make_unique<std::barrier<>>(block);
  host_warps.clear();
  for (unsigned w = 0; w < (block + 31) / 32; ++w) {
    host_warps.push_back(std::make_unique<std::barrier<>>(block - w * 32 < 32 ? block - w * 32 : 32));
  }
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < block; ++t) {
    threads.emplace_back([=] {
      threadIdx = {t, 0, 0};
      for (unsigned y = 0; y < gy; ++y) {
        for (unsigned x = 0; x < gx; ++x) {
          blockIdx = {x, y, 0};
          host_call(kernel, args, std::index_sequence_for<A...>{});
          host_block->arrive_and_wait();
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
}
"""
ENTRY = re.compile(r'(extern "C" __global__ void (?:__cluster_dims__\([^)]*\) )?__launch_bounds__\(\d+\) )'
                   r'(\w+)\(')
DYNAMIC_SHARED = "extern __shared__ __align__(16) unsigned char on_chip[];"


def host_cards(dtype: str) -> dict[str, OpCard]:
    t = lambda shape, **kw: tensor(shape, dtype, **kw)  # noqa: E731 - a local shorthand
    f32 = lambda shape, **kw: tensor(shape, "float32", **kw)  # noqa: E731
    return {
        "batch_norm_7x7": OpCard("aten.native_batch_norm.default",
                                 [t([2, 12, 7, 7]), t([12]), t([12]), t([12]), t([12]), False, 0.1, 1e-5]),
        "batch_norm_planes": OpCard("aten.native_batch_norm.default",
                                    [t([2, 6, 4, 8]), None, t([6]), t([6]), t([6]), False, 0.1, 1e-3]),
        "batch_norm_channels_last": OpCard("aten._native_batch_norm_legit_no_training.default",
                                           [channels_last([2, 16, 3, 3], dtype), f32([16]), f32([16]),
                                            f32([16]), f32([16]), 0.1, 1e-5]),
        "cat": OpCard("aten.cat.default", [[t([2, 3, 8]), t([2, 5, 8], stride=[80, 16, 1])], 1]),
        "cat_rotary": OpCard("aten.cat.default", [[t([2, 3, 4, 8]), t([2, 3, 4, 8], stride=[192, 16, 48, 1])],
                                                 -1]),
        "cat_odd": OpCard("aten.cat.default", [[t([0]), t([3, 5], stride=[1, 3]), t([2, 5])]]),
        "clone_transposed": OpCard("aten.clone.default", [t([4, 6, 5], stride=[30, 1, 6])],
                                   {"memory_format": {"t": "memory_format", "v": "contiguous_format"}}),
        "sum_interleaved": OpCard("aten.sum.dim_IntList", [t([5, 3, 7]), [0, 2]]),
        "mean_permuted": OpCard("aten.mean.dim", [t([2, 2, 6, 16], stride=[384, 16, 32, 1]), [-1], True]),
        "sum_split": OpCard("aten.sum.default", [t([16, 999])]),
        "amax_columns": OpCard("aten.amax.default", [t([4, 33, 9]), [1]]),
        "amin_rows": OpCard("aten.amin.default", [t([6, 100]), [-1], True]),
        "mean_tile": OpCard("aten.mean.dim", [t([4, 10, 7, 7]), [-1, -2], True]),
        "layer_norm_columns": OpCard("aten.native_layer_norm.default",
                                     [t([2, 48, 32], stride=[1536, 1, 48]), [32], t([32]), t([32]), 1e-5]),
        "rms_norm_columns": OpCard("aten._fused_rms_norm.default",
                                   [t([2, 20, 24], stride=[480, 1, 20]), [24], t([24]), 1e-6]),
        "softmax_middle": OpCard("aten._softmax.default", [t([2, 8, 40]), 1, False]),
        "group_norm_resident": OpCard("aten.native_group_norm.default",
                                      [t([2, 16, 6, 6]), t([16]), t([16]), 2, 16, 36, 4, 1e-5]),
        "max_pool": OpCard("aten.max_pool2d_with_indices.default", [t([2, 3, 15, 16]), [3, 3], [2, 2], [1, 1]]),
        "max_pool_channels_last": OpCard("aten.max_pool2d_with_indices.default",
                                         [channels_last([2, 8, 9, 9], dtype), [3, 3], [2, 2], [1, 1]]),
        "max_pool_dilated": OpCard("aten.max_pool2d_with_indices.default",
                                   [t([2, 3, 13, 10]), [3, 2], [2, 1], [1, 0], [2, 1], True]),
        "embedding_decode": OpCard("aten.embedding.default", [t([300, 48]), tensor([1, 1], "int64")]),
    }


def points(card: OpCard) -> list[tuple[str, str, dict]]:
    """(label, approach, params): every variant that runs one block at a time, at its default
    and its safe point."""
    plan = make_plan(card, GPU)
    found = []
    for variant in plan.available:
        if variant.approach in NEEDS_CONCURRENT_BLOCKS:
            continue
        for name, params in (("default", variant.space.default), ("safe", variant.space.safe)):
            found.append((f"{variant.approach} {name} {params}", variant.approach, params))
    return found


class HostBackend:
    """Launches one candidate's kernels from the host library."""

    def __init__(self, library: ctypes.CDLL, index: int) -> None:
        self.library, self.index = library, index

    def launch(self, name, grid, block, shared_mem, params) -> None:
        values = [ctypes.c_void_p(p.data_ptr()) if isinstance(p, torch.Tensor)
                  else np.ctypeslib.as_ctypes(np.array(p)) for p in params]
        args = (ctypes.c_void_p * len(values))(*(ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
                                                 for v in values))
        getattr(self.library, f"run_c{self.index}_{name}")(grid[0], grid[1], math.prod(block), args)

    def has_kernel(self, name: str) -> bool:
        return hasattr(self.library, f"run_c{self.index}_{name}")

    def param_widths(self, name: str) -> None:
        return None


def host_library(tails: list[tuple[str, dict]], folder: Path, headers: str) -> ctypes.CDLL:
    parts = [HOST_PRELUDE, *(cuda_text(f) for f in CUDA_FILES)]
    for i, (tail, plan) in enumerate(tails):
        tail = tail.replace(DYNAMIC_SHARED, "unsigned char* on_chip = host_dynamic_shared;")
        parts.append(f"namespace c{i} {{\n" + ENTRY.sub(lambda m: f"{m.group(1)}{m.group(2)}_c{i}(", tail)
                     + "\n}")
        kernels = {name for launch in plan["launches"]
                   for name in (launch["kernel"], launch.get("unaligned_kernel")) if name}
        parts += [f'extern "C" void run_c{i}_{k}(unsigned gx, unsigned gy, unsigned b, void** a) '
                  f"{{ host_run(c{i}::{k}_c{i}, gx, gy, b, a); }}" for k in sorted(kernels)]
    text = "\n".join(parts).replace(DYNAMIC_SHARED, "unsigned char* on_chip = host_dynamic_shared;")
    library = folder / f"library_{hashlib.sha256(text.encode()).hexdigest()[:12]}.so"
    source = library.with_suffix(".cpp")
    source.write_text(text)
    done = subprocess.run(["g++", "-std=c++20", "-O1", "-w", "-shared", "-fPIC", "-pthread",
                           f"-I{headers}", str(source), "-o", str(library)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[:6000]
    return ctypes.CDLL(str(library))


def shifted(card: OpCard) -> OpCard:
    """The card with every floating tensor one element into its storage: misaligned vectors."""
    def move(spec):
        if isinstance(spec, dict) and spec.get("t") == "tensor" and spec["dtype"] in DTYPES:
            return {**spec, "offset": spec.get("offset", 0) + 1}
        if isinstance(spec, dict) and spec.get("t") == "list":
            return {**spec, "items": [move(item) for item in spec["items"]]}
        if isinstance(spec, list):
            return [move(item) for item in spec]
        return spec

    return OpCard(card.op, move(card.args), {k: move(v) for k, v in card.kwargs.items()})


def eager(card: OpCard, args: list, kwargs: dict) -> tuple[torch.Tensor, ...]:
    """What eager computes, in float64 where the op is float (indices as they are)."""
    from kforge.core.argspec import resolve_op

    up = lambda v: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else (  # noqa: E731
        [up(i) for i in v] if isinstance(v, list) else v)
    op = resolve_op(card.op)
    if card.op in ("aten.native_batch_norm.default", "aten._native_batch_norm_legit_no_training.default"):
        x, w, b, mean, var = (up(a) for a in args[:5])
        eps = args[-1]
        shape = [1, -1] + [1] * (x.dim() - 2)
        invstd = 1 / torch.sqrt(var + eps)
        y = (x - mean.view(shape)) * invstd.view(shape)
        y = y * (w.view(shape) if w is not None else 1) + (b.view(shape) if b is not None else 0)
        return y, mean, invstd
    result = op(*[up(a) for a in args], **{k: up(v) for k, v in kwargs.items() if k != "memory_format"})
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def tolerance(dtype: torch.dtype) -> float:
    return {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}.get(dtype, 0)


def compare(got: tuple, want: tuple, label: str) -> None:
    for i, (g, w) in enumerate(zip(got, want)):
        assert tuple(g.shape) == tuple(w.shape), f"{label}: output {i} shape"
        if not g.is_floating_point():
            assert torch.equal(g, w.to(g.dtype)), f"{label}: output {i} differs"
            continue
        tol = tolerance(g.dtype)
        torch.testing.assert_close(g.double(), w.double().to(g.dtype).double(), atol=tol * 4,
                                   rtol=tol * 2, msg=lambda m: f"{label}: output {i}: {m}")


def test_the_kernels_run_on_the_host_give_eager_results(tmp_path):
    headers = host_headers()
    if shutil.which("g++") is None or headers is None:
        pytest.skip("needs g++ and a CUDA toolkit's headers")
    cases = []
    for dtype in DTYPES:
        for name, card in host_cards(dtype).items():
            for variant_card in (card, shifted(card)):
                plan = make_plan(variant_card, GPU)
                for label, approach, params in points(variant_card):
                    kernel = plan.family.render(plan.problem, approach, params, GPU)
                    cases.append((f"{dtype}/{name}/{label}/offset {variant_card is not card:d}",
                                  variant_card, kernel))
    library = host_library([(k.source, k.plan) for _, _, k in cases], tmp_path, headers)
    generator = torch.Generator().manual_seed(0)
    for index, (label, card, kernel) in enumerate(cases):
        args = [materialize(a, generator) for a in card.args]
        kwargs = {k: materialize(v, generator) for k, v in card.kwargs.items()}
        if card.op == "aten.embedding.default":
            args[1].copy_(torch.randint(0, args[0].shape[0], args[1].shape, generator=generator))
        if "batch_norm" in card.op:  # a positive variance
            args[4].abs_().add_(0.5)
        resolved = resolve_for(kernel.plan, card.op, card.args, card.kwargs)
        runner = PlanRunner(resolved, card.op, HostBackend(library, index), torch.device("cpu"))
        memory = runner.allocate()
        for out in memory.outputs:
            if out is not None and out.is_floating_point():
                out.fill_(math.nan)
        result = runner.launch(tuple(args), kwargs, memory)
        got = result if isinstance(result, tuple) else (result,)
        compare(got, eager(card, args, kwargs), label)
