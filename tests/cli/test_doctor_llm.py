"""`kforge doctor --llm`: one tiny live request to the configured endpoint (a scripted
OpenAI-compatible server on loopback here), reported in one line: model, latency, tokens, price;
or the failure, in one line."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kforge.cli.main import main
from tests.fakes.openai_server import FakeOpenAIServer, chat_reply, error_reply

MODEL = "kernel-writer-1"
KEY = "sk-doctor-0123456789SECRET"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch):
    with FakeOpenAIServer() as srv:
        monkeypatch.setenv("KFORGE_LLM_BASE_URL", srv.base_url)
        monkeypatch.setenv("KFORGE_LLM_MODEL", MODEL)
        monkeypatch.setenv("KFORGE_LLM_API_KEY", KEY)
        yield srv


def priced(config: Path) -> None:
    config.write_text(f'[llm.prices."{MODEL}"]\ninput_per_mtok = 3.0\noutput_per_mtok = 15.0\n')


def doctor(capsys) -> tuple[int, list[str]]:
    code = main(["doctor", "--llm"])
    captured = capsys.readouterr()
    assert KEY not in captured.out + captured.err
    return code, captured.out.strip().splitlines()


def test_a_live_call_reports_model_latency_tokens_and_price(server, capsys, _isolated_kforge_dirs):
    priced(_isolated_kforge_dirs / "config.toml")
    server.add(chat_reply("ok", prompt_tokens=14, completion_tokens=2, model=f"{MODEL}-0425"))
    code, lines = doctor(capsys)
    assert code == 0
    (line,) = lines
    assert line.startswith("ok  ") and f"model {MODEL} (served as {MODEL}-0425)" in line
    assert "answered in" in line and "14 prompt + 2 reply tokens" in line
    assert "$0.000072 at $3 / $15 per million prompt / reply tokens" in line
    (sent,) = server.requests
    assert sent.body["model"] == MODEL and sent.body["max_tokens"] == 16  # tiny
    assert sent.headers["authorization"] == f"Bearer {KEY}"


def test_a_model_without_a_price_is_a_warning(server, capsys):
    server.add(chat_reply("ok", prompt_tokens=14, completion_tokens=2))
    code, (line,) = doctor(capsys)
    assert code == 0 and line.startswith("warn") and "no price for it in [llm.prices]" in line


@pytest.mark.parametrize("reply, said", [
    (error_reply(401, f"bad key {KEY}"),
     "authentication failed (401): check [llm] api_key or KFORGE_LLM_API_KEY"),
    (error_reply(404, f"The model `{MODEL}` does not exist"),
     f"request refused (404): The model `{MODEL}` does not exist"),
    (error_reply(503, "overloaded"), "server error (503)"),
])
def test_a_refusal_ends_in_one_line_without_retries(server, capsys, reply, said):
    server.add(reply)
    code, (line,) = doctor(capsys)
    assert code == 1 and line.startswith("FAIL") and said in line
    assert f"{server.base_url}, model {MODEL}" in line
    assert len(server.requests) == 1


def test_an_unreachable_endpoint_ends_in_one_line(monkeypatch, capsys):
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("KFORGE_LLM_BASE_URL", f"http://127.0.0.1:{port}/v1")
    monkeypatch.setenv("KFORGE_LLM_MODEL", MODEL)
    code, (line,) = doctor(capsys)
    assert code == 1 and line.startswith("FAIL") and "connection failed" in line


def test_no_endpoint_configured_ends_in_one_line(capsys):
    code, (line,) = doctor(capsys)
    assert code == 1 and "no LLM endpoint is configured" in line
