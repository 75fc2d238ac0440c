"""The composite proposer behind ``--proposer both``: the kernel library and the LLM agent, chosen
per request so that free library moves do most of the tuning and the LLM brings new ideas.

Who is asked first (``route``):

- NEW: the two alternate for each op card, the library first (it is free and instant);
- REFINE of a library-made kernel: a library parameter move most of the time (``library_share``,
  75% by default), else an LLM rewrite of it;
- REFINE or REPAIR of an LLM-written kernel: the LLM;
- REPAIR of a library-made kernel: the library (it knows its variants), then the LLM.

When the side asked first returns no candidate, the other is asked. The calls of both are kept, so
the cost of an LLM call that yielded nothing is still counted. Candidates are tagged with
``meta["proposer"]`` so later requests know who wrote their parent.
"""

from __future__ import annotations

import random
from dataclasses import replace

from kforge.core.candidate import Candidate, Proposal
from kforge.core.mcts import Action
from kforge.core.opcard import OpCard
from kforge.core.protocols import ProposalRequest, Proposer, SearchContext

LIBRARY = "library"
LLM = "llm"
DEFAULT_LIBRARY_SHARE = 0.75


def made_by(candidate: Candidate | None) -> str | None:
    """Which side wrote a candidate: its tag, else ``llm`` when it names a model, else ``library``."""
    if candidate is None:
        return None
    tag = candidate.meta.get("proposer")
    if tag in (LIBRARY, LLM):
        return tag
    return LLM if "model" in candidate.meta else LIBRARY


def route(request: ProposalRequest, new_count: int, draw: float,
          library_share: float = DEFAULT_LIBRARY_SHARE) -> str:
    """The side to ask first. ``new_count`` is how many NEW requests this card has had before this
    one; ``draw`` is a number in [0, 1) for the refine coin."""
    parent_by = made_by(request.parent.candidate) if request.parent is not None else None
    if request.action is Action.NEW or parent_by is None:
        return LIBRARY if new_count % 2 == 0 else LLM
    if parent_by == LLM:
        return LLM
    if request.action is Action.REFINE:
        return LIBRARY if draw < library_share else LLM
    return LIBRARY


class BothProposer:
    """Asks the library or the LLM per request, falling back to the other."""

    name = "both"

    def __init__(self, library: Proposer, llm: Proposer,
                 library_share: float = DEFAULT_LIBRARY_SHARE) -> None:
        self._sides = {LIBRARY: library, LLM: llm}
        self.library_share = library_share
        self._new_counts: dict[str, int] = {}

    async def propose(self, request: ProposalRequest) -> Proposal:
        new_count = self._new_counts.get(request.card.key, 0)
        if request.action is Action.NEW:
            self._new_counts[request.card.key] = new_count + 1
        draw = random.Random(f"{request.card.key}/{request.seed}").random()
        first = route(request, new_count, draw, self.library_share)
        calls, errors = [], []
        for side in (first, LLM if first == LIBRARY else LIBRARY):
            proposal = await self._sides[side].propose(request)
            calls += proposal.calls
            if proposal.candidates:
                return Proposal(candidates=[_tagged(c, side) for c in proposal.candidates], calls=calls)
            errors.append(f"{side}: {proposal.error or 'no candidate'}")
        return Proposal(calls=calls, error="; ".join(errors))

    def declines(self, card: OpCard) -> str | None:
        reasons = [side.declines(card) for side in self._sides.values()]
        return None if None in reasons else "; ".join(r for r in reasons if r)

    async def close(self) -> None:
        try:
            await self._sides[LIBRARY].close()
        finally:
            await self._sides[LLM].close()


def _tagged(candidate: Candidate, side: str) -> Candidate:
    if candidate.meta.get("proposer") == side:
        return candidate
    return replace(candidate, meta={**candidate.meta, "proposer": side})


def make_both_proposer(ctx: SearchContext) -> BothProposer:
    """The factory behind ``--proposer both``. The LLM side is built first, so a missing endpoint
    is reported before anything else is set up."""
    from kforge.propose.library import make_library_proposer
    from kforge.propose.llm import make_llm_proposer

    llm = make_llm_proposer(ctx)
    return BothProposer(make_library_proposer(ctx), llm)
