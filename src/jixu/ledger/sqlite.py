"""The embedded SQLite store: one file, WAL, durable commits.

Connection discipline: one connection per store object, used under a lock so
the object is safe to share between threads; every write is one
``BEGIN IMMEDIATE`` transaction, so writers in other processes queue on the
database lock (up to ``busy_timeout``) and then see the head they must check.
A work claim (count the live claims, pick, claim) is one such transaction.
Commits are durable by default (``synchronous=FULL``): an append that
returned is on disk. ``synchronous="NORMAL"`` trades the last commits before a
power loss (not a process crash) for speed.

Group commit: appends that threads of one process make at the same time share
one transaction and so one fsync. Each caller queues its append; whoever holds
the connection next (the leader) takes every queued append and runs each one
inside its own ``SAVEPOINT`` of a single ``BEGIN IMMEDIATE`` transaction, in
arrival order, decided as alone (by :func:`~jixu.ledger.store.decide_append`:
ids already stored, fence, head == ``expected_seq``). An append that fails
rolls back to its savepoint and gets its own error; the others go on. After ``COMMIT`` returns every caller in
the group is told its result, so no append returns before its own commit is
durable. A lone append runs exactly as before (no savepoint). See
docs/decisions/0007-group-commit.md.

A group of several appends first takes a batched path with the same checks
and answers: a few statements read every head, stored id and lease the group
needs, each append is decided in order in memory (by the same
``decide_append``, each seeing the heads the earlier ones moved), and the
accepted rows and heads are written with one ``executemany`` each, without
savepoints. Should a write fail anyway, the transaction is rolled back and the
group runs again one savepoint per append, as above. A ``COMMIT`` that fails
answers each append it carried with :class:`~jixu.errors.OutcomeUnknown`.

Writers of several processes take turns through a lock file beside the database (``<file>-jixu-writers``,
:class:`WriterGate`) before they ask SQLite for its write lock: SQLite's own wait for a busy lock sleeps
for up to 100 ms at a time, so a process whose writes follow each other closely kept the lock for hundreds
of milliseconds while another process's writes slept (decision 0062).

Before its first append a store grows a short WAL file to the length the log
reaches between SQLite's automatic checkpoints (decision 0018): a durable
commit that extends the file costs the file system a metadata write as well.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import os
import sqlite3
import stat
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from jixu.errors import (
    FencingError,
    InvalidInput,
    JixuError,
    NotFound,
    OutcomeUnknown,
    SchemaTooNew,
    StoreError,
    StoreLocked,
    StoreNotFound,
    StoreReadOnly,
)
from jixu.ledger.chain import VerifyReport, verify_tuples
from jixu.ledger.event import (
    GENESIS_HASH,
    Event,
    PreparedEvent,
    StoredRow,
    events_from_stream_rows,
    utc_now_text,
)
from jixu.ledger.store import (
    SESSION_RETENTION,
    AlreadyStored,
    AppendRequest,
    Checkpoint,
    ClaimOrder,
    Fence,
    Lease,
    LeaseChange,
    QueueCensus,
    Session,
    Store,
    StreamInfo,
    WorkChange,
    WorkClaim,
    WorkItem,
    WorkRow,
    claimed_row,
    claims_up_to,
    decide_append,
    each_change,
    group_of_meta,
    renewal_answers,
    served_groups,
    work_claim_of,
)

try:
    import fcntl
except ImportError:  # not a POSIX system: writers wait on SQLite's lock alone
    fcntl = None  # type: ignore[assignment]

Synchronous = Literal["FULL", "NORMAL", "EXTRA"]

_T = TypeVar("_T")
_CHUNK = 4096
_EVENT_CHUNK = 256
_IN_CHUNK = 500  # values bound in one IN list: far below SQLITE_MAX_VARIABLE_NUMBER (999 before SQLite 3.32)
_ROW_COLUMNS = "id, stream, seq, type, data, meta, recorded_at, prev_hash, hash"
_EVENT_COLUMNS = "id, seq, type, data, meta, recorded_at, prev_hash, hash"
_NOW_EXPR = "(julianday('now') - 2440587.5) * 86400.0"
_NOW_SQL = f"SELECT {_NOW_EXPR}"
_WAL_FRAMES = 1000
"""Pages the WAL holds before SQLite's automatic checkpoint (its default) restarts the log from its start."""

MIGRATIONS: list[tuple[int, str, tuple[str, ...]]] = [
    (
        1,
        "events, streams, leases, checkpoints; events immutable by trigger",
        (
            """CREATE TABLE jixu_streams (
                stream       TEXT PRIMARY KEY,
                head_seq     INTEGER NOT NULL,
                head_hash    TEXT NOT NULL,
                genesis_hash TEXT NOT NULL,
                created_at   TEXT NOT NULL
            ) WITHOUT ROWID""",
            """CREATE TABLE jixu_events (
                position    INTEGER PRIMARY KEY,
                id          TEXT NOT NULL UNIQUE,
                stream      TEXT NOT NULL,
                seq         INTEGER NOT NULL CHECK (seq >= 1),
                type        TEXT NOT NULL,
                data        TEXT NOT NULL,
                meta        TEXT NOT NULL,
                recorded_at TEXT NOT NULL,
                prev_hash   TEXT NOT NULL,
                hash        TEXT NOT NULL,
                UNIQUE (stream, seq)
            )""",
            """CREATE TRIGGER jixu_events_no_update BEFORE UPDATE ON jixu_events
            BEGIN SELECT RAISE(ABORT, 'jixu: events are immutable; UPDATE is refused'); END""",
            """CREATE TRIGGER jixu_events_no_delete BEFORE DELETE ON jixu_events
            BEGIN SELECT RAISE(ABORT, 'jixu: events are immutable; DELETE is refused'); END""",
            """CREATE TABLE jixu_leases (
                key          TEXT PRIMARY KEY,
                owner        TEXT,
                epoch        INTEGER NOT NULL,
                expires_at   REAL NOT NULL,
                heartbeat_at REAL NOT NULL,
                released     INTEGER NOT NULL
            ) WITHOUT ROWID""",
            """CREATE TABLE jixu_checkpoints (
                stream          TEXT NOT NULL,
                name            TEXT NOT NULL,
                seq             INTEGER NOT NULL,
                reducer_version INTEGER NOT NULL,
                head_hash       TEXT NOT NULL,
                state           TEXT NOT NULL,
                digest          TEXT NOT NULL,
                created_at      TEXT NOT NULL,
                PRIMARY KEY (stream, name)
            ) WITHOUT ROWID""",
        ),
    ),
    (
        2,
        "work queue: durable work items with fenced claims",
        (
            """CREATE TABLE jixu_work (
                position     INTEGER PRIMARY KEY,
                key          TEXT NOT NULL UNIQUE,
                project      TEXT NOT NULL,
                status       TEXT NOT NULL CHECK (status IN ('pending', 'claimed', 'done')),
                ready_at     REAL NOT NULL,
                enqueued_at  REAL NOT NULL,
                claimed_by   TEXT,
                epoch        INTEGER NOT NULL,
                expires_at   REAL,
                heartbeat_at REAL,
                rerun        INTEGER NOT NULL
            )""",
            "CREATE INDEX jixu_work_ready ON jixu_work (project, ready_at, position) WHERE status <> 'done'",
            "CREATE INDEX jixu_work_claims ON jixu_work (status, expires_at)",
            """CREATE TABLE jixu_work_projects (
                project         TEXT PRIMARY KEY,
                last_claim      INTEGER NOT NULL,
                last_claimed_at REAL NOT NULL,
                claims          INTEGER NOT NULL
            ) WITHOUT ROWID""",
        ),
    ),
    (
        3,
        "sessions, credential use, streams indexed by the project their first event names",
        (
            """CREATE TABLE jixu_sessions (
                key        TEXT PRIMARY KEY,
                subject    TEXT NOT NULL,
                created_at REAL NOT NULL,
                expires_at REAL NOT NULL,
                revoked_at REAL
            ) WITHOUT ROWID""",
            "CREATE INDEX jixu_sessions_subject ON jixu_sessions (subject)",
            "CREATE INDEX jixu_sessions_expiry ON jixu_sessions (expires_at)",
            """CREATE TABLE jixu_last_used (
                key     TEXT PRIMARY KEY,
                used_at REAL NOT NULL
            ) WITHOUT ROWID""",
            "ALTER TABLE jixu_streams ADD COLUMN project TEXT",
            # Streams made before: meta.project of the first event (the rule of group_of_meta), and for a
            # thread what jixu recorded until now, its metadata's project ("default" when it names none).
            """UPDATE jixu_streams SET project = (
                SELECT CASE
                    WHEN json_type(e.meta, '$.project') = 'text'
                         AND length(json_extract(e.meta, '$.project')) BETWEEN 1 AND 100
                        THEN json_extract(e.meta, '$.project')
                    WHEN jixu_streams.stream LIKE 'thread/%' AND json_type(e.data, '$.metadata.project') IS NULL
                        THEN 'default'
                    WHEN jixu_streams.stream LIKE 'thread/%' AND json_type(e.data, '$.metadata.project') = 'text'
                         AND length(json_extract(e.data, '$.metadata.project')) BETWEEN 1 AND 100
                        THEN json_extract(e.data, '$.metadata.project')
                END
                FROM jixu_events e WHERE e.stream = jixu_streams.stream AND e.seq = 1)""",
            "CREATE INDEX jixu_streams_project ON jixu_streams (project, stream) WHERE project IS NOT NULL",
        ),
    ),
]
SCHEMA_VERSION = MIGRATIONS[-1][0]
# The column ``project`` holds an item's group (its name from schema version 2; renaming it would stop the workers
# of older versions sharing a store), and ``jixu_work_projects`` each group's latest claim.
_STREAM_COLUMNS = "stream, head_seq, head_hash, genesis_hash, created_at, project"
_INSERT_STREAMS = f"INSERT INTO jixu_streams ({_STREAM_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"
_SESSION_COLUMNS = "key, subject, created_at, expires_at, revoked_at"
_WORK_COLUMNS = ("key, project, status, ready_at, enqueued_at, claimed_by, epoch, expires_at, heartbeat_at, "
                 "rerun, position")
