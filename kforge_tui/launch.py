"""Starting work that needs torch or a GPU: ``python -m kforge ... --json`` subprocesses (a new
session's profile, an engine resume) whose progress lines the TUI shows and whose JSON answer
names the session, and the GPU check that guards them. They are commands, not ``kforge.app``
calls: a profile and a search bring in torch, which the TUI never imports, and a detached search
outlives the TUI and a dropped link."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from kforge.core.settings import Origin, SearchSettings, Settings, parse_duration
from kforge.engine.command import kforge_command, kforge_env
from kforge.engine.plugins import PluginConsent
from kforge.errors import KforgeError

DTYPES = ("float16", "bfloat16", "float32")
PROPOSERS = ("library", "llm", "both")
# Shown when the model zoo cannot be listed in this build.
FALLBACK_MODELS = ("resnet50", "sd35", "gemma4", "qwen35")


@dataclass(frozen=True)
class GpuCheck:
    """What this machine offers: an NVIDIA GPU's name, or why there is none."""

    name: str | None
    detail: str

    @property
    def present(self) -> bool:
        return self.name is not None

    @property
    def label(self) -> str:
        return self.name or "no GPU"


NEEDS_GPU = ("the gpu evaluator needs an NVIDIA GPU and this machine has none ({detail}); "
             "browse, prune and delete here, or set [search] evaluator to a plug-in "
             "(module:factory)")


