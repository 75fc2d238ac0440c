"""Verified CUDA kernels for one model, exported by kforge.

    import this_package
    with this_package.patch() as p:
        model(x)
    print(p.report())

Each kernel runs only for the exact op variant it was verified on (op, dtypes, shapes, strides,
scalar arguments); every other call runs PyTorch's own kernel. ``manifest()`` lists every op
variant of the model: its kernel and speedup, or why it stays on eager. Needs torch, numpy and
cuda-python (cuda-core, cuda-bindings); compiling for a GPU without a shipped cubin also needs
NVRTC and the CUDA headers (nvidia-cuda-nvrtc, nvidia-cuda-runtime).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import torch

from .runtime.cubin import KernelModule, device_arch
from .runtime.guard import Patch
from .runtime.nvrtc import compile_cubin
from .runtime.plan import PlanRunner, resolve_for
from .runtime.table import Entry, KernelTable, RangeRunner

HERE = Path(__file__).resolve().parent


@cache
def manifest() -> dict[str, Any]:
    """What was exported: the session, its kernels (with speedups) and the ops kept on eager."""
    return json.loads((HERE / "manifest.json").read_text())


def kernel_folder(kernel: dict[str, Any]) -> Path:
    """Where a kernel of the manifest lies: a folder under this package's ``kernels/``; a
    ValueError for a manifest that points anywhere else."""
    folder = (HERE / str(kernel["dir"])).resolve()
    if not folder.is_relative_to(HERE / "kernels"):
        raise ValueError(f"the manifest points outside the package ({str(kernel['dir'])[:80]!r})")
    return folder


def patch(device: str | torch.device | None = None, *, any_arch: bool = False) -> Patch:
    """The kernels loaded on ``device`` (default: the current CUDA device), as a context manager
    that patches them in while active.

    Kernels run on the GPU architectures they were exported for; on another one they stay off
    unless ``any_arch=True``, which compiles them for it with NVRTC (they were verified on
    ``manifest()["verified_on"]`` only)."""
    if not torch.cuda.is_available():
        raise RuntimeError("patch() needs a CUDA GPU and this torch sees none")
    cuda = torch.device(device) if device is not None else torch.device("cuda")
    if cuda.type != "cuda":
        raise ValueError(f"patch() runs kernels on a CUDA device, not {cuda}")
    cuda = torch.device("cuda", cuda.index if cuda.index is not None
                        else torch.cuda.current_device())
    info = manifest()
    arch = device_arch(cuda)
    if arch not in info["archs"] and not any_arch:
        return Patch(KernelTable(), [f"kernels were exported for {', '.join(info['archs'])} "
                                     f"and this GPU is {arch}: they stay off (patch(any_arch="
                                     "True) compiles them for it, unverified)"])
    prelude = (HERE / "prelude.cuh").read_text()
    table, notes = KernelTable(), []
    for kernel in info["kernels"]:
        try:
            folder = kernel_folder(kernel)
            cubin = folder / f"{arch}.cubin"
            code = cubin.read_bytes() if cubin.exists() else compile_cubin(
                (folder / "kernel.cu").read_text(), arch, prelude, kernel["nvrtc_options"])
            plan = resolve_for(json.loads((folder / "plan.json").read_text()), kernel["op"],
                               kernel["args"], kernel["kwargs"])
            runner = PlanRunner(plan, kernel["op"], KernelModule(code, cuda), cuda)
            if kernel.get("ranges") is not None:  # a range of variants: resolved per point
                runner = RangeRunner(json.loads((folder / "plan.json").read_text()),
                                     kernel["op"], kernel["args"], kernel["kwargs"],
                                     kernel["ranges"], runner.backend, cuda)
            table.add(Entry(op=kernel["op"], args=kernel["args"], kwargs=kernel["kwargs"],
                            runner=runner, device=cuda, label=kernel["label"], key=kernel["key"],
                            ranges=kernel.get("ranges")))
        except Exception as exc:  # a kernel that cannot load here: its op stays on eager
            notes.append(f"{kernel['label']}: stays on eager, it does not load on {arch}: {exc}")
    return Patch(table, notes)
