"""Signing in to the console over real HTTP: the cookie, expiry, logout, the limiter, codes."""

from __future__ import annotations

import aiohttp

from gateway.admin.console.sessions import ConsoleSessions, SignInLimiter
from tests.gateway.console.console_helpers import (
    TOKEN,
    Browser,
    Clock,
    console_gateway,
    csrf_of,
    session_cookie,
)


def cookie_attributes(header: str) -> set[str]:
    """The attributes of one Set-Cookie header after name=value, as written."""
    return {part.strip() for part in header.split(";")[1:]}


async def log_out(browser: Browser, cookie: str, csrf: str, origin: str) -> aiohttp.ClientResponse:
    """The logout form posted with its CSRF field, from a page whose origin is `origin`."""
    response, _ = await browser.request(
        "POST", "/console/logout", cookie=cookie, data=f"csrf={csrf}", headers={"Origin": origin}
    )
    return response


async def test_issue12_sign_in_sets_an_httponly_strict_cookie_of_the_session_hours() -> None:
    async with console_gateway() as (_, browser):
        response, _ = await browser.request("POST", "/console/login", data=f"token={TOKEN}")
        assert response.status == 303
        assert response.headers["Location"] == "/console/"
        [header] = response.headers.getall("Set-Cookie")
        assert header.startswith("lw_console=")
        assert cookie_attributes(header) == {
            "HttpOnly",
            "Max-Age=43200",
            "Path=/",
            "SameSite=Strict",
        }
        cookie = session_cookie(response)
        page_response, page = await browser.request("GET", "/console/", cookie=cookie)
        assert page_response.status == 200
        assert 'data-page="rooms"' in page
        assert len(csrf_of(page)) >= 40
        assert TOKEN not in page


async def test_issue12_an_https_public_url_makes_the_cookie_secure() -> None:
    http = ", public_url: 'https://lw.example.com', console_session_hours: 1.5"
    async with console_gateway(http=http) as (_, browser):
        response, _ = await browser.request("POST", "/console/login", data=f"token={TOKEN}")
        [header] = response.headers.getall("Set-Cookie")
        assert {"Secure", "Max-Age=5400", "HttpOnly", "SameSite=Strict"} <= cookie_attributes(
            header
        )


async def test_issue12_the_session_ends_after_its_hours() -> None:
    clock = Clock()
    async with console_gateway(clock=clock) as (_, browser):
        cookie, _ = await browser.sign_in()
        clock.advance(12 * 3600 - 1)
        response, _ = await browser.request("GET", "/admin/audit", cookie=cookie)
        assert response.status == 200
        clock.advance(1)
        response, _ = await browser.request("GET", "/admin/audit", cookie=cookie)
        assert response.status == 401
        page, _ = await browser.request("GET", "/console/audit", cookie=cookie)
        assert (page.status, page.headers["Location"]) == (303, "/console/")


async def test_issue12_logout_ends_the_session_on_the_server() -> None:
    async with console_gateway() as (_, browser):
        cookie, csrf = await browser.sign_in()
        refused, _ = await browser.request("POST", "/console/logout", cookie=cookie, data="")
        assert refused.status == 403
        still, _ = await browser.request("GET", "/admin/audit", cookie=cookie)
        assert still.status == 200
        cross_site = await log_out(browser, cookie, csrf, "https://evil.example")
        assert cross_site.status == 403
        # Under the console's Referrer-Policy: no-referrer a browser posts its form with
        # `Origin: null`.
        response = await log_out(browser, cookie, csrf, "null")
        assert (response.status, response.headers["Location"]) == (303, "/console/")
        [header] = response.headers.getall("Set-Cookie")
        assert header.startswith('lw_console=""') or header.startswith("lw_console=;")
        assert "Max-Age=0" in header
        replayed, _ = await browser.request("GET", "/admin/audit", cookie=cookie)
        assert replayed.status == 401


async def test_issue12_a_wrong_token_is_refused_and_not_written_back() -> None:
    async with console_gateway() as (_, browser):
        typed = "adm-console-guess-98765"
        response, page = await browser.request("POST", "/console/login", data=f"token={typed}")
        assert response.status == 401
        assert "Set-Cookie" not in response.headers
        assert typed not in page
        assert "That is not the admin token." in page
        assert 'name="token"' in page
        assert "value=" not in page


