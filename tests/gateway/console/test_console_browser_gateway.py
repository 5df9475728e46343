"""The gateway's console in headless Chromium: sign-in, Rooms, Activity, CSRF and escaping.

Every test runs the demo's gateway (its six bots, no kickoff, no reply delay, a real
clock, a known admin token) and drives its console as an operator would. The screenshots
go to test-results/ (not committed).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from playwright.async_api import Dialog, Page, ViewportSize, expect
from pydantic import SecretStr

from gateway.admin.access import SESSION_COOKIE
from gateway.admin.console import messages
from gateway.app.runtime import Gateway
from gateway.demo.room import demo_config
from tests.browser.plugin import artifact_path, needs_chromium
from tests.connectors.room.room_helpers import WAIT_SECONDS, from_sender, join, next_event, say
from tests.fakes.loopback import serve_loopback

pytestmark = needs_chromium

TOKEN = "adm-console-browser-0123456789"
LOBBY = "room:lobby"
HOSTILE_ROOM = "room:<script>alert(1)</script>"
HOSTILE_IMG = "<img src=x onerror=alert(1)>"
HOSTILE_SCRIPT = "<script>alert(2)</script>"
COOLDOWN_NOTICE = "Loop guard: pausing replies between"
COOLDOWN_SECONDS = 300.0
"""Longer than the demo's 20 s, so a slow machine still sees the cooldown it reads."""
TIMEOUT_MS = WAIT_SECONDS * 1000
LIVE = "@echo said while the page is open"
DESKTOP: ViewportSize = {"width": 1280, "height": 800}
PHONE: ViewportSize = {"width": 390, "height": 844}


@dataclass
class Demo:
    """The running demo gateway, a websocket in its lobby as `carol`, a bearer client."""

    gateway: Gateway
    ws: aiohttp.ClientWebSocketResponse
    http: aiohttp.ClientSession

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.gateway.port}"

    async def admin(self, method: str, path: str, body: object = None) -> dict[str, object]:
        """One admin API call with the bearer token (as a script would make it)."""
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with self.http.request(method, self.base + path, json=body, headers=headers) as r:
            answer = await r.json()
            assert isinstance(answer, dict)
            return answer

    async def lobby(self) -> dict[str, object]:
        """The lobby's room object, as `GET /admin/rooms?room=` answers it."""
        rooms = (await self.admin("GET", f"/admin/rooms?room={LOBBY}"))["rooms"]
        assert isinstance(rooms, list)
        room = rooms[0]
        assert isinstance(room, dict)
        return room


@asynccontextmanager
async def demo() -> AsyncIterator[Demo]:
    """The demo's gateway with an admin token and a long cooldown, and a human in the lobby."""
    config = demo_config(port=0, delay=0)
    loop_policy = config.policy.bot_loop.model_copy(update={"cooldown_seconds": COOLDOWN_SECONDS})
    config = config.model_copy(
        update={
            "http": config.http.model_copy(update={"admin_token": SecretStr(TOKEN)}),
            "policy": config.policy.model_copy(update={"bot_loop": loop_policy}),
        }
    )
    gateway = Gateway(config)
    await gateway.start()
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(f"http://127.0.0.1:{gateway.port}/room/ws") as ws,
        ):
            await join(ws, "carol")
            yield Demo(gateway, ws, http)
    finally:
        await gateway.stop(5.0)


def watch(page: Page) -> tuple[list[str], list[str]]:
    """Collect the page's script errors and dialogs; each dialog is accepted (a confirm)."""
    errors: list[str] = []
    dialogs: list[str] = []

    async def accept(dialog: Dialog) -> None:
        dialogs.append(f"{dialog.type}: {dialog.message}")
        await dialog.accept()

    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("dialog", accept)
    return errors, dialogs


async def sign_in(page: Page, base: str, token: str = TOKEN) -> None:
    """Type the token into the sign-in form and submit it."""
    await page.goto(f"{base}/console/")
    await page.fill("#token", token)
    await page.get_by_role("button", name="Sign in", exact=True).click()