_CLAIMABLE = "((status = 'pending' AND ready_at <= :now) OR (status = 'claimed' AND expires_at <= :now))"


def _translate(exc: sqlite3.Error, path: str) -> StoreError:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return StoreLocked(f"{path}: the database stayed locked by another connection past the busy "
                           "timeout; retry, or raise busy_timeout", path=path)
    if "readonly" in text or "read-only" in text:
        return StoreReadOnly(f"{path}: the database is read-only; open it writable to append", path=path)
    if isinstance(exc, sqlite3.IntegrityError):
        return StoreError(f"{path}: the store's tables disagree ({text}); run `jixu verify {path}`",
                          path=path)
    if "not a database" in text or "malformed" in text:
        return StoreError(f"{path}: not a jixu SQLite database or the file is damaged ({text})", path=path)
    return StoreError(f"{path}: {text}", path=path)


def _commit(conn: sqlite3.Connection, path: str, what: str) -> None:
    """``COMMIT``; if it fails, raise :class:`OutcomeUnknown`, never a "nothing was stored".

    A commit can fail after its WAL frames were written (the fsync failed, say):
    recovery may then keep it, so neither answer is known to be true.
    """
    try:
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        if conn.in_transaction:  # SQLite kept it open: give the connection back without it
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise OutcomeUnknown(
            f"{path}: the commit of {what} failed ({exc}), so whether it was stored is unknown; read it back "
            "before going on (appending the same batch again is a no-op if it was stored)", path=path) from exc


def _insert_rows(conn: sqlite3.Connection, rows: list[StoredRow]) -> None:
    """Insert sealed rows into ``jixu_events`` (one statement for all of them)."""
    conn.executemany(
        f"INSERT INTO jixu_events ({_ROW_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(r.id, r.stream, r.seq, r.type, r.data_json, r.meta_json, r.recorded_at, r.prev_hash, r.hash) for r in rows],
    )


def _select_in(conn: sqlite3.Connection, sql: str, values: list[str]) -> list[Any]:
    """The rows of ``sql`` (ending in ``IN``) over ``values``, at most ``_IN_CHUNK`` bound values per statement.

    Fetched whole: a statement left unfinished would keep its connection in its snapshot."""
    rows: list[Any] = []
    for start in range(0, len(values), _IN_CHUNK):
        chunk = values[start:start + _IN_CHUNK]
        rows.extend(conn.execute(f"{sql} ({','.join('?' * len(chunk))})", chunk).fetchall())
    return rows


class WriterGate:
    """The turn of this store's writers among every process writing the same file (decision 0062).

    A lock file beside the database (``<file>-jixu-writers``, by the file's real path; made with the database
    file's permissions, as SQLite makes ``-wal`` and ``-shm``), locked with ``flock`` around each write
    transaction, before SQLite's own write lock is asked for. SQLite's wait for a busy lock sleeps 1, 2, 5,
    10, ... and then 100 ms between tries, so a writer that commits again as soon as it committed keeps the
    lock while the others sleep: with two worker processes on one file, one ran its turns for hundreds of
    milliseconds while the other's waited on their commits. Here a waiting writer asks again after at most
    :data:`GATE_POLL_MAX` seconds, so it gets the lock within about that of the holder's next pause.

    The gate only orders writers; SQLite's lock still guards the file. A writer that is not jixu, a lock file
    that cannot be opened (a read-only directory, a symlink or anything but a regular file in its place:
    :attr:`problem` says why) or a system without ``flock`` go by SQLite's lock alone. A writer still waiting
    after ``timeout`` goes on to SQLite's lock, which waits up to its own ``busy_timeout`` as before, and this
    store then writes without the gate for :data:`GATE_SKIP` seconds: a holder that hangs costs one wait,
    never a hang. The lock is released when its holder's process ends (SIGKILL included); a child forked
    from a process (without exec) closes its copy of the lock file at once, so it can neither hold nor keep
    the parent's turn.
    """

    __slots__ = ("__weakref__", "_fd", "_skip_until", "path", "problem")

    def __init__(self, database: str, *, writes: bool = True) -> None:
        self.path = f"{os.path.realpath(database)}-jixu-writers"
        self._fd: int | None = None
        self._skip_until = 0.0
        self.problem: str | None = None
        """Why writers here go by SQLite's lock alone (None while the gate is in use)."""
        if not writes:
            self.problem = "a read-only store does not write"
        elif fcntl is None:
            self.problem = "this system has no flock"
        else:
            try:
                self._fd = _open_gate(self.path, database)
            except OSError as error:
                self.problem = f"the lock file {self.path} cannot be used: {error.strerror or error}"
            else:
                _GATES.add(self)

    @property
    def active(self) -> bool:
        """Whether writers here take turns through the lock file (False: by SQLite's lock alone)."""
        return self._fd is not None

    @contextlib.contextmanager
    def turn(self, timeout: float) -> Iterator[None]:
        """Hold the gate while the body runs (waiting at most ``timeout`` seconds for it, then going on)."""
        fd = self._fd
        held = False
        if fd is not None and time.monotonic() >= self._skip_until:
            held = _take_turn(fd, timeout)
            if not held:
                self._skip_until = time.monotonic() + GATE_SKIP
        try:
            yield
        finally:
            if held:
                assert fd is not None and fcntl is not None
                fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the lock file (a turn held is given up)."""
        fd, self._fd = self._fd, None
        _GATES.discard(self)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


GATE_POLL_MIN = 0.00005
GATE_POLL_MAX = 0.001
"""How long a writer waiting for its turn sleeps between tries: from 50 us, doubling, up to 1 ms."""
GATE_SKIP = 60.0
"""Seconds a store writes without the gate after it could not take it within its ``busy_timeout``."""
_GATES: weakref.WeakSet[WriterGate] = weakref.WeakSet()


def _open_gate(path: str, database: str) -> int:
    """The lock file's descriptor: made with the database file's permissions if missing, never through a
    symlink; writable if it can be, else read-only (``flock`` needs no more). Raises OSError."""
    flags = os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | flags, 0o600)
    except FileExistsError:
        try:
            fd = os.open(path, os.O_RDWR | flags)
        except PermissionError:  # another user's file: a lock needs no write access
            fd = os.open(path, os.O_RDONLY | flags)
    else:
        # SQLite makes -wal and -shm with the database file's permissions: whoever may write it may take turns.
        with contextlib.suppress(OSError):
            os.fchmod(fd, stat.S_IMODE(os.stat(database).st_mode) & 0o666)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    return fd


def _close_gates_in_child() -> None:
    """After ``fork()`` (no exec): close the child's copies of every gate's lock file. The lock belongs to the open
    file description the parent shares: a child keeping it would keep the parent's turn after the parent died."""
    for gate in list(_GATES):
        gate.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_gates_in_child)


