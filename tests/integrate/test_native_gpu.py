"""The native guard on the GPU: a real cubin's kernels launched from C++ for the exact variant they
serve, the unaligned kernel for misaligned pointers, eager for everything else, and captured in a
CUDA graph."""

from __future__ import annotations

import pytest
import torch

from kforge.core.argspec import encode_call, resolve_op
from kforge.runtime import native
from kforge.runtime.cubin import KernelModule, device_arch
from kforge.runtime.guard import Patch
from kforge.runtime.nvrtc import Compiler
from kforge.runtime.plan import PlanRunner, resolve_for
from kforge.runtime.table import Entry, KernelTable

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("cuda.core", reason="cuda-core is not installed")

MUL = "aten.mul.Tensor"
SOURCE = r"""
extern "C" __global__ void scale_vec(const float* x, float* out, float s, int n) {
    // float4 accesses: a misaligned pointer here is a fault, so the guard must not send one.
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i + 3 < n) {
        float4 v = *reinterpret_cast<const float4*>(x + i);
        *reinterpret_cast<float4*>(out + i) = make_float4(v.x * s, v.y * s, v.z * s, v.w * s);
    } else {
        for (; i < n; ++i) out[i] = x[i] * s;
    }
}
extern "C" __global__ void scale_scalar(const float* x, float* out, float s, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = x[i] * s;
}
"""
PLAN = {"outputs": [{"name": "out", "like": "self"}],
        "requires": ["self.is_contiguous", "self.dtype == 'float32'"],
        "launches": [{"kernel": "scale_vec", "grid": ["ceil_div(self.numel, 1024)"],
                      "block": [256],
                      "params": [{"ptr": "self"}, {"ptr": "out"}, {"f32": "other"},
                                 {"i32": "self.numel"}],
                      "align": 16, "unaligned_kernel": "scale_scalar"}]}


@pytest.fixture(scope="module")
def module() -> KernelModule:
    if (why := native.available()) is not None:
        pytest.skip(f"the native guard cannot be built here: {why}")
    compiled = Compiler().compile(SOURCE, device_arch(0))
    assert compiled.ok, compiled.log
    return KernelModule(compiled.cubin, 0)


def entry(module: KernelModule, x: torch.Tensor, factor: float) -> Entry:
    args, kwargs = encode_call(resolve_op(MUL), (x, factor), {})
    runner = PlanRunner(resolve_for(PLAN, MUL, args, kwargs), MUL, module, x.device)
    return Entry(MUL, args, kwargs, runner, x.device, label="scale")


def test_the_variant_is_served_from_cpp_and_everything_else_runs_eager(module):
    x = torch.randn(4096, device="cuda")
    e = entry(module, x, 0.5)
    with Patch(KernelTable([e])) as patch:
        got = x * 0.5
        other_factor = x * 0.25
        other_shape = torch.randn(4095, device="cuda") * 0.5
        report = patch.report()
    assert e.native is not None  # the native guard, not the Python one, held the kernel
    assert (e.hits, report.kernels[0].hits, report.misses[MUL]) == (0, 1, 2)
    torch.testing.assert_close(got, x * 0.5, rtol=0, atol=0)
    torch.testing.assert_close(other_factor, x * 0.25, rtol=0, atol=0)
    assert other_shape.shape == (4095,)


def test_a_misaligned_variant_gets_the_unaligned_kernel(module):
    base = torch.randn(4097, device="cuda")
    x = base[1:]  # 4 bytes past a 16-byte boundary: scale_vec would fault on it
    with Patch(KernelTable([entry(module, x, 3.0)])) as patch:
        got = x * 3.0
        torch.cuda.synchronize()
        report = patch.report()
    assert report.kernels[0].hits == 1
    torch.testing.assert_close(got, x * 3.0, rtol=0, atol=0)


def test_the_served_call_is_captured_in_a_cuda_graph_and_replays_with_new_inputs(module):
    static = torch.randn(1 << 16, device="cuda")
    with Patch(KernelTable([entry(module, static, 2.0)])) as patch:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            static * 2.0  # warm-up off the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = static * 2.0
        hits = patch.report().kernels[0].hits
    fresh = torch.randn_like(static)
    static.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    assert hits == 2
    torch.testing.assert_close(out, fresh * 2.0, rtol=0, atol=0)