def seconds_of(text: str) -> int:
    """The seconds a countdown shows: `42 s`, `4 min 05 s` or `1 h 02 min`."""
    assert text.strip(), "an empty countdown"
    found = re.fullmatch(r"(?:(\d+) h )?(?:(\d+) min ?)?(?:(\d+) s)?", text.strip())
    assert found is not None, text
    hours, minutes, seconds = (int(part or 0) for part in found.groups())
    return hours * 3600 + minutes * 60 + seconds


def card_selector(room: str = LOBBY) -> str:
    """The CSS selector of a room's card on the Rooms page."""
    return f'section.room-card[data-room="{room}"]'


async def countdown_decreases(page: Page, selector: str) -> tuple[int, int]:
    """Read a countdown, wait until it shows another value, read it again."""
    clock = page.locator(selector)
    await expect(clock).to_be_visible(timeout=TIMEOUT_MS)
    first = await clock.text_content() or ""
    await expect(clock).not_to_have_text(first, timeout=TIMEOUT_MS)
    second = await clock.text_content() or ""
    return seconds_of(first), seconds_of(second)


async def test_issue12_a_ping_pong_cooldown_counts_down_on_rooms_and_reset_lets_bots_talk(
    page: Page,
) -> None:
    errors, dialogs = watch(page)
    await page.set_viewport_size(DESKTOP)
    async with demo() as room:
        await sign_in(page, room.base)
        await expect(page).to_have_url(f"{room.base}/console/")
        await say(room.ws, "@ping start")
        await next_event(room.ws, "message", lambda e: COOLDOWN_NOTICE in str(e.get("text")))
        await page.goto(f"{room.base}/console/rooms")
        card = page.locator(card_selector())
        pair = card.locator("tbody tr").filter(has_text="ping ↔ pong")
        await expect(pair).to_be_visible(timeout=TIMEOUT_MS)
        await expect(pair.locator(".count")).to_have_text(re.compile(r"^\d+ / 6$"))
        first, second = await countdown_decreases(page, f"{card_selector()} .cooldown")
        assert 0 < second < first <= COOLDOWN_SECONDS
        await page.screenshot(path=artifact_path("console-rooms.png"), full_page=True)
        await page.set_viewport_size(PHONE)
        await page.screenshot(path=artifact_path("console-rooms-phone.png"), full_page=True)
        await page.set_viewport_size(DESKTOP)

        await card.get_by_role("button", name="Reset", exact=True).click()
        await expect(card.locator(".action-status")).to_contain_text("reset", timeout=TIMEOUT_MS)
        await expect(card.locator(".cooldown")).to_have_count(0, timeout=TIMEOUT_MS)
        await expect(card).to_contain_text("No live bot pairs.", timeout=TIMEOUT_MS)
        assert (await room.lobby())["pairs"] == []

        await say(room.ws, "@ping start")
        mine = (await next_event(room.ws, "message", from_sender("carol", "@ping start")))["id"]
        assert isinstance(mine, int)
        again = await next_event(
            room.ws,
            "message",
            lambda e: from_sender("pong", "@ping pong")(e) and int(str(e["id"])) > mine,
        )
        assert again["is_bot"] is True
    assert dialogs == [
        f"confirm: Reset the bot pairs of {LOBBY}? Bots may talk to each other again at once."
    ]
    assert errors == []


async def test_issue12_a_room_where_a_message_arrived_is_listed_on_rooms(page: Page) -> None:
    errors, _ = watch(page)
    async with demo() as room:
        await sign_in(page, room.base)
        await page.goto(f"{room.base}/console/rooms")
        await expect(page.get_by_text("No room seen yet", exact=False)).to_be_visible()
        await say(room.ws, "hello, nobody in particular")
        card = page.locator(card_selector())
        await expect(card).to_contain_text("No live bot pairs.", timeout=TIMEOUT_MS)
        await expect(card.locator(".turns")).to_have_text("0 / 100")
        await expect(page.get_by_text("No room seen yet", exact=False)).to_be_hidden()
    assert errors == []


