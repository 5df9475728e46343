"""A real Redis Cluster (3 masters, 3 replicas) and a Sentinel-watched pair, on loopback.

Not fakes: the system's `redis-server` and `redis-cli` (Debian's redis-server package,
which scripts/system-deps.sh installs). The cluster is six `redis-server
--cluster-enabled yes` processes joined by `redis-cli --cluster create ...
--cluster-replicas 1`; the Sentinel setup is a master, its replica and one `redis-server
--sentinel` watching them (quorum 1). Both run without persistence and with short
failure timeouts (`NODE_TIMEOUT_MS`, `DOWN_AFTER_MS`), so a killed master is replaced
within seconds. A node can be killed (SIGKILL, an outage) and started again on its port
and files, where it rejoins as a replica of whoever took over, or frozen (SIGSTOP) and
thawed, so a replica stops acknowledging writes without its master noticing at once.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.fakes.redis_server import HOST, RedisServerMissing

START_SECONDS = 30.0
"""A bound on a cluster or Sentinel becoming ready, so a broken start fails, not hangs."""
NODE_TIMEOUT_MS = 1000
"""`cluster-node-timeout`: how long a master is unreachable before its replica takes over."""
DOWN_AFTER_MS = 1000
"""Sentinel's `down-after-milliseconds` for the watched master."""
SERVICE_NAME = "loopwarden"
"""The name the Sentinel watches the master under."""


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RedisServerMissing(
            f"{name} is not installed; install it with `apt-get install -y redis-server` "
            "(make test does this via scripts/system-deps.sh)"
        )
    return found


