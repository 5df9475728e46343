"""The proxy's console: signed in with `proxy.admin_token`, its pages, its admin API."""

from __future__ import annotations

import aiohttp

from gateway.config import parse_config
from gateway.proxy.app import ProxyServer
from tests.gateway.console.console_helpers import Browser, csrf_of, session_cookie
from tests.gateway.proxy.proxy_helpers import ADMIN_TOKEN, proxy_yaml, running_proxy


async def test_issue12_the_proxy_console_signs_in_with_the_proxy_admin_token() -> None:
    async with (
        running_proxy() as rig,
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
    ):
        browser = Browser(http, rig.url)
        response, _ = await browser.request("POST", "/console/login", data=f"token={ADMIN_TOKEN}")
        assert response.status == 303
        cookie = session_cookie(response)
        _, frame = await browser.request("GET", "/console/", cookie=cookie)
        assert "loopwarden LLM-call proxy" in frame
        assert 'href="/console/rooms"' not in frame
        assert 'href="/console/audit"' in frame
        rooms, _ = await browser.request("GET", "/console/rooms", cookie=cookie)
        assert rooms.status == 404
        audit, _ = await browser.request("GET", "/admin/audit?limit=200", cookie=cookie)
        assert audit.status == 200
        body = {"circuit": "billing-bot"}
        refused, _ = await browser.request(
            "POST", "/admin/circuits/reopen", cookie=cookie, json=body
        )
        assert refused.status == 403
        reopened, _ = await browser.request(
            "POST",
            "/admin/circuits/reopen",
            cookie=cookie,
            json=body,
            headers={"X-CSRF-Token": csrf_of(frame)},
        )
        assert reopened.status in (200, 422)
        entries = await rig.proxy.state.recent_audit(2, None)
        assert [(e.platform, e.allowed, e.outcome) for e in entries][1] == (
            "console",
            False,
            "csrf",
        )
        assert entries[0].platform == "console"
        assert entries[0].allowed


async def test_issue12_the_proxy_console_without_a_token_names_proxy_admin_token() -> None:
    yaml = proxy_yaml("http://127.0.0.1:9").replace(f"admin_token: {ADMIN_TOKEN}", "")
    proxy = ProxyServer(parse_config(yaml, env={}))
    await proxy.start()
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
            browser = Browser(http, f"http://127.0.0.1:{proxy.port}")
            for method, path in [("GET", "/console/"), ("POST", "/console/login")]:
                response, page = await browser.request(method, path, data="token=x")
                assert response.status == 403
                assert "proxy.admin_token" in page
    finally:
        await proxy.stop()