async def test_issue12_pause_counts_down_overrides_are_marked_and_resume_ends_the_pause(
    page: Page,
) -> None:
    errors, dialogs = watch(page)
    async with demo() as room:
        await room.admin(
            "POST",
            "/admin/set",
            {"room": LOBBY, "field": "bot_loop.max_events_per_window", "value": 8},
        )
        await sign_in(page, room.base)
        await page.goto(f"{room.base}/console/rooms")
        card = page.locator(card_selector())
        await expect(card.locator(".pause")).to_have_text("running", timeout=TIMEOUT_MS)
        listed = card.locator(".overrides .field")
        await expect(listed).to_have_text("bot_loop.max_events_per_window 8override")
        await card.locator("summary").click()
        marked = card.locator(".policy .field.overridden")
        await expect(marked).to_have_count(1)
        await expect(marked).to_contain_text("max_events_per_window 8")
        await expect(marked.locator(".badge")).to_have_text("override")
        await expect(card.locator(".policy")).to_contain_text("cooldown_seconds 300")

        await card.get_by_role("button", name="Pause 10 min", exact=True).click()
        first, second = await countdown_decreases(page, f"{card_selector()} .pause-left")
        assert 0 < second < first <= 600
        assert (await room.lobby())["paused"] is True

        await card.get_by_role("button", name="Pause until resumed", exact=True).click()
        await expect(card.locator(".pause")).to_have_text("paused until resumed")
        await card.get_by_role("button", name="Resume", exact=True).click()
        await expect(card.locator(".pause")).to_have_text("running", timeout=TIMEOUT_MS)
        assert (await room.lobby())["paused"] is False

        await card.get_by_role("button", name="Forget", exact=True).click()
        await expect(card.locator(".action-status")).to_contain_text("Forgot", timeout=TIMEOUT_MS)
        audit = await room.admin("GET", "/admin/audit?limit=50")
        await page.goto(f"{room.base}/console/audit")
        await expect(page.locator("main td", has_text="POST /admin/forget")).to_be_visible()
        await page.screenshot(path=artifact_path("console-audit.png"), full_page=True)
    entries = audit["entries"]
    assert isinstance(entries, list)
    by_console = [
        e["command"].partition(" {")[0]
        for e in entries
        if e["platform"] == "console" and e["outcome"] != "signed_in"  # the sign-in (issue 20)
    ]
    assert by_console == [
        "POST /admin/forget",
        "POST /admin/resume",
        "POST /admin/pause",
        "POST /admin/pause",
    ]
    assert dialogs == [
        f"confirm: Forget the conversation of {LOBBY}? The bots lose what was said there."
    ]
    assert errors == []


async def test_issue12_a_wrong_token_is_refused_and_sets_no_cookie(page: Page) -> None:
    async with demo() as room:
        await sign_in(page, room.base, token="not-the-admin-token-0000")
        await expect(page.get_by_role("alert")).to_have_text(
            messages.WRONG_TOKEN, timeout=TIMEOUT_MS
        )
        await expect(page.locator("#token")).to_have_value("")
        cookies = await page.context.cookies()
        anonymous = await page.goto(f"{room.base}/console/rooms")
    assert SESSION_COOKIE not in {cookie["name"] for cookie in cookies}
    assert anonymous is not None
    assert anonymous.url == f"{room.base}/console/"


ATTACK_PAGE = """<!doctype html>
<html><body>
<form id="attack" method="post" action="{target}/admin/pause" enctype="text/plain">
<input name='{{"room": "{room}", "seconds": 600, "x": "' value='"}}'>
<button type="submit">Win a prize</button>
</form>
</body></html>
"""


