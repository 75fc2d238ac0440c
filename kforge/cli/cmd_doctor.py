"""`kforge doctor`: what works on this machine and what is missing, in plain words."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text

from kforge.app.database import open_store
from kforge.cli.common import add_db_option, out, resolve_db
from kforge.errors import KforgeError
from kforge.store.config import config_path, load_config

if TYPE_CHECKING:
    from kforge.cli.main import Commands

OK, WARN, FAIL = "ok", "warn", "fail"
_MARK = {OK: ("ok  ", "green"), WARN: ("warn", "yellow"), FAIL: ("FAIL", "bold red")}


@dataclass(frozen=True)
class Check:
    name: str
    level: str
    detail: str


def register(sub: Commands) -> None:
    p = sub.add_parser("doctor")
    p.add_argument("--llm", action="store_true",
                   help="only check the LLM endpoint, with one tiny live request: its model, "
                        "latency, tokens and price")
    add_db_option(p)
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.llm:
        check = check_llm_live()
        out.print(Text.assemble(_MARK[check.level], f"  {check.name}  {check.detail}"))
        return 1 if check.level == FAIL else 0
    checks: list[Check] = []
    arch = "sm_90"
    for probe in (check_python, check_torch, check_gpu):
        result = probe()
        checks.append(result)
        if result.name == "GPU" and result.level == OK:
            arch = result.detail.split("(")[-1].rstrip(")")
    checks.append(check_nvrtc(arch))
    checks.append(check_sanitizer())
    checks.append(check_database(args))
    checks.append(check_config())
    checks.append(check_llm())
    checks.append(check_tui())
    width = max(len(c.name) for c in checks)
    for c in checks:
        out.print(Text.assemble(_MARK[c.level], f"  {c.name.ljust(width)}  {c.detail}"))
    failed = [c.name for c in checks if c.level == FAIL]
    if failed:
        out.print(f"\nnot working: {', '.join(failed)}")
    return 1 if any(c.name in ("database", "config") for c in checks if c.level == FAIL) else 0


def _guard(name: str, probe: Callable[[], Check]) -> Check:
    try:
        return probe()
    except Exception as exc:  # a doctor reports every failure instead of stopping at one
        return Check(name, FAIL, f"{type(exc).__name__}: {exc}")


def check_python() -> Check:
    version = platform.python_version()
    level = OK if sys.version_info >= (3, 11) else FAIL
    return Check("Python", level, f"{version} at {sys.executable}")


def check_torch() -> Check:
    def probe() -> Check:
        import torch

        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
        return Check("torch", OK, f"{torch.__version__} ({build})")

    return _guard("torch", probe)


def check_gpu() -> Check:
    def probe() -> Check:
        import torch

        if not torch.cuda.is_available():
            return Check("GPU", WARN, "no CUDA device: browsing sessions works; profiling on "
                                      "the GPU, search, apply and e2e need one")
        props = torch.cuda.get_device_properties(0)
        count = torch.cuda.device_count()
        more = f", {count} devices" if count > 1 else ""
        return Check("GPU", OK, f"{props.name}{more}, {props.multi_processor_count} SMs, "
                                f"{props.total_memory / 2**30:.0f} GiB "
                                f"(sm_{props.major}{props.minor})")

    return _guard("GPU", probe)


def check_nvrtc(arch: str) -> Check:
    def probe() -> Check:
        try:
            importlib.import_module("cuda.core")
        except ImportError:
            return Check("NVRTC", FAIL, "cuda-core is not installed: pip install 'kforge[cuda]'")
        from kforge.runtime.nvrtc import Compiler

        compiler = Compiler()
        result = compiler.compile('extern "C" __global__ void probe(float* x) { x[0] = 1.f; }',
                                  arch)
        if not result.ok:
            return Check("NVRTC", FAIL, f"test compile for {arch} failed: {result.log[:200]}")
        return Check("NVRTC", OK, f"NVRTC {compiler.version()} compiles for {arch} "
                                  f"in {1000 * result.seconds:.0f} ms")

    return _guard("NVRTC", probe)


def check_database(args: argparse.Namespace) -> Check:
    path = resolve_db(args)
    if not path.exists():
        return Check("database", OK, f"{path} (not created yet: the first profile creates it)")

    async def probe() -> Check:
        store = await open_store(path, reads_only=True)
        try:
            sessions = await store.list_sessions()
        finally:
            await store.close()
        return Check("database", OK, f"{path} ({len(sessions)} sessions)")

    try:
        return asyncio.run(probe())
    except KforgeError as exc:
        return Check("database", FAIL, str(exc))


def check_config() -> Check:
    path = config_path()
    try:
        load_config(path)
    except KforgeError as exc:
        return Check("config", FAIL, str(exc))
    return Check("config", OK, f"{path}" + ("" if path.exists() else " (none: defaults apply)"))


def check_llm() -> Check:
    def probe() -> Check:
        import os

        from kforge.propose.llm.settings import PLACEHOLDER_KEY, load_llm_settings

        try:
            s = load_llm_settings(load_config().llm, os.environ)
        except KforgeError as exc:
            return Check("LLM", WARN, f"not configured ({exc}); the built-in kernel library "
                                      "works offline")
        key = "no key" if s.api_key == PLACEHOLDER_KEY else "key set"
        return Check("LLM", OK, f"model {s.model} at {s.base_url or 'api.openai.com'} ({key})")

    return _guard("LLM", probe)


def check_llm_live() -> Check:
    """One tiny request to the configured endpoint: who answered, how fast, what it cost, and
    the price kforge counts for the model; a failure in one line."""
    import os

    from kforge.propose.llm.proposer import probe_endpoint
    from kforge.propose.llm.settings import load_llm_settings

    try:
        settings = load_llm_settings(load_config().llm, os.environ,
                                     config_file=str(config_path()))
        found = asyncio.run(probe_endpoint(settings))
    except KforgeError as exc:
        return Check("LLM", FAIL, str(exc))
    served = f" (served as {found.served})" if found.served and found.served != found.model \
        else ""
    price = (f"${found.usd:.6f} at ${found.price.input_per_mtok:g} / "
             f"${found.price.output_per_mtok:g} per million prompt / reply tokens"
             if found.price is not None else
             f"no price for it in [llm.prices] ({config_path()}): its calls count as $0")
    return Check("LLM", OK if found.price is not None else WARN, settings.redact(
        f"model {found.model}{served} at {settings.base_url or 'api.openai.com'} answered in "
        f"{found.seconds:.2f} s: {found.input_tokens} prompt + {found.output_tokens} reply "
        f"tokens, {price}"))


def check_sanitizer() -> Check:
    def probe() -> Check:
        from kforge.eval.process.sanitize import find_sanitizer

        found = find_sanitizer()
        if found is None:
            return Check("sanitizer", WARN, "compute-sanitizer not found: a new best is then kept "
                         "without its race and memory checks (pip install "
                         "nvidia-cuda-sanitizer-api, or the CUDA toolkit)")
        return Check("sanitizer", OK, f"compute-sanitizer at {found}")

    return _guard("sanitizer", probe)


def check_tui() -> Check:
    def probe() -> Check:
        textual = importlib.import_module("textual")
        importlib.import_module("tree_sitter_cuda")
        return Check("TUI", OK, f"textual {textual.__version__}, tree-sitter-cuda present")

    return _guard("TUI", probe)
