"""A real `redis-server` on a free loopback port, for tests and benchmarks that need Redis.

Not a fake: the binary from the system (`apt-get install -y redis-server`, which `make
test` does through scripts/system-deps.sh). It runs without persistence (`--save ''
--appendonly no`), so a restart loses every key and every loaded script, exactly like a
crashed cache node. `stop()` and `start()` again reuse the same port, so a client's URL
stays valid across an outage.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

HOST = "127.0.0.1"
START_SECONDS = 10.0
"""A bound on waiting for PING to answer, so a broken start fails instead of hanging."""


class RedisServerMissing(RuntimeError):
    """`redis-server` is not on PATH."""


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def _answers_ping(port: int) -> bool:
    """True when a Redis server on `port` answers an inline PING (-NOAUTH is an answer too)."""
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


class RedisServer:
    """One redis-server process; start, stop and start again on the same port."""

    def __init__(self, workdir: Path, *, port: int | None = None, password: str | None = None):
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisServerMissing(
                "redis-server is not installed; install it with `apt-get install -y "
                "redis-server` (make test does this via scripts/system-deps.sh)"
            )
        self._binary = binary
        self._workdir = workdir
        self.port = port or free_port()
        self._password = password
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The redis:// URL of this server (with the password, when one is required)."""
        auth = f":{self._password}@" if self._password else ""
        return f"redis://{auth}{HOST}:{self.port}/0"

    @property
    def running(self) -> bool:
        """True while the process is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the server and wait until it answers PING (or raise)."""
        if self.running:
            return
        self._workdir.mkdir(parents=True, exist_ok=True)
        args = [
            self._binary,
            "--port",
            str(self.port),
            "--bind",
            HOST,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self._workdir),
            "--loglevel",
            "warning",
        ]
        if self._password:
            args += ["--requirepass", self._password]
        log = (self._workdir / "redis.log").open("ab")
        with log:
            self._process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_SECONDS
        while not _answers_ping(self.port):
            if self._process.poll() is not None:
                raise RuntimeError(f"redis-server exited at start; see {self._workdir}/redis.log")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer PING on port {self.port}")
            time.sleep(0.02)

    def stop(self) -> None:
        """Kill the server (SIGKILL: an outage, not a shutdown) and wait for it to exit."""
        process, self._process = self._process, None
        if process is None:
            return
        process.kill()
        process.wait(timeout=START_SECONDS)

    def restart(self) -> None:
        """Stop and start on the same port; every key and script is gone afterwards."""
        self.stop()
        self.start()

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def running_redis(workdir: Path, *, password: str | None = None) -> Iterator[RedisServer]:
    """A started RedisServer in `workdir`, stopped on exit."""
    with RedisServer(workdir, password=password) as server:
        yield server
