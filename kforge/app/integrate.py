"""A session's winning kernels in its model: decide and load them on this GPU (apply), time the
model with and without them in every mode a user may pick (e2e), or write them as a package that
needs only torch (export)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from kforge.app.database import with_store
from kforge.core.fmt import fmt_speedup, fmt_us
from kforge.core.gpu import memory_of
from kforge.errors import KforgeError
from kforge.store import Store
from kforge.store.events import ModelMeasured

if TYPE_CHECKING:
    import torch

    from kforge.capture.loader import LoadedModel
    from kforge.integrate.export import Exported
    from kforge.integrate.measure import Difference, E2eResult, Measured
    from kforge.integrate.patching import SessionPatch
    from kforge.integrate.plan import SessionPlan
    from kforge.integrate.winners import CardChoice
    from kforge.runtime.table import Report

T = TypeVar("T")
# Told each card's fate as soon as it is decided, before the long work (a model's rebuild, a
# package's compiles): the plan, and the kernels loaded on this GPU (None where none can be).
PlanShown = Callable[["SessionPlan", "SessionPatch | None"], None]


def _unshown(plan: SessionPlan, patch: SessionPatch | None) -> None:
    pass


def plan_facts(plan: SessionPlan, patch: SessionPatch | None) -> dict:
    """What a program reads of a plan: each target card's fate, and how many op variants run a
    kforge kernel (loaded here, where a patch was built) with the projected speedup."""
    return {"session": plan.session.id, "made_on": plan.made_on,
            "decisions": [_decision(d, patch) for d in plan.decisions if d.card.target],
            "kernels": len(plan.winners) if patch is None else len(patch.table),
            "op_variants": len(plan.decisions),
            "projected": plan.projected if patch is None else patch.projected}


def _decision(d: CardChoice, patch: SessionPatch | None) -> dict:
    return {"card": d.card.id, "op": d.card.op, "replaced": d.replaced,
            "loaded": d.replaced and patch is not None and patch.loaded(d),
            "speedup": d.speedup if d.replaced else None, "reason": d.reason, "node": d.node_id}


# ----- apply -----


@dataclass(frozen=True)
class ApplyRequest:
    """Load session ``session``'s winners on this GPU (``device``: cuda or cuda:N, None the
    current one), all of them where the model runs as CUDA graphs; with ``run``, rebuild the
    model (its file imported only with ``trust_model``) and run it eager and patched once."""

    session: int
    run: bool = False
    cuda_graphs: bool = False
    device: str | None = None
    trust_model: bool = False


@dataclass(frozen=True)
class ModelRun:
    """One eager and one patched forward: what the kernels did, the output's difference, and
    why the patched forward ran none of the kernels (None where some ran)."""

    report: Report
    difference: Difference
    unused: str | None

    def to_dict(self) -> dict:
        return {"hits": self.report.hits, "difference": str(self.difference),
                "unused": self.unused}


@dataclass(frozen=True)
class Applied:
    """The session's plan, the kernels loaded on this GPU (None where none can be: the plan is
    then the decisions for the GPU it was searched on), and the model's run where one was
    asked for."""

    plan: SessionPlan
    patch: SessionPatch | None
    run: ModelRun | None = None

    def to_dict(self) -> dict:
        return {**plan_facts(self.plan, self.patch), "loaded": self.patch is not None,
                "notes": list(self.patch.notes) if self.patch is not None else [],
                "run": self.run.to_dict() if self.run is not None else None}


def apply(db: Path, request: ApplyRequest, on_plan: PlanShown = _unshown) -> Applied:
    """Decide per op card whether its best kernel replaces eager, compile and load the winners
    on this GPU, and with ``request.run`` run the model once eager and patched (kept in the
    session's log). Where no kernel can load (no GPU, a session profiled without one) and no run
    is asked for, the decisions alone."""
    from kforge.integrate.patching import NoGpu, ProfiledWithoutGpu

    try:
        device, plan, patch = _prepare(db, request.session, request.device, "kforge apply",
                                       request.cuda_graphs)
    except (NoGpu, ProfiledWithoutGpu):
        if request.run:
            raise
        from kforge.integrate.plan import load_plan

        plan = with_store(db, lambda store: load_plan(store, request.session,
                                                      graphs=request.cuda_graphs),
                          reads_only=True)
        on_plan(plan, None)
        return Applied(plan, None)
    on_plan(plan, patch)
    if not request.run:
        return Applied(plan, patch)
    from kforge.integrate.measure import compare_once, rebuild_model
    from kforge.integrate.patching import unused_message

    loaded = rebuild_model(plan.session, device, trust_model=request.trust_model)
    patch = patch.for_model(loaded.model)  # region kernels replace their modules' forwards
    difference, report = _on_gpu(loaded, lambda: compare_once(loaded, patch))
    line = (f"apply --run: {report.hits} kernel calls in one forward, output vs eager "
            f"{difference}")
    with_store(db, lambda store: store.log(plan.session.id, line))
    return Applied(plan, patch, ModelRun(report, difference, unused_message(patch, report)))


def _prepare(db: Path, session: int, device_name: str | None, what: str, graphs: bool
             ) -> tuple[torch.device, SessionPlan, SessionPatch]:
    from kforge.integrate.patching import build_patch, check_arch, cuda_device
    from kforge.integrate.plan import load_plan
    from kforge.runtime.cubin import device_arch

    # a missing database or session is said before the GPU is asked for
    with_store(db, lambda store: store.get_session(session), reads_only=True)
    device = cuda_device(device_name, what)
    plan = with_store(db, lambda store: load_plan(store, session, device_arch(device), graphs))
    check_arch(plan, device)
    return device, plan, build_patch(plan, device)


def _on_gpu(loaded: LoadedModel, work: Callable[[], T]) -> T:
    """Run ``work``; running out of the device's memory becomes one clear message."""
    import torch

    try:
        return work()
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        raise KforgeError(f"out of {memory_of(loaded.device.type)} running {loaded.name} on "
                          f"{loaded.device}") from None


# ----- export -----


@dataclass(frozen=True)
class ExportRequest:
    """Write session ``session``'s winners as package ``name`` (None: kforge_session_N) in
    ``output``, with cubins for ``archs`` (none named: the session's GPU); ``force`` replaces a
    package folder already there."""

    session: int
    output: Path = Path(".")
    archs: tuple[str, ...] = ()
    name: str | None = None
    force: bool = False


@dataclass(frozen=True)
class ExportResult:
    """The session's plan and the package written from it."""

    plan: SessionPlan
    package: Exported

    @property
    def unverified(self) -> list[str]:
        """The architectures shipped that the kernels were not verified on."""
        return [arch for arch in self.package.archs if arch != self.plan.made_on]

    def to_dict(self) -> dict:
        return {**plan_facts(self.plan, None), "path": str(self.package.path),
                "packaged": self.package.kernels, "archs": list(self.package.archs),
                "unverified": self.unverified, "problems": list(self.package.problems)}


def export(db: Path, request: ExportRequest, on_plan: PlanShown = _unshown) -> ExportResult:
    """Write the session's winners as a package that patches its model with only torch and
    cuda-python installed; needs no GPU."""
    from kforge.integrate.export import export_session, package_folder
    from kforge.integrate.plan import load_plan

    # a bad --name, --arch or an existing folder is said before the plan is shown
    package_folder(request.session, request.output, name=request.name, archs=request.archs,
                   force=request.force)
    plan = with_store(db, lambda store: load_plan(store, request.session))
    on_plan(plan, None)
    package = export_session(plan, request.output, name=request.name,
                             archs=list(request.archs) or None, force=request.force)
    return ExportResult(plan, package)


# ----- e2e -----


@dataclass(frozen=True)
class E2eRequest:
    """Time session ``session``'s model: ``modes`` as ``kforge e2e --modes`` names them (None:
    all), ``reps`` timed forwards each after ``warmup``; ``select``: choose the kernels by
    measuring the model; ``aa``: each compiled mode's A/A control too."""

    session: int
    modes: str | None = None
    reps: int = 20
    warmup: int = 3
    select: bool = True
    aa: bool = False
    device: str | None = None
    trust_model: bool = False


@dataclass(frozen=True)
class E2eMeasured:
    """The session's plan, every mode's measurement, and what was stored of it."""

    plan: SessionPlan
    result: E2eResult = field(repr=False)

    @property
    def measurement(self) -> ModelMeasured:
        return model_measurement(self.result)

    def to_dict(self) -> dict:
        return {"session": self.plan.session.id, "projected": self.result.projected,
                "modes": [_measured(s) for s in self.result.subjects],
                "measured": asdict(self.measurement), "notes": list(self.result.notes),
                "summary": e2e_summary(self.result)}


def _measured(s: Measured) -> dict:
    t = s.timing
    return {"mode": s.mode, "name": s.name, "median_us": t.median_us if t else None,
            "p10_us": t.p10_us if t else None, "p90_us": t.p90_us if t else None,
            "host_us": s.host.median_us if s.host else None, "setup_s": s.setup_s,
            "difference": str(s.difference) if s.difference else None, "kernels": s.kernels,
            "error": s.error or None}


def e2e(db: Path, request: E2eRequest) -> E2eMeasured:
    """Rebuild the session's model and time whole forwards in each mode, with and without the
    session's kernels; store the measurement for the session's viewers and its log."""
    from kforge.integrate.decide import measure_session
    from kforge.integrate.measure import parse_modes, rebuild_model

    modes = parse_modes(request.modes, aa=request.aa)
    device, plan, patch = _prepare(db, request.session, request.device, "kforge e2e",
                                   graphs=True)  # every winner, to start
    if not plan.winners:
        raise KforgeError(f"session {plan.session.id} has no kernel to measure: no op card has a "
                          f"verified kernel that beats eager beyond noise (see `kforge apply "
                          f"{plan.session.id}`)")
    loaded = rebuild_model(plan.session, device, trust_model=request.trust_model)
    result = _on_gpu(loaded, lambda: measure_session(
        patch, loaded, modes, select=request.select, reps=request.reps, warmup=request.warmup))
    with_store(db, lambda store: keep_e2e(store, plan.session.id, result))
    return E2eMeasured(plan, result)


async def keep_e2e(store: Store, session_id: int, result: E2eResult) -> None:
    """Store a measurement: its figures for the session's viewers, its summary in the log."""
    await store.add_model_measurement(session_id, model_measurement(result))
    await store.log(session_id, e2e_summary(result))


def model_measurement(result: E2eResult) -> ModelMeasured:
    """What a measurement says of the whole model, by mode id: each timed mode's speedup over
    eager (none without an eager timing), what kforge gains in each +kforge mode that ran a
    kforge kernel and whose noise allows a verdict, each mode's median device time and spread
    (p90/p10), and the kforge kernels that ran in each +kforge mode."""
    from kforge.integrate.measure import BASES, KFORGE_SUFFIX

    eager = result.subject("eager")
    base = eager.timing.median_us if eager and eager.timing else None
    speedups = {s.mode: base / s.timing.median_us for s in result.subjects
                if base and s.timing}
    gains = {mode + KFORGE_SUFFIX: gain for mode in BASES
             if (gain := result.gain(mode)) is not None}
    return ModelMeasured(
        speedups=speedups, gains=gains, projected=result.projected,
        times_us={s.mode: s.timing.median_us for s in result.subjects if s.timing},
        kernels={s.mode: s.ran for s in result.subjects if s.ran is not None},
        spreads={s.mode: spread for s in result.subjects if (spread := s.spread) is not None})


def e2e_summary(result: E2eResult) -> str:
    """One line for the session log."""
    parts = [f"{s.name} {fmt_us(s.timing.median_us)}" for s in result.subjects if s.timing]
    gains = ", ".join(f"{mode} {fmt_speedup(gain)}" for mode, gain in result.gains().items())
    return (f"e2e: {', '.join(parts)}; kforge measured {gains or '-'}, projected "
            f"{result.projected:.3f}x; {result.report.hits} kernel calls per eager forward")
