"""The one error type a user sees: a problem kforge explains in a single line."""


class KforgeError(Exception):
    """A user-facing failure (bad input, missing GPU, locked database...).

    The message is one plain sentence saying what is wrong and, where possible, what to do.
    The CLI prints it on stderr and exits non-zero; the TUI shows it in its error bar.
    """
