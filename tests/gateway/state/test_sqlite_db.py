"""SqliteDb, the one SQLite helper: where each write runs, another process's lock, the WAL."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, closing
from pathlib import Path

import pytest

from gateway.app.errors import StateError
from gateway.calls.entry import CallLogEntry
from gateway.calls.sqlite_store import SqliteCallStore
from gateway.state.sqlite_db import CHECKPOINT_EVERY, LOOP_LOCK_WAIT, SqliteDb, _WriteLock
from tests.gateway.state.hammer import ROOT, WAIT_SECONDS

# Long enough that a write waiting for the lock on the loop thread would be seen stuck.
BUSY_TIMEOUT = 60.0
HOLD_LOCK = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
db.execute("COMMIT")
"""
WRITE_THEN_DIE = """
import asyncio, os, signal, sys, threading
from gateway.state.sqlite_db import SqliteDb
from tests.gateway.state.test_sqlite_db import create, insert

async def main():
    db = SqliteDb(sys.argv[1], name="t", thread_name="t", create_schema=create,
                  clock=lambda: 1.0, busy_timeout=5.0)
    await db.start()
    for n in range(int(sys.argv[2])):
        assert await db.write(insert(n)) == threading.current_thread().name
    print("written", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""
# busy_timeout 0: a write that met SQLite's lock held would fail ("database is locked")
# where it used to wait in SQLite's busy handler.
WRITE_WHEN_TOLD = """
import asyncio, sys
from gateway.state.sqlite_db import SqliteDb
from tests.gateway.state.test_sqlite_db import create, insert

async def main():
    db = SqliteDb(sys.argv[1], name="t", thread_name="t", create_schema=create,
                  clock=lambda: 1.0, busy_timeout=0.0)
    await db.start()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    first, count = int(sys.argv[2]), int(sys.argv[3])
    threads = await asyncio.gather(*(db.write(insert(first + n)) for n in range(count)))
    await db.aclose()
    print(sum(thread == "t" for thread in threads), flush=True)

asyncio.run(main())
"""


class Clock:
    """A settable clock."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def create(db: sqlite3.Connection, path: str) -> None:
    """One table of numbered rows: the time and the thread each was written at."""
    db.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER, at REAL, thread TEXT)")


Write = Callable[[sqlite3.Connection, float], str]


def insert(n: int) -> Write:
    """The write of row `n`; it answers the name of the thread it ran on."""

    def write(db: sqlite3.Connection, now: float) -> str:
        thread = threading.current_thread().name
        db.execute("INSERT INTO t (n, at, thread) VALUES (?, ?, ?)", (n, now, thread))
        return thread

    return write


@asynccontextmanager
async def started(
    path: Path, clock: Clock, busy_timeout: float = BUSY_TIMEOUT
) -> AsyncIterator[SqliteDb]:
    db = SqliteDb(
        path,
        name="test db",
        thread_name="lw-test",
        create_schema=create,
        clock=clock,
        busy_timeout=busy_timeout,
    )
    await db.start()
    try:
        yield db
    finally:
        await db.aclose()


