"""The admin API called by a signed-in console: session cookie, CSRF token, Origin, audit."""

from __future__ import annotations

import aiohttp

from gateway.app.runtime import Gateway
from gateway.state.base import AuditEntry
from tests.gateway.console.console_helpers import ROOM, TOKEN, Browser, console_gateway


async def newest_audit(gateway: Gateway) -> AuditEntry:
    [entry] = await gateway.state.recent_audit(1, None)
    return entry


async def console_audit(gateway: Gateway) -> AuditEntry:
    """The newest audit entry, checked to name the console, from loopback, as the caller."""
    entry = await newest_audit(gateway)
    assert (entry.platform, entry.user_id, entry.user_name) == ("console", "console", "127.0.0.1")
    return entry


async def pause(
    browser: Browser, cookie: str, headers: dict[str, str], seconds: float | None = None
) -> aiohttp.ClientResponse:
    """`POST /admin/pause` of ROOM from the signed-in browser, with these headers."""
    body: dict[str, object] = {"room": ROOM}
    if seconds is not None:
        body["seconds"] = seconds
    response, _ = await browser.request(
        "POST", "/admin/pause", cookie=cookie, json=body, headers=headers
    )
    return response


async def test_issue12_a_console_post_without_csrf_changes_nothing_and_is_audited_refused() -> None:
    async with console_gateway() as (gateway, browser):
        cookie, _ = await browser.sign_in()
        response, text = await browser.request(
            "POST", "/admin/pause", cookie=cookie, json={"room": ROOM}
        )
        assert response.status == 403
        assert text == '{"error": "csrf"}'
        assert await gateway.state.pause_remaining(ROOM) is None
        entry = await console_audit(gateway)
        assert (entry.allowed, entry.outcome, entry.command) == (False, "csrf", "POST /admin/pause")


async def test_issue12_a_wrong_csrf_token_is_refused_too() -> None:
    async with console_gateway() as (gateway, browser):
        cookie, csrf = await browser.sign_in()
        wrong = csrf[:-1] + ("A" if csrf[-1] != "A" else "B")
        response = await pause(browser, cookie, {"X-CSRF-Token": wrong})
        assert response.status == 403
        assert await gateway.state.pause_remaining(ROOM) is None


async def test_issue12_a_console_post_with_its_csrf_token_works_and_is_audited_as_console() -> None:
    async with console_gateway() as (gateway, browser):
        cookie, csrf = await browser.sign_in()
        response = await pause(
            browser, cookie, {"X-CSRF-Token": csrf, "Origin": browser.base}, seconds=600
        )
        assert response.status == 200
        assert await gateway.state.pause_remaining(ROOM) is not None
        entry = await console_audit(gateway)
        assert (entry.allowed, entry.outcome, entry.room) == (True, "done", ROOM)


async def test_issue12_a_cross_site_origin_is_refused_even_with_the_csrf_token() -> None:
    async with console_gateway() as (gateway, browser):
        cookie, csrf = await browser.sign_in()
        for origin in (
            "https://evil.example",
            "null",
            browser.base.replace("127.0.0.1", "localhost"),
        ):
            response = await pause(browser, cookie, {"X-CSRF-Token": csrf, "Origin": origin})
            assert response.status == 403, origin
        assert await gateway.state.pause_remaining(ROOM) is None


async def test_issue12_the_public_urls_origin_is_accepted_behind_a_reverse_proxy() -> None:
    async with console_gateway(http=", public_url: 'https://lw.example.com/'") as (gw, browser):
        cookie, csrf = await browser.sign_in()
        response, _ = await browser.request(
            "POST",
            "/admin/resume",
            cookie=cookie,
            json={"room": ROOM},
            headers={"X-CSRF-Token": csrf, "Origin": "https://lw.example.com"},
        )
        assert response.status == 200
        assert (await newest_audit(gw)).platform == "console"


async def test_issue12_console_reads_need_the_session_but_no_csrf_token_nor_audit() -> None:
    async with console_gateway() as (gateway, browser):
        anonymous, _ = await browser.request("GET", "/admin/audit")
        assert anonymous.status == 401
        forged, _ = await browser.request("GET", "/admin/audit", cookie="not-a-session")
        assert forged.status == 401
        cookie, _ = await browser.sign_in()
        response, _ = await browser.request("GET", "/admin/audit?limit=200", cookie=cookie)
        assert response.status == 200
        # The pages poll their reads; storing each would fill the audit log with them. Only
        # the sign-in is stored (issue 20).
        stored = await gateway.state.recent_audit(10, None)
        assert [(e.command, e.outcome) for e in stored] == [("POST /console/login", "signed_in")]


async def test_issue12_the_bearer_token_still_needs_no_csrf_token() -> None:
    async with console_gateway() as (gateway, browser):
        response, _ = await browser.request(
            "POST",
            "/admin/pause",
            json={"room": ROOM},
            headers={"Authorization": f"Bearer {TOKEN}", "Origin": "https://elsewhere.example"},
        )
        assert response.status == 200
        entry = await newest_audit(gateway)
        assert (entry.platform, entry.user_id) == ("http", "admin-api")


async def test_issue12_anonymous_refusals_stay_out_of_the_audit_log() -> None:
    async with console_gateway() as (gateway, browser):
        response, _ = await browser.request(
            "POST", "/admin/pause", cookie="forged", json={"room": ROOM}
        )
        assert response.status == 401
        assert await gateway.state.recent_audit(10, None) == []
