"""The proxy's per-call path does once what does not change from call to call (issue 24).

`bench/workers_bench.py` measures what the proxy adds to a call; these tests hold the
shape that takes some of it off: one upstream URL per path (bounded), one canonical form
per path, one search for the upstream key in a response's headers, and no shadow hook
on a proxy with no guard in shadow mode.
"""

from __future__ import annotations

import aiohttp
from multidict import CIMultiDict

from gateway.proxy.paths import canonical_path
from gateway.proxy.provider import response_headers
from gateway.proxy.relay import masked_forms
from gateway.proxy.shadow import add_shadow_header
from gateway.proxy.upstream import URL_CACHE_MAX
from tests.gateway.proxy.proxy_helpers import MODEL, PROXY_KEY, UPSTREAM_KEY, running_proxy

HEADERS = {"Authorization": f"Bearer {PROXY_KEY}"}


def _body(n: int) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": f"question {n} of the day"}]}


async def test_issue24_one_upstream_url_per_path_and_a_bounded_table() -> None:
    async with running_proxy() as rig, aiohttp.ClientSession() as http:
        for n in range(3):
            url = f"{rig.url}/openai/v1/chat/completions"
            async with http.post(url, json=_body(n), headers=HEADERS) as response:
                assert response.status == 200
        urls = rig.proxy._upstreams._urls
        assert list(urls) == [("openai", "chat/completions")]
        built = urls["openai", "chat/completions"]
        # Endless distinct paths (unguarded: model lists, files) are forwarded all the
        # same, and past the bound their URLs are built per request, not kept.
        for n in range(URL_CACHE_MAX + 5):
            async with http.get(f"{rig.url}/openai/v1/models/m{n}", headers=HEADERS) as response:
                assert response.status in (200, 404)
        assert len(urls) == URL_CACHE_MAX
        assert urls["openai", "chat/completions"] is built
        assert rig.upstream.requests[-1].path == f"/v1/models/m{URL_CACHE_MAX + 4}"


def test_issue24_a_path_is_made_canonical_once() -> None:
    canonical_path.cache_clear()
    for _ in range(3):
        assert canonical_path("chat//completions/") == "chat/completions"
    info = canonical_path.cache_info()
    assert (info.misses, info.hits) == (1, 2)


def test_issue24_response_headers_with_one_search_still_drop_every_form_of_the_key() -> None:
    forms = masked_forms(UPSTREAM_KEY)
    headers = CIMultiDict(
        {
            "Content-Type": "application/json",
            "X-Echo": f"Bearer {UPSTREAM_KEY}",
            "X-Escaped": UPSTREAM_KEY.replace("-", "\\-"),
            **{f"X-Form-{n}": f"key={form};" for n, form in enumerate(forms)},
        }
    )
    kept = response_headers(headers, forms)
    assert list(kept) == ["Content-Type", "X-Escaped"]
    assert list(response_headers(headers, [])) == list(headers)


async def test_issue24_no_shadow_hook_unless_a_guard_is_in_shadow_mode() -> None:
    async with running_proxy() as rig:
        assert add_shadow_header not in rig.proxy.app.on_response_prepare
    async with running_proxy("call_loop: {mode: shadow}") as rig:
        assert add_shadow_header in rig.proxy.app.on_response_prepare
    rule = (
        "rules: [{name: once, fields: [session], max_calls: 1, window_seconds: 60, mode: shadow}]"
    )
    async with running_proxy(rule) as rig:
        assert add_shadow_header in rig.proxy.app.on_response_prepare
