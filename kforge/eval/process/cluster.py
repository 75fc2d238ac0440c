"""Evaluation on a Ray cluster: the engine stays here, one evaluation actor per GPU on every node.

Each actor runs a one-GPU ``GpuEvaluator`` (``kforge.eval.process.pool``), so a candidate still runs
in the actor's own worker subprocess, with the local pool's timeouts, crash isolation and recycling.
This module adds the cluster: joining it, placing the actors, keeping only GPUs of the session's
architecture, shipping each op's captured samples through Ray's object store once (every actor on a
node reads the node's copy, and unpacks it once), and running again elsewhere a request whose actor
or node was lost (a candidate that crashes its worker is the candidate's failure; an actor that
vanishes is the cluster's, and costs only a re-queue). The engine alone owns the store: actors get a
card, a candidate and samples, and answer an outcome.

Ray is imported only here, and only once a cluster is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kforge
from kforge.core.candidate import Baseline, Candidate, EvalOutcome, EvalStatus
from kforge.core.gpu import NO_GPU, GpuInfo
from kforge.core.opcard import OpCard, key_folder
from kforge.core.outcome import Placement
from kforge.core.settings import EvalSettings
from kforge.errors import KforgeError
from kforge.eval.process.pool import EvaluatorLost

if TYPE_CHECKING:
    from kforge.core.protocols import SearchContext

log = logging.getLogger("kforge.eval.process.cluster")

MIN_RAY = (2, 40)
INSTALL_RAY = "pip install 'kforge[cluster]'"
REACH_TIMEOUT_S = 5.0
# An actor answers within its own timeouts, a dead worker's respawns included; past this much
# more, it (or its node, or the whole cluster) is taken for lost.
ANSWER_GRACE_S = 60.0
CLOSE_TIMEOUT_S = 15.0
WORKERS_KEY = "workers"  # the session settings' key the engine reports the workers under
# In a worker command template: the actor's interpreter and its GPU's index.
PYTHON, DEVICE = "{python}", "{device}"


# ----- what viewers see of the workers -----


@dataclass(frozen=True)
class WorkerStatus:
    """One evaluation worker as the engine reports it (and the TUI shows it)."""

    node: str  # the host it runs on
    gpu: int  # the GPU's index on that host
    name: str  # the GPU's name
    arch: str
    busy: bool = False
    done: int = 0  # evaluations answered
    lost: bool = False  # its actor or node is gone

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> WorkerStatus:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def workers_of(settings: dict) -> list[WorkerStatus]:
    """The workers a session's stored settings report (none for a local search)."""
    table = settings.get(WORKERS_KEY)
    if not isinstance(table, list):
        return []
    return [WorkerStatus.from_dict(w) for w in table if isinstance(w, dict)]


# ----- the pure rules -----


def gpu_slots(nodes: list[dict]) -> list[str]:
    """One entry per whole GPU of the cluster's live nodes (as ``ray.nodes()`` lists them): the
    id of the node it is on."""
    return [node["NodeID"] for node in nodes if node.get("Alive")
            for _ in range(int((node.get("Resources") or {}).get("GPU", 0)))]


def chosen_arch(archs: list[str], wanted: str | None) -> str:
    """The architecture a session is evaluated on: its own (the one it was profiled for) when it
    has one, else the one most of the cluster's GPUs share. KforgeError where no GPU has it."""
    found = Counter(archs)
    if wanted and wanted != "none":
        if wanted not in found:
            have = ", ".join(f"{n} x {a}" for a, n in sorted(found.items())) or "none"
            raise KforgeError(f"the Ray cluster has no GPU of this session's architecture "
                              f"{wanted} (it has: {have})")
        return wanted
    if not found:
        raise KforgeError("no evaluation actor of the Ray cluster started")
    return max(sorted(found), key=lambda arch: found[arch])


