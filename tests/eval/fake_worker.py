"""A stand-in evaluation worker that speaks the real protocol; each request's candidate meta says
how to behave (``behaviour``: ok, hang, die, restart, infra, infra_restart; ``delay_s``).

Run as ``python -m tests.eval.fake_worker --device N [--fail-start] [--start-delay S]``; an
outcome's summary is JSON saying which process answered (``pid``) and when it said it was ready
(``started_at``): ``worker_said`` reads it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from kforge.core.candidate import Baseline, EvalOutcome, EvalStatus, Timing
from kforge.core.gpu import GpuInfo
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
    Ready,
    Reply,
    Shutdown,
    read_request,
    worker_exits_after,
    write_frame,
)

TIMING = Timing(median_us=10.0, p10_us=9.0, p90_us=11.0, reps=20)


def worker_said(outcome: EvalOutcome) -> dict:
    """What the fake worker that answered said of itself: its ``pid`` and ``started_at``."""
    return json.loads(outcome.summary)
STARTED_AT = [0.0]  # when this worker said it was ready


def reply_to(request: Evaluate | MeasureBaseline | Ping, device: int) -> Reply:
    if isinstance(request, Ping):
        return Pong(id=request.id)
    if isinstance(request, MeasureBaseline):
        if request.card.op == "aten.div.Tensor":
            return Failed("eager aten.div.Tensor fails on replayed inputs", id=request.id)
        return BaselineMeasured(Baseline(eager=TIMING, floor_us=1.0, note="fake"), id=request.id)
    meta = request.candidate.meta
    time.sleep(meta.get("delay_s", 0))
    behaviour = meta.get("behaviour", "ok")
    if behaviour == "hang":
        time.sleep(3600)
    if behaviour == "die":
        print("RuntimeError: CUDA error: an illegal memory access was encountered",
              file=sys.stderr, flush=True)
        os._exit(1)
    if behaviour in ("infra", "infra_restart"):
        return Failed("something broke", restart=behaviour == "infra_restart", id=request.id)
    placement = Placement(f"cuda:{device}")
    said = json.dumps({"pid": os.getpid(), "started_at": STARTED_AT[0]})
    if behaviour == "restart":
        outcome = EvalOutcome(EvalStatus.CRASH, "a kernel crashed", placement=placement,
                              restart=True)
        return Evaluated(outcome, restart=True, id=request.id)
    outcome = EvalOutcome(EvalStatus.OK, said, timing=TIMING, eager=TIMING, speedup=1.0,
                          placement=placement)
    return Evaluated(outcome, id=request.id)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--fail-start", action="store_true")
    parser.add_argument("--start-delay", type=float, default=0.0)
    args = parser.parse_args()
    time.sleep(args.start_delay)
    out, inp = sys.stdout.buffer, sys.stdin.buffer
    if args.fail_start:
        write_frame(out, Fatal("no GPU here"))
        return 2
    STARTED_AT[0] = time.time()
    write_frame(out, Ready(GpuInfo(name=f"Fake {args.device}", arch="sm_90", index=args.device)))
    while True:
        request = read_request(inp)
        if request is None or isinstance(request, Shutdown):
            return 0
        reply = reply_to(request, args.device)
        write_frame(out, reply)
        if worker_exits_after(reply):
            return 3


if __name__ == "__main__":
    sys.exit(main())
