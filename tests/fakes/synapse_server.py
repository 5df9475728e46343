"""A real Synapse homeserver on loopback, and an aiohttp client for what the Matrix tests set up.

Not a fake: `matrix-synapse` from PyPI (the `dev` extra), started as a subprocess
(`python -m synapse.app.homeserver -c homeserver.yaml`) on a free 127.0.0.1 port with SQLite,
all its files (config, signing key, database, `homeserver.log`) in one work folder. The
generated config keeps it local: a client listener only (no federation listener, an empty
federation whitelist, every outbound IP range blocked), no trusted key servers, no stats
reporting, no media repository or URL previews, presence off, public registration off.
Users are made through the shared-secret admin registration API. The message rate limit
(`rc_message`) is `RateLimit` for the server, generous by default; other rate limits are
raised so that tests never meet them.

`SynapseServer` is the process (start, stop, `base_url`); `running_synapse` a started one
for a `with` block; `SynapseClient` the async helpers (`register`, `create_room`, `join`,
`send_text`, `messages`) over a real aiohttp session, raising `MatrixError` (errcode,
`retry_after_ms`) on a Matrix error answer.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import importlib.util
import itertools
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import aiohttp
import yaml

from tests.fakes.loopback import LOOPBACK_HOST
from tests.fakes.redis_server import free_port

Json = dict[str, Any]
SERVER_NAME = "loopwarden.test"
START_SECONDS = 90.0
"""A bound on waiting for /_matrix/client/versions, so a broken start fails instead of hanging.

Synapse answers about 1.5 s after launch on an idle 2-core machine; the bound leaves room
for a machine busy with the rest of the suite."""
STOP_SECONDS = 15.0


class SynapseMissing(RuntimeError):
    """The `synapse` package is not installed in this interpreter."""


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A Synapse token-bucket rate limit: `burst_count` actions, refilled at `per_second`."""

    per_second: float
    burst_count: int


GENEROUS = RateLimit(per_second=1000.0, burst_count=1000)
"""High enough that no test meets the limit by accident."""


def _limits(rc_message: RateLimit) -> Json:
    """Every `rc_*` setting of the config: `rc_message` as given, the rest generous."""
    generous = {"per_second": GENEROUS.per_second, "burst_count": GENEROUS.burst_count}
    return {
        "rc_message": {"per_second": rc_message.per_second, "burst_count": rc_message.burst_count},
        "rc_registration": generous,
        "rc_login": {"address": generous, "account": generous, "failed_attempts": generous},
        "rc_joins": {"local": generous, "remote": generous},
        "rc_joins_per_room": generous,
        "rc_invites": {"per_room": generous, "per_user": generous, "per_issuer": generous},
        "rc_admin_redaction": generous,
        "rc_room_creation": generous,
        "rc_presence": {"per_user": generous},
        "rc_profile": generous,
        "rc_user_directory": generous,
        "rc_reports": generous,
    }


def homeserver_config(workdir: Path, port: int, secret: str, rc_message: RateLimit) -> Json:
    """The homeserver.yaml of a local-only Synapse with its files in `workdir`."""
    return {
        "server_name": SERVER_NAME,
        "pid_file": str(workdir / "homeserver.pid"),
        "listeners": [
            {
                "port": port,
                "bind_addresses": [LOOPBACK_HOST],
                "type": "http",
                "tls": False,
                "x_forwarded": False,
                "resources": [{"names": ["client"], "compress": False}],
            }
        ],
        "database": {"name": "sqlite3", "args": {"database": str(workdir / "homeserver.db")}},
        "log_config": str(workdir / "log.yaml"),
        "media_store_path": str(workdir / "media"),
        "signing_key_path": str(workdir / "signing.key"),
        "registration_shared_secret": secret,
        "macaroon_secret_key": secrets.token_hex(16),
        "form_secret": secrets.token_hex(16),
        "enable_registration": False,
        # Synapse's own test setting: registering a user hashes its password, 12 rounds take
        # a quarter of a second each on an idle core.
        "bcrypt_rounds": 4,
        "report_stats": False,
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        # No federation: nobody to talk to, and the only listener serves the client API.
        "federation_domain_whitelist": [],
        # Synapse may reach no address at all (pushers, previews, key fetches): loopback only.
        "ip_range_blacklist": ["0.0.0.0/0", "::/0"],
        "enable_media_repo": False,
        "url_preview_enabled": False,
        "presence": {"enabled": False},
        **_limits(rc_message),
    }


