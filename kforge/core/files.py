"""Opening only kforge's own files for writing, where someone else may have put something first.

A folder kforge writes in may be someone else's too (a shared folder, an unpacked archive, an
export folder others can write): a name there may be a link, of either kind, to a file of the
user's (a hard link to ``~/.bashrc`` is a second name of that very file), or a pipe that blocks
whoever opens it. A file kforge writes is refused, naming it, unless it is absent or a regular
file with no other name (``check_own``), checked before it is opened and again on what was
opened, which is never reached through a symbolic link (``O_NOFOLLOW``). A folder kforge fills
from scratch it makes itself, private to the user (``private_folder``), and each file in it is
new (``create_new``): nothing planted there is written through.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO

from kforge.errors import KforgeError

_NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # O_NONBLOCK: a pipe never blocks


def no_link(path: Path) -> Path:
    """``path``, unless it is a symbolic link (a dangling one too): then a KforgeError naming
    it."""
    if path.is_symlink():
        raise KforgeError(f"{path} is a link: kforge keeps its own files beside a database and "
                          "follows no link there (in a shared folder one may lead anywhere); "
                          "remove it")
    return path


def check_own(path: Path, what: str = "file") -> None:
    """Refuse ``path`` for writing unless nothing is there or it is a regular file with no other
    name: a link of either kind would have kforge write into someone else's file."""
    try:
        _check_status(path, os.lstat(path), what)
    except FileNotFoundError:
        return
    except OSError as exc:  # a folder on the way that cannot be searched
        raise KforgeError(f"cannot check {path}: {exc.strerror}") from None


def plain_file(path: Path) -> bool:
    """Whether ``path`` is a regular file itself, not a link to one: what kforge reads from a
    folder others may write (a pipe there would block its reader forever)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def regular_file(path: Path, what: str) -> None:
    """Refuse what stands at ``path`` (a link followed) but is no regular file, naming ``what``:
    a folder, or a pipe, socket or device (reading one waits forever or never ends). Nothing
    there passes."""
    try:
        _check_kind(path, os.stat(path), what)
    except (FileNotFoundError, NotADirectoryError):
        return


def _check_kind(path: Path, status: os.stat_result, what: str) -> None:
    if stat.S_ISDIR(status.st_mode):
        raise KforgeError(f"{path} is a folder, not a {what}")
    if not stat.S_ISREG(status.st_mode):
        raise KforgeError(f"{path} is not a regular file (a pipe, socket or device), not a "
                          f"{what}")


def _check_status(path: Path, status: os.stat_result, what: str) -> None:
    if stat.S_ISLNK(status.st_mode):
        no_link(path)
    _check_kind(path, status, what)
    if status.st_nlink > 1:
        raise KforgeError(f"{path} is a hard link ({status.st_nlink} names for one file): kforge "
                          f"writes only its own {what}s, and this one may be another file's "
                          "name (in a shared folder, any of yours); remove it")


def open_append(path: Path, what: str) -> BinaryIO:
    """``path`` opened to append to, made where missing; refused (``check_own``) where it is
    anything but kforge's own file, before it is opened and as opened."""
    check_own(path, what)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NO_FOLLOW, 0o644)
    except OSError as exc:
        check_own(path, what)  # the reason named, where it was one
        raise KforgeError(f"cannot write the {what} {path}: {exc.strerror}") from None
    return _checked(fd, path, what, "ab")


def create_new(path: Path, what: str = "file") -> BinaryIO:
    """A new file at ``path`` to write; refused where anything is there already (a link planted
    where kforge was about to write is never written through)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NO_FOLLOW, 0o644)
    except FileExistsError:
        raise KforgeError(f"{path} is there already: kforge writes a {what} only where it made "
                          "the file itself (something else put it there); remove it") from None
    except OSError as exc:
        raise KforgeError(f"cannot write the {what} {path}: {exc.strerror}") from None
    return _checked(fd, path, what, "wb")


def write_new(path: Path, data: bytes | str, what: str = "file") -> None:
    """Write ``data`` (text as UTF-8) to a new file at ``path`` (``create_new``)."""
    with create_new(path, what) as out:
        out.write(data.encode() if isinstance(data, str) else data)


def _checked(fd: int, path: Path, what: str, mode: str) -> BinaryIO:
    try:
        _check_status(path, os.fstat(fd), what)
    except BaseException:
        os.close(fd)
        raise
    os.set_blocking(fd, True)
    return os.fdopen(fd, mode)


def private_folder(parent: Path, prefix: str) -> Path:
    """A new folder in ``parent`` named ``prefix`` and random letters, that only this user may
    enter (nobody else can put anything in it); KforgeError when ``parent`` cannot be written."""
    try:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    except OSError as exc:
        raise KforgeError(f"cannot write into {parent}: {exc.strerror}") from None
