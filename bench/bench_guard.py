"""What the integration guard costs on the host: patched vs unpatched latency when none of its
kernels applies, and per call for a tiny op whose kernel runs.

For each model, the op variants of one forward are recorded, then decoy kernel tables are built
that route ops through the guard without ever matching a call (a decoy kernel raises if run):

- ``near``: every target op of the model, each with a variant equal to a real call except for
  one storage offset; calls pass the guard's quick shape/dtype test and are fully encoded before
  they miss (the worst case);
- ``far``: the same ops with a first-argument shape no call has (the quick test rejects them);
- ``top3``: only the three ops the model calls most, ``near`` style (a typical session patches
  a handful of ops);
- ``session`` (with ``--ops``): exactly the ops a session's plan routes, ``near`` style: the cost
  when that session's kernels do not apply (another batch size, another model).

Unpatched and patched forwards are timed interleaved with CUDA events (an unpatched-vs-unpatched
row shows the noise floor), and the table gives the ratio of medians.

The host-cost table times one call of a tiny op (``aten.mul.Tensor``, two float32 [1, 1536]) on
the CPU's clock, the GPU idle before each call: eager's own dispatch (the op called from Python,
as the evaluator measures ``eager_host_us``), kforge's launch path (the library kernel's launch
plan run by ``PlanRunner``, the evaluator's ``host_us``), the whole patched call through the
native guard (C++: compare, allocate, launch) and through the Python guard, and a patched call of
another variant (the guard's miss) through each. The patched call may not cost the host more
than eager's own dispatch (``PlanRunner`` alone serves the evaluator, whose timings are GPU
events, and the Python guard).

Run on a GPU machine from the repository root (a few minutes on an H200):
    python3 bench/bench_guard.py                          # gemma4 decode, resnet50 b32, host cost
    python3 bench/bench_guard.py --host-only              # the host-cost table alone (seconds)
    python3 bench/bench_guard.py --models gemma4 --layers 8 --reps 50
    python3 bench/bench_guard.py --tiny --device cpu      # smoke run: tiny twins, untimed; the
                                                          # host table with a stand-in backend
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from kforge.capture import ModelOptions, load_model  # noqa: E402
from kforge.capture.loader import LoadedModel  # noqa: E402
from kforge.capture.recorder import CallRecorder, ModuleTracker  # noqa: E402
from kforge.core.argspec import encode_call, resolve_op  # noqa: E402
from kforge.core.fmt import fmt_us  # noqa: E402
from kforge.core.gpu import GpuInfo  # noqa: E402
from kforge.core.opcard import OpCard  # noqa: E402
from kforge.errors import KforgeError  # noqa: E402
from kforge.integrate.measure import output_tensors, time_subjects  # noqa: E402
from kforge.runtime.cubin import device_arch  # noqa: E402
from kforge.runtime.guard import Patch  # noqa: E402
from kforge.runtime.native import ENV_DISABLE  # noqa: E402
from kforge.runtime.plan import (  # noqa: E402
    KernelLauncher,
    PlanRunner,
    check_kernels,
    check_widths,
    resolve_for,
)
from kforge.runtime.table import Entry, KernelTable  # noqa: E402
from kforge.runtime.timing import ForwardRun  # noqa: E402

RUNS = (("gemma4", "decode"), ("resnet50", None), ("sd35", None))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["gemma4", "resnet50"],
                        help="gemma4, resnet50, sd35")
    parser.add_argument("--ops", nargs="*", default=None, metavar="OP",
                        help="route exactly these ops (as a session's plan does), none matching, "
                             "instead of the near/far/top3 decoys")
    parser.add_argument("--layers", type=int, default=None, help="truncate gemma4")
    parser.add_argument("--reps", type=int, default=40, help="timed forwards per subject")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--host-calls", type=int, default=2000,
                        help="timed calls per path in the host-cost table")
    parser.add_argument("--host-only", action="store_true", help="only the host-cost table")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the tiny twins (smoke run)")
    args = parser.parse_args()
    on_gpu = args.device.startswith("cuda")
    if on_gpu and not torch.cuda.is_available():
        print("bench_guard needs a CUDA GPU (or --device cpu --tiny)", file=sys.stderr)
        return 1
    print(f"# {torch.cuda.get_device_name() if on_gpu else 'CPU'}  torch {torch.__version__}")
    host_cost(torch.device(args.device), args.host_calls)
    if args.host_only:
        return 0
    print(f"\n{'model':<18} {'guard':<10} {'ops':>4} {'calls':>6} {'unpatched':>10} "
          f"{'patched':>10} {'ratio':>7}  p10-p90 spread")
    for name, mode in RUNS:
        if name not in args.models:
            continue
        options = ModelOptions(device=args.device, mode=mode,
                               layers=args.layers if name == "gemma4" else None)
        label = f"{name} {mode}" if mode else name
        try:
            loaded = load_model(f"{name}-tiny" if args.tiny else name, options)
        except KforgeError as exc:
            print(f"{label:<18} skipped: {exc}")
            continue
        try:
            bench(label, loaded, args.reps, args.warmup, on_gpu, args.ops)
        finally:
            del loaded
            gc.collect()
            if on_gpu:
                torch.cuda.empty_cache()
    return 0


# ----- host cost of one call of a tiny op -----

HOST_OP = "aten.mul.Tensor"
HOST_SHAPE = (1, 1536)  # a decode step's hidden state


class NoLaunch:
    """The backend on the CPU, where there is no GPU to launch on: every launch is accepted and
    does nothing, so the table shows the launch path's own Python cost without the driver's."""

    def has_kernel(self, name: str) -> bool:
        return True

    def param_widths(self, name: str) -> list[int] | None:
        return None

    def launch(self, name: str, grid: tuple[int, ...], block: tuple[int, ...], shared_mem: int,
               params: Sequence[Any]) -> None:
        return None


def library_kernel(card: OpCard, device: torch.device) -> tuple[dict, KernelLauncher, list[str]]:
    """The kernel library's default kernel for ``card``: its launch plan, its cubin loaded on
    ``device`` (NoLaunch on the CPU) and the kernels the compiler reported."""
    from kforge.propose.library.proposer import build_candidate, make_plan

    if device.type != "cuda":
        gpu = GpuInfo(name="no GPU", arch="sm_90", sm_count=132)
    else:
        gpu = GpuInfo(name=torch.cuda.get_device_name(device), arch=device_arch(device),
                      sm_count=torch.cuda.get_device_properties(device).multi_processor_count)
    plan = make_plan(card, gpu)
    variant = plan.available[0]
    candidate = build_candidate(plan, variant, variant.space.default, gpu, card, "bench")
    if device.type != "cuda":
        return candidate.plan, NoLaunch(), []
    from kforge.runtime.kernel_loader import NvrtcLoader

    loader = NvrtcLoader(device.index, gpu.arch)
    compiled = loader.compile(candidate)
    if not compiled.ok:
        raise KforgeError(f"the library kernel for {card.op} does not compile: {compiled.log}")
    return candidate.plan, loader.load(compiled), sorted(compiled.resources)


def host_cost(device: torch.device, calls: int) -> None:
    """Print the host time per call of a tiny op: eager's own dispatch, kforge's launch path,
    the whole patched call, and a patched call that misses."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    func = resolve_op(HOST_OP)
    a, b = (torch.randn(HOST_SHAPE, device=device) for _ in range(2))
    wider = [torch.randn(HOST_SHAPE[0], HOST_SHAPE[1] + 1, device=device) for _ in range(2)]
    args_spec, kwargs_spec = encode_call(func, (a, b), {})
    card = OpCard(HOST_OP, args_spec, kwargs_spec)
    plan, backend, known = library_kernel(card, device)
    resolved = resolve_for(plan, HOST_OP, args_spec, kwargs_spec)
    check_kernels(resolved, backend.has_kernel, known)
    check_widths(resolved, backend.param_widths)
    runner = PlanRunner(resolved, HOST_OP, backend, device)

    def table() -> KernelTable:
        return KernelTable([Entry(HOST_OP, args_spec, kwargs_spec, runner, device, label="mul")])

    native_guard, python_guard = Patch(table()), python_only(Patch(table()))
    paths = {"eager dispatch (op from Python)": (lambda: func(a, b), None),
             "PlanRunner from Python": (lambda: runner((a, b), {}), None),
             "patched call, native guard": (lambda: func(a, b), native_guard),
             "patched call, Python guard": (lambda: func(a, b), python_guard),
             "other shape (miss), native guard": (lambda: func(*wider), native_guard),
             "other shape (miss), Python guard": (lambda: func(*wider), python_guard)}
    samples = time_host(paths, calls, device)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    eager = medians["eager dispatch (op from Python)"]
    where = "stand-in backend, no GPU: the launch path without the driver's launch" \
        if device.type != "cuda" else torch.cuda.get_device_name(device)
    print(f"\nhost time per call of {card.short_op}({card.signature}), {calls} calls per path "
          f"({where}); launches "
          + ("straight to cuLaunchKernel, parameters packed once" if runner.direct
             else "through the backend's generic launch"))
    print(f"{'path':<36} {'median':>9} {'p10':>9} {'p90':>9} {'vs eager':>9}")
    for name, values in samples.items():
        deciles = statistics.quantiles(values, n=10)
        print(f"{name:<36} {fmt_us(medians[name]):>9} {fmt_us(deciles[0]):>9} "
              f"{fmt_us(deciles[-1]):>9} {medians[name] / eager:>8.2f}x")
    if device.type != "cuda":  # eager computes on the CPU and launches nothing: no verdict
        return
    hit = medians["patched call, native guard"]
    miss = medians["other shape (miss), native guard"] - medians["eager dispatch (op from Python)"]
    verdict = "within" if hit <= eager else "ABOVE"
    print(f"patched call {fmt_us(hit)} vs eager's own dispatch {fmt_us(eager)}: {verdict} "
          "eager's host cost")
    print(f"native guard's miss: {fmt_us(miss)} over eager's dispatch of another shape "
          "(its own call of the op included)", flush=True)


