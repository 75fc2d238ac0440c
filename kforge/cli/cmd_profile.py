"""`kforge profile MODEL`: profile a model into op cards and store them as a new session."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
from typing import TYPE_CHECKING, TextIO

from kforge.cli.common import (
    add_db_option,
    add_json_option,
    out,
    resolve_db,
    respond,
    session_facts,
    whole,
    with_store,
)
from kforge.core.gpu import NO_GPU, GpuInfo
from kforge.core.settings import MODEL_RANGES
from kforge.errors import KforgeError
from kforge.store import Store
from kforge.store.beside import own_folder
from kforge.store.config import store_options

if TYPE_CHECKING:
    from kforge.capture import Profile
    from kforge.cli.main import Commands

DEFAULT_SAMPLES = 3
MOST_SAMPLES, MOST_SHOWN = 1_000, 100_000  # sample inputs per card; op variants printed
STAGE_LABELS = {
    "build": "building the model",
    "warmup": "warm-up forward",
    "profile": "timed forwards",
    "regions": "finding fusion regions (one recorded forward)",
    "lengths": "profiling at the other sequence lengths",
    "samples": "saving sample inputs (op calls)",
}


def register(sub: Commands) -> None:
    p = sub.add_parser(
        "profile",
        description="Run a model once per pass at the aten level and store one op card per op "
                    "variant, ranked by its share of the model's time, with sample inputs.")
    p.add_argument("model", nargs="?",
                   help="a built-in model (see --list) or path/to/file.py:factory")
    p.add_argument("--list", action="store_true", help="list the built-in models and exit")
    add_model_options(p)
    p.add_argument("--top", type=whole(1, MOST_SHOWN), default=15,
                   help="op variants to print (default 15)")
    add_json_option(p)
    add_db_option(p)
    p.set_defaults(func=cmd_profile)


def add_model_options(p: argparse.ArgumentParser) -> None:
    """How to build and run the model: shared by `profile` and `search MODEL`."""
    g = p.add_argument_group("model")
    g.add_argument("--dtype", help="bf16, fp16 or fp32 (default: the model's own)")
    g.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when there is a GPU)")
    g.add_argument("--batch", type=whole(*MODEL_RANGES["batch"]),
                   help="batch size (default: the model's)")
    g.add_argument("--seq-len", type=whole(*MODEL_RANGES["seq_len"]), dest="seq_len",
                   help="sequence length; for decode, the tokens already in the KV cache")
    g.add_argument("--mode", choices=("prefill", "decode"),
                   help="for language models: the prompt pass or one generated token")
    g.add_argument("--layers", type=whole(*MODEL_RANGES["layers"]),
                   help="keep only the first N layers, for speed (default: all)")
    g.add_argument("--samples", type=whole(0, MOST_SAMPLES), default=DEFAULT_SAMPLES,
                   help=f"sample inputs kept per op card (default {DEFAULT_SAMPLES})")
    g.add_argument("--no-regions", dest="regions", action="store_false",
                   help="op cards only: no fusion-region cards (chains of ops in one module "
                        "call, searched as one kernel)")
    g.add_argument("--seq-lengths", type=lengths, dest="seq_lengths", metavar="N,N[,...]",
                   help="also profile at these sequence lengths (two or more): op variants whose "
                        "sizes follow the length (a decode step's KV cache) become range cards")
    g.add_argument("--seq-range", type=span, dest="seq_range", metavar="LO:HI",
                   help="the lengths range cards cover (default: 1 to the model's cache size)")


_length = whole(*MODEL_RANGES["seq_len"])


def lengths(text: str) -> list[int]:
    """argparse type: comma-separated sequence lengths."""
    return [_length(part) for part in text.split(",") if part.strip()]


def span(text: str) -> tuple[int, int]:
    """argparse type: ``LO:HI``, sequence lengths with LO <= HI."""
    lo, sep, hi = text.partition(":")
    if not sep or _length(lo) > _length(hi):
        raise argparse.ArgumentTypeError(f"expected LO:HI with 1 <= LO <= HI, not {text!r}")
    return _length(lo), _length(hi)


def cmd_profile(args: argparse.Namespace) -> int:
    from kforge.capture import zoo

    if args.list:
        return respond(args, lambda: list_models(zoo.listing()))
    if not args.model:
        raise KforgeError("name a model to profile: a built-in one (kforge profile --list) or "
                          "path/to/file.py:factory")

    def work() -> tuple[int, dict]:
        session, extras = profile_to_session(args, top=args.top)
        return 0, {**with_store(args, lambda store: session_facts(store, session)), **extras}

    return respond(args, work)


def list_models(models: list[tuple[str, str]]) -> tuple[int, dict]:
    """`kforge profile --list`: the built-in models, one a line; for --json, by name."""
    width = max(len(name) for name, _ in models)
    for name, description in models:
        out.print(f"{name.ljust(width)}  {description}")
    return 0, {"models": dict(models)}


def profile_to_session(args: argparse.Namespace, top: int = 15) -> tuple[int, dict]:
    """Profile ``args.model`` with the model options into a new session; print its op table.
    Returns the session's id and what the profile adds to its ``--json`` facts."""
    session, result, name, settings = asyncio.run(_profile_into_store(args, ProgressLine()))
    from kforge.capture.report import format_table, summary_line

    out.print(summary_line(name, settings, result), markup=False)
    out.print(format_table(result, top=top), markup=False)
    for warning in result.warnings:
        out.print(f"note: {warning}", markup=False)
    out.print(f"stored as session {session} with {result.samples_saved} sample inputs "
              f"({result.sample_bytes / 2**20:.1f} MiB); see `kforge show {session}`")
    return session, {"samples": result.samples_saved, "sample_bytes": result.sample_bytes,
                     "warnings": list(result.warnings)}


