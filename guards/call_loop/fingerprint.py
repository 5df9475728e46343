"""Call fingerprints: the model, the last two messages and the attachments' content hashes.

Volatile tokens in the text are normalised first (`guards.call_loop.normalise`), so the
rounds of a loop that differ only by a timestamp or an id get one fingerprint.

Decisions the design left open:
- Message structure: dict keys are sorted; `id`, `tool_call_id`, `tool_use_id`,
  `filename`, `file_name`, media/mime types and `cache_control` are dropped in messages
  and content parts, never inside tool arguments or tool output (there an "id" is data).
  A tool or participant `name` is kept: it is part of the question. Base64 payloads
  (data URLs anywhere; `data`, `file_data`, `b64_json` in content parts) hash by their
  decoded bytes. A string attachment that is neither a data URL nor base64 (a remote URL)
  hashes by its text: a pure guard cannot fetch it.
- Step: with a step (the `step=` argument here; in `call_identity` the "step" field, with
  the "model" field), a call is identified by model + step and its text is ignored, so
  "attempt 3" and "attempt 4" sent with the same step are the same call; `circuit_key`
  also puts the step in the circuit.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping, Sequence
from urllib.parse import unquote_to_bytes

from guards.call_loop.normalise import normalise_bytes

_DIGEST_SIZE = 16
# Dropped in messages and content parts: provider-assigned per call, or a wrapper around
# bytes that are hashed by content anyway.
_VOLATILE_KEYS = frozenset(
    {
        "id",
        "tool_call_id",
        "tool_use_id",
        "filename",
        "file_name",
        "media_type",
        "mime_type",
        "mimeType",
        "cache_control",
    }
)
# Values under these keys are still message structure (parts, tool calls, payload
# wrappers); under any other key they are data and kept whole.
_STRUCTURAL_KEYS = frozenset(
    {
        "content",
        "parts",
        "tool_calls",
        "function_call",
        "function",
        "functionCall",
        "functionResponse",
        "source",
        "image_url",
        "input_audio",
        "inline_data",
        "inlineData",
        "file",
        "file_data",
        "fileData",
        "document",
        "image",
    }
)
_PAYLOAD_KEYS = frozenset({"data", "file_data", "b64_json"})
_DATA_URL_HEADER_MAX = 256


def _blob(content: bytes) -> bytes:
    """The content hash of one binary payload."""
    return hashlib.blake2b(content, digest_size=_DIGEST_SIZE, person=b"lw-blob").digest()


def _decode_base64(text: str) -> bytes | None:
    """The bytes of a base64 (or base64url) string, or None when it is not base64."""
    if not text:
        return None
    candidate = text
    if "-" in candidate or "_" in candidate:
        candidate = candidate.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(candidate, validate=True)
    except (binascii.Error, ValueError):
        pass
    squeezed = "".join(candidate.split())
    if squeezed == candidate:
        return None
    try:
        return base64.b64decode(squeezed, validate=True)
    except (binascii.Error, ValueError):
        return None


def _data_url_bytes(text: str) -> bytes | None:
    """The content of a `data:` URL, whatever its media type, or None if it is not one."""
    if not text.startswith("data:"):
        return None
    comma = text.find(",", 5, _DATA_URL_HEADER_MAX)
    if comma < 0:
        return None
    payload = text[comma + 1 :]
    if text[5:comma].endswith(";base64"):
        return _decode_base64(payload)
    return unquote_to_bytes(payload)


def _attachment_digest(attachment: bytes | str) -> bytes:
    """An attachment's content hash: raw bytes, a data URL or base64 hash by their bytes."""
    if isinstance(attachment, bytes | bytearray | memoryview):
        return _blob(bytes(attachment))
    content = _data_url_bytes(attachment)
    if content is None:
        content = _decode_base64(attachment)
    if content is None:
        content = attachment.encode("utf-8", "surrogatepass")
    return _blob(content)


def _frame(out: list[bytes], tag: bytes, payload: bytes) -> None:
    """Append one item as tag, decimal length, ":" and payload: no two structures collide."""
    out.append(b"%s%d:" % (tag, len(payload)))
    out.append(payload)


def _framed_key(name: str) -> bytes:
    """A dict key's frame (tag "K"), as `_frame` writes it."""
    raw = name.encode("utf-8", "surrogatepass")
    return b"K%d:%s" % (len(raw), raw)


# The frames of the keys messages use most, built once: keys are framed at every use.
_KEY_FRAMES = {
    name: _framed_key(name)
    for name in (
        _VOLATILE_KEYS
        | _STRUCTURAL_KEYS
        | _PAYLOAD_KEYS
        | {"role", "type", "text", "name", "arguments", "input", "url", "detail", "is_error"}
    )
}


