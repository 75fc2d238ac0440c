"""``python -m kforge_tui``: the same as the ``kforge-tui`` command."""

from kforge_tui.app import main

raise SystemExit(main())
