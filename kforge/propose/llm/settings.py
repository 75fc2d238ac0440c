"""The LLM endpoint settings: where to send requests, with which model and key, and what a call costs.

Read from the ``[llm]`` section of the config file and the environment. Environment variables named
for kforge win over the file; the generic OpenAI ones only fill what neither gives::

    KFORGE_LLM_BASE_URL, KFORGE_LLM_MODEL, KFORGE_LLM_API_KEY   (over the file)
    OPENAI_BASE_URL, OPENAI_API_KEY                             (under the file)

``OPENAI_API_KEY`` is only sent where OpenAI's tools would send it: to OpenAI, or to the server named
by ``OPENAI_BASE_URL``; a server configured for kforge never receives it by accident.

A session may override the model with its ``llm_model`` setting. The API key is a secret: it is kept
out of ``repr`` and every text kforge records passes through ``LlmSettings.redact``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from kforge.errors import KforgeError

# Sent as the key to servers that need none (vLLM, Ollama, llama.cpp): the SDK insists on one.
PLACEHOLDER_KEY = "no-key"
# The price used for a model the table does not list, when the user configures one.
DEFAULT_PRICE = "default"
REDACTED = "[redacted]"

DEFAULT_TIMEOUT_S = 300.0  # a long kernel rewrite from a slow local model takes minutes
DEFAULT_MAX_RETRIES = 3
DEFAULT_MAX_TOKENS = 8192


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input_per_mtok: float
    output_per_mtok: float

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1e6


@dataclass(frozen=True)
class LlmSettings:
    model: str
    base_url: str | None = None  # None: OpenAI's own endpoint
    api_key: str = field(default=PLACEHOLDER_KEY, repr=False)
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_retries: int = DEFAULT_MAX_RETRIES
    temperature: float | None = None  # None: the server's default (some models accept no other)
    max_tokens: int = DEFAULT_MAX_TOKENS
    prices: dict[str, Price] = field(default_factory=dict)

    @property
    def openai_hosted(self) -> bool:
        """Whether requests go to OpenAI itself rather than a compatible server."""
        return self.base_url is None or urlsplit(self.base_url).hostname == "api.openai.com"

    @property
    def token_limit_field(self) -> str:
        """OpenAI's newer models refuse ``max_tokens``; compatible servers all know it."""
        return "max_completion_tokens" if self.openai_hosted else "max_tokens"

    @property
    def secrets(self) -> list[str]:
        found = [self.api_key] if self.api_key and self.api_key != PLACEHOLDER_KEY else []
        if self.base_url and (password := urlsplit(self.base_url).password):
            found.append(password)
        return found

    def redact(self, text: str) -> str:
        """``text`` with every secret replaced; applied to all text that is recorded or raised."""
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

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


def load_llm_settings(config: Mapping, env: Mapping[str, str], overrides: Mapping | None = None,
                      config_file: str = "the kforge config file") -> LlmSettings:
    """Settings from the config dict, the environment and the session's overrides.

    Raises KforgeError naming the setting to fix when no endpoint or model is configured or a
    value has the wrong type.
    """
    section = config.get("llm") or {}
    if not isinstance(section, Mapping):
        raise KforgeError(f"[llm] in {config_file} must be a table of settings")
    overrides = overrides or {}

    base_url = _first(env.get("KFORGE_LLM_BASE_URL"), section.get("base_url"))
    key_follows_openai = base_url is None  # OpenAI itself, or the server OpenAI's variables name
    base_url = base_url or _first(env.get("OPENAI_BASE_URL"))
    api_key = _first(env.get("KFORGE_LLM_API_KEY"), section.get("api_key"),
                     env.get("OPENAI_API_KEY") if key_follows_openai else None)
    model = _first(overrides.get("llm_model"), env.get("KFORGE_LLM_MODEL"), section.get("model"))
    if not api_key and not base_url:
        raise KforgeError(
            f"no LLM endpoint is configured: set [llm] api_key in {config_file} (or KFORGE_LLM_API_KEY)"
            " for OpenAI, or [llm] base_url (or KFORGE_LLM_BASE_URL) for an OpenAI-compatible server"
            " such as vLLM, Ollama or llama.cpp")
    if not model:
        raise KforgeError(f"no LLM model is configured: set [llm] model in {config_file} "
                          "(or KFORGE_LLM_MODEL) to a model name the endpoint serves")
    where = f"in [llm] of {config_file}"
    return LlmSettings(
        model=model,
        base_url=base_url,
        api_key=api_key or PLACEHOLDER_KEY,
        timeout_s=_number(section, "timeout_s", DEFAULT_TIMEOUT_S, where, positive=True),
        max_retries=int(_number(section, "max_retries", DEFAULT_MAX_RETRIES, where, integer=True)),
        temperature=_optional_number(section, "temperature", where),
        max_tokens=int(_number(section, "max_tokens", DEFAULT_MAX_TOKENS, where, positive=True,
                               integer=True)),
        prices=_prices(section.get("prices") or {}, config_file),
    )


def _first(*values: object) -> str | None:
    """The first value that is set and not empty, as text."""
    return next((str(v) for v in values if v not in (None, "")), None)


def _number(table: Mapping, key: str, default: float | None, where: str, *, positive: bool = False,
            integer: bool = False) -> float:
    """``table[key]`` checked to be a (positive or non-negative) number; ``where`` names the table."""
    value = table.get(key, default)
    is_number = isinstance(value, int) if integer else isinstance(value, (int, float))
    if not is_number or isinstance(value, bool) or not (value > 0 if positive else value >= 0):
        kind = "whole number" if integer else "number"
        sign = "positive" if positive else "non-negative"
        raise KforgeError(f"{key} {where} must be a {sign} {kind}, not {value!r}")
    return value


def _optional_number(table: Mapping, key: str, where: str) -> float | None:
    return None if table.get(key) is None else float(_number(table, key, 0, where))


def _prices(table: Mapping, config_file: str) -> dict[str, Price]:
    if not isinstance(table, Mapping):
        raise KforgeError(f"[llm.prices] in {config_file} must be a table of models")
    prices = {}
    for model, entry in table.items():
        where = f'in [llm.prices."{model}"] of {config_file}'
        if not isinstance(entry, Mapping):
            raise KforgeError(f'[llm.prices."{model}"] in {config_file} must be a table with '
                              "input_per_mtok and output_per_mtok")
        prices[model] = Price(input_per_mtok=float(_number(entry, "input_per_mtok", None, where)),
                              output_per_mtok=float(_number(entry, "output_per_mtok", None, where)))
    return prices
