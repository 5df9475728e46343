"""Playwright on the Debian `chromium`: the launch options every browser test uses.

pytest-playwright-asyncio's `browser`, `context` and `page` fixtures launch the browser
type's own download by default; none is possible here, so `browser_type_launch_args`
points it at `/usr/bin/chromium` (installed by `scripts/system-deps.sh`) with the flags
that keep Chromium from reaching for Google's hosts on a closed network. Screenshots a
test takes go to `test-results/` (`artifact_path`), which is not committed.

The plugin's two session fixtures that start Playwright and the browser are restated
here with `loop_scope="session"`: this suite's async fixtures run on the test's own loop
by default (`asyncio_default_fixture_loop_scope = "function"`), and the browser must
outlive one test's loop.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Playwright, async_playwright

CHROMIUM = shutil.which("chromium") or shutil.which("chromium", path="/usr/bin")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-results"
CHROMIUM_FLAGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)

needs_chromium = [
    pytest.mark.chromium,
    pytest.mark.skipif(
        CHROMIUM is None, reason="needs the chromium binary (apt-get install chromium)"
    ),
    pytest.mark.asyncio(loop_scope="session"),
]
"""Marks for a browser test: chromium present, and the browser fixtures' session loop."""


@pytest.fixture(scope="session")
def browser_type_launch_args() -> dict[str, object]:
    """Launch the system Chromium headless, never a downloaded browser."""
    return {"executable_path": CHROMIUM, "headless": True, "args": list(CHROMIUM_FLAGS)}


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def playwright() -> AsyncIterator[Playwright]:
    """One Playwright driver for the session, on the session's loop."""
    async with async_playwright() as driver:
        yield driver


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser(launch_browser: Callable[[], Awaitable[Browser]]) -> AsyncIterator[Browser]:
    """One Chromium for the session; each test gets its own context and page."""
    launched = await launch_browser()
    yield launched
    await launched.close()


def artifact_path(name: str) -> Path:
    """Where a test keeps a screenshot (`test-results/<name>`), its folder created."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / name
