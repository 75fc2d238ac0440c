"""A stand-in evaluation worker that speaks the real protocol; each request's candidate meta says
how to behave (``behaviour``: ok, hang, die, restart, infra; ``delay_s``).

Run as ``python -m tests.eval.fake_worker --device N [--fail-start]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from kforge.core.candidate import EvalOutcome, EvalStatus, Timing
from kforge.core.gpu import GpuInfo
from kforge.eval.protocol import read_frame, write_frame

TIMING = Timing(median_us=10.0, p10_us=9.0, p90_us=11.0, reps=20)


def reply_to(message: dict, device: int) -> tuple[dict, bool]:
    if message["kind"] == "baseline":
        if message["card"]["op"] == "aten.div.Tensor":
            return {"ok": False, "error": "eager aten.div.Tensor fails on replayed inputs"}, False
        return {"ok": True, "baseline": {"eager": vars(TIMING), "compiled": None,
                                         "compile_s": None, "floor_us": 1.0, "note": "fake"}}, False
    meta = message["candidate"]["meta"]
    time.sleep(meta.get("delay_s", 0))
    behaviour = meta.get("behaviour", "ok")
    if behaviour == "hang":
        time.sleep(3600)
    if behaviour == "die":
        print("RuntimeError: CUDA error: an illegal memory access was encountered",
              file=sys.stderr, flush=True)
        os._exit(1)
    if behaviour == "infra":
        return {"ok": False, "error": "something broke"}, False
    extra = {"pid": os.getpid(), "device": device}
    if behaviour == "restart":
        outcome = EvalOutcome(EvalStatus.CRASH, "a kernel crashed", extra=extra)
        return {"ok": True, "outcome": outcome.to_dict(), "restart": True}, True
    outcome = EvalOutcome(EvalStatus.OK, "fine", timing=TIMING, eager=TIMING, speedup=1.0,
                          extra=extra)
    return {"ok": True, "outcome": outcome.to_dict()}, False


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--fail-start", action="store_true")
    args = parser.parse_args()
    out, inp = sys.stdout.buffer, sys.stdin.buffer
    if args.fail_start:
        write_frame(out, {"type": "fatal", "error": "no GPU here"})
        return 2
    write_frame(out, {"type": "ready",
                      "gpu": GpuInfo(name=f"Fake {args.device}", arch="sm_90",
                                     index=args.device).to_dict()})
    while True:
        message = read_frame(inp)
        if message is None or message.get("kind") == "shutdown":
            return 0
        reply, restart = reply_to(message, args.device)
        reply["id"] = message.get("id")
        write_frame(out, reply)
        if restart:
            return 3


if __name__ == "__main__":
    sys.exit(main())
