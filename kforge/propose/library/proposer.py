"""The kernel library as a Proposer: MCTS actions become moves in each family's variants and
parameter spaces. No network, no cost, and the same request always gets the same answer.

- NEW: the most promising variant not yet tried for the card, at its default point; once every
  variant has been tried, an untried point of any variant (a restart), drawn from the seed.
- REFINE: the parent's variant at the nearest untried point of its space; a step that made the
  parent faster than its own parent is taken once more first.
- REPAIR: back to safe ground: the parent's variant at its safe point (no vectors, small blocks),
  then the family's reference variant.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from kforge.core.candidate import Candidate, Proposal
from kforge.core.gpu import NO_GPU, GpuInfo
from kforge.core.mcts import Action
from kforge.core.opcard import OpCard
from kforge.core.protocols import NodeView, ProposalRequest
from kforge.propose.library.cards import Declined, read_call
from kforge.propose.library.families import BY_OP
from kforge.propose.library.families.base import Family, Variant
from kforge.propose.library.regions.families import analyze_region
from kforge.propose.library.space import Params, point_key


@dataclass(frozen=True)
class Support:
    """Whether the library has kernels for a card: the family, or the reason it declines."""

    family: str | None
    reason: str = ""
    approaches: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.family is not None


@dataclass(frozen=True)
class Plan:
    """A card as one family sees it, with that family's variants for it."""

    family: Family
    problem: Any
    variants: tuple[Variant, ...]

    @property
    def available(self) -> list[Variant]:
        return [v for v in self.variants if v.available]

    def variant(self, approach: str) -> Variant | None:
        return next((v for v in self.available if v.approach == approach), None)

    @property
    def reference(self) -> Variant:
        """The family's reference variant, or where it does not apply, the last (simplest)."""
        return self.variant(self.family.reference) or self.available[-1]


def make_plan(card: OpCard, gpu: GpuInfo = NO_GPU) -> Plan:
    """The family and variants for ``card``; raises Declined with the reason when there are none."""
    if card.ranges is not None:
        raise Declined("the library's kernels are built for one exact variant (its sizes are "
                       "compile-time constants), not a range of shapes: the llm proposer writes "
                       "range kernels")
    if card.region is not None:  # a fusion region: matched by its structure
        family, problem = analyze_region(card)
    else:
        family = BY_OP.get(card.op)
        if family is None:
            raise Declined(f"no kernel family for {card.op}")
        try:
            problem = family.analyze(read_call(card))
        except (TypeError, ValueError, KeyError, IndexError) as exc:  # arguments of the wrong kind
            raise Declined(f"the card's arguments are not what {card.op} takes ({exc})") from None
    variants = tuple(family.variants(problem, gpu))
    if not any(v.available for v in variants):
        reasons = "; ".join(f"{v.approach}: {v.why_not}" for v in variants)
        raise Declined(f"no {family.name} variant fits this card ({reasons})")
    return Plan(family, problem, variants)


def supports(card: OpCard) -> Support:
    """Which family would handle ``card`` and with which variants, or why none would. Pure and
    fast: reads the card and eager's output layout, writes no code."""
    try:
        plan = make_plan(card)
    except Declined as exc:
        return Support(None, str(exc))
    return Support(plan.family.name, approaches=tuple(v.approach for v in plan.available))


def build_candidate(plan: Plan, variant: Variant, params: Params, gpu: GpuInfo, card: OpCard,
                    note: str) -> Candidate:
    kernel = plan.family.render(plan.problem, variant.approach, params, gpu)
    meta = {"family": plan.family.name, "approach": variant.approach, "params": dict(params),
            "op": card.op, "notes": f"{variant.summary}; {note}"}
    if kernel.nvrtc_options:
        meta["nvrtc_options"] = list(kernel.nvrtc_options)
    return Candidate(source=plan.family.source(kernel), meta=meta, plan=kernel.plan)