def reach_target(address: str) -> tuple[str, int] | None:
    """The host and port a cluster address names (``host:port``, ``ray://host:port``), or None
    for an address Ray resolves itself (``auto``)."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    return host.strip("[]"), int(port)


def connect_error(address: str, exc: BaseException) -> KforgeError:
    """One line for a failed ``ray.init``: a version mismatch, or a cluster not found."""
    text = " ".join(str(exc).split())
    if "version mismatch" in text.lower():
        return KforgeError(f"the Ray cluster at {address} runs another Ray or Python version "
                           f"than this machine ({text[:300]}): install the same versions on "
                           f"every node")
    return KforgeError(f"cannot join the Ray cluster at {address}: {text[:300]}")


# ----- Ray, imported on use -----


def require_ray() -> Any:
    """The ``ray`` module; KforgeError where it is missing or too old."""
    try:
        import ray
    except ImportError:
        raise KforgeError(f"evaluating on a Ray cluster needs Ray: {INSTALL_RAY}") from None
    version = tuple(int(p) for p in ray.__version__.split(".")[:2] if p.isdigit())
    if version < MIN_RAY:
        raise KforgeError(f"Ray {ray.__version__} is too old for kforge (it needs "
                          f"{'.'.join(map(str, MIN_RAY))} or later): {INSTALL_RAY}")
    return ray


def check_reachable(address: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Fail at once, in one line, on an address nothing answers at (Ray itself retries for a
    long time before it gives up)."""
    target = reach_target(address)
    if target is None:
        return
    try:
        socket.create_connection(target, timeout=timeout_s).close()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise KforgeError(f"cannot reach the Ray cluster at {address}: {why} (is `ray start "
                          f"--head` running there, and the port open?)") from None


def connect(address: str) -> bool:
    """Join the Ray cluster at ``address`` as a driver; False when this process already had."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    check_reachable(address)
    try:
        ray.init(address=address, namespace="kforge", log_to_driver=False,
                 logging_level=logging.ERROR)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise connect_error(address, exc) from None
    return True


# ----- the samples' journey -----


def pack_samples(samples_dir: Path | None, card: OpCard) -> dict[str, bytes]:
    """The captured sample files of ``card``, by name (none where there are none)."""
    try:
        folder = key_folder(Path(samples_dir), card.key) if samples_dir else None
    except ValueError:  # a key from a damaged database names no samples
        return {}
    if folder is None or not folder.is_dir():
        return {}
    return {path.name: path.read_bytes() for path in sorted(folder.glob("*.pt"))}


def unpack_samples(root: Path, card_key: str, files: dict[str, bytes]) -> None:
    """Lay shipped samples out under ``root`` as capture did under the session's samples dir."""
    try:
        folder = key_folder(root, card_key)
    except ValueError as exc:
        raise KforgeError(f"refusing the shipped samples: {exc}") from None
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        if Path(name).name != name:  # only plain file names were packed
            raise KforgeError(f"refusing the shipped sample name {name!r}")
        (folder / name).write_bytes(data)


# ----- one actor per GPU -----


def worker_command_from(template: tuple[str, ...] | None):
    """The ``GpuEvaluator`` command of an actor: the real worker, or ``template`` with
    ``{python}`` and ``{device}`` filled in (stand-in workers in tests)."""
    from kforge.eval.process.pool import worker_command

    if template is None:
        return worker_command
    return lambda device: [part.replace(PYTHON, sys.executable).replace(DEVICE, str(device))
                           for part in template]


