"""The held-stream timer on a real GPU: a host slow to issue a call is timed as its GPU time, a
hold the host never releases gives up by itself, a call that synchronizes cannot hang the loop,
and a multi-op eager chain's device time agrees with the kernel time torch.profiler sees."""

from __future__ import annotations

import time

import pytest
import torch

from kforge.core.candidate import profile_disagreement
from kforge.core.settings import TimingPlan
from kforge.eval.process.local import device_context
from kforge.eval.verify.baseline import eager_kernels
from kforge.runtime.timing import time_interleaved

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PLAN = TimingPlan(warmup=2, min_reps=24, max_reps=24, budget_s=0.01)


def test_a_host_far_slower_than_its_kernel_is_timed_as_the_kernel():
    runtime = device_context(0).runtime
    with runtime.scope():
        x = torch.ones(1024, device=runtime.device)

        def slow_host(r: int) -> torch.Tensor:
            time.sleep(0.002)  # 2 ms of Python before a kernel of a few us
            return x + 1

        timing = time_interleaved({"slow": slow_host}, runtime, PLAN).timings["slow"]
    print(timing)
    assert timing.device_us < 25, timing
    assert timing.host_us > 1500 and timing.wall_us > 1500, timing


def test_a_hold_never_released_gives_up_by_itself():
    runtime = device_context(0).runtime
    with runtime.scope():
        x = torch.ones(1024, device=runtime.device)
        runtime.hold(0.05)
        y = x + 1
        time.sleep(0.3)  # the host never releases within the timeout
        start = time.perf_counter()
        assert runtime.release() is False
        assert time.perf_counter() - start < 1.0
        assert float(y[0].item()) == 2.0  # the stream runs on after it
        runtime.hold(1.0)
        z = x + 2
        assert runtime.release() is True and float(z[0].item()) == 3.0


def test_a_call_that_waits_for_the_gpu_cannot_hang_the_loop():
    runtime = device_context(0).runtime
    with runtime.scope():
        x = torch.ones(4096, device=runtime.device)
        start = time.perf_counter()
        run = time_interleaved({"syncs": lambda r: float((x * 2).sum().item())}, runtime,
                               TimingPlan(warmup=1, min_reps=8, max_reps=8, budget_s=0.01))
    print(run.notes, run.timings["syncs"])
    assert time.perf_counter() - start < 10.0
    assert any("without a hold" in note for note in run.notes)
    assert run.timings["syncs"].reps == 8


def test_an_eager_chain_times_as_the_kernels_the_profiler_sees():
    """An RMSNorm written as eager ops (Llama's, bf16 [1, 512, 4096]): 7 kernels whose launches
    take the host longer than the GPU takes to run them."""
    runtime = device_context(0).runtime
    with runtime.scope():
        x = torch.randn(1, 512, 4096, device=runtime.device, dtype=torch.bfloat16)
        w = torch.randn(4096, device=runtime.device, dtype=torch.bfloat16)

        def rms_norm(r: int) -> torch.Tensor:
            h = x.to(torch.float32)
            var = h.pow(2).mean(-1, keepdim=True)
            return w * (h * torch.rsqrt(var + 1e-6)).to(torch.bfloat16)

        timing = time_interleaved({"eager": rms_norm}, runtime, PLAN).timings["eager"]
        kernels = eager_kernels(lambda: rms_norm(0), runtime)
    profiled = sum(k["us"] for k in kernels)
    launches = sum(k["calls"] for k in kernels)
    print(f"device {timing.device_us:.1f} us, host {timing.host_us:.1f} us, wall "
          f"{timing.wall_us:.1f} us; profiler kernel sum {profiled:.1f} us over {launches:g} "
          f"launches: {(timing.device_us - profiled) / launches:.2f} us of GPU gap per launch")
    # Device time is the kernels plus the GPU's gap between dependent launches, never host time.
    assert 0.8 * profiled <= timing.device_us, (timing, kernels)
    assert profile_disagreement(timing.device_us, None, profiled, launches) == "", kernels


def test_a_compiled_15_op_chain_is_timed_without_recompiling():
    """A LayerNorm then an RMSNorm written out in 15 aten ops, as a fusion region's baseline:
    torch.compile is timed under fail_on_recompile, so its figure holds no compile."""
    from kforge.eval.process.local import baseline_local
    from tests.eval import candidates as C
    from tests.eval.redteam import ref, region_card

    card = region_card(
        [("aten.mean.dim", ref("x0"), [-1], True), ("aten.sub.Tensor", ref("x0"), ref("n0")),
         ("aten.pow.Tensor_Scalar", ref("n1"), 2), ("aten.mean.dim", ref("n2"), [-1], True),
         ("aten.add.Tensor", ref("n3"), 1e-5), ("aten.rsqrt.default", ref("n4")),
         ("aten.mul.Tensor", ref("n1"), ref("n5")), ("aten.mul.Tensor", ref("n6"), ref("x1")),
         ("aten.add.Tensor", ref("n7"), ref("x2")), ("aten.pow.Tensor_Scalar", ref("n8"), 2),
         ("aten.mean.dim", ref("n9"), [-1], True), ("aten.add.Tensor", ref("n10"), 1e-6),
         ("aten.rsqrt.default", ref("n11")), ("aten.mul.Tensor", ref("n8"), ref("n12")),
         ("aten.mul.Tensor", ref("n13"), ref("x1"))],
        [C.tensor([512, 4096]), C.tensor([4096]), C.tensor([4096])])
    base = baseline_local(card)
    print(f"eager {base.eager}\ncompiled {base.compiled}\nkernels {base.kernels_us} us over "
          f"{base.launches:g} launches; note: {base.note}")
    assert base.compiled is not None and "recompiled" not in base.note, base.note
    assert base.compiled.device_us < base.eager.device_us, base
