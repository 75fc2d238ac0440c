"""The kforge command line: the top layer with ``kforge_tui``; ``--json`` gives programs one
JSON object."""
