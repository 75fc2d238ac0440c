"""The LLM proposer end to end: the real openai SDK over HTTP to a scripted server on loopback."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import socket

import pytest

from kforge.core.candidate import EvalOutcome, EvalStatus, Proposal
from kforge.core.launch_plan import parse_plan
from kforge.core.mcts import Action
from kforge.core.opcard import OpCard
from kforge.core.protocols import Proposer, SearchContext
from kforge.core.settings import LlmSection, SessionSettings, Settings
from kforge.errors import KforgeError
from kforge.propose.llm import LlmProposer, LlmSettings, Price, make_llm_proposer
from kforge.propose.llm.prompt import EXAMPLE_PLAN
from tests.fakes.llm_replies import (
    BROKEN_CODE_REPLY,
    BROKEN_SOURCE,
    FLOAT32_ONLY_REPLY,
    GOOD_REPLY,
    INJECTION_REPLY,
    MISSPELT_PLAN_REPLY,
    NO_CODE_REPLY,
    SECRET_KEY,
    node,
    ok_outcome,
    request,
)
from tests.fakes.openai_server import (
    FakeOpenAIServer,
    Scripted,
    chat_reply,
    error_reply,
    stall,
)

MODEL = "kernel-writer-1"
PRICE = Price(input_per_mtok=3.0, output_per_mtok=15.0)


@pytest.fixture
def server():
    with FakeOpenAIServer() as srv:
        yield srv


class Sleeps:
    """Stands in for asyncio.sleep: records each wait and returns at once."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
async def make(server, sleeps):
    made: list[LlmProposer] = []

    def build(**changes) -> LlmProposer:
        settings = LlmSettings(model=MODEL, base_url=server.base_url, api_key=SECRET_KEY,
                               timeout_s=5.0, max_retries=3, prices={MODEL: PRICE})
        proposer = LlmProposer(dataclasses.replace(settings, **changes), sleep=sleeps,
                               rng=random.Random(0))
        made.append(proposer)
        return proposer

    yield build
    for proposer in made:
        await proposer.close()


def assert_no_secret(proposal: Proposal, caplog: pytest.LogCaptureFixture | None = None) -> None:
    texts = [proposal.error,
             *(repr(c.meta) + c.source + json.dumps(c.plan) for c in proposal.candidates)]
    texts += [f"{c.prompt}{c.reply}{c.error}" for c in proposal.calls]
    if caplog is not None:
        texts += [r.getMessage() for r in caplog.records]
    assert not [t for t in texts if SECRET_KEY in t]


async def test_a_good_reply_becomes_a_candidate_with_its_cost(server, make):
    server.add(chat_reply(GOOD_REPLY, prompt_tokens=2000, completion_tokens=1000))
    proposal = await make().propose(request(Action.NEW))
    assert proposal.error == ""
    (candidate,) = proposal.candidates
    assert "softmax_rows_bf16" in candidate.source
    assert candidate.plan == parse_plan(EXAMPLE_PLAN).to_dict()
    assert candidate.meta["kernels"] == ["softmax_rows_bf16"]
    assert candidate.meta["proposer"] == "llm" and candidate.meta["model"] == MODEL
    assert candidate.meta["approach"] == "one block per row, two-pass reductions"
    (call,) = proposal.calls
    assert (call.model, call.input_tokens, call.output_tokens) == (MODEL, 2000, 1000)
    assert call.usd == pytest.approx(2000 * 3.0 / 1e6 + 1000 * 15.0 / 1e6)
    assert proposal.usd == call.usd
    assert call.reply == GOOD_REPLY and call.error == ""
    assert "aten._softmax.default" in call.prompt and "[system]" in call.prompt


async def test_the_request_reaches_the_server_as_an_openai_chat_call(server, make):
    server.add(chat_reply(GOOD_REPLY))
    await make(temperature=0.3, max_tokens=1234).propose(request(Action.NEW))
    (sent,) = server.requests
    assert sent.headers["authorization"] == f"Bearer {SECRET_KEY}"  # the key goes to the server only
    assert sent.body["model"] == MODEL
    assert sent.body["max_tokens"] == 1234 and sent.body["temperature"] == 0.3
    assert [m["role"] for m in sent.messages] == ["system", "user"]
    assert "NVIDIA H200, architecture sm_90: 132 SMs" in sent.text
    assert "eager PyTorch: 115 us per call; torch.compile: 148 us; physical floor: 62 us" in sent.text