def _encode(value: object, out: list[bytes], structural: bool, payload: bool) -> None:
    """Append the canonical encoding of a message value (see the module docstring).

    `structural`: the value is message structure (volatile keys are dropped); `payload`:
    a string here may be base64 content. This is the hot path of `fingerprint_call`: the
    JSON types are handled first, by cheap exact checks, and the rest by the same rules
    (isinstance on an ABC is slow).
    """
    if isinstance(value, str):
        if payload or value.startswith("data:"):
            _encode_text(value, out, payload)
        else:
            raw = value.encode("utf-8", "surrogatepass")
            # A word holds no digit, "_" or "-", so no token: roles, types, names.
            text = raw if value.isalpha() else normalise_bytes(raw)
            out.append(b"S%d:" % len(text))
            out.append(text)
    elif isinstance(value, dict):
        _encode_mapping(value, out, structural)
    elif type(value) is list or type(value) is tuple:
        out.append(b"[")
        for item in value:
            _encode(item, out, structural, False)
        out.append(b"]")
    elif value is None or value is True or value is False:
        out.append(b"n" if value is None else b"t" if value else b"f")
    elif isinstance(value, Mapping):
        _encode_mapping(value, out, structural)
    elif isinstance(value, bytes | bytearray | memoryview):
        out.append(b"B" + _blob(bytes(value)))
    elif isinstance(value, list | tuple):
        _encode(list(value), out, structural, payload)
    else:
        _frame(out, b"V", normalise_bytes(repr(value).encode("utf-8", "surrogatepass")))


def _encode_text(value: str, out: list[bytes], payload: bool) -> None:
    """Append a string: the hash of the bytes it wraps, else its normalised text."""
    content = _data_url_bytes(value) if value.startswith("data:") else None
    if content is None and payload:
        content = _decode_base64(value)
    if content is None:
        _frame(out, b"S", normalise_bytes(value.encode("utf-8", "surrogatepass")))
    else:
        out.append(b"B" + _blob(content))


def _encode_mapping(value: Mapping[object, object], out: list[bytes], structural: bool) -> None:
    """Append a mapping in key order, without the volatile keys of message structure."""
    append = out.append
    append(b"{")
    frames = _KEY_FRAMES
    for key in sorted(value, key=str):
        name = key if isinstance(key, str) else str(key)
        inner = payload = False
        if structural:
            if name in _VOLATILE_KEYS:
                continue
            inner = name in _STRUCTURAL_KEYS
            payload = inner and name in _PAYLOAD_KEYS
        append(frames.get(name) or _framed_key(name))
        item = value[key]
        if item is None:
            append(b"n")
        elif not payload and isinstance(item, str) and item.isalpha():  # as in `_encode`
            raw = item.encode("utf-8", "surrogatepass")
            append(b"S%d:" % len(raw))
            append(raw)
        else:
            _encode(item, out, inner, payload)
    append(b"}")


def _step_fingerprint(model: str, step: str) -> str:
    """The identity of a call sent with an explicit step: model + step, text ignored."""
    out: list[bytes] = []
    _frame(out, b"M", model.encode("utf-8", "surrogatepass"))
    _frame(out, b"P", step.encode("utf-8", "surrogatepass"))
    digest = hashlib.blake2b(b"".join(out), digest_size=_DIGEST_SIZE, person=b"lw-step")
    return digest.hexdigest()


def fingerprint_call(
    model: str,
    messages: Sequence[Mapping[str, object]],
    attachments: Sequence[bytes | str] = (),
    *,
    step: str | None = None,
) -> str:
    """The identity of an LLM call: model, last two messages and attachment content hashes.

    Volatile tokens in the text are normalised first (see `normalise_text`), so rounds
    that differ only by a timestamp or an id get the same fingerprint. With a `step`, the
    call is identified by model + step alone: the same step is the same call.
    """
    if step:
        return _step_fingerprint(model, step)
    out: list[bytes] = []
    _frame(out, b"M", model.encode("utf-8", "surrogatepass"))
    for message in messages[-2:]:
        _encode(message, out, True, False)
    out.append(b"A")
    for attachment in attachments:
        out.append(_attachment_digest(attachment))
    digest = hashlib.blake2b(b"".join(out), digest_size=_DIGEST_SIZE, person=b"lw-call")
    return digest.hexdigest()


def call_identity(fingerprint: str, fields: Mapping[str, str]) -> str:
    """What makes two calls the same: the fingerprint, or model + step when a step is sent."""
    step = fields.get("step")
    return _step_fingerprint(fields.get("model", ""), step) if step else fingerprint
