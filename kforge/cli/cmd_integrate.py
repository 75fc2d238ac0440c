"""`kforge apply`, `kforge export` and `kforge e2e`: a session's winning kernels in its model."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from rich.table import Table

from kforge.cli.common import add_db_option, cells, err, out, session_id, whole, with_store
from kforge.core.fmt import fmt_headline, fmt_projection, fmt_speedup, fmt_us
from kforge.core.gpu import memory_of
from kforge.errors import KforgeError
from kforge.store import Store
from kforge.store.events import ModelMeasured

if TYPE_CHECKING:
    import torch

    from kforge.capture.loader import LoadedModel
    from kforge.cli.main import Commands
    from kforge.integrate.measure import E2eResult, Measured
    from kforge.integrate.patching import SessionPatch
    from kforge.integrate.plan import SessionPlan
    from kforge.runtime.table import Report


T = TypeVar("T")


def add_trust_model_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trust-model", action="store_true",
                        help="import the model file the session names, to rebuild the model "
                             "(a built-in model needs no confirmation)")


def register(sub: Commands) -> None:
    p = sub.add_parser(
        "apply",
        description="Decide per op card whether its best kernel replaces eager PyTorch (verified, "
                    "faster beyond the timing noise, same GPU architecture) or why not; compile "
                    "and load the winners on this GPU. With --run, rebuild the session's model and "
                    "run it eager and patched once.")
    p.add_argument("session", type=session_id)
    p.add_argument("--run", action="store_true",
                   help="run the model eager and patched once: kernel hits, output difference")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="the model runs as CUDA graphs: use every winner (else only those worth "
                        "their guard's cost)")
    p.add_argument("--device", help="cuda or cuda:N (default: the current GPU)")
    add_trust_model_option(p)
    add_db_option(p)
    p.set_defaults(func=cmd_apply)

    p = sub.add_parser(
        "export",
        description="Write a package (kernel sources, launch plans, cubins per architecture, a "
                    "manifest of every op variant, a README) that patches a model with only torch "
                    "and cuda-python installed: `import PKG; with PKG.patch(): model(x)`. "
                    "Needs no GPU.")
    p.add_argument("session", type=session_id)
    p.add_argument("-o", "--output", default=".", metavar="DIR",
                   help="folder to write the package into (default: the current folder)")
    p.add_argument("--arch", action="append", metavar="SM",
                   help="GPU architecture to ship a cubin for, such as sm_90 or sm_121; repeat "
                        "for several (default: the session's GPU)")
    p.add_argument("--name", help="package name (default: kforge_session_N)")
    p.add_argument("--force", action="store_true", help="replace a package folder already there")
    add_db_option(p)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "e2e",
        description="Rebuild the session's model and time whole forwards (device time: CUDA "
                    "events with the host released ahead of the GPU; median and p10-p90, all "
                    "modes interleaved; host-inclusive time beside it) eager, captured as a "
                    "CUDA graph, and under torch.compile in its default, reduce-overhead and "
                    "max-autotune modes, each without and with the session's kernels (through "
                    "kforge's compile backend for the compiled modes, chosen by measurement in "
                    "each mode; where kforge's compiled model is not faster than torch.compile "
                    "alone, torch.compile's own is what kforge hands back, and its row says so); "
                    "compare outputs with eager, show compile and capture times, and the measured "
                    "speedups next to the one projected from the op cards.")
    p.add_argument("session", type=session_id)
    p.add_argument("--modes", metavar="LIST",
                   help="comma-separated modes: eager, graphs, compile, reduce-overhead, "
                        "max-autotune (each measured with and without kforge), or one variant "
                        "such as compile+kforge; default all (max-autotune compiles take minutes)")
    p.add_argument("--reps", type=whole(1, 100_000), default=20,
                   help="timed forwards each (default 20)")
    p.add_argument("--warmup", type=whole(1, 10_000), default=3,
                   help="untimed forwards first (default 3)")
    p.add_argument("--no-select", dest="select", action="store_false",
                   help="do not choose the kernels by measuring the model: eager + kforge then "
                        "uses those projected to pay for their guard, CUDA graphs + kforge and "
                        "the compiled modes all (and a compiled mode keeps them even where "
                        "torch.compile alone is faster)")
    p.add_argument("--aa", action="store_true",
                   help="also measure each compiled mode's A/A control: kforge's backend with "
                        "no kernel against torch.compile alone (what the backend itself costs)")
    p.add_argument("--device", help="cuda or cuda:N (default: the current GPU)")
    add_trust_model_option(p)
    add_db_option(p)
    p.set_defaults(func=cmd_e2e)


# ----- apply -----


def cmd_apply(args: argparse.Namespace) -> int:
    from kforge.integrate.patching import NoGpu, ProfiledWithoutGpu

    try:
        device, plan, patch = _prepare(args, "kforge apply")
    except (NoGpu, ProfiledWithoutGpu):
        if args.run:
            raise
        return _decisions_only(args)  # what is decided needs only the database
    print_plan(plan, patch)
    if not args.run:
        return 0
    from kforge.integrate.measure import compare_once, rebuild_model

    loaded = rebuild_model(plan.session, device, trust_model=args.trust_model)
    patch = patch.for_model(loaded.model)  # region kernels replace their modules' forwards
    difference, report = _on_gpu(loaded, lambda: compare_once(loaded, patch))
    out.print(str(report))
    out.print(f"output vs eager: {difference}")
    _log(args, plan, f"apply --run: {report.hits} kernel calls in one forward, output vs eager "
                     f"{difference}")
    _check_used(patch, report)
    return 0


def _decisions_only(args: argparse.Namespace) -> int:
    """`kforge apply` where no kernel can load: each card's fate on the GPU it was searched on,
    which needs only the database."""
    from kforge.integrate.plan import load_plan
    from kforge.integrate.winners import NO_GPU_ARCH

    plan = with_store(args, lambda store: load_plan(store, args.session,
                                                    graphs=args.cuda_graphs), reads_only=True)
    print_plan(plan)
    if plan.made_on == NO_GPU_ARCH:
        out.print(f"note: session {plan.session.id} was profiled without a GPU: a search on a "
                  "GPU finds its kernels")
    else:
        out.print(f"note: nothing was compiled or loaded (no CUDA GPU with cuda-core here): "
                  f"these are the decisions for the GPU the session was searched on "
                  f"({plan.made_on})")
    return 0


def _prepare(args: argparse.Namespace, what: str, graphs: bool = False
             ) -> tuple[torch.device, SessionPlan, SessionPatch]:
    from kforge.integrate.patching import build_patch, check_arch, cuda_device
    from kforge.integrate.plan import load_plan
    from kforge.runtime.cubin import device_arch

    device = cuda_device(args.device, what)
    graphs = graphs or bool(getattr(args, "cuda_graphs", False))
    plan = with_store(args, lambda store: load_plan(store, args.session, device_arch(device),
                                                    graphs))
    check_arch(plan, device)
    return device, plan, build_patch(plan, device)


def print_plan(plan: SessionPlan, patch: SessionPatch | None = None) -> None:
    """Each target card's fate, largest share first; views and copies as a count."""
    session = plan.session
    model, gpu = cells(session.model, session.gpu_label)
    out.print(f"session {session.id}  {model}  searched on {gpu}")
    table = Table(box=None, header_style="bold")
    for name, right in (("card", True), ("op", False), ("arguments", False), ("share", True),
                        ("runs", False), ("why", False)):
        table.add_column(name, justify="right" if right else "left", overflow="fold")
    hidden = 0
    for d in plan.decisions:
        if not d.card.target:
            hidden += 1
            continue
        runs, why = f"kernel {fmt_speedup(d.speedup)}" if d.replaced else "eager", d.reason
        if d.replaced and patch is not None and not patch.loaded(d):
            runs, why = "eager", "won, but does not load here (see the note)"
        table.add_row(str(d.card.id), *cells(d.card.short_op), d.card.signature[:60],
                      f"{100 * d.card.share:.1f}%", runs, *cells(why))
    out.print(table)
    if hidden:
        out.print(f"  ({hidden} views and copies stay on eager: they are never targets)")
    for note in patch.notes if patch else []:
        out.print(f"note: {note}")
    if patch is None:
        count, projected = len(plan.winners), plan.projected
    else:
        count, projected = len(patch.table), patch.projected
    out.print(f"{count} of {len(plan.decisions)} op variants run a kforge kernel; projected "
              f"speedup {projected:.3f}x over operator time")


