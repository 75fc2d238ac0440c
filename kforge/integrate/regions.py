"""Region winners in an eagerly run model: the forward of each module whose whole forward is a
region (an RMSNorm, say) is replaced by a call of the region's operator, so that the guard in
front of that operator runs kforge's kernel for the exact variant it won on.

A call with other arguments (keywords, another shape) still runs the region's operator, whose
own implementation is the module's chain of aten calls: the same result as the module's forward.
Compiled models need no swap: kforge's compile backend finds every region's chain in the graph
itself (Inductor's pattern matcher, ``kforge.integrate.backend``), whole module forward or not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from kforge.core.opcard import OpCard
from kforge.runtime.regions import register


@dataclass
class ForwardSwap:
    """Module forwards replaced by region operators while active (``with``), and why some
    region cards could not be placed."""

    model: torch.nn.Module
    cards: list[OpCard]
    # module path -> region operator, as last installed
    placed: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    _saved: list[tuple[torch.nn.Module, bool, Any]] = field(default_factory=list)

    def __enter__(self) -> ForwardSwap:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def install(self) -> None:
        if self._saved:
            return
        self.placed.clear()
        self.notes.clear()
        modules = dict(self.model.named_modules())
        for card in self.cards:
            forward = (card.region or {}).get("forward")
            if forward is None:
                self.notes.append(f"{card.short_op}: not the whole forward of a module; in "
                                  "eager mode only its ops' own kernels apply")
                continue
            op = register(card.region)
            for path in forward["paths"]:
                module = modules.get(path)
                if module is None:
                    self.notes.append(f"{card.short_op}: the model has no module {path!r}")
                    continue
                if path in self.placed:
                    continue  # another card (another variant) of the same region placed it
                had_own = "forward" in vars(module)
                self._saved.append((module, had_own, vars(module).get("forward")))
                module.forward = _region_forward(module, op, forward["inputs"])
                self.placed[path] = card.op

    def remove(self) -> None:
        for module, had_own, own in reversed(self._saved):
            if had_own:
                module.forward = own
            else:
                del module.forward
        self._saved.clear()


def _region_forward(module: torch.nn.Module, op: Any, sources: Iterable[list]) -> Any:
    sources = [tuple(s) for s in sources]
    arity = max((i + 1 for kind, i in sources if kind == "arg"), default=0)
    original = type(module).forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != arity:
            return original(module, *args, **kwargs)
        return op(*[args[value] if kind == "arg" else getattr(module, value)
                    for kind, value in sources])

    return forward


def region_cards_of(cards: Iterable[OpCard]) -> list[OpCard]:
    """The region cards among ``cards``."""
    return [c for c in cards if c.region is not None]
