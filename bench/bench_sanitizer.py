"""Where a confirmation's compute-sanitizer time goes, with the torch-free child.

For each case (an honest kernel from the red-team controls): the process costs on their own (a
Python start, a torch import and a CUDA context, the child's imports and its driver context);
NVRTC cold and cached; the parent's job (the plan resolved, the inputs made on the CPU and
written); then the child without any tool and under each tool alone, each with its own step times
(device: driver context and lock; module load; inputs; calls) and the seconds from launch to the
child's first line (the sanitizer's start and the interpreter's); then the tools the kernel needs
at once, as a confirmation runs them, and the verdict from the cache.

A sanitizer process kept for a whole search would still pay, per candidate, its module load,
inputs and calls: the ``per candidate in a kept process`` column is that sum, beside what a fresh
child costs in all. Earlier figures for the torch child it replaces: docs/BENCHMARKS.md, run G3.

Run on a GPU machine from the repository root (about a minute for the two default cases):
    python3 bench/bench_sanitizer.py [--cases softmax,matmul] [--device 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kforge.eval.process import sanitize as S  # noqa: E402
from kforge.eval.process.sanitize_child import PHASES  # noqa: E402

CASES = {  # name -> the red-team control it runs
    "softmax": "softmax-two-launches-scratch",
    "matmul": "matmul-f32",
    "add": "add-in-place",
    "layernorm": "layer-norm-bf16",
}


def timed(command: list[str], env: dict | None = None, timeout: float = 300.0
          ) -> tuple[float, int, str]:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    return time.perf_counter() - started, done.returncode, done.stdout + done.stderr


def phases_of(output: str, launched_at: float) -> dict:
    for line in output.splitlines():
        if PHASES in line:
            data = json.loads(line.split(PHASES, 1)[1])
            data["to_child"] = round(data.pop("entered_at") - launched_at, 3)
            data["kept"] = round(sum(data.get(k, 0.0) for k in ("module_load", "inputs",
                                                                  "calls")), 3)
            return data
    return {}


def child_run(binary: str | None, tool: str | None, kernels: list[str], job: Path) -> dict:
    """One child run (under ``tool``, or none) with its step times."""
    command = ([sys.executable, "-P", "-m", "kforge.eval.process.sanitize_child", str(job)]
               if tool is None else S.tool_command(binary or "", tool, kernels, job))
    launched = time.time()
    seconds, code, output = timed(command, {"PYTHONUNBUFFERED": "1"})
    return {"seconds": round(seconds, 2), "rc": code, "reports": S.reports(output)[:2],
            **phases_of(output, launched),
            **({} if code in (0, S.FOUND) else {"tail": output.strip().splitlines()[-3:]})}


def process_costs() -> dict:
    probes = {
        "python": "pass",
        "torch + CUDA context": "import torch; torch.zeros(1, device='cuda')",
        "child imports": "import kforge.eval.process.sanitize_child, kforge.runtime.gpulock",
        "child + driver context": "from kforge.eval.process.sanitize_child import Driver; "
                                  "Driver().context(0)",
    }
    return {name: round(timed([sys.executable, "-c", code])[0], 2)
            for name, code in probes.items()}


def run_case(name: str, device: int, binary: str | None) -> dict:
    import torch

    from kforge.core.launch_plan import parse_plan
    from kforge.core.settings import TimingPlan
    from kforge.eval.process.local import device_context, evaluate_local
    from kforge.runtime.nvrtc import Compiler
    from tests.eval import redteam as R

    control = next(c for c in R.CONTROLS if c.name == CASES[name])
    card = control.card()
    candidate = control.candidate("cuda")
    arch = device_context(device).gpu.arch
    with tempfile.TemporaryDirectory() as cold_dir:
        started = time.perf_counter()
        cold = Compiler(Path(cold_dir)).compile(candidate.source, arch)
        cold_s = time.perf_counter() - started
    compiled = device_context(device).loader.compile(candidate)  # fills the shared cache
    started = time.perf_counter()
    device_context(device).loader.compile(candidate)
    cached_s = time.perf_counter() - started
    kernels = list(parse_plan(candidate.plan).kernel_names())
    evaluated = evaluate_local(card, candidate, device=device)  # how many calls its timing makes
    timed_calls = (evaluated.timing.reps + TimingPlan().warmup) if evaluated.timing else None
    torch.cuda.synchronize()
    out: dict = {"case": name, "control": control.name, "kernels": kernels,
                 "nvrtc_cold_s": round(cold_s, 3), "nvrtc_cached_s": round(cached_s, 4),
                 "ok": cold.ok and compiled.ok, "evaluation": evaluated.status.value,
                 "timed_calls": timed_calls,
                 "needed_tools": list(S.needed_tools(candidate, compiled.cubin))}
    with tempfile.TemporaryDirectory() as folder:
        calls = S.calls_to_check(timed_calls)
        started = time.perf_counter()
        job = S.write_job(S.job_for(card, candidate, compiled.cubin, Path(folder), device=device,
                                    calls=calls, phases=True), Path(folder))
        out["job_s"] = round(time.perf_counter() - started, 3)
        out["calls"] = calls
        out["no_tool"] = child_run(binary, None, kernels, job)
        if binary is None:
            return out
        out["alone"] = {tool: child_run(binary, tool, kernels, job) for tool in S.TOOLS}
        print(f"   {name}: no tool {out['no_tool']}; alone {out['alone']}", flush=True)
        cache = S.VerdictCache(Path(folder) / "verdicts")
        started = time.perf_counter()
        report = S.sanitize_candidate(card, candidate, device=device, cubin=compiled.cubin,
                                      timed_calls=timed_calls, cache=cache)
        out["now"] = {**report.to_dict(), "wall_s": round(time.perf_counter() - started, 2)}
        started = time.perf_counter()
        again = S.sanitize_candidate(card, candidate, device=device, cubin=compiled.cubin,
                                     timed_calls=timed_calls, cache=cache)
        out["cached"] = {"ok": again.ok, "cached": again.cached,
                         "wall_s": round(time.perf_counter() - started, 3)}
    return out


def print_case(result: dict) -> None:
    print(f"\n== {result['case']} ({result['control']}), kernels {result['kernels']}, "
          f"tools needed: {result['needed_tools']}")
    print(f"   NVRTC cold {result['nvrtc_cold_s']:.3f} s, cached {result['nvrtc_cached_s']:.4f} s; "
          f"evaluation {result['evaluation']}, timed calls {result['timed_calls']}; "
          f"the child's job made in {result['job_s']:.3f} s, {result['calls']} calls")
    keys = ("seconds", "to_child", "device", "module_load", "inputs", "calls", "kept")
    print("   " + "run".ljust(16) + "".join(k.rjust(13) for k in keys))

    def row(label: str, data: dict) -> None:
        cells = "".join((f"{data[k]:.2f}" if isinstance(data.get(k), (int, float)) else "-")
                        .rjust(13) for k in keys)
        extra = f"  reports: {data['reports']}" if data.get("reports") else ""
        extra += f"  FAILED rc={data['rc']}: {data.get('tail')}" if data.get("tail") else ""
        print("   " + label.ljust(16) + cells + extra)

    row("no tool", result["no_tool"])
    for tool, data in result.get("alone", {}).items():
        row(tool, data)
    if "now" in result:
        now = result["now"]
        print(f"   needed tools at once (a confirmation): {now['wall_s']:.1f} s ok={now['ok']} "
              f"per tool {now['tool_seconds']} {now['message'][:120]}")
        print(f"   cached verdict: {result['cached']['wall_s'] * 1000:.1f} ms "
              f"(cached={result['cached']['cached']})")
    print("   (kept: what a sanitizer process kept for the whole search would still pay per "
          "candidate)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="softmax,matmul",
                        help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("bench_sanitizer: no CUDA GPU here; nothing to measure")
        return
    binary = S.find_sanitizer()
    print(f"compute-sanitizer: {binary or 'not found'}"
          + (f" ({S.sanitizer_version(binary)})" if binary else ""))
    costs = process_costs()
    print("process costs (s): " + ", ".join(f"{k} {v:.2f}" for k, v in costs.items()))
    results = {"process": costs, "cases": []}
    for name in args.cases.split(","):
        result = run_case(name.strip(), args.device, binary)
        results["cases"].append(result)
        print_case(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
