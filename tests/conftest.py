"""Test-wide settings: GPU tests skip with a reason where there is no CUDA device, no test
touches the user's real kforge data or config, and property tests draw the same examples on every
run."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

# The suite passes or fails alike on every machine and run: Hypothesis derives each test's
# examples from the test itself and keeps no database of earlier failures. To look for new
# counterexamples, run with KFORGE_HYPOTHESIS=explore (new random examples on every run).
settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("explore", database=None)
settings.load_profile(os.environ.get("KFORGE_HYPOTHESIS", "repeatable"))

# torch.compile's caches (Inductor's FX graphs, Triton's kernels) go to a folder of this run's
# own, not the machine's shared one: another run beside this one, of other code, writes there.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _COMPILE_CACHE = tempfile.TemporaryDirectory(prefix="kforge-tests-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _COMPILE_CACHE.name


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_kforge_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Point kforge's database, config and cache at a per-test folder."""
    home = tmp_path_factory.mktemp("kforge-home")
    monkeypatch.setenv("KFORGE_DB", str(home / "kforge.db"))
    monkeypatch.setenv("KFORGE_CONFIG", str(home / "config.toml"))
    monkeypatch.setenv("KFORGE_CACHE_DIR", str(home / "cache"))
    for name in ("KFORGE_LLM_API_KEY", "KFORGE_LLM_BASE_URL", "KFORGE_LLM_MODEL",
                 "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture
async def store(tmp_path: Path):
    """A new session database, closed after the test."""
    from kforge.store import Store

    s = await Store.open(tmp_path / "k.db")
    yield s
    await s.close()
