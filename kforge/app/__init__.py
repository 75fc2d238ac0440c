"""The application layer: kforge's use cases (profile a model, start a search, add a kernel,
apply, e2e, export, a session's facts), each a function with typed arguments that returns a
typed result whose ``to_dict()`` is the command's ``--json`` answer. The command line and the TUI
call them; they print and show what these return.

Importing this package imports nothing: a use case's module brings in what it needs (most of
them torch), so a caller takes only the one it calls."""
