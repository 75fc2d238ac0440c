"""Benchmark scale-out evaluation: evaluations per minute of one library search over 8 ops, on one
GPU (the local worker pool), on two GPUs through a Ray cluster, and (for reference) on two GPUs
through the local pool. Each run is a fresh session searched by the real engine with the
``library`` proposer and real evaluation workers; the table gives the wall time of the whole
search (eager and torch.compile baselines included) and of the candidates alone.

Run on a 2-GPU machine from the repository root (``pip install -e '.[cuda,cluster]'``):
    python3 bench/bench_cluster.py [--iterations 12] [--address auto] [--quick]

Without ``--address`` a Ray instance is started in this process over this machine's GPUs; with
one, the runs join that cluster (``ray start --head`` there first). ``--quick`` turns the
compute-sanitizer and hardware-counter passes off, so the table measures evaluation alone.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kforge.core.opcard import OpCard
from kforge.core.protocols import SearchContext
from kforge.core.settings import EvalSettings, SearchSettings, SessionSettings
from kforge.engine.engine import Engine
from kforge.engine.plugins import make_proposer
from kforge.eval.process.cluster import ClusterEvaluator
from kforge.eval.process.pool import GpuEvaluator
from kforge.propose.library import supports
from kforge.propose.library.examples import tensor
from kforge.runtime.gpuinfo import detect_gpu, require_cuda
from kforge.store import NodeStatus, SessionStatus, Store

BF16, F32 = "bfloat16", "float32"


def bench_cards() -> list[OpCard]:
    """Eight ops of a transformer block at 2048 tokens, one library family each where it can."""
    tokens, hidden = 2048, 2048
    x = tensor([1, tokens, hidden], BF16)
    cards = [
        OpCard("aten._softmax.default", [tensor([1, 16, tokens, tokens], F32), -1, False]),
        OpCard("aten.native_layer_norm.default", [x, [hidden], None, None, 1e-5]),
        OpCard("aten.gelu.default", [tensor([1, tokens, 4 * hidden], BF16)],
               {"approximate": "tanh"}),
        OpCard("aten.silu.default", [tensor([1, tokens, 4 * hidden], BF16)]),
        OpCard("aten.mul.Tensor", [x, x]),
        OpCard("aten.add.Tensor", [x, tensor([1, 1, hidden], BF16)]),
        OpCard("aten.mean.dim", [tensor([1, tokens, hidden], F32), [-1], True]),
        OpCard("aten.sigmoid.default", [x]),
    ]
    unsupported = [c.op for c in cards if supports(c).family is None]
    if unsupported:
        raise SystemExit(f"the library has no kernels for {unsupported}: pick other ops")
    return [replace(c, calls=1, total_us=100.0, share=1 / len(cards)) for c in cards]


@dataclass
class Run:
    name: str
    gpus: int
    evaluations: int
    wall_s: float
    status: str

    @property
    def per_minute(self) -> float:
        return 60 * self.evaluations / self.wall_s if self.wall_s else 0.0


async def search(name: str, make_evaluator, iterations: int, gpus: int,
                 eval_settings: EvalSettings) -> Run:
    with tempfile.TemporaryDirectory(prefix="kforge-bench-") as folder:
        store = await Store.open(Path(folder) / "k.db")
        try:
            gpu = detect_gpu(0)
            search_settings = SearchSettings(iterations_per_op=iterations, parallel=2 * gpus,
                                             patience=10**6, seed=0)
            settings = SessionSettings(search=search_settings, eval=eval_settings)
            sid = await store.create_profiled_session(
                "bench", {"search": search_settings.to_dict(), "eval": eval_settings.to_dict()},
                gpu.to_dict(), bench_cards())
            ctx = SearchContext(session_id=sid, samples_dir=store.samples_dir(sid),
                                settings=settings, gpu=gpu)
            evaluator = make_evaluator(ctx)
            engine = Engine(store, sid, make_proposer("library", ctx), evaluator,
                            search_settings)
            started = time.perf_counter()
            status = await engine.run()
            wall = time.perf_counter() - started
            evaluated = [n for n in await store.list_nodes(sid)
                         if n.status != NodeStatus.NO_CANDIDATE]
            return Run(name, evaluator.capacity, len(evaluated), wall, str(status))
        finally:
            await store.close()


def local_pool(devices: list[int], settings: EvalSettings):
    return lambda ctx: GpuEvaluator(ctx.samples_dir, devices, settings=settings.to_dict(),
                                    timeout_s=settings.timeout_s,
                                    baseline_timeout_s=settings.baseline_timeout_s,
                                    start_timeout_s=settings.start_timeout_s, gpu=ctx.gpu)


def ray_cluster(address: str, settings: EvalSettings):
    return lambda ctx: ClusterEvaluator(address, ctx.samples_dir, settings=settings.to_dict(),
                                        timeout_s=settings.timeout_s,
                                        baseline_timeout_s=settings.baseline_timeout_s,
                                        start_timeout_s=settings.start_timeout_s, gpu=ctx.gpu)


def table(runs: list[Run]) -> str:
    base = runs[0].per_minute or 1.0
    lines = [f"{'evaluator':<28} {'GPUs':>4} {'evals':>6} {'wall s':>8} {'evals/min':>10} "
             f"{'vs 1 GPU':>9}  status"]
    for r in runs:
        lines.append(f"{r.name:<28} {r.gpus:>4} {r.evaluations:>6} {r.wall_s:>8.1f} "
                     f"{r.per_minute:>10.1f} {r.per_minute / base:>8.2f}x  {r.status}")
    return "\n".join(lines)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=12, help="per op (default 12)")
    parser.add_argument("--address", help="a running Ray cluster (default: one started here)")
    parser.add_argument("--quick", action="store_true",
                        help="no compute-sanitizer, no hardware counters")
    args = parser.parse_args()
    require_cuda()
    import torch

    if torch.cuda.device_count() < 2 and not args.address:
        raise SystemExit("this benchmark needs two GPUs here (or --address of a cluster)")
    settings = EvalSettings(sanitize=not args.quick, counters=not args.quick)
    address = args.address
    if address is None:
        import ray

        ray.init(num_gpus=2, include_dashboard=False, log_to_driver=False)
        address = "auto"  # the evaluator finds this process already joined
    runs = [await search("local pool", local_pool([0], settings), args.iterations, 1, settings),
            await search("Ray cluster", ray_cluster(address, settings), args.iterations, 2,
                         settings)]
    if torch.cuda.device_count() >= 2:
        runs.append(await search("local pool (reference)", local_pool([0, 1], settings),
                                 args.iterations, 2, settings))
    print(table(runs))
    failed = [r for r in runs if r.status != SessionStatus.DONE]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
