"""The console's pages and files: security headers, the page list, static paths, escaping."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from importlib import resources
from importlib.resources.abc import Traversable

import pytest

from gateway.admin.console.app import SECURITY_HEADERS
from gateway.admin.console.pages import PAGES, shipped
from gateway.state.base import AuditEntry
from tests.gateway.console.console_helpers import console_gateway

HOSTILE_ROOM = "room:<script>alert(1)</script>"
HOSTILE_NAME = "<img src=x onerror=alert(1)>"


class MarkupCheck(HTMLParser):
    """Collects what the CSP would block: inline scripts, inline styles, event attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = {name for name, _ in attrs}
        if tag == "script":
            self._in_script = True
            if "src" not in names:
                self.problems.append("script without src")
        if tag == "style":
            self.problems.append("style element")
        self.problems += [
            f"{tag} {name}=" for name in names if name == "style" or name.startswith("on")
        ]

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.problems.append("inline script text")


def markup_problems(page: str) -> list[str]:
    check = MarkupCheck()
    check.feed(page)
    return check.problems


async def test_issue12_every_console_answer_carries_the_security_headers() -> None:
    async with console_gateway() as (_, browser):
        cookie, _ = await browser.sign_in()
        for path, status in [
            ("/console/", 200),
            ("/console/login", 303),
            ("/console/audit", 200),
            ("/console/static/console.js", 200),
            ("/console/static/nothing.js", 404),
            ("/console/nothing", 404),
            ("/admin/audit", 200),
        ]:
            response, _ = await browser.request("GET", path, cookie=cookie)
            assert response.status == status, path
            for name, value in SECURITY_HEADERS.items():
                assert response.headers[name] == value, (path, name)
            expected = "no-cache" if path == "/console/static/console.js" else "no-store"
            assert response.headers["Cache-Control"] == expected, path
        assert SECURITY_HEADERS["Content-Security-Policy"] == (
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
        )
        assert SECURITY_HEADERS["X-Frame-Options"] == "DENY"


async def test_issue12_pages_have_no_inline_script_style_or_handlers() -> None:
    async with console_gateway() as (_, browser):
        _, login = await browser.request("GET", "/console/")
        cookie, _ = await browser.sign_in()
        _, frame = await browser.request("GET", "/console/audit", cookie=cookie)
        scripts = re.findall(r'<script src="([^"]+)"></script>', frame)
        assert scripts == [
            "/console/static/uPlot.iife.min.js",
            "/console/static/console.js",
            "/console/static/pages/audit.js",
        ]
        assert '<main id="page" data-page="audit">' in frame
        assert 'action="/console/logout"' in frame
        for page in (login, frame):
            assert markup_problems(page) == []
    async with console_gateway(token="") as (_, browser):
        _, disabled = await browser.request("GET", "/console/")
        assert markup_problems(disabled) == []


async def test_issue12_only_pages_whose_script_ships_are_listed_and_served() -> None:
    listed = shipped(PAGES["gateway"])
    assert [page.slug for page in listed][-1] == "audit"
    async with console_gateway() as (_, browser):
        cookie, _ = await browser.sign_in()
        _, frame = await browser.request("GET", "/console/", cookie=cookie)
        nav = re.findall(r'<a href="/console/([a-z]+)"', frame)
        assert nav == [page.slug for page in listed]
        for page in PAGES["gateway"]:
            response, _ = await browser.request("GET", f"/console/{page.slug}", cookie=cookie)
            assert response.status == (200 if page in listed else 404), page.slug
        anonymous, _ = await browser.request("GET", "/console/audit")
        assert (anonymous.status, anonymous.headers["Location"]) == (303, "/console/")


@pytest.mark.parametrize(
    "path",
    [
        "/console/static/../app.py",
        "/console/static/%2e%2e%2fapp.py",
        "/console/static/%2e%2e/%2e%2e/config.py",
        "/console/static/pages%2Faudit.js",
        "/console/static/pages%2faudit.js",
        "/console/static/..%5capp.py",
        "/console/static/%2Fetc%2Fpasswd",
        "/console/static//etc/passwd",
        "/console/static/console.js%00.png",
        "/console/static/console%2ejs",
        "/console/static/",
        "/console/static/pages",
        "/console/static/../../gateway/http.py",
    ],
)
async def test_issue12_static_paths_outside_the_shipped_files_are_404(path: str) -> None:
    async with console_gateway() as (_, browser):
        response, text = await browser.request("GET", path)
        assert response.status == 404, path
        assert "import" not in text
        served, _ = await browser.request("GET", "/console/static/console.js")
        assert served.status == 200


