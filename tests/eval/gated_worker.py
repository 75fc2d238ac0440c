"""A stand-in evaluation worker for the cluster tests: ``tests.eval.fake_worker``'s replies, with
the GPU's architecture read from ``KFORGE_TEST_ARCH`` (each test node sets its own), an
evaluation held back until the file its candidate's meta names as ``gate`` exists, and the
captured samples the worker was given reported (name -> sha256) as ``samples`` in what
``tests.eval.fake_worker.worker_said`` reads.

Run as ``python -m tests.eval.gated_worker --device N``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from kforge.core.gpu import GpuInfo
from kforge.eval.process.protocol import (
    Evaluate,
    Evaluated,
    Ready,
    Shutdown,
    read_request,
    worker_exits_after,
    write_frame,
)
from tests.eval.fake_worker import reply_to, worker_said

GATE_POLL_S = 0.02


def wait_for_gate(gate: str, parent: int) -> None:
    """Until the gate file exists; exit if the actor that started this worker is gone."""
    while not Path(gate).exists():
        if os.getppid() != parent:
            sys.exit(0)
        time.sleep(GATE_POLL_S)


def samples_seen(request: Evaluate) -> dict[str, str]:
    folder = request.samples_dir / request.card.key if request.samples_dir else None
    if folder is None or not folder.is_dir():
        return {}
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args()
    out, inp, parent = sys.stdout.buffer, sys.stdin.buffer, os.getppid()
    arch = os.environ.get("KFORGE_TEST_ARCH", "sm_90")
    write_frame(out, Ready(GpuInfo(name=f"Fake {arch}", arch=arch, index=args.device)))
    while True:
        request = read_request(inp)
        if request is None or isinstance(request, Shutdown):
            return 0
        if isinstance(request, Evaluate) and request.candidate.meta.get("gate"):
            wait_for_gate(request.candidate.meta["gate"], parent)
        reply = reply_to(request, args.device)
        if isinstance(request, Evaluate) and isinstance(reply, Evaluated) and reply.outcome.ok:
            said = {**worker_said(reply.outcome), "samples": samples_seen(request)}
            reply = replace(reply, outcome=replace(reply.outcome, summary=json.dumps(said)))
        write_frame(out, reply)
        if worker_exits_after(reply):
            return 3


if __name__ == "__main__":
    sys.exit(main())