class LibraryProposer:
    """Proposes kernels from the built-in library. Costs nothing and records no LLM calls."""

    name = "library"

    def __init__(self, gpu: GpuInfo | None = None) -> None:
        self.gpu = gpu

    def declines(self, card: OpCard) -> str | None:
        try:
            make_plan(card, self.gpu or NO_GPU)
        except Declined as exc:
            return f"no library kernel: {exc}"
        return None

    async def propose(self, request: ProposalRequest) -> Proposal:
        return self.propose_now(request)

    async def close(self) -> None:
        pass

    def propose_now(self, request: ProposalRequest) -> Proposal:
        """The proposal for ``request``, computed synchronously (it takes milliseconds)."""
        gpu = request.gpu if request.gpu.arch != NO_GPU.arch else (self.gpu or request.gpu)
        try:
            plan = make_plan(request.card, gpu)
        except Declined as exc:
            return Proposal(error=f"the kernel library has no kernel for this card: {exc}")
        moves = _Moves(plan, request)
        choice = {Action.NEW: moves.new, Action.REFINE: moves.refine,
                  Action.REPAIR: moves.repair}[Action(request.action)]()
        if isinstance(choice, str):
            return Proposal(error=choice)
        variant, params, note = choice
        return Proposal(candidates=[build_candidate(plan, variant, params, gpu, request.card, note)])


Choice = tuple[Variant, Params, str]


class _Moves:
    """The three actions over one plan, excluding every point already in the card's tree."""

    def __init__(self, plan: Plan, request: ProposalRequest) -> None:
        self.plan = plan
        self.request = request
        self.family = plan.family.name
        self.tried = {point_key(m["family"], m["approach"], m["params"]) for m in request.tried
                      if m.get("family") == self.family and "approach" in m and "params" in m}
        self.tried_approaches = {m["approach"] for m in request.tried if m.get("family") == self.family}
        self.rng = random.Random(f"{request.seed}/{request.card.key}/{request.action}")

    def untried(self, variant: Variant, params: Params) -> bool:
        return point_key(self.family, variant.approach, params) not in self.tried

    def new(self) -> Choice | str:
        for variant in self.plan.available:
            if variant.approach not in self.tried_approaches and self.untried(variant, variant.space.default):
                return variant, variant.space.default, "new approach at its default point"
        left = [(v, p) for v in self.plan.available for p in v.space.points() if self.untried(v, p)]
        if not left:
            return f"every {self.family} kernel in the library's space has been tried for this card"
        variant, params = self.rng.choice(left)
        return variant, params, "every approach tried: restart at an untried point"

    def parent_point(self, action: str) -> tuple[Variant, Params] | str:
        parent = self.request.parent
        meta = parent.candidate.meta if parent is not None and parent.candidate is not None else {}
        if meta.get("family") != self.family or "params" not in meta:
            return f"{action} needs a parent kernel from the library's {self.family} family"
        variant = self.plan.variant(meta.get("approach", ""))
        if variant is None:
            return f"the parent's approach {meta.get('approach')!r} does not apply to this card"
        return variant, dict(meta["params"])

    def refine(self) -> Choice | str:
        found = self.parent_point("refine")
        if isinstance(found, str):
            return found
        variant, params = found
        space = variant.space
        if (step := self.continued_step(variant, params)) is not None:
            return variant, step, "repeat the step that made the parent faster"
        near = space.nearest(params, exclude=lambda p: not self.untried(variant, p))
        if not near:
            return f"every {self.family}/{variant.approach} kernel has been tried for this card"
        moved = self.rng.choice(near)
        changes = ", ".join(f"{k} {params.get(k)}->{v}" for k, v in moved.items() if params.get(k) != v)
        return variant, moved, f"neighbour of the parent ({changes})"

    def continued_step(self, variant: Variant, params: Params) -> Params | None:
        """The parent's own step from its parent once more, if that step sped things up."""
        lineage: list[NodeView] = self.request.lineage
        if len(lineage) < 2:
            return None
        grand, parent = lineage[-2], lineage[-1]
        meta = grand.candidate.meta if grand.candidate is not None else {}
        before = meta.get("params")
        space = variant.space
        if (meta.get("family") != self.family or meta.get("approach") != variant.approach
                or grand.speedup is None or parent.speedup is None or parent.speedup <= grand.speedup
                or not isinstance(before, dict) or not space.contains(before)
                or not space.contains(params)):
            return None
        step = space.step(params, space.delta(before, params))
        return step if step is not None and self.untried(variant, step) else None

    def repair(self) -> Choice | str:
        found = self.parent_point("repair")
        reference = self.plan.reference
        options = [(found[0], found[0].space.safe)] if not isinstance(found, str) else []
        options += [(reference, reference.space.safe), (reference, reference.space.default)]
        for variant, params in options:
            if self.untried(variant, params):
                return variant, params, "repair: back to safe parameters"
        near = reference.space.nearest(reference.space.safe,
                                       exclude=lambda p: not self.untried(reference, p))
        if near:
            return reference, self.rng.choice(near), "repair: near the reference's safe point"
        return f"no safe {self.family} kernel is left to try for this card"