class EvaluationActor:
    """A Ray actor owning one GPU (Ray makes it the only one visible): a one-GPU
    ``GpuEvaluator`` and the samples shipped to this actor, unpacked once per op."""

    def __init__(self, settings: dict, timeouts: dict[str, float],
                 command: tuple[str, ...] | None) -> None:
        from kforge.eval.process.pool import GpuEvaluator

        self.samples_root = Path(tempfile.mkdtemp(prefix="kforge-samples-"))
        self.unpacked: set[str] = set()
        # The engine sends an actor one evaluation at a time (a slot per GPU): one worker
        # evaluates, the spare beside it replaces it and re-times confirmations.
        self.pool = GpuEvaluator(self.samples_root, [0], settings={**settings, "workers": 1},
                                 command=worker_command_from(command), **timeouts)

    async def start(self) -> dict:
        import ray

        await self.pool.start()
        gpu_ids = ray.get_gpu_ids()
        return {"gpu": self.pool.gpu.to_dict(), "host": socket.gethostname(),
                "gpu_index": int(gpu_ids[0]) if gpu_ids and str(gpu_ids[0]).isdigit() else 0,
                "kforge": kforge.__version__}

    async def _samples(self, card: OpCard, shipment: list) -> None:
        # a one-item list: Ray hands a bare ObjectRef argument over resolved, on every call
        if shipment and card.key not in self.unpacked:
            unpack_samples(self.samples_root, card.key, await shipment[0])
        self.unpacked.add(card.key)

    async def evaluate(self, card: dict, candidate: dict, shipment: list) -> dict:
        op = OpCard.from_dict(card)
        try:
            await self._samples(op, shipment)
            outcome = await self.pool.evaluate(op, Candidate.from_dict(candidate))
        except KforgeError as exc:
            return self._failure(exc)
        return {"outcome": outcome.to_dict()}

    async def confirm(self, card: dict, candidate: dict, outcome: dict, shipment: list) -> dict:
        op = OpCard.from_dict(card)
        try:
            await self._samples(op, shipment)
            confirmed = await self.pool.confirm(op, Candidate.from_dict(candidate),
                                                EvalOutcome.from_dict(outcome))
        except KforgeError as exc:
            return self._failure(exc)
        return {"outcome": confirmed.to_dict()}

    async def baseline(self, card: dict, shipment: list) -> dict:
        op = OpCard.from_dict(card)
        try:
            await self._samples(op, shipment)
            baseline = await self.pool.baseline(op)
        except KforgeError as exc:
            return self._failure(exc)
        return {"baseline": baseline.to_dict()}

    def _failure(self, exc: KforgeError) -> dict:
        """The request failed; ``exhausted`` says the actor has no worker left to try again."""
        return {"error": str(exc), "exhausted": self.pool.exhausted}

    async def close(self) -> None:
        await self.pool.close()
        shutil.rmtree(self.samples_root, ignore_errors=True)


@dataclass
class ActorSlot:
    """The engine's side of one actor: the actor, the Ray node it runs on, what it reported."""

    actor: Any
    node_id: str
    status: WorkerStatus
    gpu: GpuInfo = field(default=NO_GPU)


class ActorLost(Exception):
    """The actor (its process, its node, or the cluster) is gone."""


