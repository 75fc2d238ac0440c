"""Proposers: where candidate kernels come from.

Three are built in, chosen by name with ``--proposer`` or ``[search] proposer``:

- ``library``: the built-in kernel library (offline, $0);
- ``llm``: a chat model behind any OpenAI-compatible endpoint (see ``docs/llm.md``);
- ``both``: the two together, chosen per request (see ``kforge.propose.both``).

Each is built by a factory taking a ``SearchContext``; the modules are imported only when named.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from kforge.errors import KforgeError

if TYPE_CHECKING:
    from kforge.core.protocols import Proposer, SearchContext

FACTORIES = {
    "library": "kforge.propose.library:make_library_proposer",
    "llm": "kforge.propose.llm:make_llm_proposer",
    "both": "kforge.propose.both:make_both_proposer",
}


def resolve_proposer(name: str, ctx: SearchContext) -> Proposer:
    """Build the built-in proposer called ``name`` for a session."""
    spec = FACTORIES.get(name.strip().lower())
    if spec is None:
        raise KforgeError(f"unknown proposer {name!r}: choose one of {', '.join(FACTORIES)} "
                          "(or give a factory as module:function)")
    module, function = spec.split(":")
    return getattr(importlib.import_module(module), function)(ctx)
