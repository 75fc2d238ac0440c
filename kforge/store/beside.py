"""Files kforge keeps beside a database: the database itself, SQLite's write-ahead log and shared
memory, the samples folder (a folder per database, in it one per session) and the engines' logs.

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
SAMPLES = "samples"


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


def samples_root(db: Path) -> Path:
    """``samples/<database file name>/`` beside the database ``db``: its sessions' samples, one
    folder per session; a folder of its own, so that databases in one folder keep theirs apart."""
    return own_folder(db.parent, SAMPLES, db.name)


def legacy_samples_dir(db: Path, session_id: int) -> Path:
    """``samples/<session id>/``, where databases kept their samples before each had a folder of
    its own: read where the database's own has none, never written or removed (any database of
    that folder may have written it)."""
    return own_folder(db.parent, SAMPLES, str(session_id))


def open_log(path: Path) -> BinaryIO:
    """``path`` opened to append to, made where missing (with its folder), never a link of
    either kind."""
    no_link(path.parent).mkdir(parents=True, exist_ok=True)
    return open_append(path, "log file")
