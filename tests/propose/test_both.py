"""The library + LLM composite, with two stub proposers, and the proposer registry."""

from __future__ import annotations

import sys
import types

import pytest

from kforge.core.candidate import Candidate, LlmCall, Proposal
from kforge.core.mcts import Action
from kforge.core.opcard import OpCard
from kforge.core.protocols import ProposalRequest, Proposer, SearchContext
from kforge.core.settings import LlmSection, Settings
from kforge.errors import KforgeError
from kforge.propose import resolve_proposer
from kforge.propose.both import (
    LIBRARY,
    LLM,
    BothProposer,
    made_by,
    make_both_proposer,
    route,
)
from kforge.propose.llm import LlmProposer
from tests.fakes.llm_replies import node, ok_outcome, request

LIBRARY_MADE = Candidate("src", {"launches": []},
                         {"family": "softmax", "approach": "online", "params": {"block": 256}})
LLM_MADE = Candidate("src", {"launches": []}, {"proposer": "llm", "model": "m", "approach": "warp per row"})


class StubProposer:
    """Answers every request with its scripted proposal and remembers what it was asked."""

    def __init__(self, name: str, proposal: Proposal | None = None, fail_close: bool = False,
                 declines: str | None = None) -> None:
        self.name = name
        self.reason = declines
        self.proposal = proposal or Proposal(candidates=[Candidate(f"{name} src", {"launches": []}, {})])
        self.asked: list[ProposalRequest] = []
        self.closed = False
        self.fail_close = fail_close

    def declines(self, card) -> str | None:
        return self.reason

    async def propose(self, request: ProposalRequest) -> Proposal:
        self.asked.append(request)
        return self.proposal

    async def close(self) -> None:
        self.closed = True
        if self.fail_close:
            raise RuntimeError(f"{self.name} failed to close")


def parent(candidate: Candidate) -> object:
    return node(5, Action.NEW, ok_outcome(1.2), candidate)


def test_who_made_a_candidate():
    assert made_by(LIBRARY_MADE) == LIBRARY
    assert made_by(LLM_MADE) == LLM
    assert made_by(Candidate("s", "l", {"model": "m"})) == LLM  # untagged, but names a model
    assert made_by(Candidate("s", "l", {"proposer": "library", "model": "x"})) == LIBRARY
    assert made_by(None) is None


def test_routing_rules():
    assert route(request(Action.NEW), new_count=0, draw=0.0) == LIBRARY
    assert route(request(Action.NEW), new_count=1, draw=0.0) == LLM
    refine_library = request(Action.REFINE, parent=parent(LIBRARY_MADE))
    assert route(refine_library, 0, draw=0.74) == LIBRARY
    assert route(refine_library, 0, draw=0.75) == LLM
    assert route(request(Action.REFINE, parent=parent(LLM_MADE)), 0, draw=0.0) == LLM
    assert route(request(Action.REPAIR, parent=parent(LLM_MADE)), 0, draw=0.0) == LLM
    assert route(request(Action.REPAIR, parent=parent(LIBRARY_MADE)), 0, draw=0.99) == LIBRARY


async def test_new_approaches_alternate_per_card_library_first():
    library, llm = StubProposer(LIBRARY), StubProposer(LLM)
    both = BothProposer(library, llm)
    other_card = OpCard(op="aten._softmax.default", args=[
        {"t": "tensor", "shape": [4, 4], "stride": [4, 1], "dtype": "float32", "offset": 0}, -1, False])
    sides = []
    for req in [request(Action.NEW), request(Action.NEW),
                ProposalRequest(card=other_card, action=Action.NEW, gpu=request().gpu),
                request(Action.NEW)]:
        proposal = await both.propose(req)
        sides.append(proposal.candidates[0].meta["proposer"])
    assert sides == [LIBRARY, LLM, LIBRARY, LIBRARY]


async def test_refining_a_library_kernel_mostly_stays_in_the_library():
    library, llm = StubProposer(LIBRARY), StubProposer(LLM)
    both = BothProposer(library, llm)
    for seed in range(400):
        await both.propose(request(Action.REFINE, parent=parent(LIBRARY_MADE), seed=seed))
    assert 0.65 < len(library.asked) / 400 < 0.85
    assert len(library.asked) + len(llm.asked) == 400