class ClusterEvaluator:
    """Evaluator (see ``kforge.core.protocols``) whose workers are Ray actors, one per GPU of
    the session's architecture on every node of the cluster at ``address``."""

    def __init__(self, address: str, samples_dir: Path | None, *, settings: dict | None = None,
                 timeout_s: float = EvalSettings.timeout_s,
                 baseline_timeout_s: float = EvalSettings.baseline_timeout_s,
                 start_timeout_s: float = EvalSettings.start_timeout_s,
                 gpu: GpuInfo | None = None,
                 worker_command: tuple[str, ...] | None = None) -> None:
        self.address = address
        self.samples_dir = samples_dir
        self.settings = dict(settings or {})
        self.timeouts = {"timeout_s": timeout_s, "baseline_timeout_s": baseline_timeout_s,
                         "start_timeout_s": start_timeout_s}
        self.wanted_arch = gpu.arch if gpu else None
        self.gpu: GpuInfo = gpu or NO_GPU
        self.worker_command = worker_command
        self.capacity = 0
        self.requeued = 0  # requests run again because their actor was lost
        self.slots: list[ActorSlot] = []  # every actor started, lost ones included
        self._idle: asyncio.Queue[ActorSlot | None] = asyncio.Queue()
        # what went into the object store, once per op: card key -> [ObjectRef], or [] (none)
        self.shipments: dict[str, list] = {}
        self._connected_here = False

    # ----- starting -----

    async def start(self) -> None:
        # joined from a thread: Ray then leaves the engine's SIGTERM handler in place
        self._connected_here = await asyncio.to_thread(connect, self.address)
        try:
            await self._start_actors()
        except BaseException:
            await self.close()
            raise

    async def _start_actors(self) -> None:
        ray = require_ray()
        nodes = gpu_slots(ray.nodes())
        if not nodes:
            raise KforgeError(f"the Ray cluster at {self.address} has no GPU: start its GPU "
                              f"nodes with `ray start --address=... --num-gpus=N`")
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remote = ray.remote(num_gpus=1, num_cpus=0, max_restarts=0,
                            max_task_retries=0)(EvaluationActor)
        actors = [remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            node, soft=False)).remote(self.settings, self.timeouts, self.worker_command)
            for node in nodes]
        limit = self.timeouts["start_timeout_s"] + ANSWER_GRACE_S
        answers = await asyncio.gather(*(self._answer(a.start.remote(), limit) for a in actors),
                                       return_exceptions=True)
        started: list[ActorSlot] = []
        for actor, node, answer in zip(actors, nodes, answers):
            if isinstance(answer, BaseException):
                log.warning("an evaluation actor did not start: %s", one_line(answer))
                ray.kill(actor)
                continue
            if answer["kforge"] != kforge.__version__:
                await self._stop(actors)
                raise KforgeError(f"the Ray cluster at {self.address} runs kforge "
                                  f"{answer['kforge']}, this machine {kforge.__version__}: "
                                  f"install the same on every node")
            gpu = GpuInfo.from_dict(answer["gpu"])
            started.append(ActorSlot(actor, node, WorkerStatus(
                answer["host"], answer["gpu_index"], gpu.name, gpu.arch), gpu))
        if not started:
            first = next(a for a in answers if isinstance(a, BaseException))
            raise KforgeError(f"no evaluation actor of the Ray cluster at {self.address} "
                              f"started: {one_line(first)}")
        try:
            arch = chosen_arch([s.gpu.arch for s in started], self.wanted_arch)
        except KforgeError:
            await self._stop([s.actor for s in started])
            raise
        others = [s for s in started if s.gpu.arch != arch]
        await self._stop([s.actor for s in others])
        self.slots = sorted((s for s in started if s.gpu.arch == arch),
                             key=lambda s: (s.status.node, s.status.gpu))
        for slot in self.slots:
            self._idle.put_nowait(slot)
        self.capacity = len(self.slots)
        self.gpu = self.slots[0].gpu
        log.info("evaluating on %d %s GPU(s) of the Ray cluster at %s", self.capacity, arch,
                 self.address)

    # ----- the workers -----

    def workers(self) -> list[WorkerStatus]:
        """Every worker this evaluator started, as it is now (lost ones included)."""
        return [s.status for s in self.slots]

    def _live(self) -> int:
        return sum(not s.status.lost for s in self.slots)

    async def _acquire(self) -> ActorSlot:
        slot = await self._idle.get() if self._live() else None
        if slot is None:
            self._idle.put_nowait(None)  # wake the next waiter too: nothing is left for it
            raise EvaluatorLost(f"every evaluation worker of the Ray cluster at {self.address} "
                                f"is lost: resume the session once the cluster is back")
        slot.status = replace(slot.status, busy=True)
        return slot

    def _release(self, slot: ActorSlot, answered: bool) -> None:
        slot.status = replace(slot.status, busy=False, done=slot.status.done + answered)
        self._idle.put_nowait(slot)

    def _retire(self, slot: ActorSlot, why: BaseException) -> None:
        import ray

        slot.status = replace(slot.status, busy=False, lost=True)
        log.warning("evaluation worker on %s GPU %d is lost (%s); its request runs again "
                    "elsewhere", slot.status.node, slot.status.gpu, one_line(why))
        with contextlib.suppress(Exception):
            ray.kill(slot.actor)
        if not self._live():
            self._idle.put_nowait(None)

    async def _answer(self, ref: Any, timeout_s: float) -> dict:
        """An actor's answer; ActorLost when the actor, its node or the cluster is gone (or
        stays silent past its own timeouts), KforgeError when the actor's code failed."""
        import ray

        try:
            return await asyncio.wait_for(ref, timeout_s)
        except ray.exceptions.RayTaskError as exc:
            raise KforgeError(f"the evaluation actor failed: {one_line(exc)}") from None
        except (ray.exceptions.RayError, TimeoutError) as exc:
            raise ActorLost(one_line(exc) or type(exc).__name__) from None

    async def _run(self, method: str, card: OpCard, *args: Any, timeout_s: float) -> dict:
        """One request on a free actor, run again on another while actors are lost under it;
        a failure the actor reports is raised as KforgeError."""
        shipment = await self._shipment(card)
        while True:
            slot = await self._acquire()
            try:
                call = getattr(slot.actor, method).remote(card.to_dict(), *args, shipment)
                reply = await self._answer(call, timeout_s + ANSWER_GRACE_S)
            except ActorLost as exc:
                self._retire(slot, exc)
                self.requeued += 1
                continue
            except BaseException:
                self._release(slot, answered=False)
                raise
            if "error" in reply and reply.get("exhausted"):
                self._retire(slot, KforgeError(reply["error"]))
                self.requeued += 1
                continue
            self._release(slot, answered=True)
            if "error" in reply:
                raise KforgeError(reply["error"])
            return {**reply, "node": slot.status}

    async def _shipment(self, card: OpCard) -> list:
        """The card's samples in the object store, put there once: ``[ref]`` (or ``[]``)."""
        if card.key not in self.shipments:
            import ray

            files = await asyncio.to_thread(pack_samples, self.samples_dir, card)
            self.shipments[card.key] = [ray.put(files)] if files else []
        return self.shipments[card.key]

    # ----- the Evaluator protocol -----

    async def evaluate(self, card: OpCard, candidate: Candidate) -> EvalOutcome:
        try:
            reply = await self._run("evaluate", card, candidate.to_dict(),
                                    timeout_s=self._request_limit())
        except EvaluatorLost:
            raise
        except KforgeError as exc:
            return EvalOutcome(EvalStatus.INFRA, f"evaluator error: {exc}")
        return _placed(EvalOutcome.from_dict(reply["outcome"]), reply["node"])

    async def confirm(self, card: OpCard, candidate: Candidate,
                      outcome: EvalOutcome) -> EvalOutcome:
        # each actor's own sanitizer run and fresh worker; the limit covers both
        limit = self._request_limit() + self.timeouts["baseline_timeout_s"]
        try:
            reply = await self._run("confirm", card, candidate.to_dict(), outcome.to_dict(),
                                    timeout_s=limit)
        except EvaluatorLost:
            raise
        except KforgeError as exc:
            return outcome.judged_again(EvalStatus.INFRA, f"the confirmation run failed: {exc}")
        return _placed(EvalOutcome.from_dict(reply["outcome"]), reply["node"])

    async def baseline(self, card: OpCard) -> Baseline:
        limit = self.timeouts["baseline_timeout_s"] + self._respawn_limit()
        reply = await self._run("baseline", card, timeout_s=limit)
        return Baseline.from_dict(reply["baseline"])

    def _respawn_limit(self) -> float:
        from kforge.eval.process.pool import RESPAWN_TRIES

        return RESPAWN_TRIES * self.timeouts["start_timeout_s"]

    def _request_limit(self) -> float:
        return self.timeouts["timeout_s"] + self._respawn_limit()

    # ----- closing -----

    async def _stop(self, actors: list) -> None:
        """Close actors (their workers stop, their samples go) and end them."""
        import ray

        async def stop(actor: Any) -> None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(actor.close.remote(), CLOSE_TIMEOUT_S)
            with contextlib.suppress(Exception):
                ray.kill(actor)

        await asyncio.gather(*(stop(a) for a in actors))

    async def close(self) -> None:
        await self._stop([s.actor for s in self.slots if not s.status.lost])
        self.shipments.clear()
        if self._connected_here:
            import ray

            ray.shutdown()
            self._connected_here = False


def _placed(outcome: EvalOutcome, where: WorkerStatus) -> EvalOutcome:
    """The outcome with the host and GPU that measured it."""
    return replace(outcome, placement=replace(outcome.placement or Placement(), node=where.node,
                                              node_gpu=where.gpu))


def one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[-1][:300] if lines else type(exc).__name__


def make_cluster_evaluator(ctx: SearchContext) -> ClusterEvaluator:
    """The ``gpu`` evaluator of a session searched with ``[search] cluster`` set: its workers
    are actors on the GPUs of that Ray cluster."""
    settings = ctx.settings.eval
    if settings.devices is not None:
        raise KforgeError("[eval] devices picks GPUs of this machine; a Ray cluster uses every "
                          "GPU of the session's architecture: leave devices unset")
    return ClusterEvaluator(
        ctx.settings.search.cluster, ctx.samples_dir, settings=settings.to_dict(),
        timeout_s=settings.timeout_s, baseline_timeout_s=settings.baseline_timeout_s,
        start_timeout_s=settings.start_timeout_s, gpu=ctx.gpu)