@asynccontextmanager
async def lock_held_elsewhere(path: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """Another process holding the file's write lock until a line is written to it."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HOLD_LOCK,
        str(path),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        line = await asyncio.wait_for(child.stdout.readline(), WAIT_SECONDS)
        assert line == b"locked\n"
        yield child
    finally:
        if child.returncode is None:
            child.kill()
        await child.wait()


async def release(child: asyncio.subprocess.Process) -> None:
    assert child.stdin is not None
    child.stdin.write(b"go\n")
    await child.stdin.drain()


async def two_writes_held(
    db: SqliteDb, clock: Clock, let_go: Callable[[], Awaitable[None]]
) -> list[str]:
    """Rows 1 and 2 written while another writer holds the lock: both wait, the loop goes
    on; the clock moves to 200 and `let_go` lets go; the threads they were written on."""
    first = asyncio.create_task(db.write(insert(1)))
    await asyncio.sleep(0)
    second = asyncio.create_task(db.write(insert(2)))
    for _ in range(20):
        await asyncio.sleep(0)  # the loop goes on serving while both writes wait
    assert not first.done()
    assert not second.done()
    clock.now = 200.0  # read under the lock: after the other writer lets go
    await let_go()
    return list(await asyncio.wait_for(asyncio.gather(first, second), WAIT_SECONDS))


def size(path: Path) -> int:
    return path.stat().st_size


def stored(path: Path) -> list[tuple[int, float, str]]:
    with closing(sqlite3.connect(path)) as db:
        return list(db.execute("SELECT n, at, thread FROM t ORDER BY rowid"))


async def test_issue10_a_write_with_the_lock_free_runs_on_the_loop_thread(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    async with started(path, Clock()) as db:
        loop_thread = threading.current_thread().name
        assert [await db.write(insert(n)) for n in range(3)] == [loop_thread] * 3
        assert await db.read(lambda c, now: threading.current_thread().name) == "lw-test"
    assert stored(path) == [
        (0, 100.0, loop_thread),
        (1, 100.0, loop_thread),
        (2, 100.0, loop_thread),
    ]


async def test_issue10_another_process_holding_the_lock_never_blocks_the_loop(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db.sqlite3"
    clock = Clock(100.0)
    async with started(path, clock) as db, lock_held_elsewhere(path) as child:
        done = await two_writes_held(db, clock, lambda: release(child))
        # The second waited on the loop for the worker to answer the first, then ran there.
        assert done == ["lw-test", threading.current_thread().name]
        assert await db.write(insert(3)) == threading.current_thread().name
    rows = stored(path)
    assert [n for n, _, _ in rows] == [1, 2, 3]  # in the order asked, each once
    assert [at for n, at, _ in rows if n in (1, 2)] == [200.0, 200.0]


async def test_issue24_writes_asked_behind_the_worker_run_on_the_loop_once_it_answers(
    tmp_path: Path,
) -> None:
    """Writes that keep coming while one waits on the worker never queue behind it there.

    Queued on the worker, each held the next in turn: under load every write then paid
    two thread hand-offs.
    """
    path = tmp_path / "db.sqlite3"
    loop_thread = threading.current_thread().name
    async with started(path, Clock()) as db, lock_held_elsewhere(path) as child:
        first = asyncio.create_task(db.write(insert(0)))
        await asyncio.sleep(0)
        later = [asyncio.create_task(db.write(insert(n))) for n in range(1, 33)]
        for _ in range(20):
            await asyncio.sleep(0)
        assert not any(task.done() for task in (first, *later))
        await release(child)
        assert await asyncio.wait_for(first, WAIT_SECONDS) == "lw-test"
        done = await asyncio.wait_for(asyncio.gather(*later), WAIT_SECONDS)
        assert list(done) == [loop_thread] * 32
    assert [n for n, _, _ in stored(path)] == list(range(33))


async def test_issue24_a_write_cancelled_while_waiting_behind_the_worker_lets_the_rest_go(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db.sqlite3"
    async with started(path, Clock()) as db, lock_held_elsewhere(path) as child:
        first = asyncio.create_task(db.write(insert(1)))
        await asyncio.sleep(0)
        cancelled = asyncio.create_task(db.write(insert(2)))
        third = asyncio.create_task(db.write(insert(3)))
        await asyncio.sleep(0)
        cancelled.cancel()
        await release(child)
        await asyncio.wait_for(asyncio.gather(first, third), WAIT_SECONDS)
        assert cancelled.cancelled()
    assert [n for n, _, _ in stored(path)] == [1, 3]


async def test_issue10_reads_go_on_while_another_process_holds_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "calls.sqlite3"
    entry = CallLogEntry(
        at=1_000.0,
        provider="openai",
        agent="billing-bot",
        session="s-1",
        circuit="billing-bot/s-1",
        model="gpt-4o-mini",
        outcome="forwarded",
        status=200,
        input_tokens=10,
        output_tokens=5,
        cost=0.001,
        estimated=False,
        fingerprint="f" * 16,
    )
    store = SqliteCallStore(path, wall_clock=lambda: 1_010.0, busy_timeout=BUSY_TIMEOUT)
    await store.start()
    try:
        await store.log_call(entry)
        async with lock_held_elsewhere(path) as child:
            assert await store.calls_since(60.0) == [entry]
            assert await store.paused() == []
            await release(child)
    finally:
        await store.aclose()


async def test_issue10_a_failing_write_on_the_loop_rolls_back_and_the_next_is_served(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db.sqlite3"

    def half_then_fail(db: sqlite3.Connection, now: float) -> str:
        insert(1)(db, now)
        raise StateError("a malformed record")

    async with started(path, Clock()) as db:
        with pytest.raises(StateError, match="a malformed record"):
            await db.write(half_then_fail)
        assert await db.write(insert(2)) == threading.current_thread().name
    assert [n for n, _, _ in stored(path)] == [2]


async def test_the_wal_is_checkpointed_and_restarted_as_writes_go_on(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    wal = Path(f"{path}-wal")
    async with started(path, Clock()) as db:
        for n in range(CHECKPOINT_EVERY):
            await db.write(insert(n))
        one_round = size(wal)
        for n in range(5 * CHECKPOINT_EVERY):
            await db.write(insert(n))
        # Restarted after each checkpoint, the WAL is rewritten from its start, not grown.
        assert size(wal) <= 2 * one_round
        assert await db.read(lambda c, now: c.execute("SELECT count(*) FROM t").fetchone()[0]) == (
            6 * CHECKPOINT_EVERY
        )


async def test_issue24_the_wal_restarts_while_another_writer_of_the_file_goes_on(
    tmp_path: Path,
) -> None:
    # Two writers of one file (two workers' stores): one's checkpoint used to run while
    # the other wrote, was never complete, and the WAL never restarted but grew.
    path = tmp_path / "db.sqlite3"
    wal = Path(f"{path}-wal")
    rounds = 6 * CHECKPOINT_EVERY
    async with started(path, Clock()) as first, started(path, Clock()) as second:
        for n in range(CHECKPOINT_EVERY):
            await first.write(insert(n))
        one_round = size(wal)

        async def writes(db: SqliteDb, start: int) -> None:
            for n in range(start, start + rounds):
                await db.write(insert(n))

        await asyncio.gather(writes(first, 0), writes(second, rounds))
        assert size(wal) <= 4 * one_round
    assert len(stored(path)) == CHECKPOINT_EVERY + 2 * rounds


def test_writes_committed_on_the_loop_thread_survive_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    child = subprocess.run(
        [sys.executable, "-c", WRITE_THEN_DIE, str(path), "50"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT_SECONDS,
        check=False,
    )
    assert (child.returncode, child.stdout) == (-signal.SIGKILL, "written\n"), child.stderr
    assert [n for n, _, _ in stored(path)] == list(range(50))
    assert {thread for _, _, thread in stored(path)} == {"MainThread"}


async def test_idle_call_windows_are_swept_as_decisions_go_on(tmp_path: Path) -> None:
    path = tmp_path / "calls.sqlite3"
    clock = Clock(1_000.0)
    store = SqliteCallStore(path, clock=clock)
    await store.start()
    try:
        for n in range(40):
            await store.decide("billing-bot/s-1", f"question {n}")
        clock.now += 86_400.0  # every window has long gone idle
        for n in range(16):
            await store.decide("billing-bot/s-2", f"later question {n}")
    finally:
        await store.aclose()
    with closing(sqlite3.connect(path)) as db:
        idle = db.execute("SELECT count(*) FROM call_windows WHERE idle_at <= ?", (clock.now,))
        assert idle.fetchone()[0] == 0


async def test_issue24_a_write_waits_on_the_lock_file_and_gets_it_when_let_go(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db.sqlite3"
    clock = Clock(100.0)
    # busy_timeout 0: the worker never waits in SQLite's busy handler, only on the flock.
    async with started(path, clock, busy_timeout=0.0) as db:
        other = os.open(f"{path}-lock", os.O_RDWR | os.O_CREAT)  # another process's writer
        try:
            fcntl.flock(other, fcntl.LOCK_EX)

            async def let_go() -> None:
                fcntl.flock(other, fcntl.LOCK_UN)

            done = await two_writes_held(db, clock, let_go)
        finally:
            os.close(other)
        # The second waited on the loop for the worker to answer the first, then ran there.
        assert done == ["lw-test", threading.current_thread().name]
        assert await db.write(insert(3)) == threading.current_thread().name
    rows = stored(path)
    assert [n for n, _, _ in rows] == [1, 2, 3]
    assert [at for n, at, _ in rows if n in (1, 2)] == [200.0, 200.0]


async def test_issue24_two_processes_writing_at_once_never_meet_sqlites_busy_handler(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db.sqlite3"
    each = 600
    # Held open all along: the children open a WAL file in use, never recover it.
    async with started(path, Clock()):
        children = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                WRITE_WHEN_TOLD,
                str(path),
                str(first),
                str(each),
                cwd=ROOT,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            for first in (0, each)
        ]
        try:
            for child in children:
                assert child.stdout is not None
                line = await asyncio.wait_for(child.stdout.readline(), WAIT_SECONDS)
                assert line == b"ready\n"
            for child in children:
                assert child.stdin is not None
                child.stdin.write(b"go\n")
                await child.stdin.drain()
            ends = [await asyncio.wait_for(c.communicate(), WAIT_SECONDS) for c in children]
        finally:
            for child in children:
                if child.returncode is None:
                    child.kill()
                    await child.wait()
        for child, (out, err) in zip(children, ends, strict=True):
            assert child.returncode == 0, err.decode()
            assert 0 <= int(out) <= each  # how many went to the worker: any share
    assert sorted(n for n, _, _ in stored(path)) == list(range(2 * each))


def test_issue24_a_loop_write_asks_again_for_a_held_flock_only_for_a_moment(
    tmp_path: Path,
) -> None:
    # The loop asks again for LOOP_LOCK_WAIT at most: held on, the lock is not taken (the
    # write goes to the worker); let go, it is taken at once.
    path = str(tmp_path / "db.sqlite3-lock")
    holder = _WriteLock(os.open(path, os.O_RDWR | os.O_CREAT))
    asker = _WriteLock(os.open(path, os.O_RDWR | os.O_CREAT))
    try:
        assert holder.take(wait=False)
        assert not asker.take_soon(LOOP_LOCK_WAIT)
        holder.release()
        assert asker.take_soon(LOOP_LOCK_WAIT)
        assert not holder.take(wait=False)
    finally:
        holder.close()
        asker.close()
