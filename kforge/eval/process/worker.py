"""An evaluation worker: a process on one GPU that compiles, runs and times candidates.

Started as ``python -m kforge.eval.process.worker --device N``; speaks
``kforge.eval.process.protocol`` on its stdin/stdout (anything else the process prints, kernel
printf included, goes to stderr). After a candidate kills the CUDA context it answers, then exits
with ``EXIT_RESTART`` so the pool starts a fresh one. Candidate code runs only here, never in the
engine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback
from dataclasses import replace
from typing import TYPE_CHECKING, BinaryIO

from kforge.core.outcome import Placement
from kforge.eval.process.protocol import (
    BaselineMeasured,
    Evaluate,
    Evaluated,
    Failed,
    Fatal,
    MeasureBaseline,
    Ping,
    Pong,
    ProtocolError,
    Ready,
    Reply,
    Shutdown,
    read_request,
    worker_exits_after,
    write_frame,
)

if TYPE_CHECKING:
    import torch

    from kforge.core.candidate import EvalOutcome
    from kforge.core.opcard import OpCard

EXIT_RESTART = 3
# A card whose inputs are more than 1/LARGE_SHARE of the GPU's memory is evaluated alone: the
# sets, copies and references of an evaluation take several times its inputs.
LARGE_SHARE = 16
EXIT_FATAL = 2
# kforge's own relu, evaluated once as the worker starts (``Worker.warm_up``): the first
# evaluation in a process pays NVRTC's start-up, CUPTI's counter set-up, the lazy imports and
# the CUDA libraries' handles, seconds that belong to the start (a spare pays them before it is
# needed), not to the first candidate's time. NaN < 0 is false: NaN passes, as in torch.relu.
WARM_UP_SOURCE = r"""
extern "C" __global__ void kforge_warm_up(const float* x, float* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        y[i] = x[i] < 0.f ? 0.f : x[i];
}
"""
WARM_UP_PLAN = {
    "let": {"n": "self.numel"},
    "requires": ["self.is_contiguous", "self.dtype == 'float32'"],
    "outputs": [{"name": "out", "like": "self"}],
    "launches": [{"kernel": "kforge_warm_up", "grid": ["min(ceil_div(n, 256), 65536)"],
                  "block": [256], "params": [{"ptr": "self"}, {"ptr": "out"}, {"i64": "n"}]}],
}
WARM_UP_ELEMENTS = 4096


def _start_cublas(device: torch.device) -> None:
    import torch

    x = torch.ones(64, 64, device=device, dtype=torch.float16)
    x @ x


def _start_cudnn(device: torch.device) -> None:
    import torch

    x = torch.ones(1, 1, 64, 64, device=device, dtype=torch.float16)
    torch.nn.functional.conv2d(x, x[:, :, :3, :3])


def card_bytes(card: OpCard) -> int:
    """The bytes of a card's tensor inputs."""
    from kforge.eval.verify.inputs import Geometry, all_tensor_specs

    return sum(Geometry.from_spec(spec).nbytes for spec in all_tensor_specs(card))