async def test_broken_code_is_still_proposed(server, make):
    server.add(chat_reply(BROKEN_CODE_REPLY))
    proposal = await make().propose(request(Action.NEW))
    assert [c.source for c in proposal.candidates] == [BROKEN_SOURCE]


async def test_a_reply_without_code_is_a_recorded_failure(server, make):
    server.add(chat_reply(NO_CODE_REPLY, prompt_tokens=900, completion_tokens=40))
    proposal = await make().propose(request(Action.NEW))
    assert proposal.candidates == []
    assert proposal.error == "unusable reply: the reply has no code block"
    (call,) = proposal.calls
    assert (call.input_tokens, call.output_tokens, call.error) == (900, 40, proposal.error)
    assert call.usd > 0 and call.reply == NO_CODE_REPLY


async def test_an_empty_or_malformed_answer_is_a_recorded_failure(server, make):
    server.add(chat_reply(""), Scripted(body={"choices": "not a list"}))
    proposer = make()
    empty = await proposer.propose(request())
    malformed = await proposer.propose(request())
    assert empty.error == "unusable reply: the reply is empty" and len(empty.calls) == 1
    assert malformed.error == "LLM call failed: the server's answer is not a chat completion"
    assert malformed.calls[0].error == "the server's answer is not a chat completion"


async def test_a_reply_cut_at_the_token_limit_says_so(server, make):
    server.add(chat_reply("```cuda\nextern \"C\" __global__ void k(", finish_reason="length"))
    proposal = await make(max_tokens=64).propose(request(Action.NEW))
    assert proposal.candidates == []
    assert "max_tokens=64" in proposal.error


async def test_refine_prompt_carries_the_parent_code_and_lineage(server, make):
    server.add(chat_reply(GOOD_REPLY))
    first, parent = node(3, Action.NEW, ok_outcome(1.1)), node(8, Action.REFINE, ok_outcome(1.3))
    proposal = await make().propose(request(Action.REFINE, parent=parent, lineage=[first, parent]))
    sent = server.requests[0].text
    assert "# The parent kernel (node 8, refine)" in sent
    parent_section = sent.split("# The parent kernel")[1]
    assert '"kernel": "softmax_rows_bf16", "grid": ["rows"]' in parent_section
    assert "def launch" not in sent
    assert "- node 3 (new)" in sent and "(improvement)" in sent
    assert proposal.candidates[0].meta["parent"] == 8


async def test_repair_prompt_carries_the_compile_log(server, make):
    server.add(chat_reply(GOOD_REPLY))
    log = 'candidate.cu(2): error: expected a ";"'
    outcome = EvalOutcome(EvalStatus.COMPILE_ERROR, summary="1 error", compile_log=log)
    parent = node(4, Action.NEW, outcome)
    proposal = await make().propose(request(Action.REPAIR, parent=parent))
    assert log in server.requests[0].text
    assert proposal.candidates[0].meta["action"] == "repair"


async def test_a_malformed_plan_is_not_proposed_and_the_error_names_the_field(server, make):
    server.add(chat_reply(MISSPELT_PLAN_REPLY))
    proposal = await make().propose(request(Action.NEW))
    assert proposal.candidates == []
    assert proposal.error.startswith(
        "unusable reply: launch plan: launches[0].blok: unknown field 'blok'")
    assert proposal.calls[0].error == proposal.error


async def test_an_expression_injection_is_refused_as_a_plan_error(server, make):
    server.add(chat_reply(INJECTION_REPLY))
    proposal = await make().propose(request(Action.NEW))
    assert proposal.candidates == []
    assert proposal.error.startswith("unusable reply: launch plan: launches[0].grid[0]: ")
    assert "may be called" in proposal.error


