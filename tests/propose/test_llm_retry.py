"""The backoff schedule and which failures are worth another try (pure: no server, no sleeping)."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx2
import openai
import pytest

from kforge.propose.llm.retry import Backoff, Failure, classify, parse_retry_after

REQUEST = httpx2.Request("POST", "http://127.0.0.1:9/v1/chat/completions")


def status_error(cls: type[openai.APIStatusError], status: int, message: str = "nope",
                 headers: dict[str, str] | None = None) -> openai.APIStatusError:
    response = httpx2.Response(status, headers=headers or {}, request=REQUEST)
    return cls(f"Error code: {status}", response=response, body={"message": message})


@pytest.mark.parametrize("retry,jitter,expected", [
    (1, 0.0, 0.5), (1, 0.5, 0.75), (2, 0.0, 1.0), (3, 0.999, 3.998),
    (10, 0.0, 30.0), (10, 0.999, 59.97)])
def test_exponential_windows_with_jitter_in_their_upper_half(retry, jitter, expected):
    assert Backoff(base_s=1.0, cap_s=60.0).delay(retry, jitter) == pytest.approx(expected)


def test_retry_after_is_honoured_up_to_the_cap():
    backoff = Backoff(base_s=1.0, cap_s=60.0)
    assert backoff.delay(1, 0.9, retry_after=7.0) == 7.0
    assert backoff.delay(1, 0.9, retry_after=0.0) == 0.0
    assert backoff.delay(1, 0.9, retry_after=3600.0) == 60.0


def test_retry_after_forms():
    now = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after({"retry-after": "5"}) == 5.0
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert parse_retry_after({"retry-after": "Sun, 29 Nov 2026 12:00:30 GMT"}, now=now) == 30.0
    assert parse_retry_after({"retry-after": "Sun, 29 Nov 2026 11:00:00 GMT"}, now=now) == 0.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


def test_rate_limit_is_retried_with_the_servers_wait():
    failure = classify(status_error(openai.RateLimitError, 429, headers={"retry-after": "3"}), 30)
    assert failure == Failure("rate limited (429)", retryable=True, retry_after=3.0)
    assert failure.report(4) == "rate limited (429) after 4 tries"


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_server_errors_are_retried(status):
    failure = classify(status_error(openai.InternalServerError, status), 30)
    assert failure.retryable and failure.cause == f"server error ({status})"


def test_timeouts_and_dropped_connections_are_retried():
    assert classify(openai.APITimeoutError(request=REQUEST), 30) == Failure("timed out (30 s)", True)
    exc = openai.APIConnectionError(request=REQUEST)
    exc.__cause__ = ConnectionRefusedError("[Errno 111] Connection refused")
    failure = classify(exc, 30)
    assert failure.retryable and failure.cause == "connection failed ([Errno 111] Connection refused)"


def test_refusals_are_not_retried_and_keep_the_servers_reason():
    failure = classify(status_error(openai.NotFoundError, 404, "model 'x' not found"), 30)
    assert not failure.retryable
    assert failure.report(1) == "request refused (404): model 'x' not found"


def test_authentication_failures_do_not_quote_the_server():
    error = status_error(openai.AuthenticationError, 401, "Incorrect API key sk-abc***xyz")
    failure = classify(error, 30)
    assert not failure.retryable
    assert "sk-abc" not in failure.report(1)
    assert "api_key" in failure.report(1)