def _check_used(patch: SessionPatch, report: Report) -> None:
    from kforge.integrate.patching import unused_message

    if message := unused_message(patch, report):
        raise KforgeError(message)


def _on_gpu(loaded: LoadedModel, work: Callable[[], T]) -> T:
    """Run ``work``; running out of the device's memory becomes one clear message."""
    import torch

    try:
        return work()
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        raise KforgeError(f"out of {memory_of(loaded.device.type)} running {loaded.name} on "
                          f"{loaded.device}") from None


def _log(args: argparse.Namespace, plan: SessionPlan, message: str) -> None:
    async def work(store: Store) -> None:
        await store.log(plan.session.id, message)

    with_store(args, work)


# ----- export -----


def cmd_export(args: argparse.Namespace) -> int:
    from kforge.integrate.export import export_session
    from kforge.integrate.plan import load_plan

    plan = with_store(args, lambda store: load_plan(store, args.session))
    print_plan(plan)
    result = export_session(plan, Path(args.output), name=args.name, archs=args.arch,
                            force=args.force)
    for problem in result.problems:
        err.print(f"warning: {problem}")
    if unverified := [a for a in result.archs if a != plan.made_on]:
        out.print(f"note: the kernels were verified on {plan.made_on} only; on "
                  f"{', '.join(unverified)} they run unverified")
    out.print(f"wrote {result.path} ({result.kernels} kernels, cubins for "
              f"{', '.join(result.archs)}); use it with `import {result.path.name}; "
              f"with {result.path.name}.patch(): model(x)`")
    return 0


