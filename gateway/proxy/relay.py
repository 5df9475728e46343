"""What the proxy does to a response body on its way to the client: mask keys, read usage.

Both work chunk by chunk, so a stream is relayed as it arrives and never held whole.
`KeyMasker` replaces every upstream key with asterisks of the same length (a body's
Content-Length stays right); it holds back only a chunk's tail that could be the start
of a key, so a key split across two chunks is still masked. `UsageScanner` reads the
token usage: from each `data:` line of a server-sent-events stream that mentions usage,
or from the whole body otherwise (up to `max_body` bytes; a larger body's usage is left
unknown rather than held in memory).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from gateway.proxy.provider import Usage

UsageReader = Callable[[object], Usage | None]
MAX_BODY = 8 * 1024 * 1024
_MAX_LINE = 1024 * 1024


class KeyMasker:
    """Masks secrets in a byte stream, also across chunk boundaries."""

    def __init__(self, secrets: Sequence[str]) -> None:
        encoded = [s.encode() for s in secrets if s]
        self._secrets = [(secret, b"*" * len(secret)) for secret in encoded]
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        """The part of the stream that can be sent now, masked."""
        if not self._secrets:
            return chunk
        data = self._held + chunk
        for secret, mask in self._secrets:
            data = data.replace(secret, mask)
        keep = self._partial_tail(data)
        self._held = data[len(data) - keep :] if keep else b""
        return data[: len(data) - keep]

    def flush(self) -> bytes:
        """Whatever was held back at the end of the stream."""
        held, self._held = self._held, b""
        return held

    def _partial_tail(self, data: bytes) -> int:
        """The length of the longest tail of `data` that is a proper prefix of a secret."""
        longest = 0
        for secret, _ in self._secrets:
            for size in range(min(len(secret) - 1, len(data)), longest, -1):
                if data.endswith(secret[:size]):
                    longest = size
                    break
        return longest


class UsageScanner:
    """Collects the usage a response reports, from an SSE stream or a JSON body."""

    def __init__(self, read: UsageReader, *, sse: bool, max_body: int = MAX_BODY) -> None:
        self._read = read
        self._sse = sse
        self._max_body = max_body
        self._buffer = bytearray()
        self._overflow = False
        self._usage: Usage | None = None

    def feed(self, chunk: bytes) -> None:
        """Take one chunk of the body."""
        if self._overflow:
            return
        self._buffer += chunk
        if self._sse:
            self._scan_lines()
        elif len(self._buffer) > self._max_body:
            self._overflow = True
            self._buffer.clear()

    def finish(self) -> Usage | None:
        """The usage reported, once the body has ended (None: none was found)."""
        if self._sse:
            self._buffer += b"\n"
            self._scan_lines()
        elif not self._overflow and self._buffer:
            try:
                data = json.loads(bytes(self._buffer))
            except (ValueError, UnicodeDecodeError):
                data = None
            # A streamed Gemini response without alt=sse is one JSON array of chunks.
            for item in data if isinstance(data, list) else [data]:
                self._take(item)
            self._buffer.clear()
        return self._usage

    def _scan_lines(self) -> None:
        end = self._buffer.rfind(b"\n")
        if end < 0:
            if len(self._buffer) > _MAX_LINE:
                self._buffer.clear()
            return
        lines = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        for line in lines.split(b"\n"):
            if line.startswith(b"data:") and b'"usage' in line:
                try:
                    self._take(json.loads(line[5:]))
                except (ValueError, UnicodeDecodeError):
                    continue

    def _take(self, data: object) -> None:
        found = self._read(data)
        if found is not None:
            self._usage = found if self._usage is None else self._usage.merge(found)
