"""Where kforge keeps its files, and the user's config file.

Paths follow platformdirs (``~/.local/share/kforge``, ``~/.config/kforge``, ``~/.cache/kforge`` on
Linux) and each can be overridden by an environment variable. The config file is TOML, read into
``kforge.core.settings.Settings`` (where every key is documented) and checked on load::

    [search]                 # defaults for `kforge search`
    proposer = "library"     # library | llm | both | module:factory
    iterations_per_op = 24
    usd = 5.0

    [eval]                   # how candidates are verified and timed
    timeout_s = 60

    [llm]                    # any OpenAI-compatible server
    base_url = "http://localhost:8000/v1"
    model = "my-model"
    api_key = "..."          # or KFORGE_LLM_API_KEY / OPENAI_API_KEY in the environment

    [tui]
    theme = "kforge-dark"

    [store]
    durability = "full"      # full: finished results survive a power loss; normal: faster

    [keys]                   # remap a TUI binding by its id
    prune = "x"
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from kforge.core.files import regular_file
from kforge.core.secrets import known_secrets
from kforge.core.settings import Origin, Settings
from kforge.errors import KforgeError
from kforge.store.connection import StoreOptions

APP = "kforge"
ENV_DB = "KFORGE_DB"
ENV_CONFIG = "KFORGE_CONFIG"


def data_dir() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir(APP))


def config_path() -> Path:
    if env := os.environ.get(ENV_CONFIG):
        return Path(env).expanduser()
    from platformdirs import user_config_dir

    return Path(user_config_dir(APP)) / "config.toml"


def config_dir() -> Path:
    return config_path().parent


def db_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The session database: ``--db``, else ``$KFORGE_DB``, else the user data directory."""
    if explicit:
        return Path(explicit).expanduser()
    if env := os.environ.get(ENV_DB):
        return Path(env).expanduser()
    return data_dir() / "kforge.db"


def load_config(path: Path | None = None) -> Settings:
    """The user's config file as the settings tree: an absent file gives every default; a file
    that is not TOML, or names an unknown key or a value out of range, is a KforgeError naming
    the file, section and key."""
    path = path or config_path()
    try:
        if not path.exists():
            return Settings()
    except OSError as exc:  # a folder on the way that cannot be searched
        raise KforgeError(f"cannot read config file {path}: {exc.strerror}") from None
    return Settings.from_dict(read_toml(path, "config file"), Origin(f"in {path}"))


def configured_secrets() -> tuple[str, ...]:
    """The LLM secrets of the config file and the environment (``known_secrets``); those of the
    environment alone where the config file cannot be read."""
    section = _readable_config().llm
    return known_secrets([section.api_key], [section.base_url], os.environ)


def store_options() -> StoreOptions:
    """How the user's config has a store write: without the configured secrets, at ``[store]
    durability``. A config that cannot be read keeps the safe default durability here; the
    commands that read the whole config report what is wrong with it."""
    return StoreOptions(secrets=configured_secrets(),
                        durability=_readable_config().store.durability)


def _readable_config() -> Settings:
    """The user's config, or every default where it cannot be read."""
    try:
        return load_config()
    except KforgeError:
        return Settings()


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """A TOML file's tables; KforgeError naming ``what`` and the file when it cannot be read."""
    regular_file(path, what)
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise KforgeError(f"{what} {path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise KforgeError(f"{what} {path} is not UTF-8 text (byte {exc.start} cannot be read); "
                          "TOML files are UTF-8") from None
    except RecursionError:  # tomllib reads nested arrays and tables recursively
        raise KforgeError(f"{what} {path} nests its arrays or tables too deeply to be "
                          "read") from None
    except OSError as exc:
        raise KforgeError(f"cannot read {what} {path}: {exc.strerror}") from None


def save_config_value(section: str, key: str, value: str | int | float | bool,
                      path: Path | None = None) -> None:
    """Set one ``[section] key = value`` in the config file, keeping everything else.

    Written by hand because tomllib only reads: the line is replaced in place or appended to the
    section, so the user's comments and layout survive.
    """
    path = path or config_path()
    lines = path.read_text().splitlines() if path.exists() else []
    rendered = f"{key} = {_toml_value(value)}"
    header = f"[{section}]"
    start = next((i for i, ln in enumerate(lines) if ln.strip() == header), None)
    if start is None:
        lines += ([""] if lines else []) + [header, rendered]
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].strip().startswith("[")),
                   len(lines))
        for i in range(start + 1, end):
            if lines[i].split("=", 1)[0].strip() == key:
                lines[i] = rendered
                break
        else:
            lines.insert(end, rendered)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


def _toml_value(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
