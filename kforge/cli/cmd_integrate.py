"""`kforge apply`, `kforge export` and `kforge e2e`: their command lines, and the plan, package and
mode table they print of a session's winning kernels in its model (``kforge.app.integrate``)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from kforge.app.integrate import (
    ApplyRequest,
    E2eRequest,
    ExportRequest,
    apply,
    e2e,
    export,
    model_measurement,
    plan_facts,
)
from kforge.cli.common import add_db_option, cells, err, out, resolve_db, session_id, whole
from kforge.core.fmt import fmt_headline, fmt_projection, fmt_speedup, fmt_us
from kforge.core.text import one_line
from kforge.errors import KforgeError

if TYPE_CHECKING:
    from kforge.cli.main import Commands
    from kforge.integrate.measure import E2eResult, Measured
    from kforge.integrate.patching import SessionPatch
    from kforge.integrate.plan import SessionPlan


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
    applied = apply(resolve_db(args), ApplyRequest(args.session, run=args.run,
                                                   cuda_graphs=args.cuda_graphs,
                                                   device=args.device,
                                                   trust_model=args.trust_model),
                    on_plan=print_plan)
    if applied.patch is None:
        _say_decisions_only(applied.plan)
    elif applied.run is not None:
        out.print(str(applied.run.report))
        out.print(f"output vs eager: {applied.run.difference}")
        if applied.run.unused:
            raise KforgeError(applied.run.unused)
    return 0


def _say_decisions_only(plan: SessionPlan) -> None:
    """Why `kforge apply` compiled and loaded nothing: its plan is each card's fate on the GPU
    the session was searched on, which needs only the database."""
    from kforge.integrate.winners import NO_GPU_ARCH

    if plan.made_on == NO_GPU_ARCH:
        out.print(f"note: session {plan.session.id} was profiled without a GPU: a search on a "
                  "GPU finds its kernels")
    else:
        out.print(f"note: nothing was compiled or loaded (no CUDA GPU with cuda-core here): "
                  f"these are the decisions for the GPU the session was searched on "
                  f"({plan.made_on})")


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
        table.add_row(str(d.card.id), *cells(d.card.short_op), one_line(d.card.signature, 60),
                      f"{100 * d.card.share:.1f}%", runs, *cells(why))
    out.print(table)
    if hidden:
        out.print(f"  ({hidden} views and copies stay on eager: they are never targets)")
    for note in patch.notes if patch else []:
        out.print(f"note: {note}")
    facts = plan_facts(plan, patch)
    out.print(f"{facts['kernels']} of {facts['op_variants']} op variants run a kforge kernel; "
              f"projected speedup {facts['projected']:.3f}x over operator time")


# ----- export -----


def cmd_export(args: argparse.Namespace) -> int:
    result = export(resolve_db(args), ExportRequest(args.session, Path(args.output),
                                                    archs=tuple(args.arch or ()),
                                                    name=args.name, force=args.force),
                    on_plan=lambda plan, _: print_plan(plan))
    package = result.package
    for problem in package.problems:
        err.print(f"warning: {problem}")
    if unverified := result.unverified:
        out.print(f"note: the kernels were verified on {result.plan.made_on} only; on "
                  f"{', '.join(unverified)} they run unverified")
    out.print(f"wrote {package.path} ({package.kernels} kernels, cubins for "
              f"{', '.join(package.archs)}); use it with `import {package.path.name}; "
              f"with {package.path.name}.patch(): model(x)`")
    return 0


# ----- e2e -----


def cmd_e2e(args: argparse.Namespace) -> int:
    measured = e2e(resolve_db(args), E2eRequest(args.session, modes=args.modes, reps=args.reps,
                                                warmup=args.warmup, select=args.select,
                                                aa=args.aa, device=args.device,
                                                trust_model=args.trust_model))
    out.print(str(replace(measured.result.report, notes=[])))  # its notes are in the table's notes
    print_e2e(measured.plan, measured.result)
    return 0


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
