"""The LLM endpoint settings: where to send requests, with which model and key, and what a call costs.

The ``[llm]`` section of the config file (``kforge.core.settings.LlmSection``, checked when the file
is read) with the environment laid over it. Environment variables named for kforge win over the
file; the generic OpenAI ones only fill what neither gives::

    KFORGE_LLM_BASE_URL, KFORGE_LLM_MODEL, KFORGE_LLM_API_KEY   (over the file)
    OPENAI_BASE_URL, OPENAI_API_KEY                             (under the file)

``OPENAI_API_KEY`` is only sent where OpenAI's tools would send it: to OpenAI, or to the server named
by ``OPENAI_BASE_URL``; a server configured for kforge never receives it by accident.

A session may override the model (its ``llm_model`` setting). The API key is a secret: it is kept
out of ``repr`` and every text kforge records passes through ``LlmSettings.redact``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from kforge.core.secrets import known_secrets, redact, secret_problem, url_credentials
from kforge.core.settings import LlmSection, Price
from kforge.errors import KforgeError

# Sent as the key to servers that need none (vLLM, Ollama, llama.cpp): the SDK insists on one.
PLACEHOLDER_KEY = "no-key"
# The price used for a model the table does not list, when the user configures one.
DEFAULT_PRICE = "default"

_DEFAULTS = LlmSection()
_ENV_NAMES = "KFORGE_LLM_API_KEY, OPENAI_API_KEY, KFORGE_LLM_BASE_URL or OPENAI_BASE_URL"


@dataclass(frozen=True)
class LlmSettings:
    """The endpoint the ``llm`` proposer talks to, resolved: a model, and a key where one is set."""

    model: str
    base_url: str | None = None  # None: OpenAI's own endpoint
    api_key: str = field(default=PLACEHOLDER_KEY, repr=False)
    timeout_s: float = _DEFAULTS.timeout_s
    max_retries: int = _DEFAULTS.max_retries
    temperature: float | None = _DEFAULTS.temperature
    max_tokens: int = _DEFAULTS.max_tokens
    prices: dict[str, Price] = field(default_factory=dict)
    # the other LLM secrets the config file and the environment hold (``known_secrets``): what
    # the store redacts is redacted from what is sent too
    other_secrets: tuple[str, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        """A key or password too short to be kept out of what kforge writes is refused."""
        credentials = url_credentials(self.base_url)
        for what, secret in (("the API key", self.api_key),
                             ("the password of the base URL", credentials and credentials[1])):
            if secret and secret != PLACEHOLDER_KEY and (problem := secret_problem(secret)):
                raise KforgeError(f"{what} {problem}")

    @property
    def openai_hosted(self) -> bool:
        """Whether requests go to OpenAI itself rather than a compatible server."""
        return self.base_url is None or urlsplit(self.base_url).hostname == "api.openai.com"

    @property
    def token_limit_field(self) -> str:
        """OpenAI's newer models refuse ``max_tokens``; compatible servers all know it."""
        return "max_completion_tokens" if self.openai_hosted else "max_tokens"

    @property
    def secrets(self) -> tuple[str, ...]:
        """This endpoint's key and password, and the other LLM secrets kforge knows of."""
        key = self.api_key if self.api_key != PLACEHOLDER_KEY else None
        return tuple(dict.fromkeys([*known_secrets([key], [self.base_url]),
                                    *self.other_secrets]))

    def redact(self, text: str) -> str:
        """``text`` with every secret replaced; applied to all text that is recorded, raised or
        sent to the endpoint."""
        return redact(text, self.secrets)

    def price_for(self, model: str, *aliases: str) -> Price | None:
        """The price listed for ``model`` or one of its aliases (such as the snapshot name a server
        reports), else the configured default, else None."""
        for name in (model, *aliases, DEFAULT_PRICE):
            if name in self.prices:
                return self.prices[name]
        return None

    def cost(self, input_tokens: int, output_tokens: int, model: str,
             *aliases: str) -> tuple[float, str]:
        """USD for one call and, when no price applies, a note saying it was counted as $0."""
        price = self.price_for(model, *aliases)
        if price is None:
            return 0.0, f"no price for model '{model}' in [llm.prices]: its calls count as $0"
        return price.cost(input_tokens, output_tokens), ""


def load_llm_settings(section: LlmSection, env: Mapping[str, str], model: str | None = None,
                      config_file: str = "the kforge config file") -> LlmSettings:
    """The ``[llm]`` section with the environment over it, and ``model`` (a session's own) over
    both.

    Raises KforgeError naming the setting to fix when no endpoint or model is configured.
    """
    base_url = _first(env.get("KFORGE_LLM_BASE_URL"), section.base_url)
    key_follows_openai = base_url is None  # OpenAI itself, or the server OpenAI's variables name
    base_url = base_url or _first(env.get("OPENAI_BASE_URL"))
    api_key = _first(env.get("KFORGE_LLM_API_KEY"), section.api_key,
                     env.get("OPENAI_API_KEY") if key_follows_openai else None)
    model = _first(model, env.get("KFORGE_LLM_MODEL"), section.model)
    if not api_key and not base_url:
        raise KforgeError(
            f"no LLM endpoint is configured: set [llm] api_key in {config_file} (or KFORGE_LLM_API_KEY)"
            " for OpenAI, or [llm] base_url (or KFORGE_LLM_BASE_URL) for an OpenAI-compatible server"
            " such as vLLM, Ollama or llama.cpp")
    if not model:
        raise KforgeError(f"no LLM model is configured: set [llm] model in {config_file} "
                          "(or KFORGE_LLM_MODEL) to a model name the endpoint serves")
    try:
        return LlmSettings(model=model, base_url=base_url, api_key=api_key or PLACEHOLDER_KEY,
                           timeout_s=section.timeout_s, max_retries=section.max_retries,
                           temperature=section.temperature, max_tokens=section.max_tokens,
                           prices=dict(section.prices),
                           other_secrets=known_secrets([section.api_key], [section.base_url],
                                                       env))
    except KforgeError as exc:  # a short key of the environment's (the file's was refused)
        raise KforgeError(f"{exc} (from {_ENV_NAMES}, or [llm] in {config_file})") from None


def _first(*values: object) -> str | None:
    """The first value that is set and not empty, as text."""
    return next((str(v) for v in values if v not in (None, "")), None)