async def test_the_same_request_routes_the_same_way():
    both = BothProposer(StubProposer(LIBRARY), StubProposer(LLM))
    req = request(Action.REFINE, parent=parent(LIBRARY_MADE), seed=17)
    first = await both.propose(req)
    again = await both.propose(req)
    assert first.candidates[0].meta["proposer"] == again.candidates[0].meta["proposer"]


async def test_repair_of_an_llm_kernel_goes_to_the_llm():
    library, llm = StubProposer(LIBRARY), StubProposer(LLM)
    await BothProposer(library, llm).propose(request(Action.REPAIR, parent=parent(LLM_MADE)))
    assert (len(library.asked), len(llm.asked)) == (0, 1)


async def test_when_one_side_has_nothing_the_other_is_asked_and_both_costs_kept():
    call = LlmCall(model="m", input_tokens=10, output_tokens=5, usd=0.02, seconds=1.0)
    empty_llm = StubProposer(LLM, Proposal(calls=[call], error="unusable reply: no code block"))
    library = StubProposer(LIBRARY)
    both = BothProposer(library, empty_llm)
    proposal = await both.propose(request(Action.REPAIR, parent=parent(LLM_MADE)))
    assert [c.meta["proposer"] for c in proposal.candidates] == [LIBRARY]
    assert proposal.calls == [call] and proposal.usd == 0.02
    assert (len(empty_llm.asked), len(library.asked)) == (1, 1)


async def test_when_neither_side_has_a_candidate_both_reasons_are_given():
    rate_limited = "LLM call failed: rate limited (429) after 4 tries"
    both = BothProposer(StubProposer(LIBRARY, Proposal(error="no kernel for this op")),
                        StubProposer(LLM, Proposal(error=rate_limited)))
    proposal = await both.propose(request(Action.NEW))
    assert proposal.candidates == []
    assert proposal.error == ("library: no kernel for this op; "
                              "llm: LLM call failed: rate limited (429) after 4 tries")


async def test_close_closes_both_even_when_one_fails():
    library, llm = StubProposer(LIBRARY, fail_close=True), StubProposer(LLM)
    with pytest.raises(RuntimeError):
        await BothProposer(library, llm).close()
    assert library.closed and llm.closed


def test_both_is_a_proposer():
    both = BothProposer(StubProposer(LIBRARY), StubProposer(LLM))
    assert isinstance(both, Proposer) and both.name == "both"


@pytest.fixture
def fake_library(monkeypatch):
    """Stand in for the kernel library's module, whose factory returns a stub."""
    module = types.ModuleType("kforge.propose.library")
    module.make_library_proposer = lambda ctx: StubProposer(LIBRARY)
    monkeypatch.setitem(sys.modules, "kforge.propose.library", module)
    return module


def llm_context() -> SearchContext:
    return SearchContext(session_id=1, samples_dir=None, config=Settings(
        llm=LlmSection(base_url="http://127.0.0.1:9/v1", model="m")))


async def test_registry_builds_each_built_in(fake_library):
    ctx = llm_context()
    llm = resolve_proposer("llm", ctx)
    both = resolve_proposer(" Both ", ctx)
    try:
        assert isinstance(llm, LlmProposer)
        assert isinstance(both, BothProposer)
        assert isinstance(resolve_proposer("library", ctx), StubProposer)
    finally:
        await llm.close()
        await both.close()


def test_registry_names_the_valid_choices():
    with pytest.raises(KforgeError, match="unknown proposer 'gpt': choose one of library, llm, both"):
        resolve_proposer("gpt", llm_context())


def test_both_needs_a_configured_llm(fake_library, monkeypatch):
    for name in ("KFORGE_LLM_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    ctx = SearchContext(session_id=1, samples_dir=None)
    with pytest.raises(KforgeError, match="no LLM endpoint is configured"):
        make_both_proposer(ctx)



def test_both_declines_only_what_neither_side_takes():
    card = parent(LIBRARY_MADE)  # any object stands in for a card here
    either = BothProposer(StubProposer(LIBRARY, declines="no kernel"), StubProposer(LLM))
    assert either.declines(card) is None
    neither = BothProposer(StubProposer(LIBRARY, declines="no kernel"),
                           StubProposer(LLM, declines="no endpoint"))
    assert neither.declines(card) == "no kernel; no endpoint"
