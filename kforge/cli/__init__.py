"""The kforge command line: the top layer with ``kforge_tui``; ``--json`` gives programs one
JSON object.

``run`` is the ``kforge`` command's entry point. Importing this package imports nothing, so a
Ctrl-C from the moment Python has started is kforge's to answer, in one line: while the command
line's own modules load too, before ``kforge.cli.main`` handles errors itself."""

from __future__ import annotations

import sys

from kforge.cli.codes import INTERRUPTED


def run() -> int:
    """Run the `kforge` command (``sys.argv``); its exit code."""
    try:
        from kforge.cli.main import main

        return main()
    except KeyboardInterrupt:  # before or after main's own handling
        return interrupted(sys.argv[1:])


def interrupted(argv: list[str]) -> int:
    """Say "interrupted" as every failure is said (stderr, and an error object for --json);
    nothing here imports or can fail on a closed stream."""
    try:
        if "--json" in (argv[:argv.index("--")] if "--" in argv else argv):
            sys.stdout.write('{"error": "interrupted"}\n')
            sys.stdout.flush()
        sys.stderr.write("kforge: interrupted\n")
        sys.stderr.flush()
    except (OSError, ValueError, KeyboardInterrupt):
        pass
    return INTERRUPTED