# ----- e2e -----


def cmd_e2e(args: argparse.Namespace) -> int:
    from kforge.integrate.decide import measure_session
    from kforge.integrate.measure import parse_modes, rebuild_model

    modes = parse_modes(args.modes, aa=args.aa)
    device, plan, patch = _prepare(args, "kforge e2e", graphs=True)  # every winner, to start
    if not plan.winners:
        raise KforgeError(f"session {plan.session.id} has no kernel to measure: no op card has a "
                          f"verified kernel that beats eager beyond noise (see `kforge apply "
                          f"{plan.session.id}`)")
    loaded = rebuild_model(plan.session, device, trust_model=args.trust_model)
    result = _on_gpu(loaded, lambda: measure_session(
        patch, loaded, modes, select=args.select, reps=args.reps, warmup=args.warmup))
    out.print(str(replace(result.report, notes=[])))  # its notes are in the table's notes
    print_e2e(plan, result)
    with_store(args, lambda store: keep_e2e(store, plan.session.id, result))
    return 0


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


def gain_cell(result: E2eResult, measured: Measured) -> str:
    """The kforge gain column: the gain, or why there is none."""
    from kforge.integrate.measure import MODES

    mode = MODES.get(measured.mode)
    if mode is None or not mode.kforge:
        return ""
    if not measured.ran:
        return "no kernels"
    if result.undecidable(mode.base):
        return "undecidable (noisy: see the CUDA-graph modes)"
    gain = result.kforge_gain(measured)
    return fmt_speedup(gain) if gain is not None else ""


def e2e_rows(result: E2eResult) -> list[list[str]]:
    """The e2e table's rows: mode, median, p10, p90 (device time), host-inclusive median,
    speedup over eager, what kforge gains over the same mode without it, output vs eager, setup
    time, what kforge's kernels did."""
    eager = result.subject("eager")
    base = eager.timing.median_us if eager and eager.timing else None
    rows = []
    for s in result.subjects:
        if s.timing is None:
            rows.append([s.name, "-", "-", "-", "-", "-", "-", "-", "-", s.error or "not measured"])
            continue
        t = s.timing
        kernels = s.kernels
        if s.tried is not None:
            kernels += f"; with kforge's it ran {fmt_us(s.tried.median_us)}"
        rows.append([s.name, fmt_us(t.median_us), fmt_us(t.p10_us), fmt_us(t.p90_us),
                     fmt_us(s.host.median_us) if s.host else "-",
                     fmt_speedup(base / t.median_us if base else None), gain_cell(result, s),
                     str(s.difference) if s.difference else "-",
                     f"{s.setup_s:.1f} s" if s.setup_s else "", kernels])
    return rows


def print_e2e(plan: SessionPlan, result: E2eResult) -> None:
    session = plan.session
    shown = " ".join(f"{k}={cells(str(session.settings[k]))[0]}"
                     for k in ("dtype", "batch", "seq_len", "mode", "layers")
                     if session.settings.get(k) is not None)
    out.print(f"session {session.id}  {cells(session.model)[0]} ({shown})")
    table = Table(box=None, header_style="bold")
    for name, right in (("mode", False), ("device", True), ("p10", True), ("p90", True),
                        ("host-incl.", True), ("vs eager", True), ("kforge gain", True),
                        ("output vs eager", False), ("compile/capture", True),
                        ("kforge kernels", False)):
        table.add_column(name, justify="right" if right else "left")
    for row in e2e_rows(result):
        table.add_row(*row)
    out.print(table)
    for note in result.notes:
        out.print(f"note: {note}")
    headline = model_measurement(result).headline()
    if headline is not None:
        out.print(f"kforge's best mode: {fmt_headline(headline)[0]}")
    gains = ", ".join(f"{mode} {fmt_speedup(gain)}" for mode, gain in result.gains().items())
    out.print(f"speedup from kforge's kernels: {fmt_projection(result.projected, result.gains())}"
              f" from the op cards; measured (whole forward, device time) {gains or '-'}")


def e2e_summary(result: E2eResult) -> str:
    """One line for the session log."""
    parts = [f"{s.name} {fmt_us(s.timing.median_us)}" for s in result.subjects if s.timing]
    gains = ", ".join(f"{mode} {fmt_speedup(gain)}" for mode, gain in result.gains().items())
    return (f"e2e: {', '.join(parts)}; kforge measured {gains or '-'}, projected "
            f"{result.projected:.3f}x; {result.report.hits} kernel calls per eager forward")
