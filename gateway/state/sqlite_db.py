"""One SQLite file in WAL mode, its connection owned by one worker thread.

The state store (gateway/state/sqlite.py) and the call store (gateway/calls/sqlite_store.py)
each hold one `SqliteDb`. Every call is handed to the worker thread, so any number of
coroutines can use a store and the event loop never blocks on disk. A write is one
`BEGIN IMMEDIATE` transaction that reads the clock only once it holds the write lock, so
writes are serialised in time order, also between processes sharing the file
(`busy_timeout` makes the others wait). A committed write survives SIGKILL (the WAL is in
the file system); `synchronous=NORMAL` may lose the last transactions on a power cut only.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from gateway.errors import StateError

T = TypeVar("T")

SchemaHook = Callable[[sqlite3.Connection, str], None]
"""Creates a store's tables, given the connection and the file's path (for error texts)."""


class SqliteDb:
    """A WAL SQLite connection on its own thread; `write` is one BEGIN IMMEDIATE transaction."""

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
            thread_name: the worker thread's name prefix.
            create_schema: run once the file is open, inside one transaction.
            clock: the time passed to `write` and `read` work.
            busy_timeout: seconds to wait for another process's write lock.
        """
        self._path = os.fspath(path)
        self._name = name
        self._thread_name = thread_name
        self._create_schema = create_schema
        self._clock = clock
        self._busy_timeout = busy_timeout
        self._executor: ThreadPoolExecutor | None = None
        # Opened, used and closed on the executor's one thread only.
        self._db: sqlite3.Connection | None = None

    @property
    def path(self) -> str:
        """The database file."""
        return self._path

    async def start(self) -> None:
        """Open the file (creating its directory and schema) on the worker thread."""
        if self._executor is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._thread_name)
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._open)
        except BaseException:
            self._executor.shutdown(wait=False)
            self._executor = None
            raise

    async def aclose(self) -> None:
        """Close the connection and stop the thread."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._close)
        finally:
            executor.shutdown(wait=False)

    def _open(self) -> None:
        if self._path != ":memory:":
            Path(self._path).parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self._path, timeout=self._busy_timeout, isolation_level=None)
        try:
            self._enter_wal(db)
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(f"PRAGMA busy_timeout={int(self._busy_timeout * 1000)}")
            with transaction(db):
                self._create_schema(db, self._path)
        except BaseException:
            db.close()
            raise
        self._db = db

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

    def _close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.close()

    async def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run `work` with the connection on the worker thread."""
        executor = self._executor
        if executor is None:
            raise StateError(f"the {self._name} is not started")
        return await asyncio.get_running_loop().run_in_executor(executor, self._with_db, work)

    def _with_db(self, work: Callable[[sqlite3.Connection], T]) -> T:
        db = self._db
        if db is None:
            raise StateError(f"the {self._name} is not started")
        return work(db)

    async def write(self, work: Callable[[sqlite3.Connection, float], T]) -> T:
        """Run `work(db, now)` in one write transaction, `now` read under the write lock."""

        def run(db: sqlite3.Connection) -> T:
            with transaction(db):
                return work(db, self._clock())

        return await self._call(run)

    async def read(self, work: Callable[[sqlite3.Connection, float], T]) -> T:
        """Run `work(db, now)` without taking the write lock (WAL readers never wait)."""
        return await self._call(lambda db: work(db, self._clock()))


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE … COMMIT, rolled back on any error."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