@asynccontextmanager
async def attacker(target: str) -> AsyncIterator[str]:
    """A page on another origin (127.0.0.1, another port) with a form posting to `target`."""
    page = ATTACK_PAGE.format(target=target, room=LOBBY)

    async def serve(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", serve)
    runner = web.AppRunner(app)
    port = await serve_loopback(runner)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        await runner.cleanup()


async def test_issue12_a_cross_site_post_without_the_csrf_token_changes_nothing(
    page: Page,
) -> None:
    async with demo() as room, attacker(room.base) as evil:
        await sign_in(page, room.base)
        await expect(page).to_have_url(f"{room.base}/console/")
        await page.goto(evil)
        async with page.expect_navigation() as landed:
            await page.get_by_role("button", name="Win a prize", exact=True).click()
        refused = await landed.value
        # What a script on that page could send too: valid JSON, the cookie, no token.
        await page.goto(evil)
        status = await page.evaluate(
            """async ([url, body]) => {
                const init = {method: "POST", body: body, credentials: "include", mode: "no-cors"};
                return (await fetch(url, init)).status;
            }""",
            [f"{room.base}/admin/pause", f'{{"room": "{LOBBY}", "seconds": 600}}'],
        )
        lobby = await room.lobby()
        audit = await room.admin("GET", "/admin/audit?limit=50&kind=others")
    assert refused is not None
    assert refused.status == 403
    assert status == 0  # opaque: the page learns nothing of the answer
    assert lobby["paused"] is False
    entries = audit["entries"]
    assert isinstance(entries, list)
    console = [(e["allowed"], e["outcome"]) for e in entries if e["platform"] == "console"]
    # Both arrived with the session cookie (127.0.0.1 is one site) and were refused.
    assert console == [(False, "csrf"), (False, "csrf")]


async def test_issue12_hostile_room_names_and_messages_are_shown_as_text(page: Page) -> None:
    errors, dialogs = watch(page)
    async with demo() as room:
        await room.admin("POST", "/admin/reset", {"room": HOSTILE_ROOM})
        await sign_in(page, room.base)
        await page.goto(f"{room.base}/console/rooms")
        hostile = page.locator("section.room-card h2").filter(has_text="<script>")
        await expect(hostile).to_have_text(HOSTILE_ROOM, timeout=TIMEOUT_MS)

        await say(room.ws, HOSTILE_IMG)
        await say(room.ws, HOSTILE_SCRIPT)
        await page.goto(f"{room.base}/console/activity")
        excerpts = page.locator(".feed .event.kind-in .excerpt")
        await expect(excerpts.filter(has_text=HOSTILE_IMG)).to_have_count(1, timeout=TIMEOUT_MS)
        await expect(excerpts.filter(has_text=HOSTILE_SCRIPT)).to_have_count(1)
        await expect(page.locator("#room-filter option", has_text=HOSTILE_ROOM)).to_have_count(1)
        images = await page.locator("main img").count()
        scripts = await page.locator("main script, .feed script").count()
    assert (images, scripts) == (0, 0)
    assert dialogs == []
    assert errors == []


async def test_issue12_the_activity_page_shows_a_message_posted_while_it_is_open(
    page: Page,
) -> None:
    errors, _ = watch(page)
    await page.set_viewport_size(DESKTOP)
    async with demo() as room:
        await say(room.ws, "@echo before the page opened")
        await sign_in(page, room.base)
        await page.goto(f"{room.base}/console/activity")
        feed = page.locator(".feed")
        await expect(feed).to_contain_text("@echo before the page opened", timeout=TIMEOUT_MS)
        await expect(page.locator(".chart-summary")).to_contain_text("last hour: ")

        await say(room.ws, LIVE)
        live = feed.locator(".event.kind-in .excerpt", has_text=re.compile(f"^{LIVE}$"))
        await expect(live).to_have_count(1, timeout=TIMEOUT_MS)
        reply = feed.locator(
            ".event.kind-reply .excerpt", has_text=re.compile(f"^carol said: {LIVE}$")
        )
        await expect(reply).to_have_count(1, timeout=TIMEOUT_MS)
        await expect(page.locator(".chart-summary")).to_contain_text(" in, ", timeout=TIMEOUT_MS)

        await page.get_by_role("button", name="Last day, per hour", exact=True).click()
        await expect(page.locator(".chart-summary")).to_contain_text("last day: ")
        await page.get_by_role("button", name="Last hour, per minute", exact=True).click()
        await page.locator("#room-filter").select_option(LOBBY)
        await expect(live).to_be_visible(timeout=TIMEOUT_MS)
        await page.screenshot(path=artifact_path("console-activity.png"), full_page=True)
        await page.set_viewport_size(PHONE)
        await page.screenshot(path=artifact_path("console-activity-phone.png"), full_page=True)
    assert errors == []
