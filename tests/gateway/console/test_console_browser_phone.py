"""Every console page at phone width (390 px) in the Debian Chromium, and its guard colours.

The gateway runs the demo (its six bots, its built-in model, every scenario once), so
Rooms, Activity, Circuits, Calls and Audit have something to show; the proxy's pages run
over a real proxy. Each page must fit 390 px: no sideways scroll, no clipped text
(`phone_layout`). Screenshots go to test-results/ (not committed).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from playwright.async_api import Page, Route, expect
from pydantic import SecretStr

from connectors.room.hub import RoomHub
from gateway.app import messages
from gateway.app.runtime import Gateway
from gateway.demo.model import DemoModel
from gateway.demo.room import KICKOFF, Scenarios, demo_config
from tests.browser.plugin import artifact_path, needs_chromium
from tests.connectors.room.room_helpers import WAIT_SECONDS, from_sender, join, next_event
from tests.gateway.console.phone_layout import PHONE, layout_problems
from tests.gateway.proxy.proxy_helpers import ADMIN_TOKEN, running_proxy

pytestmark = needs_chromium
TOKEN = "adm-console-phone-0123456789"
TIMEOUT_MS = WAIT_SECONDS * 1000
ORACLE_STOP = messages.CALL_LOOP_STOP.format(pause="5 min")


@asynccontextmanager
async def demo_after_its_scenarios() -> AsyncIterator[str]:
    """The demo's gateway (a known admin token) once every scenario has run; its base URL."""
    async with DemoModel() as model:
        config = demo_config(port=0, delay=0, model_url=model.url)
        http = config.http.model_copy(update={"admin_token": SecretStr(TOKEN)})
        gateway = Gateway(config.model_copy(update={"http": http}))
        await gateway.start()
        base = f"http://127.0.0.1:{gateway.port}"
        try:
            scenarios = Scenarios(RoomHub.for_app(gateway.app), gateway, KICKOFF, gap=0)
            async with (
                aiohttp.ClientSession() as client,
                client.ws_connect(f"{base}/room/ws") as ws,
            ):
                await join(ws, "carol")
                scenarios.start("lobby")
                await next_event(ws, "message", from_sender("oracle", ORACLE_STOP))
            await scenarios.aclose()
            await gateway.request_log.settle()
            yield base
        finally:
            await gateway.stop(5.0)


async def sign_in(page: Page, base: str, token: str) -> list[str]:
    """Sign in with the form; the nav's page addresses."""
    await page.goto(f"{base}/console/")
    await page.fill("#token", token)
    await page.get_by_role("button", name="Sign in", exact=True).click()
    nav = page.locator("header nav a")
    await expect(nav.first).to_be_visible(timeout=TIMEOUT_MS)
    return [str(await link.get_attribute("href")) for link in await nav.all()]


async def check_pages(
    page: Page, base: str, links: list[str], product: str
) -> dict[str, list[str]]:
    """Open each page at 390 px once it has loaded; the layout problems of each."""
    found: dict[str, list[str]] = {}
    for link in links:
        response = await page.goto(base + link)
        assert response is not None
        assert response.status == 200, link
        await expect(page.locator("main .muted", has_text="Loading…")).to_have_count(
            0, timeout=TIMEOUT_MS
        )
        await page.wait_for_load_state("networkidle")
        slug = link.rsplit("/", 1)[-1]
        await page.screenshot(path=artifact_path(f"phone-{product}-{slug}.png"), full_page=True)
        found[link] = await layout_problems(page)
    return found


async def test_issue22_every_gateway_console_page_fits_a_390_px_phone(page: Page) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.set_viewport_size(PHONE)
    async with demo_after_its_scenarios() as base:
        await page.goto(f"{base}/console/")
        signin = await layout_problems(page)
        links = await sign_in(page, base, TOKEN)
        found = await check_pages(page, base, links, "gateway")
        missing = await page.goto(f"{base}/console/spend")
        assert missing is not None
        await expect(page.locator("main h1")).to_have_text("Page not found")
        found["/console/spend"] = await layout_problems(page)
    assert links == [
        f"/console/{slug}" for slug in ("rooms", "activity", "circuits", "calls", "rules", "audit")
    ]
    assert missing.status == 404
    assert signin == []
    assert found == {link: [] for link in found}
    assert errors == []


async def test_issue22_every_proxy_console_page_fits_a_390_px_phone(page: Page) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.set_viewport_size(PHONE)
    async with running_proxy() as rig:
        links = await sign_in(page, rig.url, ADMIN_TOKEN)
        found = await check_pages(page, rig.url, links, "proxy")
    assert "/console/spend" in links
    assert found == {link: [] for link in found}
    assert errors == []


def series_answer(refusals: dict[str, int]) -> str:
    """An `/admin/activity/series` answer of two buckets with these refusals in the second."""
    buckets = [
        {"t": 1_767_225_600, "in": 1, "out": 1, "refusals": {}},
        {"t": 1_767_225_660, "in": 3, "out": 1, "refusals": refusals},
    ]
    return json.dumps({"span": "hour", "result": "last hour: 4 in", "buckets": buckets})


async def legend_colours(page: Page) -> dict[str, str]:
    """Each series of the refusal chart: its label and the colour of its legend marker."""
    chart = page.locator(".chart", has_text="Refusals by guard")
    await expect(chart.locator(".u-legend")).to_be_visible(timeout=TIMEOUT_MS)
    return dict(
        await chart.locator(".u-legend .u-series").evaluate_all(
            """rows => rows.slice(1).map(row => [
                row.querySelector(".u-label").textContent,
                getComputedStyle(row.querySelector(".u-marker")).borderColor,
            ])"""
        )
    )


async def test_issue22_a_guard_keeps_its_colour_whichever_guards_are_drawn_beside_it(
    page: Page,
) -> None:
    answers = [
        series_answer({"silence": 2, "bot_loop": 5}),
        series_answer({"admission": 1, "bot_loop": 3, "tool_loop": 1, "silence": 4}),
    ]
    served: list[str] = []

    async def serve(route: Route) -> None:
        served.append(route.request.url)
        await route.fulfill(
            status=200, content_type="application/json", body=answers[min(len(served), 2) - 1]
        )

    async with demo_after_its_scenarios() as base:
        await sign_in(page, base, TOKEN)
        await page.route(re.compile(r".*/admin/activity/series.*"), serve)
        await page.goto(f"{base}/console/activity")
        first = await legend_colours(page)
        await page.goto(f"{base}/console/activity")
        second = await legend_colours(page)
    assert list(first) == ["bot_loop", "silence"]
    assert list(second) == ["admission", "bot_loop", "silence", "tool_loop"]
    assert {name: second[name] for name in first} == first
    assert len(set(second.values())) == 4  # four guards, four colours