async def test_a_plan_using_an_unknown_name_is_refused_when_resolved(server, make):
    lets = {"cols": "x.shape[-1]", "rows": "x.numel // cols"}
    server.add(chat_reply(GOOD_REPLY.replace(json.dumps(EXAMPLE_PLAN["let"]), json.dumps(lets))))
    proposal = await make().propose(request(Action.NEW))
    assert proposal.candidates == []
    assert proposal.error.startswith("unusable reply: launch plan: let.cols: ")
    assert "unknown name 'x'" in proposal.error


async def test_a_plan_that_does_not_cover_the_variant_is_not_proposed(server, make):
    server.add(chat_reply(FLOAT32_ONLY_REPLY))
    proposal = await make().propose(request(Action.NEW))
    assert proposal.candidates == []
    assert proposal.error == ("the launch plan does not cover this op variant: requires[0]: "
                              "\"self.dtype == 'float32'\" is false for this variant")
    assert proposal.calls[0].error == proposal.error and proposal.calls[0].usd > 0


async def test_a_card_no_plan_can_be_given_is_declined_without_a_call(server, make):
    x = {"t": "tensor", "shape": [4, 4], "stride": [4, 1], "dtype": "float32", "offset": 0}
    card = OpCard(op="aten._softmax.default", args=[x])  # dim and half_to_float are missing
    proposer = make()
    reason = proposer.declines(card)
    assert reason is not None and "needs argument 'dim'" in reason
    proposal = await proposer.propose(dataclasses.replace(request(), card=card))
    assert proposal.error == reason and proposal.calls == [] and server.requests == []
    assert proposer.declines(request().card) is None


async def test_rate_limit_honours_retry_after_then_succeeds(server, make, sleeps):
    server.add(error_reply(429, headers={"Retry-After": "7"}), chat_reply(GOOD_REPLY))
    proposal = await make().propose(request())
    assert len(proposal.candidates) == 1
    assert sleeps.waits == [7.0]
    assert [c.error for c in proposal.calls] == ["rate limited (429)", ""]
    assert proposal.calls[0].usd == 0.0 and len(server.requests) == 2


async def test_rate_limit_without_retry_after_backs_off_then_gives_up(server, make, sleeps):
    server.add(*[error_reply(429)] * 4)
    proposal = await make(max_retries=3).propose(request())
    assert proposal.candidates == []
    assert proposal.error == "LLM call failed: rate limited (429) after 4 tries"
    assert len(proposal.calls) == 4 and len(server.requests) == 4
    windows = [(0.5, 1.0), (1.0, 2.0), (2.0, 4.0)]
    assert len(sleeps.waits) == 3
    assert all(lo <= wait <= hi for wait, (lo, hi) in zip(sleeps.waits, windows, strict=True))


async def test_a_server_error_is_retried(server, make, sleeps):
    server.add(error_reply(500, "overloaded"), chat_reply(GOOD_REPLY))
    proposal = await make().propose(request())
    assert len(proposal.candidates) == 1
    assert [c.error for c in proposal.calls] == ["server error (500)", ""]
    assert len(sleeps.waits) == 1


async def test_a_timeout_is_retried_then_reported(server, make, sleeps):
    server.add(stall(3.0), stall(3.0))
    proposal = await make(timeout_s=0.2, max_retries=1).propose(request())
    assert proposal.error == "LLM call failed: timed out (0.2 s) after 2 tries"
    assert [c.error for c in proposal.calls] == ["timed out (0.2 s)"] * 2
    assert all(c.seconds < 2.0 for c in proposal.calls)


async def test_a_timeout_then_a_reply(server, make):
    server.add(stall(3.0), chat_reply(GOOD_REPLY))
    proposal = await make(timeout_s=0.2).propose(request())
    assert len(proposal.candidates) == 1 and len(proposal.calls) == 2


async def test_a_refused_connection_is_reported(make):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proposal = await make(base_url=f"http://127.0.0.1:{port}/v1", max_retries=1).propose(request())
    assert proposal.error.startswith("LLM call failed: connection failed (")
    assert proposal.error.endswith("after 2 tries")


