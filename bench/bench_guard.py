"""What the integration guard costs when none of its kernels applies: patched vs unpatched latency.

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

Run on a GPU machine from the repository root (a few minutes on an H200):
    python3 bench/bench_guard.py                          # gemma4 decode and resnet50 batch 32
    python3 bench/bench_guard.py --models gemma4 --layers 8 --reps 50
    python3 bench/bench_guard.py --tiny --device cpu      # smoke run of the tiny twins, untimed
"""

from __future__ import annotations

import argparse
import copy
import gc
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from kforge.capture import ModelOptions, load_model  # noqa: E402
from kforge.capture.loader import LoadedModel  # noqa: E402
from kforge.capture.recorder import CallRecorder, ModuleTracker  # noqa: E402
from kforge.core.fmt import fmt_us  # noqa: E402
from kforge.errors import KforgeError  # noqa: E402
from kforge.integrate.measure import Subject, output_tensors, time_forwards  # noqa: E402
from kforge.runtime.guard import Patch
from kforge.runtime.table import Entry, KernelTable

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
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the tiny twins (smoke run)")
    args = parser.parse_args()
    on_gpu = args.device.startswith("cuda")
    if on_gpu and not torch.cuda.is_available():
        print("bench_guard needs a CUDA GPU (or --device cpu --tiny)", file=sys.stderr)
        return 1
    print(f"# {torch.cuda.get_device_name() if on_gpu else 'CPU'}  torch {torch.__version__}")
    print(f"{'model':<18} {'guard':<10} {'ops':>4} {'calls':>6} {'unpatched':>10} "
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


def never(*args: object, **kwargs: object) -> None:
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
                                 never, None, device) for op in ops)

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
            print(f"{label:<18} {guard:<10} {len(guarded_ops):>4} {guarded_calls:>6} "
                  f"{'same output' if same else 'OUTPUT DIFFERS'}")
            continue
        timings = time_forwards(loaded, [Subject("unpatched", loaded.step),
                                         Subject("patched", loaded.step, lambda p=patch: p)],
                                reps, warmup)
        base, patched = timings["unpatched"], timings["patched"]
        print(f"{label:<18} {guard:<10} {len(guarded_ops):>4} {guarded_calls:>6} "
              f"{fmt_us(base.median_us):>10} {fmt_us(patched.median_us):>10} "
              f"{patched.median_us / base.median_us:>6.3f}x  (spread {base.spread:.1%} / "
              f"{patched.spread:.1%})", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
