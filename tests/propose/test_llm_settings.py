"""Where the LLM endpoint, model, key and prices come from, and what a call costs."""

from __future__ import annotations

import pytest

from kforge.core.secrets import REDACTED
from kforge.core.settings import Origin, Settings
from kforge.errors import KforgeError
from kforge.propose.llm.settings import (
    PLACEHOLDER_KEY,
    LlmSettings,
    Price,
    load_llm_settings,
)


def load_llm(config: dict, env: dict, model: str | None = None, **options) -> LlmSettings:
    """The endpoint settings from a config file's tables, as kforge reads them."""
    return load_llm_settings(Settings.from_dict(config, Origin("in config.toml")).llm, env, model,
                             **options)


def test_config_file_gives_every_setting():
    config = {"llm": {"base_url": "http://localhost:8000/v1", "model": "qwen", "api_key": "k-123456",
                      "timeout_s": 60, "max_retries": 5, "temperature": 0.4, "max_tokens": 4096,
                      "prices": {"qwen": {"input_per_mtok": 0.5, "output_per_mtok": 1.5}}}}
    s = load_llm(config, env={})
    assert (s.base_url, s.model, s.api_key) == ("http://localhost:8000/v1", "qwen", "k-123456")
    assert (s.timeout_s, s.max_retries, s.temperature, s.max_tokens) == (60, 5, 0.4, 4096)
    assert s.prices == {"qwen": Price(0.5, 1.5)}


def test_kforge_env_wins_over_the_file():
    config = {"llm": {"model": "file-model", "base_url": "http://file/v1",
                      "api_key": "k-file-0123"}}
    env = {"KFORGE_LLM_MODEL": "env-model", "KFORGE_LLM_API_KEY": "k-env-0123",
           "KFORGE_LLM_BASE_URL": "http://env/v1"}
    s = load_llm(config, env)
    assert (s.model, s.api_key, s.base_url) == ("env-model", "k-env-0123", "http://env/v1")


def test_openai_variables_only_fill_gaps():
    env = {"OPENAI_BASE_URL": "http://openai-env/v1", "OPENAI_API_KEY": "sk-openai"}
    s = load_llm({"llm": {"model": "m"}}, env)
    assert (s.base_url, s.api_key) == ("http://openai-env/v1", "sk-openai")
    s = load_llm({"llm": {"model": "m"}}, {"OPENAI_API_KEY": "sk-openai"})
    assert (s.base_url, s.api_key) == (None, "sk-openai")


def test_the_openai_key_is_not_sent_to_a_server_configured_for_kforge():
    s = load_llm({"llm": {"model": "m", "base_url": "http://gpu-box:8000/v1"}},
                          {"OPENAI_API_KEY": "sk-openai", "OPENAI_BASE_URL": "http://elsewhere/v1"})
    assert (s.base_url, s.api_key) == ("http://gpu-box:8000/v1", PLACEHOLDER_KEY)


def test_session_setting_overrides_the_model():
    s = load_llm({"llm": {"model": "a", "api_key": "k-0123456"}}, {}, model="b")
    assert s.model == "b"


def test_local_server_needs_no_key():
    s = load_llm({"llm": {"base_url": "http://127.0.0.1:11434/v1", "model": "llama3"}}, {})
    assert s.api_key == PLACEHOLDER_KEY
    assert s.secrets == ()
    assert s.token_limit_field == "max_tokens"


def test_openai_itself_uses_the_new_token_limit_field():
    assert load_llm({"llm": {"model": "gpt", "api_key": "k-0123456"}}, {}).token_limit_field \
        == "max_completion_tokens"


def test_no_key_and_no_endpoint_is_one_clear_error():
    with pytest.raises(KforgeError) as err:
        load_llm({"llm": {"model": "m"}}, {}, config_file="/home/u/.config/kforge/config.toml")
    message = str(err.value)
    assert "no LLM endpoint is configured" in message
    assert "api_key" in message and "base_url" in message and "config.toml" in message
    assert "\n" not in message


def test_no_model_is_an_error_naming_the_setting():
    with pytest.raises(KforgeError, match=r"\[llm\] model"):
        load_llm({"llm": {"api_key": "k-0123456"}}, {})


@pytest.mark.parametrize("key,value", [("timeout_s", "slow"), ("timeout_s", 0), ("max_retries", -1),
                                       ("max_tokens", 1.5), ("temperature", True)])
def test_bad_values_are_named(key, value):
    with pytest.raises(KforgeError, match=key):
        load_llm({"llm": {"api_key": "k-0123456", "model": "m", key: value}}, {})


def test_a_price_without_its_fields_is_an_error():
    with pytest.raises(KforgeError, match="output_per_mtok"):
        load_llm({"llm": {"api_key": "k-0123456", "model": "m",
                                   "prices": {"m": {"input_per_mtok": 1}}}}, {})


def test_cost_uses_the_model_then_the_reported_snapshot_then_the_default():
    s = LlmSettings(model="gpt-x", prices={"gpt-x-2026": Price(2.0, 8.0), "default": Price(1.0, 1.0)})
    assert s.cost(1_000_000, 500_000, "gpt-x", "gpt-x-2026") == (2.0 + 4.0, "")
    assert s.cost(1_000_000, 1_000_000, "other") == (2.0, "")


def test_unknown_model_costs_nothing_with_a_note():
    usd, note = LlmSettings(model="m").cost(1000, 1000, "m")
    assert usd == 0.0
    assert "no price for model 'm'" in note


def test_the_key_is_kept_out_of_repr_and_redacted_from_text():
    s = LlmSettings(model="m", api_key="sk-very-secret", base_url="https://user:hunter22@proxy/v1")
    assert "sk-very-secret" not in repr(s)
    assert s.redact("key sk-very-secret, password hunter22") == f"key {REDACTED}, password {REDACTED}"
