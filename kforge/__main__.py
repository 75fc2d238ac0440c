"""``python -m kforge``: the same as the ``kforge`` command."""

from kforge.cli.main import main

raise SystemExit(main())
