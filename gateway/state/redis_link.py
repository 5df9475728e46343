"""One store's Redis connection: its scripts, and what happens while Redis is down.

The state store (gateway/state/redis.py) and the call store (gateway/calls/redis_store.py)
each hold one `RedisLink` and take their `start`, `aclose`, `degraded` and
`unavailable_calls` from `RedisLinked`. Scripts registered with `script` run by EVALSHA; redis-py
loads a script again when the server answers NOSCRIPT (e.g. after a restart lost the
script cache), and `start` loads them all up front. Every call goes through `guarded`:
- an unreachable Redis (connection refused, timeout, read-only replica, out of memory,
  cluster down) becomes a `StateError`, and the store decides by `on_error`;
- the first failure of an outage logs one warning and the first success after it one
  info line, on the store's own logger; `unavailable_calls` counts the calls that could
  not reach Redis and `degraded` tells whether an outage is running;
- while degraded, one call per `probe_interval` goes to Redis and the rest fail fast, so
  an unreachable host does not add a connect timeout to every call.
The URL is never logged (it may hold a password); error texts are logged with the
password masked.

Where Redis is (`RedisTopology`): one server at the URL; a Redis Cluster (`cluster`: the
URL names any node, redis-py's cluster client discovers the others and follows MOVED and
failovers); or a master watched by Sentinels (`sentinels` and `service_name`: the URL
gives only the scheme, `rediss` for TLS, the user, password and database, and the
master's address is asked of the Sentinels again after a failover). Every script's keys
share one hash tag, so each call runs on one cluster slot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import unquote, urlsplit

from redis import exceptions as redis_errors
from redis.asyncio import Redis, RedisCluster, Sentinel
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript

from gateway.app.errors import StateError
from gateway.config.state import StateConfig

T = TypeVar("T")
OnError = Literal["allow", "deny"]

# Shared by every script: `now` from ARGV (an injected clock) or the server's TIME, and
# a number formatted so that it reads back exactly.
LUA_CLOCK = """
local function clock(given)
  if given ~= '' then return tonumber(given) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function num(x) return string.format('%.17g', x) end
