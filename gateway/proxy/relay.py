"""What the proxy does to a response body on its way to the client: decode, mask, read usage.

All three work chunk by chunk, so a stream is relayed as it arrives and never held whole;
an answer that is no stream (not `text/event-stream`), in identity encoding and with a
Content-Length up to `WHOLE_BODY_MAX` is masked and read for usage whole instead
(`KeyMasker.whole`, `body_usage`), and sent in one write with its headers.
`BodyDecoder` undoes a gzip or deflate `Content-Encoding` (an upstream may ignore the
proxy's `Accept-Encoding: identity`), so keys are masked and usage read in the plain
body, which is what the client gets; any other encoding cannot be checked for keys and is
not relayed. `KeyMasker` replaces every form of an upstream key (`masked_forms`: as is,
`\\/`-escaped, percent-encoded, inside base64 at any alignment) with asterisks of the same
length (a body's Content-Length stays right); it holds back only a chunk's tail that could
be the start of one, so a key split across two chunks is still masked. `UsageScanner`
reads the token usage: from each `data:` line of a server-sent-events stream that
mentions usage, or from the whole body otherwise (up to `max_body` bytes; a larger body's
usage is left unknown rather than held in memory).

Decisions where DESIGN.md is silent: `WHOLE_BODY_MAX` is 1 MiB. An answer that is no
stream is of no use to its client before its last byte, so holding it back costs the
client nothing, and one write of headers and body instead of three saves the proxy and
the client a round each; larger answers (files, say) are still streamed, so an answer
held whole is at most that.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import zlib
from collections.abc import Callable, Sequence
from urllib.parse import quote

from gateway.app.errors import LoopwardenError
from gateway.proxy.provider import Usage

UsageReader = Callable[[object], Usage | None]
MAX_BODY = 8 * 1024 * 1024
WHOLE_BODY_MAX = 1024 * 1024
"""The largest answer (not a stream, identity encoding, Content-Length known) relayed whole."""
_MAX_LINE = 1024 * 1024
# What one compressed chunk may inflate to; more is a decompression bomb, not an answer.
MAX_INFLATED_CHUNK = 16 * 1024 * 1024
_GZIP = zlib.MAX_WBITS | 16
_PERCENT_HEX = re.compile(r"%[0-9A-F]{2}")


class EncodedBodyError(LoopwardenError):
    """A response body the proxy cannot decode, so it cannot be checked for keys."""


class BodyDecoder:
    """Undoes a response's Content-Encoding chunk by chunk: none, gzip or deflate."""

    def __init__(self, content_encoding: str) -> None:
        encoding = content_encoding.strip().lower()
        if encoding not in ("", "identity", "gzip", "x-gzip", "deflate"):
            raise EncodedBodyError(f"content-encoding {content_encoding[:40]!r}")
        self.encoding = encoding if encoding not in ("", "identity") else None
        self._inflate: zlib._Decompress | None = None

    def feed(self, chunk: bytes) -> bytes:
        """The decoded bytes of one chunk."""
        if self.encoding is None:
            return chunk
        if self._inflate is None:
            self._inflate = zlib.decompressobj(self._wbits(chunk))
        try:
            plain = self._inflate.decompress(chunk, MAX_INFLATED_CHUNK)
        except zlib.error:
            raise EncodedBodyError(f"corrupt {self.encoding} body") from None
        if self._inflate.unconsumed_tail:
            raise EncodedBodyError(f"a {self.encoding} chunk inflates past the limit")
        return plain

    def finish(self) -> bytes:
        """The last decoded bytes, once the body has ended; a truncated body is an error."""
        if self._inflate is None:
            return b""
        if not self._inflate.eof:
            raise EncodedBodyError(f"truncated {self.encoding} body")
        return self._inflate.flush()

    def _wbits(self, first: bytes) -> int:
        if self.encoding != "deflate":
            return _GZIP
        # "deflate" is meant to be zlib-wrapped, yet some servers send raw deflate.
        wrapped = not first or first[0] & 0x0F == 8
        return zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS


def masked_forms(secret: str) -> list[str]:
    """Every spelling of a key that must not reach a client: escaped, encoded or base64.

    A key inside a longer base64 text (`Bearer <key>`, encoded) is found by the part of
    its encoding that does not depend on what came before it, at each of the 3 offsets.
    """
    if not secret:
        return []
    percent = quote(secret, safe="")
    forms = {
        secret,
        secret.replace("/", "\\/"),
        percent,
        _PERCENT_HEX.sub(lambda hexed: hexed.group().lower(), percent),
    }
    raw = secret.encode()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode()
        core = encoded[-(-8 * offset // 6) : 8 * (offset + len(raw)) // 6]
        forms.update({core, core.replace("+", "-").replace("/", "_")})
    # Longest first, so a form holding a shorter one is masked whole.
    return sorted(forms, key=lambda form: (-len(form), form))


@functools.lru_cache(maxsize=16)
def _masks(secrets: tuple[str, ...]) -> list[tuple[bytes, bytes]]:
    """Each secret as bytes with its mask, built once per set (a masker per response)."""
    encoded = [secret.encode() for secret in secrets if secret]
    return [(secret, b"*" * len(secret)) for secret in encoded]


class KeyMasker:
    """Masks secrets in a byte stream, also across chunk boundaries."""

    def __init__(self, secrets: Sequence[str]) -> None:
        self._secrets = _masks(tuple(secrets))
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        """The part of the stream that can be sent now, masked."""
        if not self._secrets or not (chunk or self._held):
            return chunk
        data = self._replace(self._held + chunk)
        keep = self._partial_tail(data)
        self._held = data[len(data) - keep :] if keep else b""
        return data[: len(data) - keep]

    def whole(self, body: bytes) -> bytes:
        """A complete body, masked: nothing follows it, so nothing is held back."""
        return self._replace(body) if self._secrets else body

    def _replace(self, data: bytes) -> bytes:
        for secret, mask in self._secrets:
            data = data.replace(secret, mask)
        return data

    def flush(self) -> bytes:
        """Whatever was held back at the end of the stream."""
        held, self._held = self._held, b""
        return held

    def _partial_tail(self, data: bytes) -> int:
        """The length of the longest tail of `data` that is a proper prefix of a secret."""
        longest = 0
        for secret, _ in self._secrets:
            # Only tails longer than the longest so far, shorter than the secret.
            start, end = max(len(data) - len(secret) + 1, 0), len(data) - longest
            found = data.find(secret[:1], start, end)
            while found >= 0:
                # The first match is the longest: later ones are shorter tails.
                if secret.startswith(data[found:]):
                    longest = len(data) - found
                    break
                found = data.find(secret[:1], found + 1, end)
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

    def whole(self, body: bytes) -> None:
        """Take a complete JSON body at once (no stream): read without copying it."""
        if len(body) <= self._max_body:
            self._usage = body_usage(self._read, body)

    def finish(self) -> Usage | None:
        """The usage reported, once the body has ended (None: none was found)."""
        if self._sse:
            self._buffer += b"\n"
            self._scan_lines()
        elif not self._overflow and self._buffer:
            self._usage = body_usage(self._read, bytes(self._buffer))
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
        self._usage = _merged(self._usage, self._read(data))


def body_usage(read: UsageReader, body: bytes) -> Usage | None:
    """The usage a whole JSON body reports (None: none, or the body is not JSON)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, list):
        return read(data)
    # A streamed Gemini response without alt=sse is one JSON array of chunks.
    usage: Usage | None = None
    for item in data:
        usage = _merged(usage, read(item))
    return usage


def _merged(usage: Usage | None, found: Usage | None) -> Usage | None:
    """Usage so far with one more report: streamed usage is cumulative."""
    if found is None:
        return usage
    return found if usage is None else usage.merge(found)
