"""Profile a model into a new session: its op cards and sample inputs stored together, or
nothing; and the built-in models a profile can name."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kforge.app.facts import SessionFacts, session_facts
from kforge.core.gpu import NO_GPU, GpuInfo
from kforge.errors import KforgeError
from kforge.store import Store
from kforge.store.beside import samples_root
from kforge.store.config import store_options

if TYPE_CHECKING:
    from kforge.capture import Profile

DEFAULT_SAMPLES = 3
# (stage, done, total): a stage of the profile (build, warmup, profile, regions, lengths,
# samples) and how far it is
ProfileProgress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class ModelList:
    """The built-in models a profile can name: ``(name, description)`` each, in order."""

    models: tuple[tuple[str, str], ...]

    def to_dict(self) -> dict:
        return {"models": dict(self.models)}


def list_models() -> ModelList:
    from kforge.capture import zoo

    return ModelList(tuple(zoo.listing()))


@dataclass(frozen=True)
class ProfileRequest:
    """A model to profile (a built-in one or ``path/to/file.py:factory``) and how to build and
    run it; None leaves a setting to the model."""

    model: str
    dtype: str | None = None
    device: str | None = None
    batch: int | None = None
    seq_len: int | None = None
    mode: str | None = None
    layers: int | None = None
    samples: int = DEFAULT_SAMPLES  # sample inputs kept per op card
    regions: bool = True  # fusion-region cards besides the op cards
    seq_lengths: tuple[int, ...] = ()  # more lengths to profile at, for range cards
    seq_range: tuple[int, int] | None = None  # the lengths range cards cover

    def __post_init__(self) -> None:
        if self.seq_range is not None and not self.seq_lengths:
            raise KforgeError("--seq-range sets the lengths range cards cover, and range cards "
                              "come from --seq-lengths: give both")


@dataclass(frozen=True)
class Profiled:
    """A profile stored as a new session: the session's facts, the sample inputs kept (how many,
    how large), the profile's warnings; and, to report it, the profile itself with the model's
    name and settings as stored."""

    facts: SessionFacts
    samples: int
    sample_bytes: int
    warnings: tuple[str, ...]
    model: str
    settings: dict = field(compare=False)
    profile: Profile = field(compare=False, repr=False)

    @property
    def session(self) -> int:
        return self.facts.session

    def figures(self) -> dict:
        """What the profile adds to its session's facts in a ``--json`` answer."""
        return {"samples": self.samples, "sample_bytes": self.sample_bytes,
                "warnings": list(self.warnings)}

    def to_dict(self) -> dict:
        return {**self.facts.to_dict(), **self.figures()}


def profile(db: Path, request: ProfileRequest,
            progress: ProfileProgress | None = None) -> Profiled:
    """Profile ``request.model`` into a new session of the database at ``db`` (created only
    once there is a profile to store)."""
    session, result, name, settings = asyncio.run(_profile_into_store(db, request, progress))
    return Profiled(session_facts(db, session), result.samples_saved, result.sample_bytes,
                    tuple(result.warnings), name, settings, result)


async def _profile_into_store(db: Path, request: ProfileRequest,
                              progress: ProfileProgress | None
                              ) -> tuple[int, Profile, str, dict]:
    """Profile into a staging folder, then store cards and samples together, or nothing: a new
    database is created only once there is a profile to store."""
    from kforge.capture import ModelOptions, load_model, profile
    from kforge.capture.ranges import profile_lengths, with_ranges
    from kforge.capture.staging import new_staging_dir, remove_abandoned

    samples = samples_root(db)  # where the store keeps them (no link)
    store = await Store.open(db, create=False, options=store_options()) if db.exists() else None
    staging = None
    try:
        options = ModelOptions(dtype=request.dtype, device=request.device, batch=request.batch,
                               seq_len=request.seq_len, mode=request.mode, layers=request.layers)
        for root in (samples, samples.parent):  # the parent: an older kforge's staging folders
            remove_abandoned(root)
        staging = new_staging_dir(samples)
        others = (profile_lengths(request.model, options, list(request.seq_lengths), progress)
                  if request.seq_lengths else [])
        loaded = load_model(request.model, options, progress)
        settings = {**loaded.settings, "samples": request.samples, "regions": request.regions}
        result = profile(loaded, samples_per_card=request.samples, staging_dir=staging,
                         progress=progress, regions=request.regions)
        if others:
            result = with_ranges(result, loaded, others, staging, request.seq_range)
            settings["seq_lengths"] = sorted(other.length for other in others)
        store = store or await Store.open(db, create=True, options=store_options())
        session = await store.create_profiled_session(
            model=loaded.name, settings=settings, gpu=_gpu_info(loaded.device.type).to_dict(),
            cards=result.cards, staging_dir=staging, modules=result.modules)
    except BaseException:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
            for folder in (samples, samples.parent):  # left only where they hold nothing else
                with contextlib.suppress(OSError):
                    folder.rmdir()
        raise
    finally:
        if store is not None:
            await store.close()
    return session, result, loaded.name, settings


def _gpu_info(device_type: str) -> GpuInfo:
    if device_type != "cuda":
        return NO_GPU
    from kforge.runtime.gpuinfo import detect_gpu

    return detect_gpu()