async def test_a_wrong_key_is_not_retried_and_not_quoted(server, make, sleeps, caplog):
    server.add(error_reply(401, f"Incorrect API key provided: {SECRET_KEY}"))
    proposal = await make().propose(request())
    assert proposal.error == ("LLM call failed: authentication failed (401): check [llm] api_key "
                              "or KFORGE_LLM_API_KEY")
    assert sleeps.waits == [] and len(server.requests) == 1
    assert_no_secret(proposal, caplog)


async def test_a_bad_request_keeps_the_servers_reason(server, make):
    server.add(error_reply(404, f"The model '{MODEL}' does not exist"))
    proposal = await make().propose(request())
    assert proposal.error == ("LLM call failed: request refused (404): "
                              f"The model '{MODEL}' does not exist")


async def test_the_key_never_reaches_what_is_recorded(server, make, caplog):
    caplog.set_level(logging.DEBUG)
    echo = f"Approach: echo {SECRET_KEY}\n" + GOOD_REPLY + f"\nYour key was {SECRET_KEY}."
    server.add(error_reply(500, f"upstream said {SECRET_KEY}"), chat_reply(echo))
    proposal = await make().propose(request())
    assert len(proposal.candidates) == 1
    assert_no_secret(proposal, caplog)


async def test_an_unpriced_model_costs_nothing_with_a_note(server, make, caplog):
    server.add(chat_reply(GOOD_REPLY), chat_reply(GOOD_REPLY))
    proposer = make(prices={})
    with caplog.at_level(logging.WARNING):
        first = await proposer.propose(request())
        await proposer.propose(request())
    assert first.usd == 0.0 and first.calls[0].input_tokens == 1200
    assert "no price for model" in first.candidates[0].meta["cost_note"]
    assert sum("no price for model" in r.getMessage() for r in caplog.records) == 1


async def test_a_default_price_covers_unlisted_models(server, make):
    server.add(chat_reply(GOOD_REPLY, prompt_tokens=1_000_000, completion_tokens=0))
    proposal = await make(prices={"default": Price(1.0, 2.0)}).propose(request())
    assert proposal.usd == pytest.approx(1.0)


async def test_a_server_that_reports_no_usage_counts_zero_tokens(server, make):
    server.add(chat_reply(GOOD_REPLY, usage=False))
    proposal = await make().propose(request())
    assert len(proposal.candidates) == 1
    assert (proposal.calls[0].input_tokens, proposal.calls[0].output_tokens) == (0, 0)


async def test_concurrent_requests_share_one_client(server, make):
    server.add(*[chat_reply(GOOD_REPLY)] * 3)
    proposer = make()
    proposals = await asyncio.gather(*(proposer.propose(request(seed=i)) for i in range(3)))
    assert [len(p.candidates) for p in proposals] == [1, 1, 1]


async def test_factory_reads_config_and_environment(server, monkeypatch):
    for name in ("KFORGE_LLM_BASE_URL", "KFORGE_LLM_MODEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KFORGE_LLM_API_KEY", SECRET_KEY)
    server.add(chat_reply(GOOD_REPLY))
    ctx = SearchContext(session_id=1, samples_dir=None,
                        settings=SessionSettings(llm_model="override"),
                        config=Settings(llm=LlmSection(base_url=server.base_url, model=MODEL)))
    proposer = make_llm_proposer(ctx)
    try:
        assert isinstance(proposer, Proposer) and proposer.name == "llm"
        assert proposer.settings.model == "override"
        proposal = await proposer.propose(request())
    finally:
        await proposer.close()
    assert len(proposal.candidates) == 1
    assert server.requests[0].body["model"] == "override"
    assert server.requests[0].headers["authorization"] == f"Bearer {SECRET_KEY}"


def test_factory_without_an_endpoint_says_how_to_configure_one(monkeypatch):
    for name in ("KFORGE_LLM_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    ctx = SearchContext(session_id=1, samples_dir=None, config=Settings(llm=LlmSection(model=MODEL)))
    with pytest.raises(KforgeError, match="no LLM endpoint is configured"):
        make_llm_proposer(ctx)
