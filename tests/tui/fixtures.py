"""Deterministic session databases for the TUI tests: fixed timestamps, fixed kernels, no GPU."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

from kforge.core.candidate import Baseline, Candidate, EvalOutcome, EvalStatus, LlmCall, Timing
from kforge.core.outcome import Correctness, SetCheck
from kforge.store import SessionStatus, Store
from tests.doubles import sample_cards

NOW = 1_790_000_000.0  # the clock every fixture and app in these tests reads
GPU = {"name": "Fake GPU", "arch": "sm_90"}
KERNEL = """#include <cuda_fp16.h>
#define TILE 256
extern "C" __global__ void __launch_bounds__(TILE) softmax_rows(
    const __half* __restrict__ x, __half* __restrict__ y, int cols) {
  __shared__ float buf[TILE];
  int row = blockIdx.x, t = threadIdx.x;
  float m = -INFINITY;
  for (int c = t; c < cols; c += blockDim.x) m = fmaxf(m, __half2float(x[row * cols + c]));
  buf[t] = m;
  __syncthreads();  // reduce the row maximum
}
"""
LAUNCHER = """def launch(kernel, x, dim, half_to_float):
    y = torch.empty_like(x)
    kernel((x.shape[0],), (256,), (x, y, x.shape[-1]))
    return y
"""


def timing(us: float) -> Timing:
    return Timing(median_us=us, p10_us=us * 0.98, p90_us=us * 1.02, reps=50)


def baseline(eager_us: float, compiled_us: float | None = None) -> dict:
    """A card's baseline as the evaluator stores it: eager (and torch.compile) timed alone."""
    compiled = timing(compiled_us) if compiled_us is not None else None
    return Baseline(eager=timing(eager_us), compiled=compiled).to_dict()


@contextmanager
def frozen_time(start: float = NOW) -> Iterator[None]:
    """time.time() steps one second per call from ``start``: stable, ordered timestamps."""
    ticks = iter(range(10**9))
    with mock.patch("time.time", lambda: start - 3600 + next(ticks)):
        yield


async def build(db: Path, extra_nodes: int = 0) -> dict[str, int]:
    """Two sessions: #1 'toy' searched a little (ok, failed, in-flight and pruned nodes), #2 a
    fresh profile. Returns the ids tests refer to."""
    with frozen_time():
        store = await Store.open(db)
        settings = {"search": {"proposer": "library", "evaluator": "gpu",
                               "iterations_per_op": 4, "usd": 2.0}}
        sid = await store.create_profiled_session("toy", settings, GPU, sample_cards())
        cards = await store.list_cards(sid)
        softmax = cards[0].id
        for card in cards:
            await store.update_card(card.id, eager_us=100.0, compiled_us=110.0, floor_us=25.0)
        ids: dict[str, int] = {"session": sid, "card": softmax, "add_card": cards[1].id}

        async def node(parent: int | None, action: str, speed: float | None,
                       status: EvalStatus = EvalStatus.OK, card: int = softmax) -> int:
            node_id = await store.add_node(sid, card, parent, action)
            source = KERNEL.replace("softmax_rows", f"softmax_rows_{node_id}")
            await store.set_candidate(node_id, Candidate(source, LAUNCHER,
                                                         {"approach": f"{action} {node_id}"}),
                                      [LlmCall("fake-llm", 1200, 400, 0.01, 2.0,
                                               prompt="Write a faster softmax.",
                                               reply="```cuda\n...\n```")])
            if speed is None:
                return node_id  # left in flight
            outcome = (EvalOutcome(status, summary=f"{speed:.2f}x", timing=timing(100 / speed),
                                   eager=timing(100.0), speedup=speed,
                                   correctness=Correctness((SetCheck("seed 1",
                                                                     max_abs=0.0009),)))
                       if status is EvalStatus.OK else
                       EvalOutcome(status, summary="error: expected ';'",
                                   compile_log="kernel.cu(7): error: expected a \";\""))
            await store.finish_node(node_id, outcome, 0.1,
                                    confirmed=status is EvalStatus.OK)
            return node_id

        ids["a"] = await node(None, "new", 1.25)
        ids["a1"] = await node(ids["a"], "refine", 1.6)
        ids["a2"] = await node(ids["a"], "refine", 1.1)
        ids["a11"] = await node(ids["a1"], "refine", None)
        ids["b"] = await node(None, "new", 0.8, EvalStatus.COMPILE_ERROR)
        ids["b1"] = await node(ids["b"], "repair", 0.9)
        ids["c"] = await node(None, "new", 0.7)
        await node(None, "new", 1.05, card=cards[1].id)
        for i in range(extra_nodes):
            await node(ids["c"], "refine", 0.5 + (i % 7) / 10)
        await store.set_pruned(ids["c"], True)
        await store.update_card(softmax, best_node=ids["a1"], best_speedup=1.6, spent=6,
                                status="searching")
        await store.log(sid, "searching _softmax: 3 approaches so far")
        await store.log(sid, "node 5 failed to compile", "warning")
        await store.set_session_status(sid, SessionStatus.STOPPED)
        await store.create_profiled_session("resnet50-tiny", {}, GPU, sample_cards()[:2])
        await store.close()
    return ids


def build_sync(db: Path, extra_nodes: int = 0) -> dict[str, int]:
    return asyncio.run(build(db, extra_nodes))
