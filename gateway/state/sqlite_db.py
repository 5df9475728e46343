"""One SQLite file in WAL mode: quick writes on the event loop, waits on a worker thread.

The state store (gateway/state/sqlite.py) and the call store (gateway/calls/sqlite_store.py)
each hold one `SqliteDb`. A write is one `BEGIN IMMEDIATE` transaction that reads the
clock only once it holds the write lock, so writes are serialised in time order, also
between processes sharing the file. The event loop never waits for a lock or an fsync:
- A write runs on the loop thread, on a connection with `busy_timeout` 0, when the write
  lock is free at once; one asked while earlier writes (or a checkpoint) wait on the
  worker first waits on the loop until the worker has answered them (so writes keep
  their order), then runs on the loop too. Handing each decision to a thread and back
  cost two thread wake-ups, more than the transaction itself; a WAL commit only writes
  to the OS (`synchronous=NORMAL` syncs at checkpoints), so it does not wait for the
  disk.
- When another connection holds the lock, the write goes to the worker thread, whose
  connection waits for it. Reads (which may be long, a log export) always run there.
- Writers meet first on an `flock` of a side file, `<db>-lock` (one open file description
  per connection, as flock does not exclude within one): the loop asks for it again and
  again for at most `LOOP_LOCK_WAIT` (0.3 ms), the worker waits on it, and each holds it
  only for one transaction. With two workers under load one write in six found it held
  and went to the worker thread, and the writes behind it waited for that: asked again
  for a moment, one in a hundred still does (the holder is stopped or off the CPU). The
  kernel hands it over the moment its holder lets go, where SQLite's own busy handler sleeps 1,
  2, 5, 10 ... ms between tries: with two workers on one file, every collision cost a
  millisecond or more and the writes behind it queued on the worker. `BEGIN IMMEDIATE`
  so rarely meets a held write lock; when it does (a writer that does not take the flock:
  an older loopwarden, the sqlite3 shell), the loop hands the write to the worker and the
  worker waits up to `busy_timeout`, as before. Windows has no flock: there writers meet
  on SQLite's lock alone. The flock waits without a bound, but its holder holds it for
  one transaction only (a process stopped while holding it stops the others' writes).
- Neither connection checkpoints by itself (`wal_autocheckpoint=0`): after every
  `CHECKPOINT_EVERY` writes the worker copies the WAL into the file and makes the write
  that restarts the WAL (the one that syncs its header), while loop writes queue behind
  and, as it holds the flock, the writers of other processes wait.
  Another connection to the file (another store, another process) checkpoints and
  restarts the WAL the same way; only a writer that takes no flock (the sqlite3 shell)
  could land between its two steps and sync the header itself.
A committed write survives SIGKILL (the WAL is in the file system); `synchronous=NORMAL`
may lose the last transactions on a power cut only.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from gateway.app.errors import StateError

if sys.platform != "win32":
    import fcntl

T = TypeVar("T")

SchemaHook = Callable[[sqlite3.Connection, str], None]
"""Creates a store's tables, given the connection and the file's path (for error texts)."""

CHECKPOINT_EVERY = 200
"""Writes between checkpoints: about SQLite's default of 1,000 WAL pages at 3-5 pages each."""

LOOP_LOCK_WAIT = 0.0003
"""Seconds a loop write asks again for a held flock before going to the worker instead."""

log = logging.getLogger(__name__)


class _WriteLock:
    """The flock writers take before `BEGIN IMMEDIATE`, on an open file description of its own."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def take(self, *, wait: bool) -> bool:
        """Take the lock, waiting for it; or without waiting, False when another holds it."""
        if wait:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            return True
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def take_soon(self, within: float) -> bool:
        """Take the lock, asking again until `within` seconds have passed; False if still held.

        Another writer holds it for one transaction, tens of microseconds: asking again
        for a fraction of a millisecond costs the loop less than handing the write to the
        worker thread, and a holder that does not let go soon (stopped, busy) is waited
        for on the worker as before.
        """
        deadline = time.perf_counter() + within
        while time.perf_counter() < deadline:
            os.sched_yield()
            if self.take(wait=False):
                return True
        return False

    def release(self) -> None:
        """Let the next writer (another connection, another process) have it at once."""
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the file description (which lets go of the lock if held)."""
        os.close(self._fd)


class _Connection(sqlite3.Connection):
    """A connection and the flock its writes take first (None on Windows, for ":memory:")."""

    write_lock: _WriteLock | None = None


@dataclass(slots=True)
class _Job:
    """Work for the worker thread and the future its answer goes to (None: nobody waits)."""

    work: Callable[[], Any]
    future: asyncio.Future[Any] | None
    loop: asyncio.AbstractEventLoop
    holds_writes: bool
    """Loop writes go to the worker behind it until it is answered (order, checkpoints)."""