def _free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports that nothing listens on right now."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind((HOST, 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def _command(port: int, *args: str) -> str:
    """One redis-cli command against a node; its reply text ('' when it does not answer)."""
    done = subprocess.run(
        [_binary("redis-cli"), "-h", HOST, "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    return done.stdout


def _wait(what: str, ready: object) -> None:
    """Poll `ready()` until it is true, or fail after START_SECONDS naming `what`."""
    assert callable(ready)
    deadline = time.monotonic() + START_SECONDS
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} was not ready within {START_SECONDS:.0f} s")
        time.sleep(0.1)


class Node:
    """One redis-server process with its own directory, port and arguments."""

    def __init__(self, workdir: Path, port: int, extra: list[str]) -> None:
        self.workdir = workdir
        self.port = port
        self._extra = extra
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the process and wait until it answers PING."""
        if self.running:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [_binary("redis-server"), *self._extra]
        log = (self.workdir / "redis.log").open("ab")
        with log:
            self._process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir
            )
        _wait(f"redis node {self.address}", lambda: _command(self.port, "PING").strip() == "PONG")

    def freeze(self) -> None:
        """SIGSTOP: the node stops answering (and acknowledging replication) but keeps its
        connections, as a host stalled by its hypervisor or a long GC pause would."""
        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT: a frozen node goes on where it stopped."""
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: the node vanishes as a crashed host would."""
        process, self._process = self._process, None
        if process is not None:
            process.kill()
            process.wait(timeout=10)

    def command(self, *args: str) -> str:
        return _command(self.port, *args)


def _server_args(port: int) -> list[str]:
    return [
        "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no",
        "--loglevel", "warning",
    ]  # fmt: skip


class RedisCluster:
    """Six nodes joined as 3 masters with one replica each; `url` names one of them."""

    def __init__(self, workdir: Path) -> None:
        ports = _free_ports(12)
        self.nodes = [
            Node(
                workdir / f"node-{n}",
                ports[n],
                [
                    *_server_args(ports[n]),
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    str(ports[6 + n]),
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    str(NODE_TIMEOUT_MS),
                ],
            )  # fmt: skip
            for n in range(6)
        ]

    @property
    def url(self) -> str:
        """A redis:// URL of one node (the client discovers the others)."""
        return f"redis://{self.nodes[0].address}/0"

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        subprocess.run(
            [
                _binary("redis-cli"), "--cluster", "create",
                *(node.address for node in self.nodes),
                "--cluster-replicas", "1", "--cluster-yes",
            ],
            capture_output=True,
            timeout=60,
            check=True,
        )  # fmt: skip
        self.wait_ok()

    def wait_ok(self) -> None:
        """Wait until every running node says the cluster is ok with three masters, and
        every replica has synced (a replica that never synced cannot take over)."""
        _wait("the cluster", self._ok)

    def _ok(self) -> bool:
        for node in self.nodes:
            if not node.running:
                continue
            info = node.command("CLUSTER", "INFO")
            if "cluster_state:ok" not in info or "cluster_size:3" not in info:
                return False
            replication = node.command("INFO", "replication")
            if "role:slave" in replication and "master_link_status:up" not in replication:
                return False
        return len(self.masters()) == 3

    def masters(self) -> list[Node]:
        """The running nodes that serve slots as masters, as the first running node sees it."""
        viewer = next(node for node in self.nodes if node.running)
        ports = set()
        for line in viewer.command("CLUSTER", "NODES").splitlines():
            fields = line.split()
            if "master" in fields[2] and "fail" not in fields[2] and len(fields) > 8:
                ports.add(int(fields[1].split("@")[0].rsplit(":", 1)[1]))
        return [node for node in self.nodes if node.port in ports and node.running]

    def master_of(self, key: str) -> Node:
        """The running master that serves `key`'s slot."""
        slot = int(self.nodes[0].command("CLUSTER", "KEYSLOT", key).strip())
        for node in self.masters():
            if self._serves(node, slot):
                return node
        raise RuntimeError(f"no running master serves slot {slot}")

    @staticmethod
    def _serves(node: Node, slot: int) -> bool:
        for line in node.command("CLUSTER", "NODES").splitlines():
            fields = line.split()
            if "myself" not in fields[2]:
                continue
            for part in fields[8:]:
                low, _, high = part.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    return True
        return False

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()


class SentinelPair:
    """A master, its replica and one Sentinel watching them as `SERVICE_NAME`."""

    def __init__(self, workdir: Path) -> None:
        master, replica, sentinel = _free_ports(3)
        self.master = Node(workdir / "master", master, _server_args(master))
        self.replica = Node(
            workdir / "replica",
            replica,
            [*_server_args(replica), "--replicaof", HOST, str(master)],
        )
        self._sentinel_dir = workdir / "sentinel"
        self.sentinel = Node(
            self._sentinel_dir, sentinel, [str(self._sentinel_dir / "sentinel.conf"), "--sentinel"]
        )

    @property
    def sentinels(self) -> list[str]:
        """The Sentinels' host:port addresses, as `state.sentinels` takes them."""
        return [self.sentinel.address]

    def start(self) -> None:
        self.master.start()
        self.replica.start()
        self._sentinel_dir.mkdir(parents=True, exist_ok=True)
        (self._sentinel_dir / "sentinel.conf").write_text(
            f"port {self.sentinel.port}\n"
            f"bind {HOST}\n"
            f"sentinel monitor {SERVICE_NAME} {HOST} {self.master.port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE_NAME} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE_NAME} 10000\n"
        )
        self.sentinel.start()
        _wait(
            "the replica's sync",
            lambda: "master_link_status:up" in self.replica.command("INFO", "replication"),
        )
        _wait(
            "the Sentinel",
            lambda: (
                str(self.replica.port)
                in self.sentinel.command("SENTINEL", "REPLICAS", SERVICE_NAME)
            ),
        )

    def current_master(self) -> int:
        """The port of the master the Sentinel names now."""
        reply = self.sentinel.command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE_NAME)
        return int(reply.split()[1])

    def stop(self) -> None:
        for node in (self.sentinel, self.replica, self.master):
            node.kill()


@contextmanager
def running_cluster(workdir: Path) -> Iterator[RedisCluster]:
    """A started 6-node cluster in `workdir`, stopped on exit."""
    cluster = RedisCluster(workdir)
    with ExitStack() as stack:
        stack.callback(cluster.stop)
        cluster.start()
        yield cluster


@contextmanager
def running_sentinel(workdir: Path) -> Iterator[SentinelPair]:
    """A started master, replica and Sentinel in `workdir`, stopped on exit."""
    pair = SentinelPair(workdir)
    with ExitStack() as stack:
        stack.callback(pair.stop)
        pair.start()
        yield pair
