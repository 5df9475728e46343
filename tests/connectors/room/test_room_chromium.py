"""Drive the demo room's page in the Debian Chromium with Playwright."""

from __future__ import annotations

from playwright.async_api import Page, expect

from tests.browser.plugin import artifact_path, needs_chromium
from tests.connectors.room.room_helpers import WAIT_SECONDS, demo_gateway

pytestmark = needs_chromium
TIMEOUT_MS = WAIT_SECONDS * 1000


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
