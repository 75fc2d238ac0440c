"""Staging folders: where a profile writes its sample inputs before its session exists, so that
a session is stored with all of its samples or not at all.

A staging folder is named for its profile's process and made only when the first sample is
written (``make_staging``), private to the user: a profile killed before that (while its model
builds or runs, which is most of its time) leaves nothing behind, and one killed while it writes
samples leaves a folder the next profile removes, its process being gone.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

from kforge.errors import KforgeError

PREFIX = ".staging-"
# A staging folder untouched for this long belongs to a profile that was killed even where its
# process number is in use again: a running one writes samples into its folder as it goes, and a
# profile never runs this long.
ABANDONED_AFTER_S = 24 * 3600.0


def new_staging_dir(samples_root: Path) -> Path:
    """A fresh staging folder's path under ``samples_root``, named for this process; nothing is
    made yet (``make_staging``)."""
    return samples_root / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"


def make_staging(path: Path) -> None:
    """Make the staging folder ``path`` (with its samples root), that only this user may enter:
    nothing another can plant in it is written through. KforgeError when it cannot be made."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
    except OSError as exc:
        raise KforgeError(f"cannot write sample inputs under {path.parent}: "
                          f"{exc.strerror}") from None


def remove_abandoned(samples_root: Path, now: float | None = None) -> list[Path]:
    """Remove the staging folders under ``samples_root`` that killed profiles left behind (their
    process is gone, or none of their files changed for ``ABANDONED_AFTER_S``); return them."""
    now = time.time() if now is None else now
    removed = []
    for folder in samples_root.glob(f"{PREFIX}*"):
        if folder.is_dir() and not folder.is_symlink() and (
                not _owner_runs(folder) or now - _last_change(folder) > ABANDONED_AFTER_S):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _owner_runs(folder: Path) -> bool:
    """Whether the process the folder is named for may still run (True where it names none)."""
    pid = folder.name.removeprefix(PREFIX).split("-", 1)[0]
    if not pid.isdigit() or not 0 < int(pid) < 1 << 22:
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: it runs
        pass
    return True


def _last_change(folder: Path) -> float:
    try:
        return max(p.stat().st_mtime for p in (folder, *folder.rglob("*")))
    except OSError:  # removed meanwhile by another profile's clean-up
        return float("inf")
