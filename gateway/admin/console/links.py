"""Sign-in links made on the host (`loopwarden console-link`) for a console already running.

The command line and the server are two processes, and with `state.backend: memory`
they share no state; what they always share on one host is its file system. So the
command writes the link's code into a folder only its user can enter, and the server
(every worker of it on that host) redeems codes from there beside its own
(`ConsoleSessions.redeem`, the demo's links).

Decisions where DESIGN.md is silent:
- The folder is `console-<product>-<port>` (`console-gateway-8787`, `console-proxy-8788`)
  under `$LOOPWARDEN_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/loopwarden`, else
  `<temp dir>/loopwarden-<uid>`. The server makes it at start (mode 0700; a port of 0,
  chosen anew each run, has none). The command refuses when it is missing (no console
  has started there as this user: the command must run as the server's user, with the same
  environment) and both refuse a folder that is not a directory this user owns that no one
  else may enter, so another user cannot plant a code.
- A code is `secrets.token_urlsafe(32)`; only its SHA-256 is written, as the name of a
  file (mode 0600) holding when it expires, `LINK_TTL` (10 minutes) from its making on
  the host's clock. The server redeems a code by reading that file and deleting it: the
  delete succeeds once, so a code signs in once whichever worker gets it first, and an
  expired one (or one claiming more than `LINK_TTL` left) is deleted unused. Each run of
  the command sweeps the expired ones.
- A link is redeemed even while its address is locked out of sign-in: whoever can write
  to the folder can run the command, and that is the way back in for an operator a
  stranger has locked out (`gateway.admin.console.app`).
- The links work on the host where they were made: with replicas on several hosts, open
  the link at that host's own address. POSIX only (file owners and modes).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import secrets
import stat
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

from gateway.app.errors import LoopwardenError

LINK_TTL = 600.0
_SUFFIX = ".link"
_MAX_FILE_BYTES = 64

Product = Literal["gateway", "proxy"]


class LinkFolderError(LoopwardenError):
    """The links' folder is missing or not safe to trust; the message says which and why."""


def runtime_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where loopwarden keeps files for the processes of this user on this host."""
    env = os.environ if environ is None else environ
    if env.get("LOOPWARDEN_RUNTIME_DIR"):
        return Path(env["LOOPWARDEN_RUNTIME_DIR"])
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "loopwarden"
    return Path(tempfile.gettempdir()) / f"loopwarden-{os.getuid()}"


class ConsoleLinks:
    """One console's folder of pending sign-in links: the CLI writes them, the server redeems."""

    def __init__(self, folder: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.folder = folder
        self._clock = clock

    @classmethod
    def of(
        cls,
        product: Product,
        port: int,
        *,
        clock: Callable[[], float] = time.time,
        environ: Mapping[str, str] | None = None,
    ) -> ConsoleLinks | None:
        """The links of the console served on `port`; None for port 0 (a new port each run)."""
        if port == 0:
            return None
        return cls(runtime_dir(environ) / f"console-{product}-{port}", clock=clock)

    def prepare(self) -> None:
        """Make the folder (the server, at start), or check the one there is ours alone."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._check_folder()

    def issue(self) -> str:
        """A new code, valid once for `LINK_TTL` (the command line); expired ones are swept."""
        if not self.folder.exists():
            raise LinkFolderError(
                f"no console has started with links in {self.folder}: start the server first, "
                "or run this as the user it runs as, with the same LOOPWARDEN_RUNTIME_DIR or "
                "XDG_RUNTIME_DIR"
            )
        self._check_folder()
        self._sweep()
        code = secrets.token_urlsafe(32)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        descriptor = os.open(self._path(code), flags, 0o600)
        with os.fdopen(descriptor, "w", encoding="ascii") as file:
            file.write(repr(self._clock() + LINK_TTL))
        return code

    def redeem(self, code: str) -> bool:
        """True, once, for a code the command line made that has not expired."""
        path = self._path(code)
        try:
            descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:  # no such code (the usual case), or a link planted in its place
            return False
        with os.fdopen(descriptor, "rb") as file:
            if not _ours(os.fstat(file.fileno())) or not _ours(os.stat(self.folder)):
                return False
            expires = _expiry(file.read(_MAX_FILE_BYTES))
        try:
            path.unlink()
        except FileNotFoundError:  # another worker redeemed it first
            return False
        # Nothing this module writes lasts longer than LINK_TTL: such a file is not ours.
        return expires is not None and 0 < expires - self._clock() <= LINK_TTL

    def _path(self, code: str) -> Path:
        digest = hashlib.sha256(code.encode("utf-8", "replace")).hexdigest()
        return self.folder / f"{digest}{_SUFFIX}"

    def _check_folder(self) -> None:
        info = os.lstat(self.folder)
        if not stat.S_ISDIR(info.st_mode) or not _ours(info):
            raise LinkFolderError(
                f"{self.folder} must be a directory owned by this user that no one else may "
                "read or enter (chmod 700)"
            )
        if os.lstat(self.folder.parent).st_uid != os.getuid():
            raise LinkFolderError(f"{self.folder.parent} must be owned by this user")

    def _sweep(self) -> None:
        now = self._clock()
        for path in self.folder.glob(f"*{_SUFFIX}"):
            with contextlib.suppress(OSError):
                expires = _expiry(path.read_bytes()[:_MAX_FILE_BYTES])
                if expires is None or expires <= now:
                    path.unlink()


def _ours(info: os.stat_result) -> bool:
    """Owned by this user, and neither group nor others may read, write or enter it."""
    return info.st_uid == os.getuid() and info.st_mode & 0o077 == 0


def _expiry(content: bytes) -> float | None:
    try:
        expires = float(content.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    return expires if math.isfinite(expires) else None
