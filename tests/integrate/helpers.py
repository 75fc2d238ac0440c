"""Sessions with winning kernels for the integration tests: the toy model profiled for real (on
the CPU, or on the GPU for GPU tests), with library kernels stored as verified winners."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from kforge.capture.loader import LoadedModel
from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus, Timing
from kforge.core.gpu import GpuInfo
from kforge.core.opcard import OpCard
from kforge.core.outcome import HostCost
from kforge.core.reward import reward_from_speedup
from kforge.propose.library.proposer import build_candidate, make_plan
from kforge.store import Store

TOY = str(Path(__file__).with_name("toy_model.py").resolve()) + ":build"
TOY_WIDER = str(Path(__file__).with_name("toy_model.py").resolve()) + ":build_wider"
FAKE_GPU = {"name": "Fake GPU", "arch": "sm_90"}
# ops of the toy model with library kernels, and the speedup each is recorded with
WINNING_OPS = {"aten._softmax.default": 1.8, "aten.native_layer_norm.default": 1.4,
               "aten.gelu.default": 1.3}
# host time per call of each winner's launch path and of eager's own call, as recorded
HOST_COSTS = HostCost(9.0, 6.5)


def timing(us: float, spread: float = 0.02) -> Timing:
    return Timing(median_us=us, p10_us=us * (1 - spread / 2), p90_us=us * (1 + spread / 2),
                  reps=50)


def library_candidate(card: OpCard, arch: str) -> Candidate:
    gpu = GpuInfo(name="test", arch=arch, sm_count=132)
    plan = make_plan(card, gpu)
    variant = plan.available[0]
    return build_candidate(plan, variant, variant.space.default, gpu, card, "test")


def profile_toy(device: str = "cpu"):
    """The toy model loaded on ``device`` and profiled (no samples)."""
    from kforge.capture import ModelOptions, load_model, profile

    loaded = load_model(TOY, ModelOptions(device=device))
    return loaded, profile(loaded, samples_per_card=0, staging_dir=Path("/nonexistent"))


async def add_winner(store: Store, session: int, card_id: int, candidate: Candidate,
                     speedup: float, spread: float = 0.02, status: EvalStatus = EvalStatus.OK
                     ) -> int:
    node = await store.add_node(session, card_id, None, "new")
    await store.set_candidate(node, candidate)
    ok = status is EvalStatus.OK
    outcome = EvalOutcome(status, summary="test", timing=timing(100.0 / speedup, spread),
                          eager=timing(100.0, spread), speedup=speedup if ok else None,
                          host=HOST_COSTS)
    await store.finish_node(node, outcome, reward_from_speedup(speedup) if ok else None,
                            confirmed=ok)
    return node


def make_session(db: Path, *, gpu: dict | None = None, device: str = "cpu",
                 winners: dict[str, float] | None = None, model: str | None = None) -> int:
    """A session of the toy model with library kernels as winners for ``winners`` (op ->
    speedup; default WINNING_OPS); kernels are generated for the session's architecture.
    ``model`` stores another model spec with the toy's cards (a model that changed since)."""
    gpu = gpu or FAKE_GPU
    loaded, result = profile_toy(device)
    wanted = WINNING_OPS if winners is None else winners

    async def go() -> int:
        store = await Store.open(db)
        try:
            sid = await store.create_profiled_session(
                model or loaded.name, {**loaded.settings, "samples": 0}, gpu, result.cards,
                modules=result.modules)
            for row in await store.list_cards(sid):
                if row.card.op in wanted:
                    arch = gpu["arch"] if gpu["arch"] != "none" else "sm_90"
                    await add_winner(store, sid, row.id, library_candidate(row.card, arch),
                                     wanted[row.card.op])
            return sid
        finally:
            await store.close()

    return asyncio.run(go())


def cpu_model() -> LoadedModel:
    """A small model and input on the CPU, in the form whole-model measurements take."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    return LoadedModel("m", model, (torch.randn(2, 8),), {}, torch.float32, torch.device("cpu"))