def _log_config(log_file: Path) -> Json:
    """Python logging config: INFO and up to `log_file`, nothing to the terminal."""
    return {
        "version": 1,
        "formatters": {"plain": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
        "handlers": {
            "file": {
                "class": "logging.FileHandler",
                "filename": str(log_file),
                "formatter": "plain",
            }
        },
        "root": {"level": "INFO", "handlers": ["file"]},
        "disable_existing_loggers": False,
    }


def _signing_key() -> str:
    """A fresh ed25519 signing key line as Synapse reads it: algorithm, version, seed."""
    seed = base64.b64encode(os.urandom(32)).decode("ascii").rstrip("=")
    return f"ed25519 a_{secrets.token_hex(2)} {seed}\n"


def _answers_versions(url: str) -> bool:
    """True when the client API answers `/_matrix/client/versions` with 200."""
    try:
        with urllib.request.urlopen(f"{url}/_matrix/client/versions", timeout=1) as answer:
            return int(answer.status) == 200
    except (urllib.error.URLError, OSError):
        return False


class SynapseServer:
    """One Synapse process on a loopback port, with SQLite and a generated config in `workdir`."""

    def __init__(self, workdir: Path, *, rc_message: RateLimit = GENEROUS) -> None:
        if importlib.util.find_spec("synapse") is None:
            raise SynapseMissing(
                "matrix-synapse is not installed; install the dev extra "
                "(`pip install -e '.[dev]'`), which brings it"
            )
        self.workdir = workdir
        self.rc_message = rc_message
        self.port = free_port()
        self.registration_shared_secret = secrets.token_hex(16)
        self.startup_seconds = 0.0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """The homeserver URL a client is configured with (`http://127.0.0.1:<port>`)."""
        return f"http://{LOOPBACK_HOST}:{self.port}"

    @property
    def log_file(self) -> Path:
        """Synapse's own log: read it when a test fails in a way the answers do not explain."""
        return self.workdir / "homeserver.log"

    @property
    def running(self) -> bool:
        """True while the process is alive."""
        return self._process is not None and self._process.poll() is None

    def _write_config(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        key = self.workdir / "signing.key"
        if not key.exists():
            key.write_text(_signing_key())
        (self.workdir / "log.yaml").write_text(yaml.safe_dump(_log_config(self.log_file)))
        config = homeserver_config(
            self.workdir, self.port, self.registration_shared_secret, self.rc_message
        )
        path = self.workdir / "homeserver.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def start(self) -> None:
        """Start Synapse and wait until its client API answers (or raise, naming the log)."""
        if self.running:
            return
        config = self._write_config()
        args = [sys.executable, "-m", "synapse.app.homeserver", "-c", str(config)]
        began = time.monotonic()
        with (self.workdir / "stdio.log").open("ab") as stdio:
            self._process = subprocess.Popen(
                args, cwd=self.workdir, stdout=stdio, stderr=subprocess.STDOUT
            )
        deadline = began + START_SECONDS
        while not _answers_versions(self.base_url):
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"Synapse exited at start (code {self._process.returncode}); see "
                    f"{self.workdir}/stdio.log and {self.log_file}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"Synapse did not answer on {self.base_url} within {START_SECONDS:g} s; "
                    f"see {self.log_file}"
                )
            time.sleep(0.05)
        self.startup_seconds = time.monotonic() - began

    def stop(self) -> None:
        """Stop Synapse (SIGTERM, then SIGKILL if it lingers) and wait for it to exit."""
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=STOP_SECONDS)

    def __enter__(self) -> SynapseServer:
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
def running_synapse(workdir: Path, *, rc_message: RateLimit = GENEROUS) -> Iterator[SynapseServer]:
    """A started SynapseServer in `workdir`, stopped on exit."""
    with SynapseServer(workdir, rc_message=rc_message) as server:
        yield server


class MatrixError(Exception):
    """A Matrix error answer: HTTP status, `errcode`, `error`, and `retry_after_ms` when limited."""

    def __init__(self, status: int, body: Json, headers: dict[str, str]) -> None:
        self.status = status
        self.body = body
        self.headers = headers
        self.errcode = str(body.get("errcode", ""))
        self.error = str(body.get("error", ""))
        retry = body.get("retry_after_ms")
        self.retry_after_ms = int(retry) if isinstance(retry, int | float) else None
        super().__init__(f"{status} {self.errcode}: {self.error}")


def thread_relation(thread_root: str) -> Json:
    """The `m.relates_to` of a message in the thread of `thread_root` (with the reply fallback)."""
    return {
        "rel_type": "m.thread",
        "event_id": thread_root,
        "is_falling_back": True,
        "m.in_reply_to": {"event_id": thread_root},
    }


