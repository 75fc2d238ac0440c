"""The `kforge` command: parse the command line, run one sub-command, turn every failure into one
line on stderr (and, with --json, one object on stdout).

Only the chosen command's module is imported, inside the error handling: most bring in torch,
which takes seconds, so `kforge --version` and `kforge --help` import none of them, and a Ctrl-C
at any moment ends in one line."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import threading
import traceback
from collections.abc import Sequence

from kforge import __version__
from kforge.cli.codes import INTERRUPTED
from kforge.core.inert import capped, inert
from kforge.errors import KforgeError

# command: (the module in kforge.cli that registers it, its line in `kforge --help`)
COMMANDS = {
    "sessions": ("cmd_sessions", "list the sessions in the database"),
    "show": ("cmd_sessions", "a session's op cards (ranked by time share) and best kernels"),
    "delete": ("cmd_sessions", "delete a session, its search tree and its samples"),
    "profile": ("cmd_profile", "profile a model into op cards (creates a session)"),
    "search": ("cmd_search", "profile a model (or take a session) and search kernels"),
    "resume": ("cmd_search", "continue a session's search where it stopped"),
    "stop": ("cmd_search", "ask a running search to stop (it can be resumed)"),
    "doctor": ("cmd_doctor", "check Python, torch, the GPU, NVRTC and the database"),
    "apply": ("cmd_integrate", "compile a session's winning kernels for this GPU and say what "
                               "they replace"),
    "export": ("cmd_integrate", "write a session's winning kernels as a standalone Python "
                                "package"),
    "e2e": ("cmd_integrate", "time a session's model in every mode a user may pick, with and "
                             "without its kernels"),
    "add-kernel": ("cmd_user_kernel", "evaluate your own kernel for an op card and add it to the "
                                      "card's search tree"),
}
BAD_USAGE = 2  # argparse's code for a command line it cannot read
LONG_WORD = 120  # a longer word of an error message (a huge path) is shown by its ends
LONG_LINE = 2_000  # an error message (which may quote stored text) is cut to this...
LONG_MESSAGE = 1 << 20  # ...after redacting at most this much of it
# The LLM secrets of the config file and the environment, read once per command by ``shown``.
_secrets: tuple[str, ...] | None = None


class UsageError(KforgeError):
    """A command line that does not parse."""


class Parser(argparse.ArgumentParser):
    """An argument parser whose complaints are one line (a KforgeError), not usage text, and
    that takes options only by their whole names: a prefix (``--jso``) is no option, so what
    the error path reads from the command line as typed (``--json``) is what was parsed."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        command = self.prog.removeprefix("kforge").strip()
        raise UsageError(f"{command + ': ' if command else ''}{message} "
                         f"(see `{self.prog} --help`)")


class Commands:
    """What a command module's ``register`` adds its sub-commands to: each name is the parser
    ``main`` already made for it, with its help line from ``COMMANDS``."""

    def __init__(self, parsers: dict[str, argparse.ArgumentParser]) -> None:
        self._parsers = parsers

    def add_parser(self, name: str, *, description: str | None = None) -> argparse.ArgumentParser:
        parser = self._parsers[name]
        parser.description = description
        return parser


def build_parser(command: str | None) -> argparse.ArgumentParser:
    """The parser of every command; only ``command``'s module is imported, to fill in its
    arguments (none for None or a name that is no command)."""
    parser = Parser(
        prog="kforge",
        description="Profile a PyTorch model, search faster CUDA kernels for the operators it "
                    "runs, verify them, and patch the winners in behind a guard.")
    parser.add_argument("--version", action="version", version=f"kforge {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log engine details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parsers = {name: sub.add_parser(name, help=text) for name, (_, text) in COMMANDS.items()}
    if command in COMMANDS:
        importlib.import_module(f"kforge.cli.{COMMANDS[command][0]}").register(Commands(parsers))
    return parser


def chosen_command(argv: Sequence[str]) -> str | None:
    """The sub-command named on the command line: the first word that is not an option (the
    options before it take no values)."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    global _secrets
    argv = sys.argv[1:] if argv is None else argv
    _secrets = None  # this command's own config file and environment
    _tolerant_output()
    wants_json = "--json" in argv[:argv.index("--")] if "--" in argv else "--json" in argv
    verbose = bool({"-v", "--verbose"} & set(argv))
    parsed = False
    try:
        args, unknown = build_parser(chosen_command(argv)).parse_known_args(argv)  # --help exits
        if unknown:  # the command's own help lists what it takes
            raise UsageError(f"{args.command}: unrecognized arguments: {' '.join(unknown)} "
                             f"(see `kforge {args.command} --help`)")
        parsed = True
        handler = logging.StreamHandler()
        handler.setFormatter(_ShownFormatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            handlers=[handler])
        return args.func(args)
    except KeyboardInterrupt:
        # a database thread may still answer an event loop the interrupt closed: let it end quietly
        threading.excepthook = lambda _: None
        return fail("interrupted", INTERRUPTED, wants_json)
    except UsageError as exc:
        return fail(str(exc), BAD_USAGE, wants_json)
    except KforgeError as exc:
        return fail(str(exc), 1, wants_json)
    except BrokenPipeError:  # the reader of our output left (`kforge sessions | head -1`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        return fail(f"{exc.strerror or exc}{where}", 1, wants_json)
    except SystemExit as exc:
        if not parsed:
            raise
        # code kforge runs (a model's file, a plug-in) ended the process: not a success
        return fail(f"stopped by sys.exit({exc.code!r}) in code kforge ran (a model or a "
                    "plug-in)", 1, wants_json)
    except BaseException as exc:  # a bug: still one line, the traceback on request
        if verbose:
            print(shown(traceback.format_exc()), end="", file=sys.stderr, flush=True)
        return fail(f"unexpected {type(exc).__name__}: {exc} (run with --verbose for the "
                    "traceback, and please report it)", 1, wants_json)


def _tolerant_output() -> None:
    """A character the terminal's encoding lacks (an op table's tree lines, a model's name under
    an ASCII or Latin-1 locale) is written as an escape, not an error."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):  # not a text file of its own (a capture)
            pass


def fail(message: str, code: int, wants_json: bool) -> int:
    """Say what went wrong in one line on stderr (and as ``{"error": ...}`` on stdout for
    --json); return the exit code."""
    line = capped(" ".join(word if len(word) <= LONG_WORD else f"{word[:60]}...{word[-40:]}"
                           for word in shown(message[:LONG_MESSAGE]).split()), LONG_LINE)
    line = line or "failed"
    try:
        if wants_json:
            print(json.dumps({"error": line}), flush=True)
        print(f"kforge: {line}", file=sys.stderr, flush=True)
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    return code


def shown(text: str) -> str:
    """``text`` as the command writes it to the terminal, and a detached engine to its log file
    beside the database: without the LLM secrets of the config file and the environment (the
    store's own redaction: a library's log line quoted the endpoint's URL, password and all) and
    ``inert`` (log lines and errors quote stored text)."""
    global _secrets
    from kforge.core.secrets import redact

    if _secrets is None:
        from kforge.store.config import configured_secrets

        _secrets = configured_secrets()
    return inert(redact(text, _secrets))


class _ShownFormatter(logging.Formatter):
    """Log lines, kforge's and its libraries', as ``shown``."""

    def format(self, record: logging.LogRecord) -> str:
        return shown(super().format(record))


if __name__ == "__main__":
    raise SystemExit(main())
