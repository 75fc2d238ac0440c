"""The settings tree: what a person writes is checked strictly with one clear line per problem;
what a session stored is read leniently; secrets stay out of what is stored."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kforge.core.mcts import MctsParams
from kforge.core.settings import (
    EvalSettings,
    KeyBindings,
    LlmSection,
    Origin,
    Price,
    SearchSettings,
    SessionSettings,
    Settings,
    SettingsError,
    TimingPlan,
    parse_duration,
)
from kforge.errors import KforgeError
from kforge.store.config import load_config

FILE = Origin("in /home/u/.config/kforge/config.toml")


def error(data: dict, origin: Origin = FILE) -> str:
    with pytest.raises(SettingsError) as caught:
        Settings.from_dict(data, origin)
    message = str(caught.value)
    assert "\n" not in message
    return message


# ----- unknown keys -----


def test_an_unknown_key_is_named_with_its_file_and_section_and_the_nearest_key():
    assert error({"search": {"patiense": 5}}) == (
        "unknown setting [search] patiense in /home/u/.config/kforge/config.toml "
        "(did you mean patience?)")


@pytest.mark.parametrize("data, expected", [
    ({"serach": {}}, "unknown section [serach] in /home/u/.config/kforge/config.toml "
                     "(did you mean search?)"),
    ({"eval": {"warmpu": 1}}, "unknown setting [eval] warmpu in /home/u/.config/kforge/config.toml "
                              "(did you mean warmup?)"),
    ({"search": {"mcts": {"explor": 1.0}}}, "unknown setting [search.mcts] explor"),
    ({"llm": {"base-url": "x"}}, "(did you mean base_url?)"),
    ({"tui": {"zzz": 1}}, "unknown setting [tui] zzz in /home/u/.config/kforge/config.toml "
                          "(known: theme)"),
])
def test_unknown_keys_and_sections_suggest_what_was_meant(data, expected):
    assert expected in error(data)


# ----- ranges and types -----


@pytest.mark.parametrize("section, key, value, rule", [
    ("search", "patience", 0, "must be at least 1"),
    ("search", "iterations_per_op", 0, "must be at least 1"),
    ("search", "parallel", 0, "must be at least 1"),
    ("search", "top_ops", 0, "must be at least 1"),
    ("search", "focus", 0, "must be at least 1"),
    ("search", "usd", -0.5, "must be a finite number of at least 0"),
    ("search", "usd", math.nan, "must be a finite number of at least 0"),
    ("search", "usd", math.inf, "must be a finite number of at least 0"),
    ("search", "wall_s", 0, "must be a finite number above 0"),
    ("search", "wall_s", math.inf, "must be a finite number above 0"),
    ("search", "max_op_factor", 0, "must be a finite number above 0"),
    # beyond each range the command line's options state too: a slip, never a search to run
    ("search", "parallel", 100_000, "must be at most 256"),
    ("search", "seed", -1, "must be at least 0"),
    ("search", "seed", 2**32, "must be at most 4,294,967,295"),
    ("search", "wall_s", 99999999999 * 3600.0, "must be at most 31,622,400"),
    ("search", "usd", 1e12, "must be at most 1,000,000"),
    ("eval", "timeout_s", 0, "must be a finite number above 0"),
    ("eval", "baseline_timeout_s", -1, "must be a finite number above 0"),
    ("eval", "start_timeout_s", math.nan, "must be a finite number above 0"),
    ("eval", "timing_sets", 0, "must be at least 1"),
    ("eval", "min_reps", 0, "must be at least 1"),
    ("eval", "budget_s", -1, "must be a finite number of at least 0"),
    ("llm", "timeout_s", 0, "must be a finite number above 0"),
    ("llm", "max_retries", -1, "must be at least 0"),
    ("llm", "max_tokens", 0, "must be at least 1"),
    ("llm", "temperature", math.nan, "must be a finite number of at least 0"),
])
def test_each_range_rule_names_section_key_rule_and_value(section, key, value, rule):
    message = error({section: {key: value}})
    assert message.startswith(f"[{section}] {key} in /home/u/.config/kforge/config.toml {rule}, "
                              "not ")


@pytest.mark.parametrize("data, expected", [
    ({"search": {"patience": "ten"}}, "[search] patience in /home/u/.config/kforge/config.toml "
                                      "must be a whole number, not 'ten'"),
    ({"search": {"parallel": True}}, "must be a whole number, not True"),
    ({"search": {"usd": "5"}}, "[search] usd in /home/u/.config/kforge/config.toml must be a "
                               "number, not '5'"),
    ({"eval": {"seeds": [1, "2"]}}, "[eval] seeds in /home/u/.config/kforge/config.toml must be a "
                                    "list of whole numbers, not [1, '2']"),
    ({"eval": {"devices": [-1]}}, "[eval] devices in /home/u/.config/kforge/config.toml must list "
                                  "GPU indices, 0 or more, not [-1]"),
    ({"llm": {"prices": {"gpt-4.1": {"input_per_mtok": 1}}}},
     '[llm.prices."gpt-4.1"] output_per_mtok in /home/u/.config/kforge/config.toml is missing'),
    ({"llm": {"prices": {"m": {"input_per_mtok": -1, "output_per_mtok": 1}}}},
     "[llm.prices.m] input_per_mtok in /home/u/.config/kforge/config.toml must be a finite "
     "number of at least 0, not -1.0"),
    ({"keys": {"prune": 3}}, '[keys] prune in /home/u/.config/kforge/config.toml must name a key '
                             'as text, e.g. "x", not 3'),
    ({"search": 3}, "[search] in /home/u/.config/kforge/config.toml must be a table of settings"),
])
def test_wrong_types_are_one_clear_line(data, expected):
    assert expected in error(data)


def test_records_check_their_ranges_when_built_in_code_too():
    with pytest.raises(SettingsError, match="patience must be at least 1, not 0"):
        SearchSettings(patience=0)
    with pytest.raises(SettingsError, match="usd must be a finite number of at least 0, not nan"):
        SearchSettings(usd=math.nan)


def test_the_config_file_is_read_into_the_tree_and_checked(tmp_path: Path):
    path = tmp_path / "config.toml"
    path.write_text('[search]\nusd = 5\npatience = 4\n\n[eval]\nwarmup = 1\n\n'
                    '[llm]\nmodel = "m"\n\n[keys]\nprune = "x"\n')
    settings = load_config(path)
    assert settings.search == SearchSettings(usd=5.0, patience=4)
    assert settings.eval.timing == TimingPlan(warmup=1)
    assert settings.llm.model == "m" and settings.keys.by_id == {"prune": "x"}
    assert load_config(tmp_path / "absent.toml") == Settings()


def test_nan_written_in_the_config_file_is_refused_naming_the_file(tmp_path: Path):
    path = tmp_path / "config.toml"
    path.write_text("[search]\nusd = nan\n")
    with pytest.raises(KforgeError) as caught:
        load_config(path)
    assert str(caught.value) == (f"[search] usd in {path} must be a finite number of at least 0, "
                                 "not nan")


# ----- stored settings -----


def test_stored_settings_drop_unknown_keys_and_bad_values_with_a_note():
    origin = Origin.stored(3)
    stored = {"search": {"patience": 0, "iterations_per_op": 5, "retired_knob": True},
              "eval": {"timeout_s": 30, "old_eval_key": 1}, "llm_model": "m",
              "dtype": "float16", "fake": {"delay_s": 0.1}}
    settings = SessionSettings.from_stored(stored, origin)
    assert settings.search == SearchSettings(iterations_per_op=5)  # patience back to its default
    assert settings.eval == EvalSettings(timeout_s=30.0)
    assert settings.llm_model == "m"
    assert settings.extra == {"dtype": "float16", "fake": {"delay_s": 0.1}}
    assert origin.notes == [
        "ignored unknown setting [search] retired_knob in the stored settings of session 3",
        "ignored [search] patience in the stored settings of session 3 must be at least 1, "
        "not 0; using the default",
        "ignored unknown setting [eval] old_eval_key in the stored settings of session 3",
    ]


def test_a_session_without_stored_settings_has_the_defaults():
    assert SessionSettings.from_stored({}) == SessionSettings()


def test_updated_sets_only_the_keys_given():
    base = SearchSettings(usd=2.0, patience=3)
    assert base.updated({"patience": 7}, Origin("on the command line")) == SearchSettings(
        usd=2.0, patience=7)
    with pytest.raises(SettingsError, match="unknown setting .* on the command line"):
        base.updated({"patince": 7}, Origin("on the command line"))


# ----- storing -----

valid_search = st.builds(
    SearchSettings,
    proposer=st.sampled_from(["library", "llm", "both", "pkg.mod:make"]),
    iterations_per_op=st.integers(1, 1000), max_op_factor=st.floats(0.1, 10),
    usd=st.none() | st.floats(0, 1e6), wall_s=st.none() | st.floats(1e-3, 1e6),
    parallel=st.integers(1, 64), patience=st.integers(1, 1000), seed=st.integers(0, 2**31),
    focus=st.none() | st.integers(1, 10**6), top_ops=st.none() | st.integers(1, 100),
    mcts=st.builds(MctsParams, explore=st.floats(0, 5), max_repairs=st.integers(0, 5)))
valid_eval = st.builds(
    EvalSettings, devices=st.none() | st.lists(st.integers(0, 7), max_size=4).map(tuple),
    timeout_s=st.floats(0.1, 1e4), seeds=st.lists(st.integers(0, 99), max_size=5).map(tuple),
    max_samples=st.integers(0, 10), timing_sets=st.integers(1, 10),
    timing=st.builds(TimingPlan, warmup=st.integers(0, 10), min_reps=st.integers(1, 100),
                     budget_s=st.floats(0, 1)),
    compile_baseline=st.booleans())


@given(valid_search, valid_eval)
def test_what_a_session_stores_reads_back_the_same(search, evaluation):
    stored = json.loads(json.dumps({"search": search.to_dict(), "eval": evaluation.to_dict()}))
    origin = Origin.stored(1)
    back = SessionSettings.from_stored(stored, origin)
    assert (back.search, back.eval, origin.notes) == (search, evaluation, [])


def test_the_api_key_stays_out_of_repr_and_of_what_is_stored():
    settings = Settings(llm=LlmSection(model="m", api_key="sk-very-secret",
                                       base_url="https://user:hunter22@proxy/v1",
                                       prices={"m": Price(1.0, 2.0)}))
    for text in (repr(settings), json.dumps(settings.to_dict())):
        assert "sk-very-secret" not in text and "hunter22" not in text
    assert settings.to_dict()["llm"]["base_url"] == "https://user:[redacted]@proxy/v1"


def test_updating_the_llm_section_keeps_its_key():
    section = LlmSection(model="m", api_key="sk-very-secret")
    assert section.updated({"model": "n"}, FILE) == LlmSection(model="n", api_key="sk-very-secret")


def test_key_bindings_keep_their_table():
    keys = KeyBindings.from_dict({"prune": "x", "quit": "q,ctrl+c"}, FILE)
    assert keys.to_dict() == {"prune": "x", "quit": "q,ctrl+c"}


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("15m", 900), ("2h", 7200),
                                           (" 1.5 h ", 5400)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_an_unreadable_duration_says_how_to_write_one():
    with pytest.raises(SettingsError, match="cannot read 'soon' as a duration: use e.g. 90s"):
        parse_duration("soon")
