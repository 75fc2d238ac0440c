"""An evaluation worker: one process per GPU that compiles, runs and times candidates.

Started as ``python -m kforge.eval.worker --device N``; speaks ``kforge.eval.protocol`` on its
stdin/stdout (anything else the process prints, kernel printf included, goes to stderr). After a
candidate kills the CUDA context it answers, then exits with ``EXIT_RESTART`` so the pool starts a
fresh one. Candidate code runs only here, never in the engine.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import BinaryIO

from kforge.eval.protocol import read_frame, write_frame

EXIT_RESTART = 3
EXIT_FATAL = 2
# Compiled once at start so that the first candidate does not pay NVRTC's start-up.
WARM_UP_SOURCE = 'extern "C" __global__ void kforge_warm_up(float* x) { x[threadIdx.x] = 0.f; }'


class Worker:
    def __init__(self, device: int) -> None:
        from kforge.eval.local import device_context

        self.ctx = device_context(device)
        self.ctx.loader.compiler.compile(WARM_UP_SOURCE, self.ctx.gpu.arch)

    def handle(self, message: dict) -> tuple[dict, bool]:
        """The reply to one request, and whether the process must restart afterwards."""
        from kforge.core.candidate import Candidate
        from kforge.core.opcard import OpCard
        from kforge.eval.pipeline import (
            EvalSettings,
            evaluate_candidate,
            measure_baseline,
        )

        kind = message.get("kind")
        card = OpCard.from_dict(message["card"]) if "card" in message else None
        samples = Path(message["samples_dir"]) if message.get("samples_dir") else None
        settings = EvalSettings.from_dict(message.get("settings"))
        ctx = self.ctx
        if kind == "evaluate" and card is not None:
            outcome = evaluate_candidate(card, Candidate.from_dict(message["candidate"]),
                                         runtime=ctx.runtime, loader=ctx.loader, gpu=ctx.gpu,
                                         samples_dir=samples, settings=settings)
            restart = bool(outcome.extra.get("restart")) or not ctx.runtime.alive()
            return {"ok": True, "outcome": outcome.to_dict(), "restart": restart}, restart
        if kind == "baseline" and card is not None:
            baseline = measure_baseline(card, runtime=ctx.runtime, gpu=ctx.gpu,
                                        samples_dir=samples, settings=settings)
            return {"ok": True, "baseline": baseline.to_dict()}, False
        if kind == "ping":
            return {"ok": True}, False
        return {"ok": False, "error": f"unknown request {kind!r}"}, False


def serve(device: int, requests: BinaryIO, replies: BinaryIO) -> int:
    from kforge.errors import KforgeError

    try:
        worker = Worker(device)
    except Exception as exc:  # no GPU, no NVRTC...: tell the pool why, then stop
        write_frame(replies, {"type": "fatal", "error": f"{type(exc).__name__}: {exc}"})
        return EXIT_FATAL
    write_frame(replies, {"type": "ready", "gpu": worker.ctx.gpu.to_dict()})
    while True:
        message = read_frame(requests)
        if message is None or message.get("kind") == "shutdown":
            return 0
        restart = False
        try:
            reply, restart = worker.handle(message)
        except KforgeError as exc:
            reply = {"ok": False, "error": str(exc)}
        except Exception as exc:  # the evaluator's own failure: reported, the worker goes on
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                     "traceback": traceback.format_exc()[-4000:]}
            restart = not worker.ctx.runtime.alive()
        reply["id"] = message.get("id")
        write_frame(replies, reply)
        if restart:
            return EXIT_RESTART


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=int, default=0, help="GPU index among the visible ones")
    args = parser.parse_args(argv)
    # The protocol owns the real stdout; everything else written to fd 1 lands on stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    return serve(args.device, sys.stdin.buffer, replies)


if __name__ == "__main__":
    sys.exit(main())
