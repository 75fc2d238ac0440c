"""Files kforge keeps beside a database: the database itself, SQLite's write-ahead log and shared
memory, the samples folder (one folder per session) and the engines' logs.

A database's folder may be someone else's (a shared folder, an unpacked archive) and hold links
that lead anywhere: a ``logs`` link would have an engine append its output to any file, a
``samples`` link would have a profile write, and ``kforge delete`` remove, under any folder, and a
``k.db-shm`` that is a hard link to one of the user's files would have SQLite write its
wal-index into that file. kforge follows none of them: a link of either kind, or anything but a
regular file, where one of these files or folders goes is refused, naming it
(``kforge.core.files``).
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from kforge.core.files import check_own, no_link, open_append

DATABASE_FILE = "kforge database file"
_SQLITE_FILES = ("-wal", "-shm", "-journal")


def check_database_files(db: Path) -> None:
    """Refuse the database, or a file where SQLite keeps its write-ahead log or shared memory,
    unless each is absent or kforge's own (a regular file with no other name, no link)."""
    check_own(db, DATABASE_FILE)
    for suffix in _SQLITE_FILES:
        check_own(db.with_name(db.name + suffix), "SQLite file")


def own_folder(db_folder: Path, *parts: str) -> Path:
    """``db_folder / parts...``, a folder kforge keeps beside a database, no step of it a link."""
    path = Path(db_folder)
    for part in parts:
        path = no_link(path / part)
    return path


def open_log(path: Path) -> BinaryIO:
    """``path`` opened to append to, made where missing (with its folder), never a link of
    either kind."""
    no_link(path.parent).mkdir(parents=True, exist_ok=True)
    return open_append(path, "log file")
