"""Secrets are redacted by what they are: every form a key or a password takes on its way out is
found (as given, percent-encoded, escaped, base64 in an authorization header or in any base64
text), a secret too short to be told apart from other text is refused where it is configured, and
kforge's own data (op names, settings keys) is never rewritten."""

from __future__ import annotations

import base64
import json
import re
from urllib.parse import quote

import pytest

from kforge.core.secrets import MIN_SECRET_CHARS, REDACTED, known_secrets, redact, redact_values
from kforge.core.settings import Origin, Settings, SettingsError
from kforge.errors import KforgeError
from kforge.propose.llm.settings import LlmSettings, load_llm_settings

PASSWORD = "S3cr=t;P4ss^word"  # the audit's: characters HTTP percent-encodes
URL = f"http://user:{PASSWORD}@host/v1"
KEY = "sk-live-0123456789abcdef"


def b64(text: str, encode=base64.b64encode) -> str:
    return encode(text.encode()).decode()


@pytest.mark.parametrize("form", [
    PASSWORD,
    quote(PASSWORD, safe=""),  # how an HTTP library writes it into a URL
    re.sub("%..", lambda m: m.group(0).lower(), quote(PASSWORD, safe="")),  # lower-case hex
    quote(PASSWORD, safe=";"),  # part of it encoded
    quote(quote(PASSWORD, safe=""), safe=""),  # encoded twice
    json.dumps(PASSWORD)[1:-1],
    json.dumps(PASSWORD, ensure_ascii=True).replace("=", "\\u003d"),
    repr(PASSWORD)[1:-1],
    b64(f"user:{PASSWORD}"),  # a basic Authorization header
    b64(f"user:{PASSWORD}").rstrip("="),
    b64(f"user:{PASSWORD}", base64.urlsafe_b64encode),
    b64(PASSWORD),
], ids=["given", "percent", "percent-lower", "percent-part", "percent-twice", "json",
        "json-unicode", "repr", "basic-auth", "basic-auth-unpadded", "urlsafe", "base64"])
def test_a_password_is_redacted_in_every_form_it_takes(form):
    secrets = known_secrets([], [URL])
    text = f"HTTP Request: POST http://user:{form}@host/v1/chat/completions -> {form}."
    shown = redact(text, secrets)
    assert shown.count(REDACTED) >= 2, shown
    assert "P4ss" not in shown and "word" not in shown.replace("password", "")


@pytest.mark.parametrize("lead", ["", "x", "xy"])
def test_a_key_inside_longer_base64_text_is_redacted_at_every_alignment(lead):
    carried = base64.b64encode(f'{lead}{{"authorization": "Bearer {KEY}"}}'.encode()).decode()
    shown = redact(f"payload {carried} end", [KEY])
    assert REDACTED in shown
    assert base64.b64encode(KEY.encode()).decode()[4:16] not in shown


@pytest.mark.parametrize("key", ["x", "a", "ab", "abc", "abcd", "s" * (MIN_SECRET_CHARS - 1)])
def test_a_key_too_short_to_redact_is_refused_where_it_is_configured(key, tmp_path):
    with pytest.raises(SettingsError, match=r"\[llm\] api_key in config.toml is \d character"
                                            r"s? long: a secret shorter than 8") as caught:
        Settings.from_dict({"llm": {"model": "m", "api_key": key}}, Origin("in config.toml"))
    assert f"not {key!r}" not in str(caught.value)  # the key is not quoted back
    with pytest.raises(SettingsError, match=r"\[llm\] base_url .* its password is \d"):
        Settings.from_dict({"llm": {"model": "m", "base_url": f"http://u:{key}@h/v1"}},
                           Origin("in config.toml"))
    with pytest.raises(KforgeError, match="the API key is .* KFORGE_LLM_API_KEY"):
        load_llm_settings(Settings().llm, {"KFORGE_LLM_API_KEY": key, "KFORGE_LLM_MODEL": "m"})
    with pytest.raises(KforgeError, match="the password of the base URL is"):
        LlmSettings(model="m", base_url=f"http://user:{key}@host/v1")
    # never searched for where it is only present (a variable no search uses)
    assert known_secrets([key], [f"http://u:{key}@h/v1"], {"OPENAI_API_KEY": key}) == ()
    assert redact("aten._softmax.default", [key]) == "aten._softmax.default"


async def test_the_store_never_rewrites_kforges_own_data(tmp_path, monkeypatch):
    """Secrets that are part of an op name and a settings key: the op card, the settings and
    the events keep them; free text (a log line, a node's summary) is redacted."""
    from kforge.store import Store
    from kforge.store.config import store_options
    from tests.doubles import sample_cards

    op_part, settings_key = "_softmax.default", "iterations_per_op"
    monkeypatch.setenv("KFORGE_LLM_API_KEY", op_part)
    monkeypatch.setenv("OPENAI_API_KEY", settings_key)
    card = sample_cards()[0]
    settings = {"search": {settings_key: 3, "proposer": "library"}}
    async with await Store.open(tmp_path / "k.db", options=store_options()) as store:
        sid = await store.create_profiled_session("toy", settings, {}, [card])
        await store.update_settings(sid, {"search": {settings_key: 4}})
        await store.log(sid, f"worker said aten.{op_part} and {settings_key}")
        (row,) = await store.list_cards(sid)
        assert row.card.op == "aten._softmax.default" and row.card.key == card.key
        assert (await store.get_session(sid)).settings == {"search": {settings_key: 4}}
        logged = (await store.recent_logs(sid))[-1].record.message
    assert logged == f"worker said aten.{REDACTED} and {REDACTED}"


def test_redacting_values_keeps_keys():
    data = {KEY: [KEY, {"note": f"a {KEY}"}], "n": 1}
    assert redact_values(data, [KEY]) == {KEY: [REDACTED, {"note": f"a {REDACTED}"}], "n": 1}
