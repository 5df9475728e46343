"""Who is calling: proxy keys found by their hash, hostile key bytes answered 401 (issue 10)."""

from __future__ import annotations

import json

from gateway.config import parse_config
from gateway.proxy.anthropic import AnthropicProvider
from gateway.proxy.auth import Authenticator, ProxyClient, key_digest
from gateway.proxy.gemini import GeminiProvider
from gateway.proxy.openai import OpenAIProvider
from tests.gateway.proxy.proxy_helpers import (
    OTHER_KEY,
    PROXY_KEY,
    proxy_yaml,
    raw_request,
    running_proxy,
)


def _auth() -> Authenticator:
    config = parse_config(proxy_yaml("http://127.0.0.1:9"), env={}).proxy
    assert config is not None
    return Authenticator(config.keys)


def test_issue10_each_provider_finds_the_key_where_its_sdk_sends_it() -> None:
    auth = _auth()
    billing = ProxyClient(agent="billing-bot", root="billing-bot")
    bearer = {"Authorization": f"Bearer {PROXY_KEY}"}
    assert auth.client(OpenAIProvider(), bearer, {}) == billing
    assert auth.client(AnthropicProvider(), {"x-api-key": PROXY_KEY}, {}) == billing
    assert auth.client(GeminiProvider(), {}, {"key": OTHER_KEY}) == ProxyClient(
        agent="support-bot", root="support-bot"
    )
    assert auth.client(OpenAIProvider(), {"Authorization": "Bearer lw-unknown-key"}, {}) is None
    assert auth.client(OpenAIProvider(), {}, {}) is None


def test_issue10_a_key_with_lone_surrogates_is_hashed_not_refused() -> None:
    # aiohttp keeps a header's non-UTF-8 bytes as surrogates; hashing must not raise.
    assert len(key_digest("lw-\udcff\ud800-key")) == 32
    assert _auth().client(OpenAIProvider(), {"Authorization": "Bearer \udcff"}, {}) is None


async def test_issue10_non_utf8_key_bytes_are_a_401_and_the_next_request_is_served() -> None:
    async with running_proxy() as rig:
        for header in (
            b"Authorization: Bearer lw-\xff\xfe-key\r\n",
            b"x-api-key: \xed\xa0\x80\r\n",
        ):
            status, body = await raw_request(
                rig.proxy.port, "/openai/v1/chat/completions", header, b"{}"
            )
            assert status == 401
            assert json.loads(body)["error"]["code"] == "invalid_api_key"
        status, _ = await raw_request(
            rig.proxy.port,
            "/openai/v1/models",
            b"Authorization: Bearer " + PROXY_KEY.encode() + b"\r\n",
        )
        assert status == 404  # the fake's answer to a POST on /models: it was forwarded
