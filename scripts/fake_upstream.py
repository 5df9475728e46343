"""A keyless stand-in for OpenAI, Anthropic and Gemini, to try the LLM-call proxy locally.

The proxy tutorial (docs/tutorials/proxy.md) points the proxy's upstreams at it, so each
SDK's one-line change can be tried without an account: every request gets the same short
canned answer in its provider's shape, with a usage block, whatever key it carries.

- OpenAI: `POST /v1/chat/completions` (unstreamed);
- Anthropic: `POST /v1/messages` (unstreamed);
- Gemini: `POST /v1beta/models/{model}:generateContent`.

Usage: `python -m scripts.fake_upstream [--port 9100]` (127.0.0.1 only; Ctrl-C stops it).
It is a tutorial's prop, not a test fake: tests/fakes holds the wire-level fakes.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from aiohttp import web

ANSWER = "Still waiting for the auditors."
_USAGE_TOKENS = (12, 7)


async def _openai(request: web.Request) -> web.Response:
    body = await request.json()
    prompt, completion = _USAGE_TOKENS
    return web.json_response(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "fake"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": ANSWER},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }
    )


async def _anthropic(request: web.Request) -> web.Response:
    body = await request.json()
    prompt, completion = _USAGE_TOKENS
    return web.json_response(
        {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "fake"),
            "content": [{"type": "text", "text": ANSWER}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": completion},
        }
    )


async def _gemini(request: web.Request) -> web.Response:
    prompt, completion = _USAGE_TOKENS
    return web.json_response(
        {
            "candidates": [
                {
                    "content": {"role": "model", "parts": [{"text": ANSWER}]},
                    "finishReason": "STOP",
                    "index": 0,
                }
            ],
            "usageMetadata": {
                "promptTokenCount": prompt,
                "candidatesTokenCount": completion,
                "totalTokenCount": prompt + completion,
            },
        }
    )


def build_app() -> web.Application:
    """The three providers' routes on one aiohttp app."""
    app = web.Application()
    app.add_routes(
        [
            web.post("/v1/chat/completions", _openai),
            web.post("/v1/messages", _anthropic),
            web.post("/v1beta/models/{model}:generateContent", _gemini),
        ]
    )
    return app


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the fake providers on 127.0.0.1 until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m scripts.fake_upstream")
    parser.add_argument("--port", type=int, default=9100)
    args = parser.parse_args(argv)
    web.run_app(build_app(), host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
