"""Files kforge keeps beside a database: SQLite's write-ahead log and shared memory, the samples
folder (one folder per session) and the engines' logs.

A database's folder may be someone else's (a shared folder, an unpacked archive) and hold links
that lead anywhere: a ``logs`` link would have an engine append its output to any file, a
``samples`` link would have a profile write, and ``kforge delete`` remove, under any folder, a
``k.db-wal`` link would have SQLite write into any file. kforge follows none of them: a link where
one of these files or folders goes is refused, naming it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from kforge.errors import KforgeError

_SQLITE_FILES = ("-wal", "-shm", "-journal")


def no_link(path: Path) -> Path:
    """``path``, unless it is a link (a dangling one too): then a KforgeError naming it."""
    if path.is_symlink():
        raise KforgeError(f"{path} is a link: kforge keeps its own files beside a database and "
                          "follows no link there (in a shared folder one may lead anywhere); "
                          "remove it")
    return path


def check_database_files(db: Path) -> None:
    """Refuse a link where SQLite keeps a database's write-ahead log or shared memory."""
    for suffix in _SQLITE_FILES:
        no_link(db.with_name(db.name + suffix))


def own_folder(db_folder: Path, *parts: str) -> Path:
    """``db_folder / parts...``, a folder kforge keeps beside a database, no step of it a link."""
    path = Path(db_folder)
    for part in parts:
        path = no_link(path / part)
    return path


def open_log(path: Path) -> BinaryIO:
    """``path`` opened to append to, made where missing (with its folder), never through a
    link."""
    no_link(path.parent).mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        no_link(path)  # the link named, where that was the reason
        raise KforgeError(f"cannot write the log {path}: {exc.strerror}") from None
    return os.fdopen(fd, "ab")
