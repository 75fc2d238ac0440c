"""A session's engine lease, and whether the engine that holds it still runs.

A store that holds a session's engine lease (``claim_engine``) belongs to that engine: a write that
finds the database locked by another process (a backup, an ``sqlite3`` shell) waits it out with
backoff for as long as it takes, saying that it waits, instead of failing the search; and each write
first checks that the lease is still its own, so an engine whose lease was taken over stops
writing at once (``LeaseLost``). Whether a recorded engine still runs is the process table's word
on its host (``/proc`` tells a reused pid from the engine's), its heartbeat's elsewhere.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import aiosqlite

from kforge.errors import KforgeError
from kforge.store.connection import Connection, StoreOptions, write_event
from kforge.store.events import CommandDone, EngineAttached, LogLine, SessionStatusChanged
from kforge.store.records import CommandKind, SessionStatus

# An engine on another host that has not written a heartbeat for this long is taken to be gone
# (on this host the process table says whether it still runs).
ENGINE_STALE_S = 20.0
# Commands only the engine they were sent to carries out. One left unread by an engine that died
# is void for the next: a `kforge resume` would otherwise stop or pause at once on a stop or pause
# sent to its dead predecessor. Prunes and focuses stand: the next engine carries them out.
FOR_THEIR_ENGINE = (CommandKind.PAUSE, CommandKind.RESUME, CommandKind.STOP)


class LeaseLost(KforgeError):
    """This store's engine lease was taken over: the engine must stop without writing more."""


@dataclass(frozen=True)
class Lease:
    session_id: int
    pid: int
    host: str


class EngineLease(Connection):
    """A connection that may hold a session's engine lease, and then writes only under it."""

    def __init__(self, db: aiosqlite.Connection, path: Path, options: StoreOptions) -> None:
        super().__init__(db, path, options)
        self._lease: Lease | None = None  # the engine lease this store holds
        self._lost: LeaseLost | None = None  # set once that lease was found taken over

    async def claim_engine(self, session_id: int, pid: int | None = None,
                           host: str | None = None) -> None:
        """Take the session's engine lease for this store (this process unless ``pid``/``host``
        say otherwise); refuse if a live engine holds it. From then on this store waits out locks
        and writes only while the lease is its own."""
        pid, host = pid or os.getpid(), host or socket.gethostname()
        async with self.transaction(patient=True) as db:
            row = await (await db.execute(
                "SELECT engine_pid, engine_host, heartbeat_at FROM sessions WHERE id = ?",
                (session_id,))).fetchone()
            if row is None:
                raise KforgeError(f"no session {session_id} in {self.path}")
            if engine_alive(row["engine_pid"], row["engine_host"], row["heartbeat_at"]):
                raise KforgeError(f"session {session_id} is already being searched by process "
                                  f"{row['engine_pid']} on {row['engine_host']}")
            await db.execute(
                "UPDATE sessions SET engine_pid = ?, engine_host = ?, heartbeat_at = ?, "
                "updated_at = ? WHERE id = ?", (pid, host, time.time(), time.time(), session_id))
            await write_event(db, session_id, EngineAttached(pid=pid, host=host))
            await _void_unread_commands(db, session_id)
        self._lease, self._lost = Lease(session_id, pid, host), None

    async def heartbeat(self, session_id: int, run_seconds: float) -> None:
        """Prove the engine is alive and record the total wall time the session was searched."""
        async with self.transaction() as db:
            await db.execute("UPDATE sessions SET heartbeat_at = ?, run_seconds = ? WHERE id = ?",
                             (time.time(), run_seconds, session_id))

    async def release_engine(self, session_id: int, status: SessionStatus, error: str = "") -> None:
        async with self.transaction() as db:
            await db.execute(
                "UPDATE sessions SET engine_pid = NULL, engine_host = NULL, heartbeat_at = NULL, "
                "status = ?, error = ?, updated_at = ? WHERE id = ?",
                (status, error, time.time(), session_id))
            await write_event(db, session_id, SessionStatusChanged(status=status, error=error))
        if self._lease is not None and self._lease.session_id == session_id:
            self._lease = None

    # ----- each write under the lease -----

    @property
    def _patient(self) -> bool:
        return self._lease is not None

    def _may_write(self) -> None:
        if self._lost is not None:
            raise self._lost

    async def _writing(self, waited_s: float) -> None:
        await self._check_lease()
        if waited_s and self._lease is not None:
            await write_event(self._db, self._lease.session_id, LogLine(
                message=f"waited {waited_s:.0f} s for another process to release the "
                        "database's write lock", level="warning"))

    async def _check_lease(self) -> None:
        """Under an engine lease, refuse to write once another engine (or a stop of an engine
        that looked dead) has taken the session over."""
        lease = self._lease
        if lease is None:
            return
        row = await (await self._db.execute(
            "SELECT engine_pid, engine_host FROM sessions WHERE id = ?",
            (lease.session_id,))).fetchone()
        if row is not None and (row["engine_pid"], row["engine_host"]) == (lease.pid, lease.host):
            return
        holder = (f"process {row['engine_pid']} on {row['engine_host']}"
                  if row is not None and row["engine_pid"] else "no engine")
        self._lost = LeaseLost(f"session {lease.session_id} is no longer searched by this "
                               f"engine (its lease is now held by {holder}); stopped writing")
        raise self._lost


async def _void_unread_commands(db: aiosqlite.Connection, session_id: int) -> None:
    """Answer the pending commands that were for the session's previous engine alone, inside the
    claim's transaction (a command sent after the claim is the new engine's)."""
    marks = ", ".join("?" * len(FOR_THEIR_ENGINE))
    cur = await db.execute(
        f"UPDATE commands SET done_at = ?, result = ? WHERE session_id = ? AND done_at IS NULL "
        f"AND kind IN ({marks}) RETURNING id, result",
        (time.time(), "not carried out: the engine it was sent to ended before reading it",
         session_id, *FOR_THEIR_ENGINE))
    voided = await cur.fetchall()
    await cur.close()
    for row in sorted(voided, key=lambda r: r["id"]):
        await write_event(db, session_id, CommandDone(command_id=row["id"], result=row["result"]))


def engine_alive(pid: int | None, host: str | None, heartbeat_at: float | None) -> bool:
    """Whether a recorded engine still runs. On this host its process decides, not the heartbeat
    (a live engine's heartbeat is late while another process holds the database lock); a process
    that started after the engine's last heartbeat only reuses its pid. On another host the
    heartbeat must be fresh."""
    if not pid or pid < 1:  # 0 and -1 would ask about process groups: no engine has them
        return False
    if host == socket.gethostname():
        return _process_runs(pid) and not _started_after(pid, heartbeat_at)
    return heartbeat_at is not None and time.time() - heartbeat_at < ENGINE_STALE_S


def _process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process; a pid beyond any there is
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    try:  # an exited child its parent has not reaped yet is no engine
        return _proc_stat(pid)[0] != "Z"
    except (OSError, ValueError, IndexError):
        return True  # no /proc here: existence is all we know


def _started_after(pid: int, moment: float | None) -> bool:
    """Whether process ``pid`` started after ``moment`` (False where that cannot be told)."""
    if moment is None:
        return False
    try:
        ticks = int(_proc_stat(pid)[19])  # starttime, in clock ticks after boot
        with open("/proc/stat") as stat:
            boot = next(float(line.split()[1]) for line in stat if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return False
    # btime is whole seconds: allow one second either way
    return boot + ticks / os.sysconf("SC_CLK_TCK") > moment + 1.0


def _proc_stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state first)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()
