"""`kforge profile MODEL`: its command line, its progress line, and the op table it prints of the
new session (``kforge.app.profile`` profiles and stores)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, TextIO

from kforge.app.profile import (
    DEFAULT_SAMPLES,
    ModelList,
    Profiled,
    ProfileRequest,
    list_models,
    profile,
)
from kforge.cli.common import add_db_option, add_json_option, out, resolve_db, respond, whole
from kforge.core.settings import MODEL_RANGES
from kforge.errors import KforgeError

if TYPE_CHECKING:
    from kforge.cli.main import Commands

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
    if args.list:
        return respond(args, lambda: print_models(list_models()))
    if not args.model:
        raise KforgeError("name a model to profile: a built-in one (kforge profile --list) or "
                          "path/to/file.py:factory")
    return respond(args, lambda: (0, profile_to_session(args, top=args.top).to_dict()))


def print_models(models: ModelList) -> tuple[int, dict]:
    """`kforge profile --list`: the built-in models, one a line; for --json, by name."""
    width = max(len(name) for name, _ in models.models)
    for name, description in models.models:
        out.print(f"{name.ljust(width)}  {description}")
    return 0, models.to_dict()


def profile_request(args: argparse.Namespace) -> ProfileRequest:
    """The model and model options of the command line."""
    return ProfileRequest(model=args.model, dtype=args.dtype, device=args.device,
                          batch=args.batch, seq_len=args.seq_len, mode=args.mode,
                          layers=args.layers, samples=args.samples, regions=args.regions,
                          seq_lengths=tuple(args.seq_lengths or ()), seq_range=args.seq_range)


def profile_to_session(args: argparse.Namespace, top: int = 15) -> Profiled:
    """Profile ``args.model`` with the model options into a new session, showing progress on
    stderr; print its op table."""
    from kforge.capture.report import format_table, summary_line

    progress = ProgressLine()
    try:
        profiled = profile(resolve_db(args), profile_request(args), progress)
    finally:
        progress.finish()
    result, session = profiled.profile, profiled.session
    out.print(summary_line(profiled.model, profiled.settings, result), markup=False)
    out.print(format_table(result, top=top), markup=False)
    for warning in result.warnings:
        out.print(f"note: {warning}", markup=False)
    out.print(f"stored as session {session} with {result.samples_saved} sample inputs "
              f"({result.sample_bytes / 2**20:.1f} MiB); see `kforge show {session}`")
    return profiled


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
