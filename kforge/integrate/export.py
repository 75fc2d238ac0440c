"""Write a session's winning kernels as a standalone Python package.

The package holds the kernels' CUDA sources and launch plans, a cubin per requested architecture
(compiled here with NVRTC, which needs no GPU), the NVRTC prelude, a manifest of every op variant
of the model (its kernel and speedup, or why it stays on eager), a README, and a copy of the
runtime layer (``kforge.runtime`` with the core modules it stands on: arg specs, launch plans, op
cards). It imports nothing from kforge: torch, numpy and cuda-python are enough, and on a GPU it
has no cubin for it compiles the sources with NVRTC.
"""

from __future__ import annotations

import json
import keyword
import os
import re
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kforge import __version__
from kforge.core.files import private_folder, write_new
from kforge.core.fmt import fmt_speedup
from kforge.core.opcard import key_folder
from kforge.core.secrets import redact, redact_values
from kforge.errors import KforgeError
from kforge.integrate.plan import SessionPlan
from kforge.integrate.winners import CardChoice, card_label
from kforge.runtime.nvrtc import PRELUDE, Compiler, check_options
from kforge.store.config import configured_secrets

FORMAT = 1
PROFILE_SETTINGS = ("dtype", "batch", "seq_len", "mode", "layers")
_ARCH = re.compile(r"^sm_\d{2,3}[af]?$")
# Names an exported package must not take: the standard library's, and what the package imports.
_TAKEN_NAMES = frozenset({*sys.stdlib_module_names, "kforge", "torch", "numpy", "cuda"})
_HERE = Path(__file__).resolve().parent
_KFORGE = _HERE.parent
# What the exported package's runtime/ folder holds, and the kforge imports rewritten there.
_RUNTIME_FILES = {"runtime": ["cache.py", "cubin.py", "cubin_elf.py", "guard.py", "native.py",
                              "native_guard.cpp", "nvrtc.py", "plan.py", "table.py"],
                  "core": ["argspec.py", "describe.py", "launch_plan.py", "laws.py", "opcard.py",
                           "ranges.py", "schema.py"],
                  "": ["errors.py"]}
_KFORGE_IMPORT = re.compile(r"^(\s*)from kforge\.(?:runtime\.|core\.)?(\w+) import ", re.M)


@dataclass
class Exported:
    path: Path
    kernels: int
    archs: list[str]
    problems: list[str] = field(default_factory=list)  # kernels that did not compile for an arch


def package_name(session_id: int) -> str:
    return f"kforge_session_{session_id}"


def package_folder(session_id: int, out_dir: Path, *, name: str | None = None,
                   archs: Iterable[str] = (), force: bool = False) -> Path:
    """The folder in ``out_dir`` that package ``name`` (None: kforge_session_N) of session
    ``session_id`` is written to; a KforgeError for an architecture or a name a package cannot
    have, or a folder already there without ``force``. It reads nothing of the session, so an
    export checks its arguments with it before it prints or writes anything."""
    if bad := [a for a in archs if not _ARCH.match(a)]:
        raise KforgeError(f"{bad[0]!r} is not a GPU architecture: use the form sm_90 or sm_121")
    name = name or package_name(session_id)
    if not name.isidentifier() or keyword.iskeyword(name):
        raise KforgeError(f"{name!r} cannot be a Python package name: use letters, digits and _ "
                          "(not a Python keyword)")
    if name in _TAKEN_NAMES:
        raise KforgeError(f"{name!r} is the name of a module Python or kforge imports: "
                          f"`import {name}` would find that one; choose another --name")
    target = out_dir / name
    if target.exists() and not force:
        raise KforgeError(f"{target} already exists: remove it or pass --force")
    return target


