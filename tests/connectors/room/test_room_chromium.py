"""Drive the demo room's page in the Debian Chromium with Playwright."""

from __future__ import annotations

from playwright.async_api import Page, expect

from connectors.room.hub import RoomHub
from gateway.demo.room import KICKOFF, RERUN_LABEL, RERUN_NOTICE, Scenarios
from tests.browser.plugin import artifact_path, needs_chromium
from tests.connectors.room.room_helpers import WAIT_SECONDS, demo_gateway
from tests.gateway.console.phone_layout import PHONE, layout_problems

pytestmark = needs_chromium
TIMEOUT_MS = WAIT_SECONDS * 1000
UNBROKEN = "x" * 300


async def test_page_shows_the_bots_replies_in_headless_chromium(page: Page) -> None:
    async with demo_gateway() as gateway:
        await page.goto(f"http://127.0.0.1:{gateway.port}/room")
        await expect(page.locator("#status")).to_have_attribute(
            "data-state", "joined", timeout=TIMEOUT_MS
        )
        await page.fill("#text", "@ping start")
        await page.locator("#composer").evaluate("form => form.requestSubmit()")
        bots = page.locator("#messages li.message.bot .text")
        await expect(bots.nth(1)).to_be_visible(timeout=TIMEOUT_MS)
        human = await page.locator("#messages li.message.human .text").first.text_content()
        badge = await page.locator("#messages li.message.bot .badge").first.text_content()
        texts = await bots.all_text_contents()
        await page.screenshot(path=artifact_path("room.png"), full_page=True)
    assert human == "@ping start"
    assert badge == "bot"
    assert texts[:2] == ["@pong ping", "@ping pong"]


async def say_on_page(page: Page, text: str) -> None:
    await page.fill("#text", text)
    await page.locator("#composer").evaluate("form => form.requestSubmit()")


async def test_issue22_the_room_page_fits_a_390_px_phone_with_the_rerun_button_and_system_answers(
    page: Page,
) -> None:
    await page.set_viewport_size(PHONE)
    async with demo_gateway() as gateway:
        scenarios = Scenarios(RoomHub.for_app(gateway.app), gateway, KICKOFF[:1], gap=0)
        stop_listening = scenarios.listen()
        scenarios.start("lobby")
        await page.goto(f"http://127.0.0.1:{gateway.port}/room")
        await expect(page.locator("#status")).to_have_attribute(
            "data-state", "joined", timeout=TIMEOUT_MS
        )
        # Opened after the scenario ran: its notice is in the history the page shows.
        notices = page.locator("#messages li.notice .text")
        await expect(notices.first).to_have_text(KICKOFF[0].watch, timeout=TIMEOUT_MS)
        await say_on_page(page, "/loop status")
        system = page.locator("#messages li.message.system")
        await expect(system).to_have_count(1, timeout=TIMEOUT_MS)
        await say_on_page(page, UNBROKEN)
        await expect(page.locator("#messages li.message.human .text").last).to_have_text(UNBROKEN)
        await page.screenshot(path=artifact_path("room-phone.png"), full_page=True)
        problems = await layout_problems(page)

        await page.get_by_role("button", name=RERUN_LABEL, exact=True).click()
        rerun = RERUN_NOTICE.format(name="alice")
        await expect(notices.filter(has_text=rerun)).to_have_count(1, timeout=TIMEOUT_MS)
        await expect(notices.filter(has_text=KICKOFF[0].watch)).to_have_count(2)
        await scenarios.aclose()
        stop_listening()
        sender = await system.locator(".sender").text_content()
        badge = await system.locator(".badge").text_content()
        status = await system.locator(".text").text_content()
    assert problems == []
    assert (sender, badge) == ("loopwarden", "system")
    assert str(status).startswith("Loop status for room:lobby")
