"""The `kforge` command: parse the command line, run one sub-command, turn errors into one line."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from kforge import __version__
from kforge.core.inert import inert
from kforge.errors import KforgeError

# Each module registers its sub-commands; the optional ones arrive with their features.
COMMAND_MODULES = ("cmd_sessions", "cmd_profile", "cmd_search", "cmd_doctor", "cmd_integrate",
                   "cmd_user_kernel")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kforge",
        description="Profile a PyTorch model, search faster CUDA kernels for the operators it "
                    "runs, verify them, and patch the winners in behind a guard.")
    parser.add_argument("--version", action="version", version=f"kforge {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log engine details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"kforge.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"kforge.cli.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = logging.StreamHandler()
    handler.setFormatter(_InertFormatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        handlers=[handler])
    try:
        return args.func(args)
    except KforgeError as exc:
        print(f"kforge: {inert(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kforge: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())


class _InertFormatter(logging.Formatter):
    """Log lines quote stored text too: they reach the terminal ``inert``."""

    def format(self, record: logging.LogRecord) -> str:
        return inert(super().format(record))