async def test_issue12_shipped_static_files_are_served_with_their_types() -> None:
    async with console_gateway() as (_, browser):
        for path, content_type in [
            ("/console/static/console.js", "text/javascript"),
            ("/console/static/pages/audit.js", "text/javascript"),
            ("/console/static/console.css", "text/css"),
            ("/console/static/uPlot.iife.min.js", "text/javascript"),
            ("/console/static/uPlot.min.css", "text/css"),
            ("/console/static/LICENSE-uPlot.txt", "text/plain"),
        ]:
            response, _ = await browser.request("GET", path)
            assert response.status == 200, path
            assert response.content_type == content_type, path


def console_scripts() -> list[tuple[str, str]]:
    """Every script and stylesheet the console ships of its own (uPlot is vendored)."""

    def walk(folder: Traversable, prefix: str) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        for entry in folder.iterdir():
            if entry.is_dir():
                found += walk(entry, f"{prefix}{entry.name}/")
            else:
                found.append((prefix + entry.name, entry.read_text(encoding="utf-8")))
        return found

    files = walk(resources.files("gateway.admin.console") / "static", "")
    files += walk(resources.files("gateway.admin.console") / "templates", "templates/")
    return files


def test_issue12_the_console_never_writes_markup_from_data() -> None:
    files = console_scripts()
    assert {"console.js", "pages/audit.js", "templates/base.html"} <= {name for name, _ in files}
    for name, text in files:
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in text, (name, sink)
        assert "|safe" not in text.replace(" ", ""), name
        assert "Markup(" not in text, name


async def test_issue12_a_hostile_room_name_reaches_the_audit_page_only_as_json_data() -> None:
    async with console_gateway() as (gateway, browser):
        await gateway.state.audit(
            AuditEntry(
                at=1_800_000_000.0,
                platform="room",
                room=HOSTILE_ROOM,
                user_id="u1",
                user_name=HOSTILE_NAME,
                command="/loop reset",
                allowed=True,
                outcome="done",
            )
        )
        cookie, _ = await browser.sign_in()
        _, frame = await browser.request("GET", "/console/audit", cookie=cookie)
        assert "alert(1)" not in frame
        response, _ = await browser.request("GET", "/admin/audit?limit=200", cookie=cookie)
        assert response.content_type == "application/json"
        answer = await response.json()
        assert HOSTILE_ROOM in answer["result"]
        if "entries" in answer:
            # The newest is the sign-in itself (issue 20); the hostile entry comes next.
            assert answer["entries"][0]["outcome"] == "signed_in"
            assert answer["entries"][1]["room"] == HOSTILE_ROOM
            assert answer["entries"][1]["user_name"] == HOSTILE_NAME


async def test_issue22_an_address_that_is_no_page_answers_404_in_the_consoles_frame() -> None:
    async with console_gateway() as (_, browser):
        cookie, csrf = await browser.sign_in()
        _, first = await browser.request("GET", "/console/", cookie=cookie)
        answers = {
            path: await browser.request("GET", path, cookie=cookie)
            for path in ("/console/spend", "/console/nothing/at/all", "/console/logout")
        }
        anonymous, _ = await browser.request("GET", "/console/spend")
    nav = re.findall(r'<a href="/console/[a-z]+"', first)
    for path, (response, page) in answers.items():
        assert response.status == 404, path
        assert response.headers["Content-Type"].startswith("text/html"), path
        assert "<h1>Page not found</h1>" in page, path
        assert f"<code>{path}</code>" in page, path
        assert re.findall(r'<a href="/console/[a-z]+"', page) == nav, path  # the console's bar
        assert f'<meta name="csrf-token" content="{csrf}">' in page, path  # sign-out works
        assert "aria-current" not in page, path
        assert "<script" not in page, path  # no page script to load, none that would 404
        assert markup_problems(page) == [], path
    assert (anonymous.status, anonymous.headers["Location"]) == (303, "/console/")


async def test_issue22_every_page_a_console_links_answers_its_page() -> None:
    async with console_gateway() as (_, browser):
        cookie, _ = await browser.sign_in()
        _, first = await browser.request("GET", "/console/", cookie=cookie)
        links = re.findall(r'<a href="(/console/[a-z]+)"', first)
        statuses = [(await browser.request("GET", link, cookie=cookie))[0].status for link in links]
    assert "/console/spend" not in links  # the gateway's budgets are per room, on Rooms
    assert statuses == [200] * len(links)