async def test_issue12_ten_wrong_tokens_block_the_address_until_the_minute_is_over() -> None:
    clock = Clock()
    async with console_gateway(clock=clock) as (_, browser):
        for _ in range(10):
            wrong, _ = await browser.request("POST", "/console/login", data="token=nope")
            assert wrong.status == 401
            clock.advance(2)
        blocked, page = await browser.request("POST", "/console/login", data=f"token={TOKEN}")
        assert blocked.status == 429
        assert blocked.headers["Retry-After"] == "40"
        assert "Set-Cookie" not in blocked.headers
        assert "try again in 40 s" in page
        by_link, _ = await browser.request("GET", "/console/login?code=any-code")
        assert by_link.status == 429
        clock.advance(40)
        allowed, _ = await browser.request("POST", "/console/login", data=f"token={TOKEN}")
        assert allowed.status == 303
        assert session_cookie(allowed) is not None


async def test_issue12_a_one_time_code_signs_in_once_and_not_after_five_minutes() -> None:
    clock = Clock()
    async with console_gateway(clock=clock) as (gateway, browser):
        code = gateway.console.issue_code()
        response, _ = await browser.request("GET", f"/console/login?code={code}")
        assert (response.status, response.headers["Location"]) == (303, "/console/")
        assert response.headers["Referrer-Policy"] == "no-referrer"
        cookie = session_cookie(response)
        assert cookie is not None
        page, _ = await browser.request("GET", "/console/", cookie=cookie)
        assert page.status == 200
        again, text = await browser.request("GET", f"/console/login?code={code}")
        assert again.status == 401
        assert "Set-Cookie" not in again.headers
        assert "not valid" in text
        late = gateway.console.issue_code()
        clock.advance(300)
        expired, _ = await browser.request("GET", f"/console/login?code={late}")
        assert expired.status == 401


async def test_issue12_without_an_admin_token_every_console_url_is_403() -> None:
    async with console_gateway(token="") as (_, browser):
        for method, path in [
            ("GET", "/console"),
            ("GET", "/console/"),
            ("GET", "/console/login"),
            ("POST", "/console/login"),
            ("GET", "/console/audit"),
            ("GET", "/console/static/console.js"),
        ]:
            response, page = await browser.request(method, path, data="token=x")
            assert response.status == 403, path
            assert "http.admin_token" in page
            assert "Set-Cookie" not in response.headers


async def test_issue12_hostile_sign_in_bodies_never_crash_the_server() -> None:
    async with console_gateway() as (_, browser):
        huge, _ = await browser.request("POST", "/console/login", data="token=" + "a" * 100_000)
        assert huge.status == 413
        raw = await browser.request("POST", "/console/login", data=b"token=\xff\xfe\x00")
        assert raw[0].status == 400
        long, _ = await browser.request("POST", "/console/login", data="token=" + "9" * 5_000)
        assert long.status == 401
        lookalike = TOKEN.replace("a", "\u0430")  # Cyrillic a
        folded, _ = await browser.request("POST", "/console/login", data=f"token={lookalike}")
        assert folded.status == 401
        twice, _ = await browser.request(
            "POST", "/console/login", data=f"token={TOKEN}&token={TOKEN}"
        )
        assert twice.status == 400
        spaced, _ = await browser.request("POST", "/console/login", data=f"token=%20{TOKEN}")
        assert spaced.status == 401
        fine, _ = await browser.request("POST", "/console/login", data=f"token={TOKEN}")
        assert fine.status == 303


def test_issue12_sessions_and_codes_stay_bounded() -> None:
    clock = Clock()
    sessions = ConsoleSessions(hours=1, clock=clock)
    first = sessions.start()
    for _ in range(1_000):
        sessions.start()
    assert sessions.get(first.id) is None
    codes = [sessions.issue_code() for _ in range(101)]
    assert sessions.redeem(codes[0]) is None
    assert sessions.redeem(codes[-1]) is not None


def test_issue12_the_limiter_forgets_the_oldest_addresses_beyond_its_bound() -> None:
    clock = Clock()
    limiter = SignInLimiter(clock=clock, max_addresses=3)
    for _ in range(10):
        limiter.admit("10.0.0.1")
    assert limiter.admit("10.0.0.1").wait == 60
    for address in ("10.0.0.2", "10.0.0.3", "10.0.0.4"):
        limiter.admit(address)
    assert limiter.admit("10.0.0.1").wait is None