class Worker:
    def __init__(self, device: int) -> None:
        from kforge.eval.process.local import device_context
        from kforge.runtime import native

        self.ctx = device_context(device)
        # The host-cost check patches the op through the native guard; building it (seconds,
        # once per torch build) belongs to the worker's start, not to the first candidate's
        # time limit. Where it cannot be built the Python guard serves, as in integration.
        native.available()
        self.prepare()
        self.warm_up()

    def prepare(self) -> None:
        """The host half of the start, done before the warm-up takes the GPU's lock: the
        evaluator's modules and CUPTI's counter set-up (the warm-up's admission and compile give
        the lock up by themselves). A spare starts while other workers time their candidates,
        and each of them waits for what it holds the GPU for."""
        import kforge.eval.verify.baseline  # noqa: F401 - imported for their cost, paid here
        import kforge.eval.verify.evaluate  # noqa: F401
        from kforge.runtime.counters import prepare_counters

        device = self.ctx.runtime.device
        if device.type == "cuda":
            import torch

            torch.cuda.set_device(device)  # its context current: CUPTI's set-up asks for it
            prepare_counters(device.index or 0)

    def warm_up(self) -> EvalOutcome | None:
        """Evaluate kforge's own relu as a candidate is evaluated, and start cuBLAS and cuDNN
        (which most references call): what a process pays once is paid here. Not a candidate:
        the worker has still run none. Its outcome, or None where it could not run."""
        import torch

        from kforge.core.candidate import Candidate
        from kforge.core.opcard import OpCard

        card = OpCard("aten.relu.default", [{"t": "tensor", "shape": [WARM_UP_ELEMENTS],
                                            "stride": [1], "dtype": "float32", "offset": 0}])
        request = Evaluate(card, Candidate(WARM_UP_SOURCE, plan=WARM_UP_PLAN,
                                           meta={"family": "warm-up"}), None, {})
        reply = self.handle(request)
        if self.ctx.runtime.device.type == "cuda" and self.ctx.runtime.alive():
            # best effort: a library that fails here fails in a reference later, where the
            # evaluation says so (an infrastructure outcome), not in the worker's start
            device = self.ctx.runtime.device
            for start in (_start_cublas, _start_cudnn):  # a hold each: a timed section elsewhere
                with contextlib.suppress(RuntimeError), self.ctx.runtime.shared(), \
                        torch.no_grad():  # waits for one library's start, not two
                    start(device)
                    torch.cuda.synchronize(device)
        return reply.outcome if isinstance(reply, Evaluated) else None

    def handle(self, request: Evaluate | MeasureBaseline | Ping) -> Reply:
        """The reply to one request; it says whether the process must restart afterwards. It
        runs beside other workers' (timed sections alone), or alone where its card is large
        enough that another evaluation's memory could crowd it out; what it cached goes back to
        the device afterwards, for theirs."""
        import torch

        runtime = self.ctx.runtime
        card = getattr(request, "card", None)
        alone = card is not None and LARGE_SHARE * card_bytes(card) > self.ctx.gpu.memory_gb * 2**30
        started_at, waited_before = time.time(), runtime.lock_waited_s()
        try:
            with runtime.exclusive() if alone else runtime.shared():
                reply = self._handle(request)
            if isinstance(reply, Evaluated):
                where = reply.outcome.placement or Placement()
                reply = replace(reply, outcome=replace(reply.outcome, placement=replace(
                    where, worker=os.getpid(), started_at=round(started_at, 3),
                    gpu_wait_s=round(runtime.lock_waited_s() - waited_before, 3))))
            return reply
        finally:
            if runtime.alive():
                torch.cuda.empty_cache()

    def _handle(self, request: Evaluate | MeasureBaseline | Ping) -> Reply:
        from kforge.eval.verify.baseline import measure_baseline
        from kforge.eval.verify.evaluate import evaluate_candidate
        from kforge.eval.verify.pipeline import EvalSettings

        ctx = self.ctx
        match request:
            case Evaluate(card=card, candidate=candidate, samples_dir=samples, settings=settings):
                outcome = evaluate_candidate(card, candidate, runtime=ctx.runtime,
                                             loader=ctx.loader, gpu=ctx.gpu, samples_dir=samples,
                                             settings=EvalSettings.from_dict(settings))
                return Evaluated(outcome, restart=outcome.restart or not ctx.runtime.alive(),
                                 id=request.id)
            case MeasureBaseline(card=card, samples_dir=samples, settings=settings):
                baseline = measure_baseline(card, runtime=ctx.runtime, gpu=ctx.gpu,
                                            samples_dir=samples,
                                            settings=EvalSettings.from_dict(settings))
                return BaselineMeasured(baseline, id=request.id)
            case Ping():
                return Pong(id=request.id)


def serve(device: int, requests: BinaryIO, replies: BinaryIO) -> int:
    from kforge.errors import KforgeError

    try:
        worker = Worker(device)
    except Exception as exc:  # no GPU, no NVRTC...: tell the pool why, then stop
        write_frame(replies, Fatal(f"{type(exc).__name__}: {exc}"))
        return EXIT_FATAL
    write_frame(replies, Ready(worker.ctx.gpu))
    while True:
        try:
            request = read_request(requests)
        except ProtocolError as exc:  # the engine speaks another protocol: nothing to answer
            print(f"kforge worker: {exc}", file=sys.stderr)
            return EXIT_FATAL
        if request is None or isinstance(request, Shutdown):
            return 0
        try:
            reply = worker.handle(request)
        except KforgeError as exc:
            reply = Failed(str(exc), id=request.id)
        except Exception as exc:  # the evaluator's own failure: reported, the worker goes on
            reply = Failed(f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:],
                           restart=not worker.ctx.runtime.alive(), id=request.id)
        write_frame(replies, reply)
        if worker_exits_after(reply):
            return EXIT_RESTART


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=int, default=0, help="GPU index among the visible ones")
    args = parser.parse_args(argv)
    # Longer launch queues let the timing hold (kforge.runtime.device) keep a whole batch of rounds
    # queued behind it; read by the driver when CUDA starts, so before anything touches it.
    os.environ.setdefault("CUDA_SCALE_LAUNCH_QUEUES", "4x")
    # The protocol owns the real stdout; everything else written to fd 1 lands on stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    return serve(args.device, sys.stdin.buffer, replies)


if __name__ == "__main__":
    sys.exit(main())
