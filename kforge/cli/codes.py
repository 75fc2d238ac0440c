"""The exit codes of the ``kforge`` command that its entry point and its commands share; a module
of its own, importing nothing, so that the package's entry point needs nothing more to answer
a Ctrl-C."""

INTERRUPTED = 130  # the shell's code for a command ended by SIGINT
