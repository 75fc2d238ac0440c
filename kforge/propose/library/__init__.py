"""The built-in kernel library: parameterized CUDA kernels for the ops models spend native-kernel
time on, proposed offline at no cost (see ``docs/kernel-library.md``)."""

from __future__ import annotations

from kforge.core.protocols import SearchContext
from kforge.propose.library.proposer import LibraryProposer, Support, supports

__all__ = ["LibraryProposer", "Support", "make_library_proposer", "supports"]


def make_library_proposer(ctx: SearchContext) -> LibraryProposer:
    """The factory behind ``--proposer library``."""
    return LibraryProposer(gpu=ctx.gpu)