class python_only:  # noqa: N801 (a context manager used like a Patch)
    """A patch installed with the native guard off: the Python guard's cost."""

    def __init__(self, patch: Patch) -> None:
        self.patch = patch

    def __enter__(self) -> Patch:
        os.environ[ENV_DISABLE] = "0"
        try:
            return self.patch.__enter__()
        finally:
            del os.environ[ENV_DISABLE]

    def __exit__(self, *exc: object) -> None:
        self.patch.__exit__(*exc)


def time_host(paths: dict[str, tuple[Callable[[], Any], Any]], calls: int,
              device: torch.device, rounds: int = 20) -> dict[str, list[float]]:
    """Microseconds per call of each path, in rounds that take the paths in turns (the order
    flipped each round) so that drift in the host's speed falls on all alike; a path's patch
    is in place while it runs, and the GPU is idle before each timed call."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    samples: dict[str, list[float]] = {name: [] for name in paths}
    per_round = max(1, calls // rounds)
    names = list(paths)
    for call, patch in paths.values():  # warm up: caches, lazy loading, first launch
        with patch or nullcontext():
            for _ in range(10):
                call()
        sync()
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            call, patch = paths[name]
            with patch or nullcontext():
                for _ in range(per_round):
                    sync()
                    start = time.perf_counter()
                    call()
                    samples[name].append((time.perf_counter() - start) * 1e6)
        sync()
    return samples


def record(loaded: LoadedModel) -> tuple[CallRecorder, Counter]:
    """The op variants of one forward, and calls per op."""
    recorder = CallRecorder(ModuleTracker(loaded.model))
    loaded.prepare()
    with recorder.tracker, recorder:
        loaded.step()
    calls: Counter = Counter()
    for key, spec in recorder.specs.items():
        if not spec.view_or_copy:
            calls[spec.op] += recorder.calls[key]
    return recorder, calls


def decoy(spec_args: list, far: bool) -> list:
    """The call's arg specs changed so that no call matches: a shifted storage offset (near), or
    a first-argument shape no call has (far)."""
    args = copy.deepcopy(spec_args)
    first = args[0]
    if far:
        first["shape"] = [*first["shape"][:-1], first["shape"][-1] + 7919] if first["shape"] \
            else [7919]
    else:
        first["offset"] += 1
    return args


def never(args: tuple, kwargs: dict) -> None:
    raise AssertionError("a decoy kernel ran: the guard matched a variant it should not have")


def tables(recorder: CallRecorder, calls: Counter, device: torch.device,
           only: list[str] | None = None) -> dict[str, KernelTable]:
    """The decoy tables, each kernel on a real variant of its op made unmatchable; with
    ``only``, one table routing just those ops."""
    first_spec = {}
    for spec in recorder.specs.values():
        first = spec.args[0] if spec.args else None
        if not spec.view_or_copy and spec.op not in first_spec and isinstance(first, dict) \
                and first.get("t") == "tensor" and "offset" in first:
            first_spec[spec.op] = spec

    def table(ops: list[str], far: bool) -> KernelTable:
        return KernelTable(Entry(op, decoy(first_spec[op].args, far), first_spec[op].kwargs,
                                 never, device) for op in ops)

    if only is not None:
        return {"session": table([op for op in only if op in first_spec], far=False)}
    by_calls = sorted(first_spec, key=lambda op: -calls[op])
    return {"near": table(by_calls, far=False), "far": table(by_calls, far=True),
            "top3": table(by_calls[:3], far=False)}


def bench(label: str, loaded: LoadedModel, reps: int, warmup: int, on_gpu: bool,
          only: list[str] | None = None) -> None:
    recorder, calls = record(loaded)
    rows = {"none (A/A)": KernelTable(), **tables(recorder, calls, loaded.device, only)}
    for guard, table in rows.items():
        patch = Patch(table)  # an empty table installs nothing: the A/A row
        guarded_ops = {op for op, _ in table.ops()}
        guarded_calls = sum(calls[op] for op in guarded_ops)
        if not on_gpu:  # a smoke run: the decoys never match and eager's results are kept
            expected = output_tensors(loaded.run())
            with patch:
                same = all(map(torch.equal, expected, output_tensors(loaded.run())))
            ran = sum(k.hits + k.fallbacks for k in patch.report().kernels)
            print(f"{label:<18} {guard:<10} {len(guarded_ops):>4} {guarded_calls:>6} "
                  f"{'same output' if same else 'OUTPUT DIFFERS'}"
                  f"{f', A DECOY MATCHED {ran} CALLS' if ran else ''}")
            continue
        # host-inclusive: the guard's cost is host time
        timings = {name: host for name, (_, host) in time_subjects(
            loaded, [ForwardRun("unpatched", loaded.step),
                     ForwardRun("patched", loaded.step, lambda p=patch: p)], reps, warmup).items()}
        base, patched = timings["unpatched"], timings["patched"]
        print(f"{label:<18} {guard:<10} {len(guarded_ops):>4} {guarded_calls:>6} "
              f"{fmt_us(base.median_us):>10} {fmt_us(patched.median_us):>10} "
              f"{patched.median_us / base.median_us:>6.3f}x  (spread {base.spread:.1%} / "
              f"{patched.spread:.1%})", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
