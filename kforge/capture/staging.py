"""Staging folders: where a profile writes its sample inputs before its session exists, so that
a session is stored with all of its samples or not at all."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from kforge.core.files import private_folder
from kforge.errors import KforgeError

PREFIX = ".staging-"
# A staging folder untouched for this long belongs to a profile that was killed: a running one
# writes samples into its folder as it goes, and a profile never runs this long.
ABANDONED_AFTER_S = 24 * 3600.0


def new_staging_dir(samples_root: Path) -> Path:
    """A fresh staging folder under ``samples_root``, private to the user (nothing another can
    plant in it is written through); KforgeError when it cannot be written."""
    try:
        samples_root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KforgeError(f"cannot write sample inputs under {samples_root}: "
                          f"{exc.strerror}") from None
    return private_folder(samples_root, PREFIX)


def remove_abandoned(samples_root: Path, now: float | None = None) -> list[Path]:
    """Remove the staging folders under ``samples_root`` that killed profiles left behind (none
    of their files changed for ``ABANDONED_AFTER_S``); return them."""
    now = time.time() if now is None else now
    removed = []
    for folder in samples_root.glob(f"{PREFIX}*"):
        if folder.is_dir() and now - _last_change(folder) > ABANDONED_AFTER_S:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _last_change(folder: Path) -> float:
    try:
        return max(p.stat().st_mtime for p in (folder, *folder.rglob("*")))
    except OSError:  # removed meanwhile by another profile's clean-up
        return float("inf")