def export_session(plan: SessionPlan, out_dir: Path, *, name: str | None = None,
                   archs: list[str] | None = None, force: bool = False,
                   compiler: Compiler | None = None) -> Exported:
    """Write the plan's winners as package ``name`` inside ``out_dir``; the package appears
    whole or not at all."""
    sid = plan.session.id
    if not plan.winners:
        raise KforgeError(f"session {sid} has nothing to export: no op card has a verified kernel "
                          f"that beats eager beyond the timing noise (see `kforge apply {sid}` "
                          "or `kforge show`)")
    archs = list(dict.fromkeys(archs or [plan.made_on]))
    target = package_folder(sid, out_dir, name=name, archs=archs, force=force)
    name = target.name
    if compiler is None:
        from kforge.runtime.kernel_loader import default_cache_dir

        compiler = Compiler(default_cache_dir())
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KforgeError(f"cannot write into {out_dir}: {exc.strerror}") from None
    # Staged in a folder only this user may enter, every file and folder in it made new: a link
    # planted where the package's files go is never written through.
    staging = private_folder(out_dir, f".{name}.")
    made = staging.lstat()
    try:
        problems = _write(plan, staging, name, archs, compiler)
        if not os.path.samestat(made, staging.lstat()):
            raise KforgeError(f"the package's staging folder {staging} was replaced while it "
                              "was written: export into a folder only you can write")
        staging.chmod(0o777 & ~_umask())  # as a folder made the usual way
        if target.is_symlink():
            target.unlink()  # the link itself, never what it points to
        elif target.exists():
            shutil.rmtree(target)
        staging.replace(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Exported(target, sum(d.card.region is None for d in plan.winners), archs, problems)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write(plan: SessionPlan, root: Path, name: str, archs: list[str],
           compiler: Compiler) -> list[str]:
    """The package's files, each new, under ``root``; what the session stored is written with
    the LLM secrets redacted, as everything kforge writes."""
    secrets = configured_secrets()
    copy_runtime(root / "runtime")
    write_new(root / "__init__.py", (_HERE / "artifact.py").read_text())
    write_new(root / "prelude.cuh", PRELUDE)
    (root / "kernels").mkdir()
    # A fusion region's kernel needs the region's operator and the model's module map, which
    # only kforge itself provides (kforge.patch with the model, kforge.compile).
    problems = [f"{card_label(d.card)}: not exported, a fusion region's kernel runs through "
                "kforge itself (kforge.patch(..., model=...), kforge.compile)"
                for d in plan.winners if d.card.region is not None]
    kernels = [_write_kernel(root, d, archs, compiler, problems, secrets) for d in plan.winners
               if d.card.region is None]
    session = plan.session
    manifest = {
        "format": FORMAT, "exported_by": f"kforge {__version__}", "session": session.id,
        "model": session.model,
        "settings": {k: session.settings[k] for k in PROFILE_SETTINGS
                     if session.settings.get(k) is not None},
        "verified_on": {"name": session.gpu.get("name", ""), "arch": plan.made_on},
        "archs": archs, "nvrtc": compiler.version(), "projected_speedup": plan.projected,
        "kernels": kernels,
        "eager": [{"key": d.card.key, "label": card_label(d.card), "op": d.card.op,
                   "signature": d.card.signature, "share": d.card.share,
                   "target": d.card.target, "reason": d.reason}
                  for d in plan.decisions if not d.replaced],
    }
    manifest = redact_values(manifest, secrets)
    write_new(root / "manifest.json", json.dumps(manifest, indent=1, allow_nan=True) + "\n")
    write_new(root / "README.md", readme(name, manifest))
    return problems


def copy_runtime(folder: Path) -> None:
    """The runtime layer as a package of its own: its kforge imports become relative."""
    folder.mkdir()
    write_new(folder / "__init__.py", (_KFORGE / "runtime" / "__init__.py").read_text())
    for package, names in _RUNTIME_FILES.items():
        for file in names:
            text = _KFORGE_IMPORT.sub(r"\1from .\2 import ", (_KFORGE / package / file).read_text())
            if "kforge." in "".join(ln for ln in text.splitlines(True) if "import" in ln):
                raise AssertionError(f"{package}/{file} imports kforge beyond the runtime layer")
            write_new(folder / file, text)


def _write_kernel(root: Path, decision: CardChoice, archs: list[str], compiler: Compiler,
                  problems: list[str], secrets: tuple[str, ...]) -> dict:
    card, candidate = decision.card, decision.candidate
    assert candidate is not None  # a winner always carries its code
    try:
        folder = key_folder(Path("kernels"), card.key)
    except ValueError as exc:
        raise KforgeError(f"{exc} of the package: the session's database is damaged") from None
    source = redact(candidate.source, secrets)  # what is compiled is what is written
    (root / folder).mkdir()
    write_new(root / folder / "kernel.cu", source)
    write_new(root / folder / "plan.json",
              json.dumps(redact_values(candidate.plan, secrets), indent=1) + "\n")
    label = card_label(card)
    cubins, errors = {}, {}
    try:
        options = check_options([str(o) for o in candidate.meta.get("nvrtc_options") or []])
    except ValueError as exc:
        options, errors = [], {arch: str(exc) for arch in archs}
    for arch in archs if not errors else []:
        compiled = compiler.compile(source, arch, options)
        if compiled.ok:
            write_new(root / folder / f"{arch}.cubin", compiled.cubin)
            cubins[arch] = f"{arch}.cubin"
        else:
            errors[arch] = compiled.log.strip().splitlines()[0] if compiled.log.strip() else "?"
    problems += [f"{label}: no cubin for {arch}: {why}" for arch, why in errors.items()]
    return {"key": card.key, "label": label, "op": card.op, "args": card.args,
            "kwargs": card.kwargs, "ranges": card.ranges, "signature": card.signature,
            "share": card.share, "calls": card.calls, "speedup": decision.speedup,
            "spread": decision.spread,
            "node": decision.node_id, "meta": {k: v for k, v in candidate.meta.items()
                                               if k != "nvrtc_options"},
            "dir": folder.as_posix(), "nvrtc_options": options, "cubins": cubins,
            "compile_errors": errors}


def readme(name: str, manifest: dict) -> str:
    """The artifact's README: usage, then what runs where."""
    kernels = "\n".join(f"| `{k['label']}` | {100 * k['share']:.1f}% | "
                        f"{fmt_speedup(k['speedup'])} |" for k in manifest["kernels"])
    eager = "\n".join(f"| `{e['label']}` | {100 * e['share']:.1f}% | {e['reason']} |"
                      for e in manifest["eager"] if e["target"])
    views = sum(1 for e in manifest["eager"] if not e["target"])
    verified = manifest["verified_on"]
    return f"""# {name}

Verified CUDA kernels for `{manifest['model']}` ({json.dumps(manifest['settings'])}), from kforge
session {manifest['session']}, verified on {verified['name']} ({verified['arch']}).

```python
import {name}

with {name}.patch() as p:   # the current CUDA device; patch("cuda:1") for another
    out = model(x)
print(p.report())           # how often each kernel ran
```

Each kernel runs only for the exact op variant it won on (op, dtypes, shapes, strides, scalar
arguments); every other call, and any call where a kernel fails, runs PyTorch's own kernel.
The patch is process-wide while active and works under `torch.no_grad()`,
`torch.inference_mode()` and CUDA graph capture. Projected speedup over operator time:
{manifest['projected_speedup']:.3f}x.

Needs torch, numpy and cuda-python (`cuda-core`, `cuda-bindings`). Cubins are included for
{', '.join(manifest['archs'])}; on another GPU the kernels stay off unless
`patch(any_arch=True)`, which compiles them with NVRTC (`nvidia-cuda-nvrtc` and the headers of
`nvidia-cuda-runtime`, or a CUDA toolkit).

## Kernels

| op variant | share | speedup |
| --- | ---: | ---: |
{kernels}

## Kept on eager PyTorch

| op variant | share | why |
| --- | ---: | --- |
{eager}

and {views} views and copies, which are never targets.

`manifest.json` has all of this in full; `kernels/<card key>/` holds each kernel's source
(`kernel.cu`, compiled after `prelude.cuh`), its launch plan (`plan.json`: the outputs to allocate
and the launches to make, as data that `runtime/plan.py` interprets) and its cubins.
"""
