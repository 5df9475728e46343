"""The sign-in limiter over real HTTP: counted before the body, another site's forms, proxies.

Issue 20: attempts sent at once were all compared before any was counted; another page
could lock the operator out through their browser; behind a reverse proxy every client
was one address; failed sign-ins were neither logged nor audited.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp import web

from gateway.admin.access import AdminAccess
from gateway.app.jsonbody import read_body
from gateway.app.runtime import Gateway
from tests.gateway.console.console_helpers import TOKEN, Browser, console_gateway, session_cookie

WRONG = "adm-console-guess-5e6f7a8b"
LIMIT = 10


class Calls:
    """Counts the calls of a function it wraps (the wrapped function still runs)."""

    def __init__(self) -> None:
        self.count = 0
        self.moved = asyncio.Event()

    def add(self) -> None:
        self.count += 1
        self.moved.set()


def count_token_checks(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Count each admin token compared by the console's sign-in."""
    calls = Calls()
    compare = AdminAccess.token_matches

    def counting(self: AdminAccess, presented: str) -> bool:
        calls.add()
        return compare(self, presented)

    monkeypatch.setattr(AdminAccess, "token_matches", counting)
    return calls


def count_body_reads(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Count each sign-in body the console starts to read."""
    calls = Calls()

    async def counting(request: web.Request, max_bytes: int) -> bytes | None:
        calls.add()
        return await read_body(request, max_bytes)

    monkeypatch.setattr("gateway.admin.console.app.read_body", counting)
    return calls


async def held_sign_in(port: int, body: bytes, release: asyncio.Event) -> tuple[int, str]:
    """POST the form's head at once and its body only after `release` (unless answered first).

    Returns the answer's status and its Retry-After header ('' without one).
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        "POST /console/login HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    writer.write(head.encode())
    await writer.drain()
    answer = asyncio.create_task(reader.readuntil(b"\r\n\r\n"))
    released = asyncio.create_task(release.wait())
    await asyncio.wait({answer, released}, return_when=asyncio.FIRST_COMPLETED)
    if not answer.done():
        writer.write(body)
        await writer.drain()
    raw = await answer
    released.cancel()
    writer.close()
    await writer.wait_closed()
    head_text = raw.removesuffix(b"\r\n\r\n").decode("latin-1")
    status_line, *header_lines = head_text.split("\r\n")
    headers = dict(line.split(": ", 1) for line in header_lines)
    return int(status_line.split(" ")[1]), headers.get("Retry-After", "")


async def test_issue20_sixty_tokens_sent_at_once_are_counted_before_their_bodies_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compared = count_token_checks(monkeypatch)
    reads = count_body_reads(monkeypatch)
    release = asyncio.Event()
    async with console_gateway() as (gateway, _):
        tasks = [
            asyncio.create_task(held_sign_in(gateway.port, f"token={WRONG}".encode(), release))
            for _ in range(60)
        ]
        for task in tasks:
            task.add_done_callback(lambda _: reads.moved.set())
        # Every attempt is either answered or waiting for its body; only then do bodies go.
        async with asyncio.timeout(60):  # a bound on a hang, not a speed to meet
            while reads.count + sum(task.done() for task in tasks) < len(tasks):
                reads.moved.clear()
                await reads.moved.wait()
        refused_unread = sum(task.done() for task in tasks)
        release.set()
        answers = await asyncio.gather(*tasks)
    assert compared.count == LIMIT
    assert reads.count == LIMIT
    assert refused_unread == 60 - LIMIT
    assert sorted(status for status, _ in answers) == [401] * LIMIT + [429] * (60 - LIMIT)
    assert all(int(wait) > 0 for status, wait in answers if status == 429)


async def test_issue20_a_right_token_is_not_counted_against_the_address() -> None:
    async with console_gateway() as (_, browser):
        for _ in range(LIMIT - 1):
            wrong, _ = await browser.request("POST", "/console/login", data=f"token={WRONG}")
            assert wrong.status == 401
        for _ in range(3):
            right, _ = await browser.request("POST", "/console/login", data=f"token={TOKEN}")
            assert right.status == 303
        last, _ = await browser.request("POST", "/console/login", data=f"token={WRONG}")
        assert last.status == 401
        blocked, _ = await browser.request("POST", "/console/login", data=f"token={TOKEN}")
        assert blocked.status == 429


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Sec-Fetch-Site": "CROSS-SITE", "Origin": "null"},
        {"Origin": "https://evil.example"},
        {"Origin": "http://127.0.0.1.evil.example"},
        {"Origin": "https://" + "9" * 5_000},
    ],
)
async def test_issue20_another_sites_sign_in_is_refused_and_not_counted(
    headers: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    compared = count_token_checks(monkeypatch)
    async with console_gateway() as (_, browser):
        for _ in range(3 * LIMIT):
            refused, page = await browser.request(
                "POST", "/console/login", data=f"token={WRONG}", headers=headers
            )
            assert refused.status == 403
            assert "sent from another site" in page
            assert "Set-Cookie" not in refused.headers
        assert compared.count == 0
        own = {"Origin": browser.base, "Sec-Fetch-Site": "same-origin"}
        signed_in, _ = await browser.request(
            "POST", "/console/login", data=f"token={TOKEN}", headers=own
        )
        assert signed_in.status == 303
        # The console's own form under Referrer-Policy: no-referrer sends Origin: null.
        own_form = {"Origin": "null", "Sec-Fetch-Site": "same-origin"}
        again, _ = await browser.request(
            "POST", "/console/login", data=f"token={TOKEN}", headers=own_form
        )
        assert again.status == 303
        typed, _ = await browser.request(
            "POST", "/console/login", data=f"token={TOKEN}", headers={"Sec-Fetch-Site": "none"}
        )
        assert typed.status == 303


async def test_issue20_wrong_codes_from_another_site_are_not_counted() -> None:
    async with console_gateway() as (gateway, browser):
        clicked = {"Sec-Fetch-Site": "cross-site"}
        for _ in range(3 * LIMIT):
            wrong, _ = await browser.request("GET", "/console/login?code=nope", headers=clicked)
            assert wrong.status == 401
        # A right code clicked in a chat is a cross-site navigation: it still signs in.
        code = gateway.console.issue_code()
        right, _ = await browser.request("GET", f"/console/login?code={code}", headers=clicked)
        assert right.status == 303
        signed_in, _ = await browser.request("POST", "/console/login", data=f"token={TOKEN}")
        assert signed_in.status == 303


async def lock_out(browser: Browser, headers: dict[str, str] | None = None) -> None:
    for _ in range(LIMIT):
        wrong, _ = await browser.request(
            "POST", "/console/login", data=f"token={WRONG}", headers=headers
        )
        assert wrong.status == 401


async def sign_in_status(browser: Browser, headers: dict[str, str]) -> int:
    response, _ = await browser.request(
        "POST", "/console/login", data=f"token={TOKEN}", headers=headers
    )
    return response.status


async def test_issue20_behind_a_trusted_proxy_the_forwarded_client_is_counted() -> None:
    http = ", trusted_proxies: ['127.0.0.1', '10.0.0.0/8']"
    async with console_gateway(http=http) as (_, browser):
        await lock_out(browser, {"X-Forwarded-For": "203.0.113.7"})
        assert await sign_in_status(browser, {"X-Forwarded-For": "203.0.113.7"}) == 429
        # What the client wrote left of the proxy's entry is not whom it counts.
        spoofed = {"X-Forwarded-For": "198.51.100.9, 203.0.113.7"}
        assert await sign_in_status(browser, spoofed) == 429
        # Through a second trusted proxy (10.1.2.3), the same client.
        chained = {"X-Forwarded-For": "203.0.113.7, 10.1.2.3"}
        assert await sign_in_status(browser, chained) == 429
        assert await sign_in_status(browser, {"Forwarded": 'for="203.0.113.7:4711"'}) == 429
        mapped = {"X-Forwarded-For": "::ffff:203.0.113.7"}
        assert await sign_in_status(browser, mapped) == 429
        # Other clients behind the proxy, and the proxy's own address, are not locked out.
        assert await sign_in_status(browser, {"X-Forwarded-For": "198.51.100.9"}) == 303
        assert await sign_in_status(browser, {"Forwarded": 'for="[2001:db8::1]:80"'}) == 303
        assert await sign_in_status(browser, {}) == 303


async def test_issue20_without_trusted_proxies_a_forwarded_for_header_is_ignored() -> None:
    async with console_gateway() as (_, browser):
        for index in range(LIMIT):
            wrong, _ = await browser.request(
                "POST",
                "/console/login",
                data=f"token={WRONG}",
                headers={"X-Forwarded-For": f"203.0.113.{index}"},
            )
            assert wrong.status == 401
        assert await sign_in_status(browser, {"X-Forwarded-For": "198.51.100.9"}) == 429


@pytest.mark.parametrize(
    "forwarded_for",
    ["unknown", "_hidden", "x" * 5_000, "203.0.113.7, junk", "999.1.1.1", " , ,", "%00"],
)
async def test_issue20_junk_forwarded_for_from_a_trusted_proxy_counts_the_proxy(
    forwarded_for: str,
) -> None:
    async with console_gateway(http=", trusted_proxies: ['127.0.0.1']") as (_, browser):
        await lock_out(browser, {"X-Forwarded-For": forwarded_for})
        assert await sign_in_status(browser, {}) == 429


async def console_audit(gateway: Gateway) -> list[tuple[str, bool, str, str]]:
    """The console's entries of the audit log, oldest first: command, allowed, outcome, name."""
    entries = await gateway.state.recent_audit(100)
    return [
        (e.command, e.allowed, e.outcome, e.user_name)
        for e in reversed(entries)
        if e.platform == "console"
    ]


async def test_issue20_failed_sign_ins_and_the_lockout_are_logged_and_audited_without_tokens(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="loopwarden.console")
    async with console_gateway() as (gateway, browser):
        signed_in, _ = await browser.request("POST", "/console/login", data=f"token={TOKEN}")
        assert signed_in.status == 303
        await lock_out(browser)
        for _ in range(3):
            blocked, _ = await browser.request("POST", "/console/login", data=f"token={WRONG}")
            assert blocked.status == 429
        audit = await console_audit(gateway)
    form = "POST /console/login"
    assert audit == [
        (form, True, "signed_in", "127.0.0.1"),
        *[(form, False, "wrong_token", "127.0.0.1")] * LIMIT,
        (form, False, "locked_out", "127.0.0.1"),
    ]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == LIMIT + 1
    assert warnings[0] == (
        "console sign-in refused (wrong_token) from 127.0.0.1: attempt 1 of 10 this minute"
    )
    assert warnings[-1].startswith("console sign-in locked for 127.0.0.1")
    assert not any(WRONG in r.getMessage() or TOKEN in r.getMessage() for r in caplog.records)


async def test_issue20_hostile_sign_ins_are_answered_counted_and_audited_without_their_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="loopwarden.console")
    secret_like = "Zq" + "9" * 4_998
    async with console_gateway() as (gateway, browser):
        answers = []
        for data in (
            "token=" + "a" * 1_000_000,
            b"token=\xff\xfe\x00",
            b"token=%ff%fe",
            "token=" + secret_like,
            "token=a%00b%0d%0aSet-Cookie: x",
            "token=x&token=y",
            "\u202etoken=" + TOKEN,
        ):
            response, page = await browser.request("POST", "/console/login", data=data)
            answers.append(response.status)
            assert secret_like not in page
        code, _ = await browser.request("GET", "/console/login?code=" + "%00" * 2_000)
        answers.append(code.status)
        for _ in range(2):
            wrong, _ = await browser.request("POST", "/console/login", data=f"token={WRONG}")
            answers.append(wrong.status)
        blocked, _ = await browser.request("POST", "/console/login", data=f"token={TOKEN}")
        answers.append(blocked.status)
        outcomes = [outcome for _, _, outcome, _ in await console_audit(gateway)]
    assert answers == [413, 400, 401, 401, 401, 400, 400, 401, 401, 401, 429]
    assert outcomes == [
        "too_large",
        "unreadable",
        "wrong_token",
        "wrong_token",
        "wrong_token",
        "unreadable",
        "unreadable",
        "bad_code",
        "wrong_token",
        "wrong_token",
        "locked_out",
    ]
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert secret_like[:50] not in text
    assert "Set-Cookie" not in text


async def test_issue20_a_locked_out_page_points_at_console_link() -> None:
    async with console_gateway() as (_, browser):
        await lock_out(browser)
        blocked, page = await browser.request("POST", "/console/login", data=f"token={TOKEN}")
        assert blocked.status == 429
        assert session_cookie(blocked) is None
        assert "loopwarden console-link" in page
