"""When to retry an LLM request and how long to wait: the backoff schedule and the error taxonomy.

Timeouts, rate limits (429), lock-ups (408, 409), server errors (5xx) and dropped connections are
worth another try; anything else the server said (a bad request, a wrong key, an unknown model) is
not. The SDK's own retries are switched off so this policy is the only one that runs.
"""

from __future__ import annotations

import email.utils
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import openai

from kforge.core.text import one_line

RETRYABLE_STATUS = frozenset({408, 409, 429})
DETAIL_CHARS = 300  # how much of a server's error message a report keeps


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: retry ``n`` waits up to ``base_s * 2 ** (n - 1)``, never more than
    ``cap_s``; a server's Retry-After is honoured up to ``cap_s``."""

    base_s: float = 1.0
    cap_s: float = 60.0

    def delay(self, retry: int, jitter: float, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first). ``jitter`` in [0, 1)
        spreads concurrent clients over the upper half of the window."""
        if retry_after is not None and retry_after >= 0:
            return min(retry_after, self.cap_s)
        window = min(self.cap_s, self.base_s * 2 ** (retry - 1))
        return window * (0.5 + 0.5 * jitter)


@dataclass(frozen=True)
class Failure:
    """Why one request failed, in words fit for a report."""

    cause: str  # "rate limited (429)", "timed out (300 s)", ...
    retryable: bool
    retry_after: float | None = None
    detail: str = ""  # the server's own message, for failures that are not retried

    def report(self, tries: int) -> str:
        text = self.cause + (f" after {tries} tries" if tries > 1 else "")
        return f"{text}: {self.detail}" if self.detail else text


def parse_retry_after(headers: Mapping[str, str], now: datetime | None = None) -> float | None:
    """Seconds a server asked us to wait (``retry-after-ms``, or ``retry-after`` as seconds or an
    HTTP date), or None when it did not say."""
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return max(float(ms) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


def classify(exc: openai.OpenAIError, timeout_s: float) -> Failure:
    """The failure an SDK exception stands for."""
    if isinstance(exc, openai.APITimeoutError):
        return Failure(f"timed out ({timeout_s:g} s)", retryable=True)
    if isinstance(exc, openai.APIConnectionError):
        reason = str(exc.__cause__ or exc.message).strip() or "no reason given"
        return Failure(f"connection failed ({one_line(reason, 120)})", retryable=True)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retry_after = parse_retry_after(exc.response.headers)
        if status == 429:
            return Failure("rate limited (429)", retryable=True, retry_after=retry_after)
        if status >= 500:
            return Failure(f"server error ({status})", retryable=True, retry_after=retry_after)
        if status in RETRYABLE_STATUS:
            return Failure(f"server busy ({status})", retryable=True, retry_after=retry_after)
        if status in (401, 403):
            # The server's text may quote part of the key; say only what to check.
            return Failure(f"authentication failed ({status})", retryable=False,
                           detail="check [llm] api_key or KFORGE_LLM_API_KEY")
        return Failure(f"request refused ({status})", retryable=False,
                       detail=one_line(_server_message(exc), DETAIL_CHARS))
    return Failure(f"client error ({type(exc).__name__})", retryable=False,
                   detail=one_line(str(exc), DETAIL_CHARS))


def _server_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping) and isinstance(inner.get("message"), str):
            return inner["message"]
        if isinstance(inner, str):
            return inner
    return str(body) if body else exc.message

