"""``python -m kforge``: the same as the ``kforge`` command."""

import sys

try:
    from kforge.cli import run
except KeyboardInterrupt:  # between importing kforge.cli and taking ``run`` from it
    from kforge.cli import interrupted

    raise SystemExit(interrupted(sys.argv[1:])) from None

raise SystemExit(run())