async def probe_gpu(timeout_s: float = 5.0) -> GpuCheck:
    """Ask ``nvidia-smi -L`` (cheap; never imports torch) which GPU this machine has."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return GpuCheck(None, "nvidia-smi not found")
    try:
        proc = await asyncio.create_subprocess_exec(exe, "-L", stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except (OSError, TimeoutError) as exc:
        return GpuCheck(None, f"nvidia-smi failed: {exc}")
    return parse_nvidia_smi(proc.returncode or 0, out.decode(errors="replace"))


def parse_nvidia_smi(returncode: int, output: str) -> GpuCheck:
    """``GPU 0: NVIDIA H200 (UUID: ...)`` -> its name (and how many more there are)."""
    gpus = [line.split(":", 1)[1].split("(UUID")[0].strip()
            for line in output.splitlines() if line.startswith("GPU ") and ":" in line]
    if returncode != 0 or not gpus:
        first = output.strip().splitlines()[0] if output.strip() else f"exit code {returncode}"
        return GpuCheck(None, f"nvidia-smi: {first}")
    more = f" (+{len(gpus) - 1})" if len(gpus) > 1 else ""
    return GpuCheck(gpus[0] + more, f"{len(gpus)} GPU(s)")


def needs_gpu(evaluator: str) -> bool:
    """Whether a search judged by ``evaluator`` needs an NVIDIA GPU: the built-in one does; a
    plug-in (``module:factory``) runs where its author lets it. Profiling does not: without a
    GPU a model is profiled on the CPU."""
    return ":" not in evaluator


def search_evaluator(config: Settings, stored: dict | None = None) -> str:
    """The evaluator a search will run with: the session's stored choice over the config
    file's, as ``kforge search`` and ``kforge resume`` settle it (a new session: the config's)."""
    search = (stored or {}).get("search") or {}
    return config.search.updated(search, Origin("in the stored settings", strict=False)).evaluator


def builtin_models() -> list[tuple[str, str]]:
    """``(name, description)`` of the built-in models, as `kforge profile --list` names them
    (the zoo is cheap to import: no torch)."""
    from kforge.app.profile import list_models

    try:
        return list(list_models().models)
    except ImportError:
        return [(name, "") for name in FALLBACK_MODELS]


@dataclass(frozen=True)
class NewSession:
    """The new-session form, as typed."""

    model: str
    dtype: str = ""
    proposer: str = ""
    iterations: str = ""
    usd: str = ""
    time: str = ""


def search_argv(form: NewSession, db: Path) -> list[str]:
    """``python -m kforge search ...`` for the form, checked field by field."""
    model = form.model.strip()
    if not model:
        raise KforgeError("name a model: a built-in one or path/to/file.py:factory")
    if model.startswith("-"):  # the command line would read it as an option of its own
        raise KforgeError(f"{model!r} is no model: a model's name does not start with '-'")
    if ":" in model and not model.startswith(("http:", "https:")):
        path = Path(model.rsplit(":", 1)[0]).expanduser()
        if not path.is_file():
            raise KforgeError(f"{path} is not a file (a model is path/to/file.py:factory)")
    argv = [*kforge_command(), "search", model, "--db", str(db), "--detach", "--json"]
    if form.dtype:
        if form.dtype not in DTYPES:
            raise KforgeError(f"dtype must be one of {', '.join(DTYPES)}, not {form.dtype!r}")
        argv += ["--dtype", form.dtype]
    if form.proposer.strip():
        argv += ["--proposer", form.proposer.strip()]
    budget = {"iterations_per_op": number(form.iterations, int, "iterations per op"),
              "usd": number(form.usd, float, "the USD budget"),
              "wall_s": parse_duration(form.time) if form.time.strip() else None}
    # The range rules are the settings' own, as `kforge search` applies them.
    SearchSettings.from_dict({k: v for k, v in budget.items() if v is not None},
                             Origin("in the new-session form"))
    for option, text in (("--iterations", form.iterations), ("--usd", form.usd),
                         ("--time", form.time)):
        if text.strip():
            argv += [option, text.strip()]
    return argv


def number(text: str, kind: type[int | float], what: str) -> int | float | None:
    """A form field read as a whole number or a number (None when empty)."""
    if not text.strip():
        return None
    try:
        return kind(text.strip())
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        raise KforgeError(f"{what} must be {noun}, not {text.strip()!r}") from None


def resume_argv(session_id: int, db: Path,
                confirmed: Iterable[tuple[str, str]] = ()) -> list[str]:
    """``kforge resume --detach``, with each plug-in and cluster in ``confirmed`` (the user said
    yes to what ``needs_consent`` named) given again (``--proposer SPEC``...): the engine trusts
    those, not whatever the database names by the time it reads it."""
    return [*kforge_command(), "resume", str(session_id), "--db", str(db), "--detach", "--json",
            *PluginConsent(frozenset(confirmed)).options()]


async def run_kforge(argv: list[str], on_line: Callable[[str], None]) -> dict:
    """Run a kforge command that answers in JSON (``--json``): pass each line it writes to stderr
    (its progress) to ``on_line`` as it comes, and return the object it prints on stdout. A
    failure raises KforgeError with kforge's own one-line message."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=kforge_env())
    except OSError as exc:
        raise KforgeError(f"cannot start {argv[0]}: {exc.strerror}") from None
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[str] = []

    async def follow_progress(stream: asyncio.StreamReader) -> None:
        async for raw in stream:
            for part in raw.decode(errors="replace").replace("\r", "\n").splitlines():
                if part.strip():
                    lines.append(part)
                    on_line(part)

    try:
        answer, _ = await asyncio.gather(proc.stdout.read(), follow_progress(proc.stderr))
        await proc.wait()
    except asyncio.CancelledError:
        proc.terminate()
        raise
    if proc.returncode:
        raise KforgeError(failure_message(lines, proc.returncode))
    return json_answer(answer.decode(errors="replace"))


def failure_message(lines: list[str], returncode: int) -> str:
    """kforge's own ``kforge: ...`` line if it printed one, else the last line."""
    for line in reversed(lines):
        if line.startswith("kforge: "):
            return line.removeprefix("kforge: ")
    tail = lines[-1] if lines else "no output"
    return f"kforge exited with code {returncode}: {tail}"


def json_answer(stdout: str) -> dict:
    """The one JSON object a ``--json`` command prints, which names its session."""
    try:
        answer = json.loads(stdout)
    except json.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("session"), int):
        shown = stdout.strip()[:200] or "nothing"
        raise KforgeError(f"kforge answered without naming a session: {shown}")
    return answer
