"""The LLM agent: asks a model behind any OpenAI-compatible endpoint for a candidate kernel.

One request, one chat completion. Transient failures are retried here with backoff (the SDK's own
retries are off); every attempt is recorded as an ``LlmCall`` with its tokens and cost, and what
cannot be fixed by retrying ends as a Proposal error, never as an exception.

A reply's launch plan is resolved for the card's variant before its candidate is proposed: a plan
that is malformed, or that does not cover the variant, is not proposed, and the proposal's error
says why, naming the plan field at fault.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import openai
from openai.types.chat import ChatCompletion

from kforge.core.candidate import Candidate, LlmCall, Proposal
from kforge.core.launch_plan import PlanError, PlanNotApplicable
from kforge.core.mcts import Action
from kforge.core.opcard import OpCard
from kforge.core.protocols import ProposalRequest, SearchContext
from kforge.errors import KforgeError
from kforge.propose.llm.parse import MAX_REPLY_CHARS, UnusableReply, parse_reply, plan_error_text
from kforge.propose.llm.prompt import build_messages, effective_action, render_messages
from kforge.propose.llm.retry import Backoff, classify
from kforge.propose.llm.settings import LlmSettings, Price, load_llm_settings
from kforge.propose.llm.variant import plan_arguments
from kforge.runtime.plan import resolve_for
from kforge.store.config import config_path

log = logging.getLogger(__name__)

PROPOSER = "llm"
DEFAULT_BACKOFF = Backoff()
MALFORMED = "the server's answer is not a chat completion"
_SECRET_MARGIN = 1 << 16  # longer than any form of a secret (kforge.core.secrets)


@dataclass(frozen=True)
class _Answer:
    """What a completed call returned: the reply text, why it ended, and its cost note."""

    text: str
    finish_reason: str
    cost_note: str


class LlmProposer:
    """Writes one candidate per request with a chat model."""

    name = PROPOSER

    def __init__(self, settings: LlmSettings, *,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
                 rng: random.Random | None = None, backoff: Backoff = DEFAULT_BACKOFF) -> None:
        self.settings = settings
        self._client = openai.AsyncOpenAI(api_key=settings.api_key, base_url=settings.base_url,
                                          timeout=settings.timeout_s, max_retries=0)
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._backoff = backoff
        self._noted: set[str] = set()

    async def propose(self, request: ProposalRequest) -> Proposal:
        if reason := self.declines(request.card):
            return Proposal(error=reason)
        # What is sent is redacted as what is stored: earlier candidates' compile logs and
        # reports are text a candidate could have filled.
        messages = [{**m, "content": self.settings.redact(m["content"])}
                    for m in build_messages(request)]
        prompt = render_messages(messages)
        answer, calls, failure = await self._complete(messages, prompt)
        if answer is None:
            return Proposal(calls=calls, error=f"LLM call failed: {failure}")
        try:
            parsed = parse_reply(self.settings.redact(answer.text))
            reason = plan_problem(parsed.plan, request.card)
        except UnusableReply as exc:
            reason = f"unusable reply: {exc}"
        if reason:
            if answer.finish_reason == "length":
                reason += (f" (the reply was cut at max_tokens={self.settings.max_tokens}: "
                           "raise [llm] max_tokens)")
            calls[-1] = replace(calls[-1], error=reason)
            return Proposal(calls=calls, error=reason)
        action = effective_action(request)
        meta = {
            "proposer": PROPOSER,
            "model": self.settings.model,
            "approach": parsed.approach or f"{action.value} by {self.settings.model}",
            "notes": parsed.notes,
            "action": action.value,
            "kernels": parsed.kernels,
        }
        if request.parent is not None and action is not Action.NEW:
            meta["parent"] = request.parent.id
        if answer.cost_note:
            meta["cost_note"] = answer.cost_note
        return Proposal(candidates=[Candidate(parsed.source, plan=parsed.plan, meta=meta)],
                        calls=calls)

    def declines(self, card: OpCard) -> str | None:
        """A model may try any op whose arguments a launch plan can be given."""
        try:
            plan_arguments(card)
        except KforgeError as exc:
            return f"a launch plan cannot be given this card's arguments: {exc}"
        return None

    async def close(self) -> None:
        await self._client.close()

    async def _complete(self, messages: list[dict[str, str]],
                        prompt: str) -> tuple[_Answer | None, list[LlmCall], str]:
        """Send the request, retrying transient failures; every attempt is recorded as a call."""
        settings = self.settings
        tries = settings.max_retries + 1
        calls: list[LlmCall] = []
        attempt = 0
        while True:
            attempt += 1
            started = time.monotonic()
            try:
                response = await self._client.chat.completions.create(
                    model=settings.model, messages=messages, **self._options())
            except openai.OpenAIError as exc:
                failure = classify(exc, settings.timeout_s)
                cause = settings.redact(failure.cause)
                calls.append(LlmCall(model=settings.model, input_tokens=0, output_tokens=0, usd=0.0,
                                     seconds=time.monotonic() - started, prompt=prompt, error=cause))
                if not failure.retryable or attempt == tries:
                    return None, calls, settings.redact(failure.report(attempt))
                delay = self._backoff.delay(attempt, self._rng.random(), failure.retry_after)
                log.warning("LLM request %s; retry %d of %d in %.1f s", cause, attempt,
                            tries - 1, delay)
                await self._sleep(delay)
                continue
            seconds = time.monotonic() - started
            try:
                answer, call = self._record(response, prompt, seconds)
            except (AttributeError, TypeError):  # a payload the SDK could not shape
                calls.append(LlmCall(model=settings.model, input_tokens=0, output_tokens=0, usd=0.0,
                                     seconds=seconds, prompt=prompt, error=MALFORMED))
                return None, calls, MALFORMED
            calls.append(call)
            return answer, calls, ""

    def _options(self) -> dict:
        return request_options(self.settings)

    def _record(self, response: ChatCompletion, prompt: str, seconds: float) -> tuple[_Answer, LlmCall]:
        settings = self.settings
        choice = response.choices[0] if response.choices else None
        text = (choice.message.content or "") if choice is not None else ""
        usage = response.usage
        input_tokens = (usage.prompt_tokens or 0) if usage is not None else 0
        output_tokens = (usage.completion_tokens or 0) if usage is not None else 0
        reported = getattr(response, "model", None)  # servers may name the exact snapshot served
        usd, note = settings.cost(input_tokens, output_tokens, settings.model,
                                  *([reported] if reported else []))
        if note and note not in self._noted:
            self._noted.add(note)
            log.warning(note)
        # What is kept is at most what the parser reads, cut after redaction (a secret across
        # the cut is redacted whole first)
        kept = settings.redact(text[:MAX_REPLY_CHARS + _SECRET_MARGIN])[:MAX_REPLY_CHARS]
        call = LlmCall(model=settings.model, input_tokens=input_tokens, output_tokens=output_tokens,
                       usd=usd, seconds=seconds, prompt=prompt, reply=kept)
        finish = (choice.finish_reason or "") if choice is not None else ""
        return _Answer(text, finish, note), call


def request_options(settings: LlmSettings, max_tokens: int | None = None) -> dict:
    """The request's sampling options: the reply limit (``max_tokens`` or the configured one,
    under the name the server takes) and the temperature where one is set."""
    options: dict = {settings.token_limit_field: max_tokens or settings.max_tokens}
    if settings.temperature is not None:
        options["temperature"] = settings.temperature
    return options


PROBE_PROMPT = "Reply with the single word: ok"
PROBE_TOKENS = 16  # enough for the word; a reasoning model may spend them all on thought
PROBE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ProbeResult:
    """What one tiny request to the endpoint showed: who answered, how fast, at what cost."""

    model: str  # the model configured
    served: str  # the model the server says it served ("" if it did not say)
    seconds: float
    input_tokens: int
    output_tokens: int
    usd: float
    price: Price | None  # the price that applies to the model, None when none is configured
    reply: str


async def probe_endpoint(settings: LlmSettings) -> ProbeResult:
    """Send one tiny chat request (no retries, at most ``PROBE_TIMEOUT_S``) to the configured
    endpoint. KforgeError with the failure in one line: unreachable, refused key, unknown
    model, a timeout, an answer that is no chat completion."""
    timeout_s = min(settings.timeout_s, PROBE_TIMEOUT_S)
    options = request_options(settings, PROBE_TOKENS)
    where = settings.base_url or "api.openai.com"
    async with openai.AsyncOpenAI(api_key=settings.api_key, base_url=settings.base_url,
                                  timeout=timeout_s, max_retries=0) as client:
        started = time.monotonic()
        try:
            response = await client.chat.completions.create(
                model=settings.model, messages=[{"role": "user", "content": PROBE_PROMPT}],
                **options)
        except openai.OpenAIError as exc:
            report = classify(exc, timeout_s).report(1)
            raise KforgeError(settings.redact(f"{where}, model {settings.model}: {report}")
                              ) from None
        seconds = time.monotonic() - started
    try:
        usage = response.usage
        input_tokens = (usage.prompt_tokens or 0) if usage is not None else 0
        output_tokens = (usage.completion_tokens or 0) if usage is not None else 0
        reply = (response.choices[0].message.content or "") if response.choices else ""
    except (AttributeError, TypeError):
        raise KforgeError(f"{where}, model {settings.model}: {MALFORMED}") from None
    served = str(getattr(response, "model", None) or "")
    price = settings.price_for(settings.model, *([served] if served else []))
    return ProbeResult(model=settings.model, served=served, seconds=seconds,
                       input_tokens=input_tokens, output_tokens=output_tokens,
                       usd=price.cost(input_tokens, output_tokens) if price else 0.0,
                       price=price, reply=settings.redact(reply))


def plan_problem(plan: dict, card: OpCard) -> str:
    """Why ``plan`` is not proposed for ``card``, or "" when it resolves for the card's variant."""
    try:
        resolve_for(plan, card.op, card.args, card.kwargs)
    except PlanNotApplicable as exc:
        return f"the launch plan does not cover this op variant: {exc}"
    except PlanError as exc:
        return f"unusable reply: {plan_error_text(exc)}"
    return ""


def make_llm_proposer(ctx: SearchContext) -> LlmProposer:
    """The factory behind ``--proposer llm``: settings from the config file, the environment and
    the session's ``llm_model`` override."""
    settings = load_llm_settings(ctx.config.llm, os.environ, ctx.settings.llm_model,
                                 config_file=str(config_path()))
    return LlmProposer(settings)