"""

_UNAVAILABLE = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ReadOnlyError,
    redis_errors.OutOfMemoryError,
    redis_errors.ClusterDownError,
    OSError,
)
# Keys asked for per SCAN round trip (admin paths only).
_SCAN_COUNT = 1000
# Connections a client may open to one server: one per command in flight, as many as the
# process needs (the server's `maxclients` is the bound). Recent redis-py releases keep
# 100 a node by default and fail the 101st command at once with MaxConnectionsError,
# which would read as an outage: a burst of calls would be decided on local records.
_MAX_CONNECTIONS = 2**31

Client = Redis | RedisCluster


@dataclass(frozen=True)
class RedisTopology:
    """How the servers behind a Redis URL are laid out (DESIGN.md §2 "State").

    `cluster`: the URL names one node of a Redis Cluster; `sentinels` (host, port pairs)
    and `service_name`: the master is the one those Sentinels name. Neither: one server.
    """

    cluster: bool = False
    sentinels: tuple[tuple[str, int], ...] = ()
    service_name: str = ""

    @classmethod
    def of(cls, state: StateConfig) -> RedisTopology:
        """The topology `state:` configures (its `host:port` Sentinels already validated)."""
        sentinels = []
        for address in state.sentinels:
            host, _, port = address.rpartition(":")
            sentinels.append((host.strip("[]"), int(port)))
        return cls(state.cluster, tuple(sentinels), state.service_name)


ONE_SERVER = RedisTopology()
"""The default topology: one server at the URL."""


def connect(url: str, topology: RedisTopology, timeout: float) -> tuple[Client, list[Redis]]:
    """A client of the servers `url` and `topology` name, and the Sentinels' own clients
    (closed with it); nothing connects yet."""
    # One immediate retry on a fresh connection: after a Redis restart the pooled
    # connections are dead, and the first command on each must not count as an outage.
    retry = Retry(NoBackoff(), 1, supported_errors=(redis_errors.ConnectionError,))
    if topology.cluster:
        return RedisCluster.from_url(
            url,
            decode_responses=True,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=retry,
            max_connections=_MAX_CONNECTIONS,
        ), []
    if topology.sentinels:
        parts = urlsplit(url)
        database = parts.path.lstrip("/")
        sentinel = Sentinel(
            list(topology.sentinels),
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            sentinel_kwargs={"socket_timeout": timeout, "socket_connect_timeout": timeout},
        )
        master: Redis = sentinel.master_for(
            topology.service_name,
            decode_responses=True,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            db=int(database) if database else 0,
            ssl=parts.scheme == "rediss",
            retry=retry,
            max_connections=_MAX_CONNECTIONS,
        )
        return master, list(sentinel.sentinels)
    return Redis.from_url(
        url,
        decode_responses=True,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=retry,
        max_connections=_MAX_CONNECTIONS,
    ), []


class RedisLink:
    """A Redis client whose calls turn an outage into StateError: logged once, probed, counted."""

    def __init__(
        self,
        url: str,
        *,
        name: str,
        log: logging.Logger,
        on_error: OnError,
        if_allowed: str,
        if_denied: str,
        clock: Callable[[], float] | None,
        timeout: float,
        probe_interval: float,
        on_recovered: Callable[[], None] | None = None,
        topology: RedisTopology = ONE_SERVER,
    ) -> None:
        """Make the client; nothing connects before the first call.

        Args:
            url: the Redis URL (may hold a password: never logged).
            topology: one server, a cluster or a Sentinel-watched master.
            name: what the owner is called in logs and errors, e.g. "redis state store".
            log: the owner's logger, which the outage lines go to.
            on_error: "allow" or "deny", for the owner to act on while Redis is down.
            if_allowed: what the owner does in an outage with `allow`, for the warning.
            if_denied: the same with `deny`.
            clock: a clock whose time the scripts get (`now`), None for the server's TIME.
            timeout: connect and read timeout in seconds.
            probe_interval: seconds between the calls let through to Redis in an outage.
            on_recovered: called when the first call after an outage succeeds.
        """
        self._client, self._sentinels = connect(url, topology, timeout)
        self._password = urlsplit(url).password
        self._name = name
        self._log = log
        self._on_error = on_error
        self._consequence = if_allowed if on_error == "allow" else if_denied
        self._clock = clock
        self._probe_interval = probe_interval
        self._on_recovered = on_recovered
        self._scripts: list[AsyncScript] = []
        self._down = False
        self._down_since = 0.0
        self._probe_at = 0.0
        self._unavailable = 0
        self._unavailable_in_outage = 0

    @property
    def client(self) -> Client:
        """The client, for plain commands (wrap each call in `guarded`)."""
        return self._client

    @property
    def on_error(self) -> OnError:
        """What the owner does while Redis is down: "allow" or "deny"."""
        return self._on_error

    @property
    def probe_interval(self) -> float:
        """Seconds between the calls let through to Redis during an outage."""
        return self._probe_interval

    @property
    def degraded(self) -> bool:
        """True while Redis is unreachable and `on_error` decides."""
        return self._down

    @property
    def unavailable_calls(self) -> int:
        """Calls that could not reach Redis, over every outage so far."""
        return self._unavailable

    def now(self) -> str:
        """The time for a script's ARGV (see LUA_CLOCK): the injected clock's, or ''."""
        return "" if self._clock is None else repr(self._clock())

    def script(self, source: str) -> AsyncScript:
        """Register a Lua script (loaded by `start`, reloaded by redis-py after NOSCRIPT)."""
        script = self._client.register_script(source)
        self._scripts.append(script)
        return script

    async def run_waited(
        self,
        script: AsyncScript,
        keys: Sequence[str],
        args: Sequence[str | int],
        replicas: int,
        timeout_ms: int,
    ) -> tuple[Any, int]:
        """Run a script, then `WAIT replicas timeout_ms` on the same connection (one round
        trip, a pipeline); the script's reply and how many replicas hold its writes.

        On a cluster the WAIT goes to the master of the first key's slot, where the
        pipeline sends the script (a MOVED script is followed there; the WAIT is not, and
        then counts the old master's replicas). Wrap the call in `guarded`.
        """
        try:
            return await self._script_then_wait(script, keys, args, replicas, timeout_ms)
        except redis_errors.NoScriptError:  # a restarted server lost its script cache
            await self._client.script_load(script.script)
            return await self._script_then_wait(script, keys, args, replicas, timeout_ms)

    async def _script_then_wait(
        self,
        script: AsyncScript,
        keys: Sequence[str],
        args: Sequence[str | int],
        replicas: int,
        timeout_ms: int,
    ) -> tuple[Any, int]:
        client = self._client
        async with client.pipeline(transaction=False) as pipe:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            if isinstance(client, RedisCluster):
                node = client.get_node_from_key(keys[0])
                pipe.execute_command("WAIT", replicas, timeout_ms, target_nodes=node)
            else:
                pipe.execute_command("WAIT", replicas, timeout_ms)
            reply, acknowledged = await pipe.execute()
        return reply, int(acknowledged)

    async def start(self) -> None:
        """Load the scripts; an unreachable Redis is an outage (logged), not a start failure."""

        async def load() -> None:
            for script in self._scripts:
                await self._client.script_load(script.script)

        try:
            await self.guarded(load)
        except StateError:
            return

    async def aclose(self) -> None:
        """Close the connection pool (and the Sentinels' connections)."""
        await self._client.aclose()
        for sentinel in self._sentinels:
            await sentinel.aclose()

    async def scan(self, pattern: str) -> AsyncIterator[str]:
        """The keys matching a MATCH pattern, by SCAN (admin paths, never per message)."""
        async for key in self._client.scan_iter(match=pattern, count=_SCAN_COUNT):
            yield str(key)

    async def guarded(self, call: Callable[[], Awaitable[T]]) -> T:
        """Run one Redis call; an unreachable Redis becomes a StateError (logged once)."""
        if self._down:
            now = time.monotonic()
            if now < self._probe_at:
                self._count_unavailable()
                raise StateError(f"the {self._name} is unreachable")
            self._probe_at = now + self._probe_interval
        try:
            result = await call()
        except _UNAVAILABLE as exc:
            self._failed(exc)
            raise StateError(f"the {self._name} is unreachable") from None
        if self._down:
            self._recovered()
        return result

    def _count_unavailable(self) -> None:
        self._unavailable += 1
        self._unavailable_in_outage += 1

    def _failed(self, exc: BaseException) -> None:
        if self._down:
            self._count_unavailable()
            return
        self._unavailable_in_outage = 0
        self._count_unavailable()
        self._down = True
        self._down_since = time.monotonic()
        self._probe_at = self._down_since + self._probe_interval
        self._log.warning(
            "%s unreachable (%s); on_error=%s: %s until it is back",
            self._name,
            self._describe(exc),
            self._on_error,
            self._consequence,
        )

    def _recovered(self) -> None:
        self._down = False
        self._log.info(
            "%s reachable again after %.1f s; %d call(s) failed meanwhile",
            self._name,
            time.monotonic() - self._down_since,
            self._unavailable_in_outage,
        )
        if self._on_recovered is not None:
            self._on_recovered()

    def _describe(self, exc: BaseException) -> str:
        """The error's type and text, with the URL's password masked."""
        text = f"{type(exc).__name__}: {exc}"
        return text.replace(self._password, "***") if self._password else text


class RedisLinked:
    """Base of a store kept behind one RedisLink: its start, close and outage report."""

    _link: RedisLink

    @property
    def degraded(self) -> bool:
        """True while Redis is unreachable and `on_error` decides."""
        return self._link.degraded

    @property
    def unavailable_calls(self) -> int:
        """Calls that could not reach Redis, over every outage so far."""
        return self._link.unavailable_calls

    async def start(self) -> None:
        """Load the scripts; an unreachable Redis is an outage (logged), not a start failure."""
        await self._link.start()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._link.aclose()


def glob_escape(text: str) -> str:
    """`text` as a literal in a Redis MATCH pattern."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)
