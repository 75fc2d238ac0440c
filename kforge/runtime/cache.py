"""Where kforge keeps what it builds and can build again: ``$KFORGE_CACHE_DIR``, else the user
cache directory (``~/.cache/kforge`` on Linux)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_CACHE = "KFORGE_CACHE_DIR"


def cache_dir() -> Path:
    if env := os.environ.get(ENV_CACHE):
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("kforge"))