class SqliteDb:
    """A WAL SQLite file: `write` is one BEGIN IMMEDIATE transaction, on the loop when free."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        name: str,
        thread_name: str,
        create_schema: SchemaHook,
        clock: Callable[[], float],
        busy_timeout: float,
    ) -> None:
        """Describe the database; nothing is opened before `start`.

        Args:
            path: the database file (":memory:" for a private in-memory database).
            name: what the owner is called in errors, e.g. "sqlite state store".
            thread_name: the worker thread's name.
            create_schema: run once the file is open, inside one transaction.
            clock: the time passed to `write` and `read` work.
            busy_timeout: seconds the worker waits for another process's write lock.
        """
        self._path = os.fspath(path)
        self._name = name
        self._thread_name = thread_name
        self._create_schema = create_schema
        self._clock = clock
        self._busy_timeout = busy_timeout
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        # The worker's connection: opened, used and closed on the worker thread only.
        self._db: _Connection | None = None
        # The loop thread's connection (none for ":memory:", private to each connection):
        # opened and closed by the worker, used by the loop thread only in between.
        self._here: _Connection | None = None
        self._holding = 0  # jobs handed to the worker that loop writes wait behind
        self._drained = asyncio.Event()  # set while nothing is held: loop writes may go
        self._drained.set()
        self._writes = 0  # writes since the last checkpoint

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    async def start(self) -> None:
        """Start the worker thread and open the file (its directory, its schema) there."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        # A queue per thread: a thread still finishing after `aclose` never takes new jobs.
        self._jobs = queue.SimpleQueue()
        self._holding = 0
        self._drained = asyncio.Event()  # bound to this loop on its first wait
        self._drained.set()
        threading.Thread(
            target=self._serve, args=(self._jobs,), name=self._thread_name, daemon=True
        ).start()
        try:
            await self._submit(self._open)
        except BaseException:
            self._stop()
            raise

    async def aclose(self) -> None:
        """Close both connections and stop the thread."""
        if self._loop is None:
            return
        here, self._here = self._here, None
        try:
            await self._submit(lambda: self._close(here))
        finally:
            self._stop()

    def _stop(self) -> None:
        self._loop = None
        self._jobs.put(None)

    def _serve(self, jobs: queue.SimpleQueue[_Job | None]) -> None:
        """The worker thread: run the jobs in the order they came, until told to stop."""
        while (job := jobs.get()) is not None:
            try:
                result = job.work()
            except BaseException as exc:  # the waiting coroutine gets it, as raised
                self._answer(job, None, exc)
            else:
                self._answer(job, result, None)

    def _answer(self, job: _Job, result: object, error: BaseException | None) -> None:
        # RuntimeError: the loop has closed, nobody is left to answer.
        with suppress(RuntimeError):
            job.loop.call_soon_threadsafe(self._settle, job, result, error)

    def _settle(self, job: _Job, result: object, error: BaseException | None) -> None:
        """On the loop thread: release the writes held behind the job, answer its future."""
        if job.holds_writes:
            self._holding -= 1
            if not self._holding:
                self._drained.set()
        future = job.future
        if future is None:
            if error is not None:
                log.warning("%s: WAL checkpoint failed: %s", self._name, error)
        elif not future.done():
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

    def _queue(
        self, work: Callable[[], Any], future: asyncio.Future[Any] | None, holds: bool
    ) -> None:
        if self._loop is None:
            raise StateError(f"the {self._name} is not started")
        loop = asyncio.get_running_loop() if future is None else future.get_loop()
        if holds:
            self._holding += 1
            self._drained.clear()
        self._jobs.put(_Job(work, future, loop, holds))

    async def _submit(self, work: Callable[[], T], *, holds: bool = False) -> T:
        """Run `work` on the worker thread and wait for its answer."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue(work, future, holds)
        return await future

    def _open(self) -> None:
        if self._path != ":memory:":
            Path(self._path).parent.mkdir(parents=True, exist_ok=True)
        db = self._connect(self._busy_timeout)
        try:
            self._enter_wal(db)
            with transaction(db):
                self._create_schema(db, self._path)
            if self._path != ":memory:":
                self._here = self._connect(0.0)
        except BaseException:
            _close(db)
            raise
        self._db = db

    def _connect(self, busy_timeout: float) -> _Connection:
        db = sqlite3.connect(
            self._path,
            timeout=busy_timeout,
            isolation_level=None,
            check_same_thread=False,
            factory=_Connection,
        )
        try:
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
            db.execute("PRAGMA wal_autocheckpoint=0")
            db.write_lock = self._open_lock()
        except BaseException:
            db.close()
            raise
        return db

    def _open_lock(self) -> _WriteLock | None:
        """A new open file description on `<db>-lock` (none on Windows, for ":memory:")."""
        if sys.platform == "win32" or self._path == ":memory:":
            return None
        path = f"{self._path}-lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StateError(f"the {self._name} cannot open {path}: {exc.strerror}") from exc
        return _WriteLock(fd)

    def _enter_wal(self, db: sqlite3.Connection) -> None:
        """Switch to WAL, waiting out another process doing the same on a new file.

        Changing the journal mode can answer "database is locked" at once, without the busy
        handler, while another connection holds the file: retry until `busy_timeout`.
        """
        deadline = time.monotonic() + self._busy_timeout
        while True:
            try:
                db.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)
            else:
                return

    def _close(self, here: _Connection | None) -> None:
        db, self._db = self._db, None
        for connection in (here, db):
            if connection is not None:
                _close(connection)

    def _connection(self) -> _Connection:
        """The worker's connection (on the worker thread)."""
        db = self._db
        if db is None:
            raise StateError(f"the {self._name} is not started")
        return db

    def _checkpoint(self) -> None:
        """Copy the WAL into the file; once all of it is, restart it here, not on the loop.

        The first commit after a complete checkpoint rewrites the WAL from its start and
        syncs its header: rewriting the (unused) application id with its own value is that
        commit, made on the worker while loop writes wait behind this job. Both steps hold
        the flock, so writers in other processes sharing the file wait too: otherwise,
        with two workers under load, a write of the other one always landed during the
        copy, no checkpoint was ever complete, and the WAL never restarted (it grew by
        about 14 MB a second at 2,900 requests a second).
        """
        db = self._connection()
        with _flocked(db):
            busy, frames, copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if busy or frames <= 0 or copied < frames:
                return
            with _immediate(db):
                (application_id,) = db.execute("PRAGMA application_id").fetchone()
                db.execute(f"PRAGMA application_id={int(application_id)}")

    def _wrote(self) -> None:
        """Count a committed write; every CHECKPOINT_EVERY, queue a checkpoint."""
        self._writes += 1
        if self._writes >= CHECKPOINT_EVERY:
            self._writes = 0
            self._queue(self._checkpoint, None, holds=True)

    async def _free_here(self) -> _Connection | None:
        """The loop's connection once nothing is held on the worker (None on another loop).

        A write that finds jobs held waits on the loop until the worker has answered them,
        rather than queueing behind them: queued, it would hold the next writes in turn,
        and under load the queue never drained, every write then paying two thread
        hand-offs (half a loop write's throughput at 32 requests in flight).
        """
        if asyncio.get_running_loop() is not self._loop:
            return None
        while self._holding:
            await self._drained.wait()
        return self._here

    async def write(self, work: Callable[[sqlite3.Connection, float], T]) -> T:
        """Run `work(db, now)` in one write transaction, `now` read under the write lock.

        On the loop thread when the lock is free within `LOOP_LOCK_WAIT`, else on the
        worker (which waits for it). Writes asked while the worker holds others wait for
        it on the loop.
        """
        here = await self._free_here()
        if here is not None and _begin_at_once(here):
            # No context manager on the path every decision takes: it costs as much as a
            # statement.
            try:
                result = work(here, self._clock())
            except BaseException:
                _end(here, "ROLLBACK")
                raise
            _end(here, "COMMIT")
            self._wrote()
            return result

        def run() -> T:
            db = self._connection()
            with transaction(db):
                return work(db, self._clock())

        result = await self._submit(run, holds=True)
        self._wrote()
        return result

    async def read(self, work: Callable[[sqlite3.Connection, float], T]) -> T:
        """Run `work(db, now)` on the worker without the write lock (WAL readers never wait)."""
        return await self._submit(lambda: work(self._connection(), self._clock()))