class SynapseClient:
    """Set-up and inspection calls against a SynapseServer, over one aiohttp session.

    Usernames are server-wide and the session's homeserver is shared by every test of a
    worker: pick names unique to the test.
    """

    def __init__(self, server: SynapseServer) -> None:
        self.server = server
        self._session: aiohttp.ClientSession | None = None
        self._txn = itertools.count(1)
        self._txn_prefix = secrets.token_hex(4)

    async def __aenter__(self) -> SynapseClient:
        self._session = aiohttp.ClientSession(base_url=self.server.base_url)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        token: str | None = None,
        body: Json | None = None,
        params: dict[str, str] | None = None,
    ) -> Json:
        """One client-server API call; its JSON answer, or MatrixError for a non-2xx answer."""
        if self._session is None:
            raise RuntimeError("SynapseClient is used outside `async with`")
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        async with self._session.request(
            method, path, json=body, params=params, headers=headers
        ) as answer:
            data = await answer.json(content_type=None)
            if not isinstance(data, dict):
                data = {"error": repr(data)}
            if answer.status >= 300:
                raise MatrixError(answer.status, data, dict(answer.headers))
            return data

    async def register(self, username: str, *, admin: bool = False) -> tuple[str, str]:
        """A new user through the shared-secret admin API; (user_id, access_token)."""
        path = "/_synapse/admin/v1/register"
        nonce = str((await self.request("GET", path))["nonce"])
        password = secrets.token_urlsafe(16)
        mac = hmac.new(self.server.registration_shared_secret.encode(), digestmod=hashlib.sha1)
        for part in (nonce, username, password):
            mac.update(part.encode())
            mac.update(b"\x00")
        mac.update(b"admin" if admin else b"notadmin")
        answer = await self.request(
            "POST",
            path,
            body={
                "nonce": nonce,
                "username": username,
                "password": password,
                "admin": admin,
                "mac": mac.hexdigest(),
            },
        )
        return str(answer["user_id"]), str(answer["access_token"])

    async def create_room(
        self,
        token: str,
        *,
        invite: Sequence[str] = (),
        name: str | None = None,
        preset: str = "private_chat",
    ) -> str:
        """A room made by the token's user, inviting `invite` (user ids); its room id.

        `private_chat` rooms are joined by invitation; `public_chat` ones by anyone.
        """
        body: Json = {"preset": preset, "invite": list(invite)}
        if name is not None:
            body["name"] = name
        answer = await self.request("POST", "/_matrix/client/v3/createRoom", token=token, body=body)
        return str(answer["room_id"])

    async def join(self, token: str, room_id: str) -> None:
        """The token's user joins `room_id` (invited, or the room is public)."""
        await self.request(
            "POST", f"/_matrix/client/v3/rooms/{quote(room_id, safe='')}/join", token=token, body={}
        )

    async def send_text(
        self,
        token: str,
        room_id: str,
        body: str,
        *,
        msgtype: str = "m.text",
        mentions: Sequence[str] | None = None,
        thread_root: str | None = None,
    ) -> str:
        """An `m.room.message` from the token's user; its event id.

        Args:
            msgtype: `m.text`, `m.notice` (what bots send) or `m.emote`.
            mentions: user ids for `m.mentions` (omitted when None, as an older client does).
            thread_root: the event id of the thread to post in.
        """
        content: Json = {"msgtype": msgtype, "body": body}
        if mentions is not None:
            content["m.mentions"] = {"user_ids": list(mentions)}
        if thread_root is not None:
            content["m.relates_to"] = thread_relation(thread_root)
        txn = f"{self._txn_prefix}-{next(self._txn)}"
        path = f"/_matrix/client/v3/rooms/{quote(room_id, safe='')}/send/m.room.message/{txn}"
        answer = await self.request("PUT", path, token=token, body=content)
        return str(answer["event_id"])

    async def messages(
        self, token: str, room_id: str, *, event_type: str | None = "m.room.message"
    ) -> list[Json]:
        """Every event of `room_id` the token's user can see, oldest first (one type, or all)."""
        params = {"dir": "b", "limit": "500"}
        if event_type is not None:
            params["filter"] = json.dumps({"types": [event_type]})
        path = f"/_matrix/client/v3/rooms/{quote(room_id, safe='')}/messages"
        events: list[Json] = []
        while True:
            answer = await self.request("GET", path, token=token, params=params)
            events.extend(answer.get("chunk", []))
            end = answer.get("end")
            if not answer.get("chunk") or end is None:
                return events[::-1]
            params["from"] = str(end)
