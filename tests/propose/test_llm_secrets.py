"""The configured LLM key never reaches the database or a request: a reply that includes the
config file is refused before NVRTC reads it, and text that carries the key anyway (a compile log,
a sanitizer report, crash output, a log line) is redacted where it is stored and where it is sent
back to the endpoint (a fake one on loopback)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus
from kforge.core.mcts import Action
from kforge.core.outcome import Confirmation, FailureEvidence, SanitizerReport
from kforge.propose.llm import LlmProposer, LlmSettings
from kforge.runtime.nvrtc import Compiler
from kforge.store import Store
from kforge.store.config import store_options
from tests.doubles import sample_cards
from tests.fakes.llm_replies import EXAMPLE_PLAN, EXAMPLE_SOURCE, node, reply, request
from tests.fakes.openai_server import FakeOpenAIServer, chat_reply, error_reply

KEY = "sk-configured-0123456789abcdefKEY"


@pytest.fixture
def config(tmp_path: Path, monkeypatch) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(f'[llm]\nmodel = "m"\napi_key = "{KEY}"\n')
    monkeypatch.setenv("KFORGE_CONFIG", str(path))
    for name in ("KFORGE_LLM_API_KEY", "OPENAI_API_KEY", "KFORGE_LLM_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    return path


async def test_the_configured_key_reaches_neither_the_database_nor_a_request(config, tmp_path):
    pytest.importorskip("cuda.core", reason="NVRTC through cuda.core is not installed")
    leaking = f"#include \"{config}\"\n{EXAMPLE_SOURCE}"
    with FakeOpenAIServer() as server:
        server.add(chat_reply(reply(leaking, EXAMPLE_PLAN)), chat_reply(reply(leaking,
                                                                             EXAMPLE_PLAN)))
        proposer = LlmProposer(LlmSettings(model="m", base_url=server.base_url, api_key=KEY,
                                           max_retries=0), rng=random.Random(0))
        try:
            proposal = await proposer.propose(request())
            (candidate,) = proposal.candidates
            compiled = Compiler().compile(candidate.source, "sm_90")
            assert not compiled.ok and str(config) in compiled.log and KEY not in compiled.log
            # Text that holds the key anyway, however it got there, as the evaluator reports it.
            outcome = EvalOutcome(EvalStatus.COMPILE_ERROR, summary=f"1 error {KEY}",
                                  compile_log=f"{compiled.log}\napi_key = \"{KEY}\"",
                                  confirmation=Confirmation(sanitizer=SanitizerReport(
                                      False, "memcheck", f"report {KEY}")),
                                  failure=FailureEvidence(stderr=f"crashed: {KEY}\n"))
            store = await Store.open(tmp_path / "k.db", options=store_options())
            try:
                sid = await store.create_profiled_session("toy", {}, {"name": "g"},
                                                          sample_cards())
                card = (await store.list_cards(sid))[0]
                node_id = await store.add_node(sid, card.id, None, "new")
                await store.set_candidate(node_id, candidate, proposal.calls)
                await store.finish_node(node_id, outcome, None)
                await store.log(sid, f"worker said {KEY}", "warning")
                stored = (await store.get_node(node_id)).outcome
            finally:
                await store.close()
            assert "[redacted]" in stored.compile_log
            parent = node(node_id, Action.NEW, outcome, Candidate(candidate.source,
                                                                  plan=EXAMPLE_PLAN))
            await proposer.propose(request(Action.REPAIR, parent=parent))
        finally:
            await proposer.close()
        sent = [r.text for r in server.requests]
    assert len(sent) == 2 and "api_key" in sent[1] and "report [redacted]" in sent[1]
    assert not [text for text in sent if KEY in text]
    database = b"".join(p.read_bytes() for p in tmp_path.glob("k.db*"))
    assert KEY.encode() not in database


async def test_every_secret_the_store_redacts_is_redacted_from_requests(config, monkeypatch):
    """The key a search uses and every other LLM secret in the config file or environment (an
    OpenAI key beside a local server's): what the store keeps out, a request keeps out too."""
    from kforge.propose.llm.settings import load_llm_settings
    from kforge.store.config import configured_secrets, load_config

    other = "sk-other-environment-key-9876543210"
    monkeypatch.setenv("OPENAI_API_KEY", other)
    with FakeOpenAIServer() as server:
        server.add(chat_reply(reply(EXAMPLE_SOURCE, EXAMPLE_PLAN)))
        monkeypatch.setenv("KFORGE_LLM_BASE_URL", server.base_url)
        settings = load_llm_settings(load_config().llm, __import__("os").environ)
        assert set(configured_secrets()) <= set(settings.secrets)
        proposer = LlmProposer(settings, rng=random.Random(0))
        outcome = EvalOutcome(EvalStatus.COMPILE_ERROR, summary=f"1 error {other}",
                              compile_log=f"error: {KEY} {other}")
        try:
            await proposer.propose(request(Action.REPAIR, parent=node(3, Action.NEW, outcome)))
        finally:
            await proposer.close()
        sent = [r.text for r in server.requests]
    assert len(sent) == 1 and "[redacted]" in sent[0]
    assert KEY not in sent[0] and other not in sent[0]


@pytest.mark.parametrize("password", ["pa55word-0123456789-secret", "S3cr=t;P4ss^word"],
                         ids=["url-safe", "percent-encoded"])
def test_a_detached_engines_log_keeps_no_secret(config, tmp_path, password):
    """A detached engine logs verbosely to a file beside the database: the endpoint's password
    (the HTTP library logs each request's URL, percent-encoding what a URL cannot hold) and the
    key are redacted there as in the store."""
    import asyncio
    import subprocess
    from urllib.parse import quote

    from kforge.engine.command import kforge_command, kforge_env

    async def make_db() -> int:
        async with await Store.open(tmp_path / "k.db") as store:
            return await store.create_profiled_session(
                "toy", {"search": {"iterations_per_op": 1}}, {"name": "g"}, sample_cards()[:1])

    sid = asyncio.run(make_db())
    with FakeOpenAIServer() as server:
        server.add(error_reply(401, f"Incorrect API key provided: {KEY}"))
        url = server.base_url.replace("http://", f"http://user:{password}@")
        config.write_text(f'[llm]\nmodel = "m"\napi_key = "{KEY}"\nbase_url = "{url}"\n'
                          'max_retries = 0\n')
        result = subprocess.run(
            [*kforge_command(), "--verbose", "resume", str(sid), "--db", str(tmp_path / "k.db"),
             "--quiet", "--proposer", "llm", "--evaluator", "tests.doubles:make_evaluator"],
            env=kforge_env(), capture_output=True, text=True, timeout=120)
    logged = result.stdout + result.stderr
    assert "HTTP Request: POST" in logged and "[redacted]" in logged
    assert password not in logged and KEY not in logged
    assert quote(password, safe="") not in logged and "P4ss" not in logged