def _begin_at_once(db: _Connection) -> bool:
    """The flock (asked again for `LOOP_LOCK_WAIT` at most), then BEGIN IMMEDIATE without
    waiting: False if another holds either."""
    lock = db.write_lock
    if lock is not None and not (lock.take(wait=False) or lock.take_soon(LOOP_LOCK_WAIT)):
        return False
    try:
        db.execute("BEGIN IMMEDIATE")
    except BaseException as exc:
        if lock is not None:
            lock.release()
        if isinstance(exc, sqlite3.OperationalError) and (
            exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY
        ):
            return False
        raise
    return True


def _end(db: _Connection, statement: str) -> None:
    """COMMIT or ROLLBACK, then let go of the flock taken at the start."""
    try:
        db.execute(statement)
    finally:
        if db.write_lock is not None:
            db.write_lock.release()


def _close(db: _Connection) -> None:
    """Close the connection and its lock file."""
    try:
        db.close()
    finally:
        if db.write_lock is not None:
            db.write_lock.close()


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE … COMMIT, rolled back on any error; the flock first, waiting for it.

    `db` is a `SqliteDb`'s worker connection (a store's work gets it): any other
    connection has no flock and meets other writers on SQLite's lock alone.
    """
    with _flocked(db), _immediate(db):
        yield


@contextmanager
def _flocked(db: sqlite3.Connection) -> Iterator[None]:
    """Hold the connection's flock (if it has one), waiting for it."""
    lock = db.write_lock if isinstance(db, _Connection) else None
    if lock is not None:
        lock.take(wait=True)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


@contextmanager
def _immediate(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE … COMMIT, rolled back on any error (the flock already held)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