async def _profile_into_store(args: argparse.Namespace, progress: ProgressLine
                              ) -> tuple[int, Profile, str, dict]:
    """Profile into a staging folder, then store cards and samples together, or nothing: a new
    database is created only once there is a profile to store."""
    from kforge.capture import ModelOptions, load_model, profile
    from kforge.capture.ranges import profile_lengths, with_ranges
    from kforge.capture.staging import new_staging_dir, remove_abandoned

    db = resolve_db(args)
    samples_root = own_folder(db.parent, "samples")  # where the store keeps them (no link)
    store = await Store.open(db, create=False, options=store_options()) if db.exists() else None
    staging = None
    try:
        options = ModelOptions(dtype=args.dtype, device=args.device, batch=args.batch,
                               seq_len=args.seq_len, mode=args.mode, layers=args.layers)
        remove_abandoned(samples_root)
        staging = new_staging_dir(samples_root)
        others = (profile_lengths(args.model, options, args.seq_lengths, progress)
                  if args.seq_lengths else [])
        loaded = load_model(args.model, options, progress)
        settings = {**loaded.settings, "samples": args.samples, "regions": args.regions}
        result = profile(loaded, samples_per_card=args.samples, staging_dir=staging,
                         progress=progress, regions=args.regions)
        if others:
            result = with_ranges(result, loaded, others, staging, args.seq_range)
            settings["seq_lengths"] = sorted(other.length for other in others)
        store = store or await Store.open(db, create=True, options=store_options())
        session = await store.create_profiled_session(
            model=loaded.name, settings=settings, gpu=_gpu_info(loaded.device.type).to_dict(),
            cards=result.cards, staging_dir=staging, modules=result.modules)
    except BaseException:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
            with contextlib.suppress(OSError):  # left only where it holds nothing else
                samples_root.rmdir()
        raise
    finally:
        progress.finish()
        if store is not None:
            await store.close()
    return session, result, loaded.name, settings


def _gpu_info(device_type: str) -> GpuInfo:
    if device_type != "cuda":
        return NO_GPU
    from kforge.runtime.gpuinfo import detect_gpu

    return detect_gpu()


class ProgressLine:
    """Renders ``progress(stage, done, total)``: one redrawn line on a terminal, else plain lines
    at the start and end of each stage."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.stage = ""
        self.drawn = False

    def __call__(self, stage: str, done: int, total: int) -> None:
        label = STAGE_LABELS.get(stage, stage)
        text = f"{label}: {done}/{total}"
        if self.live:
            self.stream.write("\r\033[K" + text)
            self.drawn = True
        elif stage != self.stage or done >= total:
            self.stream.write(text + "\n")
        self.stream.flush()
        self.stage = stage

    def finish(self) -> None:
        """End the redrawn line so that what follows starts on its own line."""
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False
