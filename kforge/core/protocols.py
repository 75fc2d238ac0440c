"""The two seams of a search: a Proposer writes candidates, an Evaluator judges them.

The engine knows nothing else about either. Real ones (the GPU evaluator, the kernel library, the LLM
agent) and test doubles plug in the same way, by a factory named in the CLI or config: a built-in
name (see ``kforge.engine.plugins``) or ``module:function``. A factory takes a ``SearchContext``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from kforge.core.candidate import Baseline, Candidate, EvalOutcome, Proposal
from kforge.core.gpu import GpuInfo
from kforge.core.mcts import Action
from kforge.core.opcard import OpCard
from kforge.core.settings import SessionSettings, Settings


@dataclass(frozen=True)
class SearchContext:
    """What a factory may need to build a proposer or evaluator for one session."""

    session_id: int
    samples_dir: Path  # where capture saved this session's sample inputs, per card key
    settings: SessionSettings = field(default_factory=SessionSettings)  # the session's own
    config: Settings = field(default_factory=Settings)  # the user's config file (LLM endpoint...)
    gpu: GpuInfo | None = None


@dataclass(frozen=True)
class NodeView:
    """A search node as a proposer sees it."""

    id: int
    action: Action
    candidate: Candidate | None
    outcome: EvalOutcome | None

    @property
    def speedup(self) -> float | None:
        return self.outcome.speedup if self.outcome and self.outcome.ok else None


@dataclass(frozen=True)
class ProposalRequest:
    """Everything a proposer gets to write the next candidate for ``card``.

    ``parent`` is the node being refined or repaired (None for a new approach); ``lineage`` runs
    from the oldest ancestor kept down to the parent; ``tried`` holds the meta of every candidate
    already in this card's tree, so a proposer does not repeat itself; ``failed`` summarises
    approaches that failed for this card; ``baseline`` is eager's measurement of the card (its
    times and the kernels it launches), once measured.
    """

    card: OpCard
    action: Action
    gpu: GpuInfo
    parent: NodeView | None = None
    lineage: list[NodeView] = field(default_factory=list)
    tried: list[dict] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    best: NodeView | None = None
    seed: int = 0
    baseline: Baseline | None = None


@runtime_checkable
class Proposer(Protocol):
    name: str

    def declines(self, card: OpCard) -> str | None:
        """Why this proposer can never write a kernel for ``card`` (the op is then skipped), or
        None. Cheap and pure: it is asked for every op card when a search starts."""
        ...

    async def propose(self, request: ProposalRequest) -> Proposal:
        """Return candidates for the request. A proposer that cannot help returns a Proposal
        with no candidates and an ``error``; it raises only for a failure of its own setup."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class Evaluator(Protocol):
    gpu: GpuInfo
    capacity: int  # evaluations that may run at once (its workers)

    async def start(self) -> None: ...

    async def baseline(self, card: OpCard) -> Baseline:
        """Time eager PyTorch (and torch.compile) for the card and give its physical floor."""
        ...

    async def evaluate(self, card: OpCard, candidate: Candidate) -> EvalOutcome:
        """Compile, verify and time a candidate. Never raises for a bad candidate: its failure is
        the outcome. Raises only when the evaluator itself cannot go on."""
        ...

    async def confirm(self, card: OpCard, candidate: Candidate,
                      outcome: EvalOutcome) -> EvalOutcome:
        """The outcome that counts for a candidate about to become the card's best: checked
        again (compute-sanitizer for the GPU evaluator) and timed again on new inputs in a fresh
        process, so the best of many noisy timings is not taken at face value."""
        ...

    async def close(self) -> None: ...