def _take_turn(fd: int, timeout: float) -> bool:
    """``flock(fd, LOCK_EX)`` tried until it holds (True) or ``timeout`` passed (False)."""
    assert fcntl is not None
    pause, deadline = GATE_POLL_MIN, None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        except OSError:
            return False  # a lock file that cannot be locked (some network file systems): SQLite's lock alone
        now = time.monotonic()
        if deadline is None:
            deadline = now + timeout
        elif now >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, GATE_POLL_MAX)


@dataclasses.dataclass(slots=True, eq=False)
class _QueuedAppend:
    """One caller's append waiting for a group commit (filled in by the leader that commits it)."""

    stream: str
    batch: list[PreparedEvent]
    expected_seq: int
    fence: Fence | None
    genesis_hash: str
    work: tuple[str, Callable[[WorkRow | None, float], WorkRow]] | None = None
    """A work item's key and change committed with the append (``append_and_enqueue``), or None."""
    done: bool = False
    rows: list[StoredRow] | None = None
    error: BaseException | None = None


class SQLiteStore(Store):
    """The embedded default store. ``path`` is a file path (created if missing).

    ``commit_count`` and ``append_count`` count the append transactions and the
    appends they carried (their ratio shows how much group commit shared).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "FULL",
        busy_timeout: float = 10.0,
        read_only: bool = False,
        create: bool = True,
        max_payload_bytes: int | None = None,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise InvalidInput(f"synchronous must be FULL, NORMAL or EXTRA, not {synchronous!r}",
                               field="synchronous")
        if isinstance(busy_timeout, bool) or not isinstance(busy_timeout, int | float) or busy_timeout < 0:
            raise InvalidInput(f"busy_timeout {busy_timeout!r} must be a number of seconds >= 0",
                               field="busy_timeout")
        self.path = str(Path(path))
        self.url = f"sqlite:///{self.path}"
        self._opened_again = functools.partial(
            SQLiteStore, os.path.abspath(path), synchronous=synchronous, busy_timeout=busy_timeout,
            read_only=read_only, create=False, max_payload_bytes=max_payload_bytes)
        self.synchronous = synchronous
        self.durability = f"synchronous={synchronous}"
        self.read_only = read_only
        if max_payload_bytes is not None:
            self.max_payload_bytes = max_payload_bytes
        self._lock = threading.Lock()
        self._queue: deque[_QueuedAppend] = deque()
        self._queue_lock = threading.Lock()
        self.commit_count = 0
        self.append_count = 0
        self._closed = False
        self._wal_grown = False
        """Whether the WAL was grown (or found long enough) before this store's first append (decision 0018)."""
        self._busy_timeout_ms = int(busy_timeout * 1000)
        exists = os.path.exists(self.path)
        if not exists and (read_only or not create):
            raise StoreNotFound(f"{self.path}: no such database (nothing was created)",
                                path=self.path)
        try:
            if read_only:
                uri = f"{Path(self.path).resolve().as_uri().replace('file://', 'file:', 1)}?mode=ro"
                self._conn = sqlite3.connect(uri, uri=True, isolation_level=None,
                                             check_same_thread=False, timeout=busy_timeout)
            else:
                self._conn = sqlite3.connect(self.path, isolation_level=None,
                                             check_same_thread=False, timeout=busy_timeout)
        except sqlite3.Error as exc:
            raise _translate(exc, self.path) from exc
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            if not read_only and not create and self._installed_version(self._conn) == 0:
                # An empty file (or another program's database) is not a jixu store: not made one by a reader.
                raise StoreNotFound(f"{self.path} holds no jixu schema and create=False (nothing was created)",
                                    path=self.path)
            if not read_only:
                self._ensure_wal(busy_timeout)
            self._conn.execute(f"PRAGMA synchronous = {synchronous}")
            self._migrate()
        except sqlite3.Error as exc:
            self._conn.close()
            raise _translate(exc, self.path) from exc
        except StoreError:
            self._conn.close()
            raise
        self._read_lock = threading.Lock()
        self._reader: sqlite3.Connection | None = None if read_only else self._open_reader(busy_timeout)
        self.writer_gate = WriterGate(self.path, writes=not read_only)
        """How this store's writers take turns with other processes' (inactive for a read-only store)."""

    def _open_reader(self, busy_timeout: float) -> sqlite3.Connection:
        """The connection reads go through (:meth:`_read`), never written with (``query_only``)."""
        try:
            reader = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=busy_timeout)
        except sqlite3.Error as exc:
            self._conn.close()
            raise _translate(exc, self.path) from exc
        try:
            reader.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            reader.execute("PRAGMA query_only = ON")
            reader.execute("SELECT count(*) FROM jixu_streams WHERE stream = ''").fetchone()  # opens the WAL now
        except sqlite3.Error as exc:
            reader.close()
            self._conn.close()
            raise _translate(exc, self.path) from exc
        return reader

    # --- plumbing -------------------------------------------------------------------

    def _ensure_wal(self, busy_timeout: float) -> None:
        """Switch the file to WAL once; the mode persists in the file.

        Changing the journal mode reports "locked" at once, without waiting on
        the busy handler, while another process is opening the same new file,
        so the switch is retried here until ``busy_timeout``.
        """
        deadline = time.monotonic() + busy_timeout
        while True:
            try:
                mode = str(self._conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
                if mode != "wal":
                    mode = str(self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower()
                if mode != "wal":
                    raise StoreError(f"{self.path}: could not switch the database to WAL mode ({mode})")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.005)

    def _run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``fn`` under the connection lock, translating sqlite errors."""
        if self._closed:
            raise StoreError(f"{self.path}: the store is closed")
        with self._lock:
            try:
                return fn(self._conn)
            except sqlite3.Error as exc:
                raise _translate(exc, self.path) from exc

    def opened_again(self) -> SQLiteStore:
        """The same file, by the absolute path it had when this store was opened, with the same options."""
        return self._opened_again()

    def _read(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``fn`` (reads only) on the read connection, translating sqlite errors.

        A read never waits behind a commit: the writing connection holds its lock through a commit's fsync, while
        a WAL reader sees the last committed state concurrently with the writer (every statement of ``fn`` starts
        from a state at least as new as any commit that returned before it). A read-only store has one connection.
        """
        reader = self._reader
        if reader is None:
            return self._run(fn)
        with self._read_lock:
            if self._closed:
                raise StoreError(f"{self.path}: the store is closed")
            try:
                return fn(reader)
            except sqlite3.Error as exc:
                raise _translate(exc, self.path) from exc
            finally:
                if reader.in_transaction:  # a snapshot ``fn`` began and did not end: later reads must see new commits
                    reader.execute("ROLLBACK")

    def _write(self, fn: Callable[[sqlite3.Connection], _T], *, sync: bool = True) -> _T:
        """Run ``fn`` inside one ``BEGIN IMMEDIATE`` transaction (rolled back on any error).

        ``sync=False`` commits without waiting for the disk (``synchronous =
        NORMAL`` for this transaction; decision 0017): for writes whose loss in
        a power failure is harmless, because the next durable commit of this
        file syncs the log up to and including them first.
        """
        if self.read_only:
            raise StoreReadOnly(f"{self.path}: opened read-only; open it writable to change it",
                                path=self.path)
        lazy = not sync and self.synchronous != "NORMAL"

        def transaction(conn: sqlite3.Connection) -> _T:
            if lazy:
                conn.execute("PRAGMA synchronous = NORMAL")
            try:
                with self.writer_gate.turn(self._busy_timeout_ms / 1000):
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        result = fn(conn)
                    except BaseException:
                        if conn.in_transaction:
                            conn.execute("ROLLBACK")
                        raise
                    _commit(conn, self.path, "this write")
                    return result
            finally:
                if lazy:
                    conn.execute(f"PRAGMA synchronous = {self.synchronous}")

        return self._run(transaction)

    def _installed_version(self, conn: sqlite3.Connection) -> int:
        has_table = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'jixu_schema'"
        ).fetchone()
        if not has_table:
            return 0
        row = conn.execute("SELECT max(version) FROM jixu_schema").fetchone()
        return int(row[0] or 0)

    def _check_version(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{self.path} has schema version {version}, newer than this jixu understands "
                f"({SCHEMA_VERSION}); upgrade jixu to open it",
                found=version,
                supported=SCHEMA_VERSION,
            )

    def _migrate(self) -> None:
        conn = self._conn
        version = self._installed_version(conn)
        self._check_version(version)
        if version == SCHEMA_VERSION:
            return
        if self.read_only:
            if version == 0:
                raise StoreError(f"{self.path} is not a jixu database (no schema table)", path=self.path)
            raise StoreReadOnly(f"{self.path} needs a schema migration; open it writable once",
                                path=self.path)
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = self._installed_version(conn)  # another process may have migrated meanwhile
            self._check_version(version)
            if version == 0:
                has_tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
                if has_tables:
                    raise StoreError(f"{self.path} holds other tables and is not a jixu database",
                                     path=self.path)
                conn.execute("CREATE TABLE jixu_schema (version INTEGER PRIMARY KEY, "
                             "applied_at TEXT NOT NULL, description TEXT NOT NULL)")
            for number, description, statements in MIGRATIONS:
                if number <= version:
                    continue
                for statement in statements:
                    conn.execute(statement)
                conn.execute("INSERT INTO jixu_schema VALUES (?, ?, ?)", (number, utc_now_text(), description))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def schema_version(self) -> int:
        return self._run(self._installed_version)

    def now(self) -> float:
        return self._read(lambda conn: float(conn.execute(_NOW_SQL).fetchone()[0]))

    def close(self) -> None:
        with self._lock, self._read_lock:
            if not self._closed:
                self._closed = True
                self._conn.close()
                if self._reader is not None:
                    self._reader.close()
                self.writer_gate.close()

    # --- events ---------------------------------------------------------------------

    def _append(
        self,
        stream: str,
        batch: list[PreparedEvent],
        expected_seq: int,
        fence: Fence | None,
        genesis_hash: str,
    ) -> list[StoredRow]:
        if self.read_only:
            raise StoreReadOnly(f"{self.path}: opened read-only; open it writable to change it",
                                path=self.path)
        if self._closed:
            raise StoreError(f"{self.path}: the store is closed")
        request = _QueuedAppend(stream, batch, expected_seq, fence, genesis_hash)
        self._commit_queued([request])
        if request.error is not None:
            raise request.error
        assert request.rows is not None
        return request.rows

    def _commit_queued(self, requests: list[_QueuedAppend]) -> None:
        """Queue ``requests`` and wait until a commit answered each (its rows or its own error).

        Whoever takes the lock first while some are unanswered leads: it commits
        everything queued so far, its own and other callers', in one transaction.
        """
        with self._queue_lock:
            self._queue.extend(requests)
        with self._lock:
            if all(request.done for request in requests):
                return
            with self._queue_lock:
                group = list(self._queue)
                self._queue.clear()
            try:
                self._commit_group(group)
            except Exception:
                # The group failed as a whole: each request has its own error, unless it failed before saying so.
                if any(request.error is None for request in requests):
                    raise

    def append_many(self, requests: Sequence[AppendRequest]) -> list[list[Event] | JixuError]:
        """Commit the appends in one transaction (one fsync), each all or nothing with its own answer."""
        results: list[list[Event] | JixuError | None] = [None] * len(requests)
        queued: list[tuple[int, _QueuedAppend]] = []
        for index, request in enumerate(requests):
            try:
                batch = self._prepare_append(request.stream, request.events, request.expected_seq, request.fence,
                                             request.genesis_hash)
            except JixuError as refused:
                results[index] = refused
                continue
            queued.append((index, _QueuedAppend(request.stream, batch, request.expected_seq, request.fence,
                                                request.genesis_hash or GENESIS_HASH)))
        if queued:
            if self.read_only:
                raise StoreReadOnly(f"{self.path}: opened read-only; open it writable to change it", path=self.path)
            self._commit_queued([pending for _index, pending in queued])
            for index, pending in queued:
                failure = pending.error
                if failure is not None:
                    results[index] = failure if isinstance(failure, JixuError) else StoreError(
                        f"{self.path}: {type(failure).__name__}: {failure}", path=self.path)
                else:
                    assert pending.rows is not None
                    results[index] = [row.to_event() for row in pending.rows]
        return [result for result in results if result is not None]

    def _grow_wal(self, conn: sqlite3.Connection) -> None:
        """Grow a short WAL file to :data:`_WAL_FRAMES` pages and restart the log at its start (decision 0018).

        A durable commit that extends the WAL file also makes the file system
        write the file's new size (measured here: ~0.2 ms per commit instead
        of ~0.1), for the first ~1,000 pages after every open, since SQLite
        deletes the WAL when the last connection closes. So once per store,
        before its first append: empty transactions (each sets
        ``user_version`` to another value and back, which dirties one page
        and commits it unchanged) are committed with ``synchronous = OFF`` and
        the automatic checkpoint off (none of them needs to survive anything,
        and no real page is checkpointed unsynced), then one checkpoint runs at
        the store's own setting; the next commit restarts the log at its start
        and overwrites blocks the file already has. No committed state ever
        differs from the one before, so a kill at any point leaves nothing
        changed. Another writer (a busy lock) or any SQLite error stops it
        quietly: it changes only speed.
        """
        self._wal_grown = True
        try:
            size = os.path.getsize(f"{self.path}-wal")
        except OSError:
            size = 0
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
        frames = _WAL_FRAMES - size // (page_size + 24)  # a WAL frame: a 24-byte header and a page
        if frames <= 0:
            return
        autocheckpoint = int(conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0])
        try:
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            conn.execute("PRAGMA synchronous = OFF")
            for _frame in range(frames):
                conn.execute("BEGIN IMMEDIATE")  # busy at once while another writer holds the lock: stop
                try:
                    # Read under the lock: another writer's value is the one set back.
                    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
                    conn.execute(f"PRAGMA user_version = {version + 1 if version < 2**31 - 1 else version - 1}")
                    conn.execute(f"PRAGMA user_version = {version}")
                    conn.execute("COMMIT")
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    raise
        except sqlite3.Error:
            pass
        finally:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            conn.execute(f"PRAGMA wal_autocheckpoint = {autocheckpoint}")
            with contextlib.suppress(sqlite3.Error):
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def _commit_group(self, group: list[_QueuedAppend]) -> None:
        """Run ``group``'s appends in one transaction; tell each its rows or error after COMMIT (lock held)."""
        with self.writer_gate.turn(self._busy_timeout_ms / 1000):
            self._commit_group_in_turn(group)

    def _commit_group_in_turn(self, group: list[_QueuedAppend]) -> None:
        conn = self._conn
        rows: list[list[StoredRow] | None] = [None] * len(group)
        errors: list[BaseException | None] = [None] * len(group)
        try:
            if self._closed:
                raise StoreError(f"{self.path}: the store is closed")
            if not self._wal_grown:
                self._grow_wal(conn)
            conn.execute("BEGIN IMMEDIATE")
            try:
                if len(group) == 1:
                    rows[0] = self._append_with_work(conn, group[0])
                else:
                    try:
                        batched = self._append_batched(conn, group, rows, errors)
                    except sqlite3.Error:
                        # Not expected (every check was made before the writes, under the write lock): undo the
                        # batch and run the group again one savepoint per append, so each gets its own answer.
                        if conn.in_transaction:
                            conn.execute("ROLLBACK")
                        conn.execute("BEGIN IMMEDIATE")
                        rows[:] = [None] * len(group)
                        errors[:] = [None] * len(group)
                        batched = False
                    if not batched:
                        self._append_each(conn, group, rows, errors)
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            _commit(conn, self.path,
                    "this append" if len(group) == 1 else "the group of appends carrying this one")
            self.commit_count += 1
            self.append_count += len(group)
        except BaseException as exc:
            # The group failed: every append in it fails, each with its own error object. Before COMMIT nothing
            # of it was stored (rolled back); a failed COMMIT leaves that unknown (OutcomeUnknown).
            failure = _translate(exc, self.path) if isinstance(exc, sqlite3.Error) else exc
            for index in range(len(group)):
                rows[index] = None
                if len(group) == 1:
                    errors[index] = failure
                elif errors[index] is None and isinstance(failure, OutcomeUnknown):
                    errors[index] = OutcomeUnknown(failure.message, path=self.path)
                elif errors[index] is None:
                    errors[index] = StoreError(f"{self.path}: the shared commit of this append failed and "
                                               f"nothing of it was stored ({type(failure).__name__}: {failure})",
                                               path=self.path)
            self._finish(group, rows, errors)
            if failure is exc:
                raise
            raise failure from exc
        self._finish(group, rows, errors)

    def _append_with_work(self, conn: sqlite3.Connection, request: _QueuedAppend) -> list[StoredRow]:
        """``request``'s append, and its work item's change if it carries one, inside the open transaction."""
        rows = self._append_in(conn, request)
        if request.work is not None:
            self._work_in(conn, *request.work)
        return rows

    def _append_each(self, conn: sqlite3.Connection, group: list[_QueuedAppend], rows: list[list[StoredRow] | None],
                     errors: list[BaseException | None]) -> None:
        """Run ``group``'s appends one by one, each in its own savepoint; fill in ``rows`` and ``errors``."""
        for index, request in enumerate(group):
            conn.execute("SAVEPOINT jixu_append")
            try:
                rows[index] = self._append_with_work(conn, request)
            except (JixuError, sqlite3.Error) as exc:
                # This append alone is undone; the others in the group go on.
                conn.execute("ROLLBACK TO jixu_append")
                errors[index] = _translate(exc, self.path) if isinstance(exc, sqlite3.Error) else exc
            conn.execute("RELEASE jixu_append")

    def _append_batched(self, conn: sqlite3.Connection, group: list[_QueuedAppend],
                        rows: list[list[StoredRow] | None], errors: list[BaseException | None]) -> bool:
        """Run ``group``'s appends with a few statements for all of them instead of ~5 each.

        Reads every head, stored id and lease the checks need at once, decides
        each append in order as :meth:`_append_in` would (a stream's head moves
        in memory as its appends are accepted, so a later append to it sees the
        earlier one), then writes the accepted rows and heads with one
        ``executemany`` each; fills in ``rows`` and ``errors``. Returns False,
        having run nothing, when an event id is in two appends of the group
        (the second must see the first's rows; the savepoint path does). On a
        ``sqlite3.Error`` the transaction is half written: the caller rolls back.
        """
        ids: list[str] = []
        streams: dict[str, None] = {}
        keys: dict[str, None] = {}
        for request in group:
            ids.extend(prepared.id for prepared in request.batch)
            streams[request.stream] = None
            if request.fence is not None:
                keys[request.fence.key] = None
        if len(set(ids)) != len(ids) or any(request.work is not None for request in group):
            return False  # the same id twice, or a queue row to change: one savepoint per append
        heads: dict[str, tuple[int, str]] = {
            stream: (seq, digest) for stream, seq, digest in
            _select_in(conn, "SELECT stream, head_seq, head_hash FROM jixu_streams WHERE stream IN", list(streams))}
        stored = {found[0] for found in _select_in(conn, "SELECT id FROM jixu_events WHERE id IN", ids)}
        leases: dict[str, Lease] = {}
        now = 0.0
        if keys:
            leases = {row[0]: Lease(row[0], row[1], row[2], row[3], row[4], bool(row[5])) for row in _select_in(
                conn, "SELECT key, owner, epoch, expires_at, heartbeat_at, released FROM jixu_leases WHERE key IN",
                list(keys))}
            now = float(conn.execute(_NOW_SQL).fetchone()[0])
        existed = set(heads)
        moved: dict[str, None] = {}  # streams that were there and took events, in order
        created: dict[str, tuple[str, str, str | None]] = {}  # new streams -> genesis_hash, created_at, project
        new_rows: list[StoredRow] = []
        recorded_at = utc_now_text()  # one commit, one time
        for index, request in enumerate(group):
            stream, batch, fence = request.stream, request.batch, request.fence
            found: dict[str, StoredRow] = {}
            if stored and any(prepared.id in stored for prepared in batch):
                # A retry or a clash (rare): the same read as alone, so the same rows and the same error text.
                batch_ids = [prepared.id for prepared in batch]
                found = {row[0]: StoredRow(*row) for row in conn.execute(
                    f"SELECT {_ROW_COLUMNS} FROM jixu_events WHERE id IN ({','.join('?' * len(batch_ids))})",
                    batch_ids)}
            # heads holds this group's accepted appends too: a later append to a stream sees the earlier ones.
            verdict = decide_append(stream, batch, request.expected_seq, fence, found=found,
                                    lease=leases.get(fence.key) if fence is not None else None, now=now,
                                    head=heads.get(stream), genesis_hash=request.genesis_hash,
                                    recorded_at=recorded_at)
            if isinstance(verdict, JixuError):
                errors[index] = verdict
                continue
            sealed = rows[index] = verdict
            if isinstance(verdict, AlreadyStored):
                continue
            new_rows.extend(sealed)
            heads[stream] = (sealed[-1].seq, sealed[-1].hash)
            if stream in existed:
                moved[stream] = None
            else:
                created.setdefault(stream, (request.genesis_hash, recorded_at, group_of_meta(sealed[0].meta_json)))
        if new_rows:
            _insert_rows(conn, new_rows)
        if moved:
            conn.executemany("UPDATE jixu_streams SET head_seq = ?, head_hash = ? WHERE stream = ?",
                             [(*heads[stream], stream) for stream in moved])
        if created:
            conn.executemany(_INSERT_STREAMS, [(stream, *heads[stream], genesis_hash, created_at, group)
                                               for stream, (genesis_hash, created_at, group) in created.items()])
        return True

    @staticmethod
    def _finish(group: list[_QueuedAppend], rows: list[list[StoredRow] | None],
                errors: list[BaseException | None]) -> None:
        for request, stored, error in zip(group, rows, errors, strict=True):
            request.rows, request.error = stored, error
            request.done = True

    def _append_after(self, stream: str, expected_seq: int, fence: Fence | None,
                      build: Callable[[list[StoredRow], int], list[PreparedEvent]]
                      ) -> tuple[list[StoredRow], list[StoredRow]]:
        if self._closed:
            raise StoreError(f"{self.path}: the store is closed")

        def transaction(conn: sqlite3.Connection) -> tuple[list[StoredRow], list[StoredRow]]:
            # BEGIN IMMEDIATE holds the write lock: no other writer appends between this read and the insert.
            head = conn.execute("SELECT head_seq FROM jixu_streams WHERE stream = ?", (stream,)).fetchone()
            if head is None:
                raise NotFound(f"stream {stream!r} has no events", stream=stream)
            rows = [StoredRow(*row) for row in conn.execute(
                f"SELECT {_ROW_COLUMNS} FROM jixu_events WHERE stream = ? AND seq > ? ORDER BY seq",
                (stream, expected_seq))]
            batch = build(rows, int(head[0]))
            if not batch:
                return rows, []
            return rows, self._append_in(conn, _QueuedAppend(stream, batch, int(head[0]), fence, GENESIS_HASH))

        return self._write(transaction)

    def _append_in(self, conn: sqlite3.Connection, request: _QueuedAppend) -> list[StoredRow]:
        """One append's checks and inserts inside the open transaction (raises on any refusal)."""
        stream, batch, expected_seq = request.stream, request.batch, request.expected_seq
        fence, genesis_hash = request.fence, request.genesis_hash
        ids = [p.id for p in batch]
        marks = ",".join("?" * len(ids))
        # One statement reads everything the checks need: the head, whether any id is stored already, the
        # fence's lease and the store clock (an append is on every agent step's path).
        probe = conn.execute(
            f"SELECT s.head_seq, s.head_hash, EXISTS (SELECT 1 FROM jixu_events WHERE id IN ({marks})), "
            f"{_NOW_EXPR}, l.key, l.owner, l.epoch, l.expires_at, l.heartbeat_at, l.released "
            "FROM (SELECT 1) LEFT JOIN jixu_streams s ON s.stream = ? LEFT JOIN jixu_leases l ON l.key = ?",
            [*ids, stream, fence.key if fence is not None else None],
        ).fetchone()
        found = {
            row[0]: StoredRow(*row)
            for row in conn.execute(f"SELECT {_ROW_COLUMNS} FROM jixu_events WHERE id IN ({marks})", ids)
        } if probe[2] else {}
        lease = (Lease(probe[4], probe[5], probe[6], probe[7], probe[8], bool(probe[9]))
                 if fence is not None and probe[4] is not None else None)
        head = probe[:2] if probe[0] is not None else None
        verdict = decide_append(stream, batch, expected_seq, fence, found=found, lease=lease, now=float(probe[3]),
                                head=head, genesis_hash=genesis_hash, recorded_at=utc_now_text())
        if isinstance(verdict, JixuError):
            raise verdict
        if isinstance(verdict, AlreadyStored):
            return verdict
        rows = verdict
        _insert_rows(conn, rows)
        if head:
            conn.execute("UPDATE jixu_streams SET head_seq = ?, head_hash = ? WHERE stream = ?",
                         (rows[-1].seq, rows[-1].hash, stream))
        else:
            conn.execute(_INSERT_STREAMS, (stream, rows[-1].seq, rows[-1].hash, genesis_hash, rows[0].recorded_at,
                                           group_of_meta(rows[0].meta_json)))
        return rows

    def _pages(self, stream: str, from_seq: int, to_seq: int | None, columns: str, size: int,
               seq_column: int) -> Iterator[list[Any]]:
        """``stream``'s rows with ``from_seq <= seq <= to_seq`` in seq order, ``size`` rows per read."""
        last = to_seq if to_seq is not None else 2**62
        start = from_seq
        while start <= last:
            chunk = self._read(lambda conn, start=start: conn.execute(  # type: ignore[misc]
                f"SELECT {columns} FROM jixu_events WHERE stream = ? AND seq >= ? AND seq <= ? "
                "ORDER BY seq LIMIT ?",
                (stream, start, last, size),
            ).fetchall())
            yield chunk
            if len(chunk) < size:
                return
            start = chunk[-1][seq_column] + 1

    def _read_rows(self, stream: str, from_seq: int, to_seq: int | None) -> Iterator[StoredRow]:
        for chunk in self._pages(stream, from_seq, to_seq, _ROW_COLUMNS, _CHUNK, 2):
            yield from map(StoredRow.from_tuple, chunk)

    def _iter_events(self, stream: str, from_seq: int, to_seq: int | None) -> Iterator[Event]:
        # Rows straight into events (no StoredRow between), without the stream column: it is ``stream``.
        # Smaller chunks than _read_rows: each one's rows are decoded while still in the CPU's caches.
        for chunk in self._pages(stream, from_seq, to_seq, _EVENT_COLUMNS, _EVENT_CHUNK, 1):
            yield from events_from_stream_rows(stream, chunk)

    def _verify_snapshot(self, stream: str) -> VerifyReport:
        def snapshot(conn: sqlite3.Connection) -> VerifyReport:
            # One read transaction: WAL gives it a snapshot that concurrent appends do not change.
            conn.execute("BEGIN")
            try:
                info = conn.execute(
                    "SELECT head_seq, head_hash, genesis_hash FROM jixu_streams WHERE stream = ?", (stream,)
                ).fetchone()
                head = (info[0], info[1]) if info else (0, GENESIS_HASH)

                def rows() -> sqlite3.Cursor:  # read again, in this snapshot, only when a row does not hold
                    return conn.execute(f"SELECT {_ROW_COLUMNS} FROM jixu_events WHERE stream = ? ORDER BY seq",
                                        (stream,))

                return verify_tuples(stream, rows, genesis_hash=info[2] if info else GENESIS_HASH,
                                     recorded_head=head)
            finally:
                conn.execute("COMMIT")

        return self._read(snapshot)

    def _get_row(self, event_id: str) -> StoredRow | None:
        row = self._read(lambda conn: conn.execute(
            f"SELECT {_ROW_COLUMNS} FROM jixu_events WHERE id = ?", (event_id,)).fetchone())
        return StoredRow(*row) if row else None

    def _stream_info(self, stream: str) -> StreamInfo | None:
        row = self._read(lambda conn: conn.execute(
            f"SELECT {_STREAM_COLUMNS} FROM jixu_streams WHERE stream = ?", (stream,)).fetchone())
        return StreamInfo(*row) if row else None

    def _list_streams(self, prefix: str, after: str, limit: int) -> list[StreamInfo]:
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self._read(lambda conn: conn.execute(
            f"SELECT {_STREAM_COLUMNS} FROM jixu_streams "
            "WHERE stream LIKE ? ESCAPE '\\' AND stream > ? ORDER BY stream LIMIT ?",
            (escaped + "%", after, limit)).fetchall())
        return [StreamInfo(*row) for row in rows]

    def _list_group_streams(self, prefix: str, after: str, limit: int, groups: list[str]) -> list[StreamInfo]:
        # One index range per project (project, stream > after), each cut at ``limit``, merged: the rows read
        # are at most limit x projects, whatever else the store holds. GLOB, not LIKE: case-sensitive, like the
        # names, and its prefix bounds the range.
        low = max(after, prefix)
        glob = "".join(f"[{c}]" if c in "*?[" else c for c in prefix) + "*"
        part = (f"SELECT * FROM (SELECT {_STREAM_COLUMNS} FROM jixu_streams INDEXED BY jixu_streams_project "
                "WHERE project = ? AND stream > ? AND stream GLOB ? ORDER BY stream LIMIT ?)")
        sql = " UNION ALL ".join([part] * len(groups)) + " ORDER BY stream LIMIT ?"
        values: list[Any] = [v for group in groups for v in (group, low, glob, limit)] + [limit]
        rows = self._read(lambda conn: conn.execute(sql, values).fetchall())
        return [StreamInfo(*row) for row in rows]

    # --- sessions and credential use -------------------------------------------------

    def _create_session(self, key: str, subject: str, ttl: float) -> Session:
        def create(conn: sqlite3.Connection) -> Session:
            now = float(conn.execute(_NOW_SQL).fetchone()[0])
            conn.execute("DELETE FROM jixu_sessions WHERE expires_at < ?", (now - SESSION_RETENTION,))
            try:
                conn.execute(f"INSERT INTO jixu_sessions ({_SESSION_COLUMNS}) VALUES (?, ?, ?, ?, NULL)",
                             (key, subject, now, now + ttl))
            except sqlite3.IntegrityError:
                raise InvalidInput(f"session {key!r} exists already", field="key") from None
            return Session.of_row(key, subject, now, now + ttl, None, now)

        return self._write(create)

    def _get_session(self, key: str) -> Session | None:
        row = self._read(lambda conn: conn.execute(
            f"SELECT {_SESSION_COLUMNS}, {_NOW_EXPR} FROM jixu_sessions WHERE key = ?", (key,)).fetchone())
        return Session.of_row(*row) if row else None

    def _revoke_sessions(self, key: str | None, subject: str | None) -> int:
        def revoke(conn: sqlite3.Connection) -> int:
            now = float(conn.execute(_NOW_SQL).fetchone()[0])
            column, value = ("key", key) if key is not None else ("subject", subject)
            cursor = conn.execute(f"UPDATE jixu_sessions SET revoked_at = ? WHERE {column} = ? "
                                  "AND revoked_at IS NULL AND expires_at > ?", (now, value, now))
            return int(cursor.rowcount)

        return self._write(revoke)

    def _record_use(self, key: str) -> None:
        # Not waited for on disk (decision 0017): a note lost in a power failure only makes a last use look older.
        self._write(lambda conn: conn.execute(
            f"INSERT INTO jixu_last_used VALUES (?, {_NOW_EXPR}) ON CONFLICT (key) DO UPDATE "
            "SET used_at = excluded.used_at", (key,)), sync=False)

    def _last_used(self, keys: list[str]) -> dict[str, float]:
        rows = self._read(lambda conn: _select_in(conn, "SELECT key, used_at FROM jixu_last_used WHERE key IN", keys))
        try:
            return {str(key): float(at) for key, at in rows}
        except (TypeError, ValueError) as exc:
            raise StoreError(f"{self.path}: a last use in jixu_last_used is damaged ({exc})", path=self.path) from exc

    # --- leases ---------------------------------------------------------------------

    @staticmethod
    def _lease_row(conn: sqlite3.Connection, key: str) -> Lease | None:
        row = conn.execute(
            "SELECT key, owner, epoch, expires_at, heartbeat_at, released FROM jixu_leases WHERE key = ?",
            (key,),
        ).fetchone()
        return Lease(row[0], row[1], row[2], row[3], row[4], bool(row[5])) if row else None

    @staticmethod
    def _put_lease(conn: sqlite3.Connection, lease: Lease) -> None:
        conn.execute(
            "INSERT INTO jixu_leases VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET "
            "owner = excluded.owner, epoch = excluded.epoch, expires_at = excluded.expires_at, "
            "heartbeat_at = excluded.heartbeat_at, released = excluded.released",
            (lease.key, lease.owner, lease.epoch, lease.expires_at, lease.heartbeat_at, int(lease.released)),
        )

    def _change_lease(self, key: str, change: Callable[[Lease | None, float], Lease]) -> Lease:
        def apply(conn: sqlite3.Connection) -> Lease:
            lease = change(self._lease_row(conn, key), float(conn.execute(_NOW_SQL).fetchone()[0]))
            self._put_lease(conn, lease)
            return lease

        return self._write(apply)  # taking a lease is durable: it is acted on at once (renewals: below)

    def _change_leases(self, changes: list[tuple[str, LeaseChange]], *, durable: bool,
                       refusals: tuple[type[JixuError], ...]) -> list[Lease | JixuError]:
        def apply(conn: sqlite3.Connection) -> list[Lease | JixuError]:
            now = float(conn.execute(_NOW_SQL).fetchone()[0])

            def change_one(key: str, change: LeaseChange) -> Lease:
                lease = change(self._lease_row(conn, key), now)
                self._put_lease(conn, lease)
                return lease

            return each_change(changes, change_one, refusals)

        # A renewal is not waited for on disk (decision 0042): lost in a power failure, the lease expires as if
        # its holder had died in it, which it did. A take-over is (durable): it is acted on at once.
        return self._write(apply, sync=durable) if changes else []

    def _release_lease(self, fence: Fence) -> None:
        # Not waited for on disk: lost in a power failure, the lease just expires as if its holder had died,
        # and whoever acts on the release commits durably after it (decision 0017).
        self._write(lambda conn: conn.execute(
            "UPDATE jixu_leases SET released = 1 WHERE key = ? AND owner = ? AND epoch = ?",
            (fence.key, fence.owner, fence.epoch)), sync=False)

    def _get_lease(self, key: str) -> Lease | None:
        return self._read(lambda conn: self._lease_row(conn, key))

    # --- checkpoints ----------------------------------------------------------------

    def _write_checkpoints(self, checkpoints: list[Checkpoint]) -> None:
        # Not waited for on disk (decision 0017): a checkpoint lost in a power failure is rebuilt from the
        # events, and the log keeps its order, so a checkpoint that survives has its events and chunks.
        self._write(lambda conn: conn.executemany(
            "INSERT INTO jixu_checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (stream, name) DO UPDATE "
            "SET seq = excluded.seq, reducer_version = excluded.reducer_version, head_hash = excluded.head_hash, "
            "state = excluded.state, digest = excluded.digest, created_at = excluded.created_at",
            [(checkpoint.stream, checkpoint.name, checkpoint.seq, checkpoint.reducer_version, checkpoint.head_hash,
              checkpoint.state_json, checkpoint.digest, checkpoint.created_at or utc_now_text())
             for checkpoint in checkpoints]),
            sync=False)

    def _read_checkpoints(self, stream: str, names: list[str]) -> dict[str, Checkpoint]:
        rows = self._read(lambda conn: conn.execute(
            "SELECT stream, name, seq, reducer_version, head_hash, state, digest, created_at "
            f"FROM jixu_checkpoints WHERE stream = ? AND name IN ({', '.join('?' * len(names))})",
            (stream, *names)).fetchall())
        return {row[1]: Checkpoint(*row) for row in rows}

    def _checkpoints_named(self, name: str, streams: list[str]) -> dict[str, Checkpoint]:
        def read(conn: sqlite3.Connection) -> list[Any]:
            rows: list[Any] = []
            for start in range(0, len(streams), _IN_CHUNK):
                chunk = streams[start:start + _IN_CHUNK]
                rows.extend(conn.execute(
                    "SELECT stream, name, seq, reducer_version, CAST(head_hash AS BLOB), CAST(state AS BLOB), "
                    "CAST(digest AS BLOB), CAST(created_at AS BLOB) "
                    f"FROM jixu_checkpoints WHERE name = ? AND stream IN ({','.join('?' * len(chunk))})",
                    (name, *chunk)).fetchall())
            return rows

        found: dict[str, Checkpoint] = {}
        for stream, row_name, seq, version, *texts in self._read(read):
            # Read as bytes: a row edited to hold what is no UTF-8 is skipped (it seals nothing), instead of
            # failing the read of every other stream's row with it (the watch of a process reads them together).
            try:
                head_hash, state, digest, created_at = (bytes(text).decode("utf-8") for text in texts)
            except (UnicodeDecodeError, TypeError):
                continue
            found[stream] = Checkpoint(stream, row_name, seq, version, head_hash, state, digest, created_at)
        return found

    # --- work queue -----------------------------------------------------------------

    @staticmethod
    def _work_row(row: Any) -> WorkRow:
        key, group, status, ready_at, enqueued_at, claimed_by, epoch, expires_at, heartbeat_at, rerun, pos = row
        return WorkRow(str(key), str(group), str(status), float(ready_at), float(enqueued_at),
                       None if claimed_by is None else str(claimed_by), int(epoch),
                       None if expires_at is None else float(expires_at),
                       None if heartbeat_at is None else float(heartbeat_at), bool(rerun), int(pos))

    @staticmethod
    def _put_work(conn: sqlite3.Connection, row: WorkRow, *, new: bool) -> WorkRow:
        values = (row.group, row.status, row.ready_at, row.enqueued_at, row.claimed_by, row.epoch, row.expires_at,
                  row.heartbeat_at, int(row.rerun))
        if new:
            cursor = conn.execute(
                "INSERT INTO jixu_work (project, status, ready_at, enqueued_at, claimed_by, epoch, expires_at, "
                "heartbeat_at, rerun, key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (*values, row.key))
            return dataclasses.replace(row, position=int(cursor.lastrowid or 0))
        conn.execute("UPDATE jixu_work SET project = ?, status = ?, ready_at = ?, enqueued_at = ?, claimed_by = ?, "
                     "epoch = ?, expires_at = ?, heartbeat_at = ?, rerun = ? WHERE key = ?", (*values, row.key))
        return row

    def _change_work(self, key: str, change: Callable[[WorkRow | None, float], WorkRow]) -> tuple[WorkItem, WorkRow]:
        return self._write(lambda conn: self._work_in(conn, key, change))

    def _renew_works(self, changes: list[tuple[str, WorkChange]]) -> list[WorkRow | FencingError]:
        def apply(conn: sqlite3.Connection) -> list[WorkRow | FencingError]:
            return renewal_answers(each_change(changes, lambda key, change: self._work_in(conn, key, change)[1]))

        return self._write(apply, sync=False) if changes else []  # renewals, as leases' (decision 0042)

    def _work_in(self, conn: sqlite3.Connection, key: str,
                 change: Callable[[WorkRow | None, float], WorkRow]) -> tuple[WorkItem, WorkRow]:
        """A work item's change inside the open transaction."""
        now = float(conn.execute(_NOW_SQL).fetchone()[0])
        found = conn.execute(f"SELECT {_WORK_COLUMNS} FROM jixu_work WHERE key = ?", (key,)).fetchone()
        current = self._work_row(found) if found else None
        row = change(current, now)
        if row is not current:
            row = self._put_work(conn, row, new=current is None)
        return row.item(now), row

    def _append_and_enqueue(self, stream: str, batch: list[PreparedEvent], expected_seq: int, fence: Fence | None,
                            change: Callable[[WorkRow | None, float], WorkRow], key: str,
                            genesis_hash: str = GENESIS_HASH) -> list[StoredRow]:
        # Through the group commit, as appends are: the API's sync endpoints (one thread each) that queue work
        # at once share one transaction and one fsync instead of one each.
        if self.read_only:
            raise StoreReadOnly(f"{self.path}: opened read-only; open it writable to change it", path=self.path)
        if self._closed:
            raise StoreError(f"{self.path}: the store is closed")
        request = _QueuedAppend(stream, batch, expected_seq, fence, genesis_hash, work=(key, change))
        self._commit_queued([request])
        if request.error is not None:
            raise request.error
        assert request.rows is not None
        return request.rows

    def _claim_works(self, owner: str, ttl: float, order: ClaimOrder, count: int) -> list[WorkClaim]:
        def claim(conn: sqlite3.Connection) -> list[WorkClaim]:
            # BEGIN IMMEDIATE: no other writer (claimer, renewer, finisher) runs until this commits.
            now = float(conn.execute(_NOW_SQL).fetchone()[0])
            live = {str(g): int(n) for g, n in conn.execute(
                "SELECT project, count(*) FROM jixu_work WHERE status = 'claimed' AND expires_at > ? "
                "GROUP BY project", (now,))}
            oldest = {str(g): (float(r), int(pos)) for g, r, pos in conn.execute(
                "SELECT project, ready_at, position FROM (SELECT project, ready_at, position, row_number() OVER "
                f"(PARTITION BY project ORDER BY ready_at, position) AS rank FROM jixu_work WHERE {_CLAIMABLE}) "
                "WHERE rank = 1", {"now": now})}
            served = {str(g): int(n) for g, n in conn.execute("SELECT project, last_claim FROM jixu_work_projects")}

            def claim_from(group: str, number: int) -> tuple[WorkClaim, tuple[float, int] | None] | None:
                # The group's two oldest claimable items: the first is claimed, the second is the group's next.
                found = conn.execute(
                    f"SELECT {_WORK_COLUMNS} FROM jixu_work WHERE project = :group AND {_CLAIMABLE} "
                    "ORDER BY ready_at, position LIMIT 2", {"group": group, "now": now}).fetchall()
                if not found:
                    return None
                row = self._put_work(conn, claimed_row(self._work_row(found[0]), owner, ttl, now), new=False)
                after = self._work_row(found[1]) if len(found) > 1 else None
                return work_claim_of(row, number), (after.ready_at, after.position) if after else None

            made = claims_up_to(count, QueueCensus(live, oldest, served), order, claim_from)
            # Each group's latest claim number and count, once per batch (the census kept them meanwhile).
            for group, (last, claims) in served_groups(made).items():
                conn.execute("INSERT INTO jixu_work_projects VALUES (?, ?, ?, ?) ON CONFLICT (project) DO UPDATE "
                             "SET last_claim = excluded.last_claim, last_claimed_at = excluded.last_claimed_at, "
                             "claims = claims + excluded.claims", (group, last, now, claims))
            return made

        return self._write(claim)

    def _list_work(self, group: str | None, status: str | None) -> tuple[list[WorkRow], float]:
        def read(conn: sqlite3.Connection) -> tuple[list[WorkRow], float]:
            conn.execute("BEGIN")
            try:
                now = float(conn.execute(_NOW_SQL).fetchone()[0])
                rows = conn.execute(
                    f"SELECT {_WORK_COLUMNS} FROM jixu_work WHERE (:group IS NULL OR project = :group) "
                    "AND (:status IS NULL OR status = :status) ORDER BY ready_at, position",
                    {"group": group, "status": status}).fetchall()
            finally:
                conn.execute("COMMIT")
            return [self._work_row(r) for r in rows], now

        return self._read(read)

    def _get_work(self, key: str) -> tuple[WorkRow | None, float]:
        def read(conn: sqlite3.Connection) -> tuple[WorkRow | None, float]:
            now = float(conn.execute(_NOW_SQL).fetchone()[0])
            found = conn.execute(f"SELECT {_WORK_COLUMNS} FROM jixu_work WHERE key = ?", (key,)).fetchone()
            return (self._work_row(found) if found else None), now

        return self._read(read)


__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "SQLiteStore"]
