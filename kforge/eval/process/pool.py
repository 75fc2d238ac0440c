"""The engine's GPU evaluator: ``workers`` worker processes per visible GPU, evaluations spread
over them.

Workers of one GPU evaluate side by side: compiles and correctness checks overlap, and only timed
sections hold the GPU alone (``kforge.runtime.gpulock``), so a timing is the candidate's own. Each
GPU also has ``spares``: workers started ahead of need that have run nothing, so that replacing a
worker or confirming a new best never waits for a process to start.

A worker that hangs past the timeout is killed, one that dies is noted; either way the candidate's
outcome says what happened (TIMEOUT, CRASH), the spare takes its place and the search goes on. A
worker that has run a candidate can never weigh on the verdict of another: it is replaced after any
crash or failure, and in any case after ``recycle_after`` evaluations. A candidate about to become
an op's best is confirmed before it counts (``confirm``, which the engine runs beside the search):
compute-sanitizer runs it while a worker that has run nothing before (the spare) evaluates and
times it again on new inputs. Once its candidate passed, that worker takes the place of the next
search worker of its GPU that retires, so the replacement starts no process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from kforge.core.candidate import Baseline, Candidate, EvalOutcome, EvalStatus
from kforge.core.child import child_env, python_command
from kforge.core.gpu import NO_GPU, GpuInfo
from kforge.core.opcard import OpCard
from kforge.core.outcome import (
    Confirmation,
    FailureEvidence,
    Placement,
    SanitizerReport,
)
from kforge.core.settings import EvalSettings, TimingPlan
from kforge.errors import KforgeError
from kforge.eval.process.protocol import (
    BaselineMeasured,
    Evaluate,
    Evaluated,
    Failed,
    Fatal,
    MeasureBaseline,
    Message,
    Ping,
    Ready,
    Reply,
    Shutdown,
    encode,
    read_frame_async,
    worker_exits_after,
)

DEFAULT_TIMEOUT_S = EvalSettings.timeout_s
DEFAULT_BASELINE_TIMEOUT_S = EvalSettings.baseline_timeout_s
DEFAULT_START_TIMEOUT_S = EvalSettings.start_timeout_s
RESPAWN_TRIES = 3
STDERR_LINES = 200


def worker_command(device: int) -> list[str]:
    return python_command("kforge.eval.process.worker", "--device", str(device))


class WorkerGone(Exception):
    """The worker process ended or stopped answering."""


class EvaluatorLost(KforgeError):
    """No worker is left to evaluate on: the search cannot go on (no op or candidate is at
    fault, so none is written off for it)."""


def confirmation_settings(settings: dict) -> dict:
    """The evaluation settings of a confirmation run: other seeds, so other input values."""
    seeds = settings.get("seeds") or EvalSettings.seeds
    return {**settings, "seeds": [int(s) + 7919 for s in seeds],
            "stress_seed": int(settings.get("stress_seed", EvalSettings.stress_seed)) + 7919}


class WorkerProcess:
    """One worker subprocess and its pipes."""

    def __init__(self, device: int, command: list[str]) -> None:
        self.device = device
        self.command = command
        self.process: asyncio.subprocess.Process | None = None
        self.stderr: deque[str] = deque(maxlen=STDERR_LINES)
        self._pump: asyncio.Task | None = None
        self._ids = itertools.count(1)
        self.served = 0  # evaluations answered

    async def start(self, timeout_s: float) -> GpuInfo:
        # The worker imports this same kforge, installed or not, and nothing from the folder
        # it starts in.
        self.process = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=child_env())
        self._pump = asyncio.create_task(self._read_stderr())
        try:
            hello = await asyncio.wait_for(self._read(), timeout_s)
        except TimeoutError:
            await self.kill()
            raise KforgeError(f"the evaluation worker for GPU {self.device} did not start within "
                              f"{timeout_s:.0f} s") from None
        except WorkerGone:
            await self.kill()
            raise KforgeError(f"the evaluation worker for GPU {self.device} exited at start: "
                              f"{self.last_error()}") from None
        if isinstance(hello, Ready):
            return hello.gpu
        await self.kill()
        why = hello.error if isinstance(hello, Fatal) else f"it began with {hello!r}"
        raise KforgeError(f"the evaluation worker for GPU {self.device} cannot run: {why}")

    async def _read_stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        async for line in self.process.stderr:
            self.stderr.append(line.decode(errors="replace").rstrip())

    async def _read(self) -> Message:
        assert self.process is not None and self.process.stdout is not None
        try:
            return await read_frame_async(self.process.stdout)
        except EOFError:
            raise WorkerGone() from None

    async def request(self, request: Evaluate | MeasureBaseline | Ping, timeout_s: float) -> Reply:
        """Send one request and wait for its reply. Raises TimeoutError or WorkerGone."""
        assert self.process is not None and self.process.stdin is not None
        request = replace(request, id=next(self._ids))
        try:
            self.process.stdin.write(encode(request))
            await self.process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            raise WorkerGone() from None
        while True:
            reply = await asyncio.wait_for(self._read(), timeout_s)
            if isinstance(reply, Reply) and reply.id == request.id:
                return reply

    def last_error(self) -> str:
        """The most telling stderr lines (a CUDA error, a Python exception)."""
        lines = [ln for ln in self.stderr if ln.strip()]
        telling = [ln for ln in lines if "error" in ln.lower() or "Error" in ln]
        return (telling or lines or ["no output"])[-1][:500]

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
        if self._pump is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._pump, 5)

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(Exception):
                assert self.process.stdin is not None
                self.process.stdin.write(encode(Shutdown()))
                await self.process.stdin.drain()
                self.process.stdin.close()
                await asyncio.wait_for(self.process.wait(), 10)
        await self.kill()


class GpuEvaluator:
    """Evaluator (see ``kforge.core.protocols``) backed by worker processes, ``workers`` per GPU."""

    def __init__(self, samples_dir: Path | None, devices: list[int], *,
                 settings: dict | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 baseline_timeout_s: float = DEFAULT_BASELINE_TIMEOUT_S,
                 start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 command: Callable[[int], list[str]] = worker_command,
                 gpu: GpuInfo | None = None) -> None:
        if not devices:
            raise KforgeError("the GPU evaluator needs at least one GPU")
        self.samples_dir = samples_dir
        self.devices = list(devices)
        self.settings = dict(settings or {})
        self.timeout_s = timeout_s
        self.baseline_timeout_s = baseline_timeout_s
        self.start_timeout_s = start_timeout_s
        self.command = command
        self.gpu: GpuInfo = gpu or NO_GPU
        self.gpus: dict[int, GpuInfo] = {}
        self.per_gpu = int(self.settings.get("workers", EvalSettings.workers))
        self.capacity = len(self.devices) * self.per_gpu
        self.restarts = 0
        self.recycle_after = int(self.settings.get("recycle_after", EvalSettings.recycle_after))
        self._idle: asyncio.Queue[WorkerProcess | None] = asyncio.Queue()
        self._working: set[WorkerProcess] = set()
        self._alive = 0
        self._respawns: set[asyncio.Task] = set()
        self.spares = int(self.settings.get("spares", EvalSettings.spares))
        # device -> its spare workers, each started (or starting) ahead of need
        self._spares: dict[int, deque[asyncio.Task[WorkerProcess]]] = {}
        # device -> a worker that confirmed a candidate, kept for the next retiring search worker
        self._successors: dict[int, WorkerProcess] = {}

    @property
    def exhausted(self) -> bool:
        """Every worker failed to restart: no evaluation can run here any more."""
        return self._alive <= 0

    async def start(self) -> None:
        workers = [WorkerProcess(d, self.command(d)) for d in self.devices
                   for _ in range(self.per_gpu)]
        results = await asyncio.gather(*(w.start(self.start_timeout_s) for w in workers),
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await asyncio.gather(*(w.kill() for w in workers))
            raise errors[0] if isinstance(errors[0], KforgeError) else KforgeError(
                f"the evaluation workers did not start: {errors[0]}")
        for worker, info in zip(workers, results):
            assert isinstance(info, GpuInfo)
            self.gpus[worker.device] = info
            self._idle.put_nowait(worker)
        self._alive = len(workers)
        self.gpu = self.gpus[self.devices[0]]
        for device in self.devices:
            for _ in range(self.spares):
                self._start_spare(device)

    def _start_spare(self, device: int) -> None:
        """Start a spare worker of GPU ``device`` in the background."""
        self._spares.setdefault(device, deque()).append(asyncio.create_task(
            self._started(WorkerProcess(device, self.command(device)))))

    async def _started(self, worker: WorkerProcess) -> WorkerProcess:
        try:
            await worker.start(self.start_timeout_s)
        except BaseException:  # a start that failed or was cancelled leaves no process behind
            await worker.kill()
            raise
        return worker

    async def _fresh(self, device: int) -> WorkerProcess:
        """A worker of GPU ``device`` that has run nothing: a spare (started ahead of need; one
        that is ready before one still starting), with the next spare started in its place.
        KforgeError when none would start."""
        why: BaseException | None = None
        for _ in range(RESPAWN_TRIES):
            waiting = self._spares.setdefault(device, deque())
            if not waiting:
                self._start_spare(device)
            spare = next((t for t in waiting if t.done()), waiting[0])
            waiting.remove(spare)
            self._start_spare(device)
            try:
                return await spare
            except KforgeError as exc:
                why = exc
        raise KforgeError(f"no fresh worker would start on GPU {device}: {why}")

    async def _acquire(self) -> WorkerProcess:
        while True:
            if self._alive <= 0:
                raise EvaluatorLost("no evaluation worker is left: every GPU worker failed to "
                                    "restart (see the log for the worker's last error)")
            worker = await self._idle.get()
            if worker is not None:
                self._working.add(worker)
                return worker

    def _release(self, worker: WorkerProcess) -> None:
        self._working.discard(worker)
        self._idle.put_nowait(worker)

    def _replace(self, worker: WorkerProcess) -> None:
        """Kill ``worker`` and start a fresh one for its GPU in the background."""
        self._working.discard(worker)
        self.restarts += 1
        task = asyncio.create_task(self._respawn(worker))
        self._respawns.add(task)
        task.add_done_callback(self._respawns.discard)

    async def _respawn(self, old: WorkerProcess) -> None:
        await old.kill()
        successor = self._successors.pop(old.device, None)
        if successor is not None and successor.running:
            self._idle.put_nowait(successor)
            return
        try:
            worker = await self._fresh(old.device)
        except KforgeError:
            self._alive -= 1
            self._idle.put_nowait(None)  # wake a waiter so it sees that no worker is left
            return
        self._idle.put_nowait(worker)

    async def _call(self, request: Evaluate | MeasureBaseline,
                    timeout_s: float) -> tuple[Reply | None, str, WorkerProcess]:
        """Run one request on a free worker: ``(reply, "", worker)``, or ``(None, why, worker)``
        with why "timeout" or "died"; a worker that failed is being replaced already."""
        worker = await self._acquire()
        try:
            reply = await worker.request(request, timeout_s)
        except TimeoutError:
            self._replace(worker)
            return None, "timeout", worker
        except WorkerGone:
            await asyncio.sleep(0.2)  # let the stderr pump catch the last lines
            self._replace(worker)
            return None, "died", worker
        except BaseException:
            self._replace(worker)  # cancelled mid-request: the worker's state is unknown
            raise
        worker.served += 1
        if worker_exits_after(reply) or worker.served >= self.recycle_after:
            self._replace(worker)
        else:
            self._release(worker)
        return reply, "", worker

    async def evaluate(self, card: OpCard, candidate: Candidate) -> EvalOutcome:
        started = time.perf_counter()
        request = Evaluate(card, candidate, self.samples_dir, self.settings)
        reply, failure, worker = await self._call(request, self.timeout_s)
        wall = round(time.perf_counter() - started, 3)
        if failure == "timeout":
            return EvalOutcome(EvalStatus.TIMEOUT, f"no verdict within {self.timeout_s:.0f} s (a "
                               f"hung kernel?): the worker on GPU {worker.device} was restarted",
                               wall_s=wall, placement=Placement(f"cuda:{worker.device}"))
        if failure == "died":
            code = worker.process.returncode if worker.process else None
            return EvalOutcome(EvalStatus.CRASH, f"the worker on GPU {worker.device} died (exit "
                               f"code {code}): {worker.last_error()}", wall_s=wall,
                               placement=Placement(f"cuda:{worker.device}"),
                               failure=FailureEvidence(
                                   stderr="\n".join(list(worker.stderr)[-30:])))
        match reply:
            case Evaluated(outcome=outcome):
                return outcome
            case Failed(error=error, traceback=trace):
                return EvalOutcome(EvalStatus.INFRA, f"evaluator error: {error}", wall_s=wall,
                                   failure=FailureEvidence(traceback=trace))
        raise KforgeError(f"the worker on GPU {worker.device} answered an evaluation with "
                          f"{reply!r}")

    async def confirm(self, card: OpCard, candidate: Candidate,
                      outcome: EvalOutcome) -> EvalOutcome:
        """The outcome that counts for a candidate about to become ``card``'s best: rejected with
        compute-sanitizer's message if it reports anything, else the candidate's evaluation on
        new inputs by a worker that has run nothing before (its speedup is the one reported).

        The sanitizer and the fresh worker's evaluation run at once (a confirmation takes the
        longer of the two, not their sum), each in a process of its own, so neither verdict
        depends on the other; a sanitizer report ends the evaluation. Both run beside the
        search's evaluations, holding the GPU only as any evaluation does: alone while timed,
        shared otherwise."""
        where = outcome.placement.device if outcome.placement else ""
        device = int(where.split(":")[1]) if where.startswith("cuda:") else self.devices[0]
        facts = replace(outcome.confirmation or Confirmation(), first_speedup=outcome.speedup)
        stop = threading.Event()  # a confirmation cancelled (superseded) ends its sanitizer run
        rerun = asyncio.create_task(self._fresh_evaluation(card, candidate, device))
        kept = False
        try:
            if self.settings.get("sanitize", EvalSettings.sanitize):
                report = await asyncio.to_thread(self._sanitize, card, candidate, outcome, device,
                                                 stop)
                facts = replace(facts, sanitizer=report)
                if not report.ok:  # a report rejects it; a sanitizer that could not run, not
                    return replace(outcome.judged_again(
                        EvalStatus.MISMATCH if report.ran else EvalStatus.INFRA, report.message),
                        confirmation=facts)
            reply, worker = await rerun
            if not isinstance(reply, Evaluated):
                return replace(outcome.judged_again(
                    EvalStatus.INFRA, f"the confirmation run answered {reply!r}"),
                    confirmation=facts)
            again = reply.outcome
            kept = self._keep_as_successor(worker, reply)
            return replace(again, confirmation=replace(
                again.confirmation or Confirmation(), first_speedup=facts.first_speedup,
                sanitizer=facts.sanitizer, confirmed=True))
        except (KforgeError, TimeoutError, WorkerGone) as exc:
            return replace(outcome.judged_again(EvalStatus.INFRA,
                                                f"the confirmation run failed: {exc}"),
                           confirmation=facts)
        finally:
            stop.set()
            rerun.cancel()
            (ran,) = await asyncio.gather(rerun, return_exceptions=True)
            if isinstance(ran, tuple) and not kept:
                await ran[1].kill()

    def _keep_as_successor(self, worker: WorkerProcess, reply: Evaluated) -> bool:
        """Keep a confirmation's worker, whose one candidate passed every check and the
        sanitizer, to take the place of the next search worker of its GPU that retires: that
        replacement then starts no process (a start holds the GPU for its warm-up while the
        search's timed sections wait). One a GPU; whether it was kept."""
        if reply.outcome.status is not EvalStatus.OK or worker_exits_after(reply):
            return False
        worker.served += 1
        old = self._successors.pop(worker.device, None)
        self._successors[worker.device] = worker
        if old is not None:
            task = asyncio.create_task(old.kill())
            self._respawns.add(task)
            task.add_done_callback(self._respawns.discard)
        return True

    async def _fresh_evaluation(self, card: OpCard, candidate: Candidate, device: int
                                ) -> tuple[Reply, WorkerProcess]:
        """``candidate`` evaluated on new inputs by a worker that has run nothing before: the
        reply and the worker, the caller's to keep or end (ended here if the request fails or
        is cancelled)."""
        fresh = await self._fresh(device)
        try:
            request = Evaluate(card, candidate, self.samples_dir,
                               confirmation_settings(self.settings))
            return await fresh.request(request, self.timeout_s), fresh
        except BaseException:
            await fresh.kill()
            raise

    def _sanitize(self, card: OpCard, candidate: Candidate, outcome: EvalOutcome,
                  device: int, stop: threading.Event) -> SanitizerReport:
        """compute-sanitizer's verdict, from the cache where the same kernel was judged before.
        The cubin comes from the compile cache the worker filled."""
        from kforge.eval.process.sanitize import VerdictCache, sanitize_candidate
        from kforge.runtime.kernel_loader import NvrtcLoader

        arch = self.gpus[device].arch if device in self.gpus else self.gpu.arch
        try:
            compiled = NvrtcLoader(device, arch).compile(candidate)
            cubin = compiled.cubin if compiled.ok else None
        except Exception:  # noqa: BLE001 - no NVRTC here: every tool runs, keyed by source
            cubin = None
        timed = outcome.timing.reps + TimingPlan().warmup if outcome.timing else None
        return sanitize_candidate(card, candidate, samples_dir=self.samples_dir, device=device,
                                  cubin=cubin, timed_calls=timed, cache=VerdictCache(),
                                  stop=stop)

    async def baseline(self, card: OpCard) -> Baseline:
        request = MeasureBaseline(card, self.samples_dir, self.settings)
        reply, failure, worker = await self._call(request, self.baseline_timeout_s)
        if failure == "timeout":
            raise KforgeError(f"timing eager {card.op} took longer than "
                              f"{self.baseline_timeout_s:.0f} s")
        if failure == "died":
            raise KforgeError(f"the worker died while timing eager {card.op}: "
                              f"{worker.last_error()}")
        match reply:
            case BaselineMeasured(baseline=baseline):
                return baseline
            case Failed(error=error):
                raise KforgeError(error)
        raise KforgeError(f"the worker on GPU {worker.device} answered a baseline request with "
                          f"{reply!r}")

    async def close(self) -> None:
        for task in list(self._respawns):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._respawns, return_exceptions=True)
        spares = [task for waiting in self._spares.values() for task in waiting]
        self._spares.clear()
        for task in spares:
            task.cancel()  # one still starting is killed; one started is stopped below
        workers = [w for w in await asyncio.gather(*spares, return_exceptions=True)
                   if isinstance(w, WorkerProcess)]
        workers += list(self._working) + list(self._successors.values())
        self._successors.clear()
        while not self._idle.empty():
            if (w := self._idle.get_nowait()) is not None:
                workers.append(w)
        await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)
        self._alive = 0
