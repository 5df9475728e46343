"""Paths and bodies the guard must not be stepped around with, on all three routes (issue 9)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from yarl import URL

from gateway.proxy.paths import PathError, canonical_path, upstream_path
from tests.gateway.proxy.proxy_helpers import MODEL, PROXY_KEY, Rig, running_proxy

TEXT = "Check order 12345 at 10:00"


@dataclass(frozen=True)
class Route:
    """One provider's guarded call: where it is sent, with what, and where it must land."""

    name: str
    prefix: str
    canonical: str
    upstream: str
    credential: dict[str, str]
    body: dict[str, object]

    def code(self, error: dict[str, Any]) -> object:
        """The loopwarden code in this provider's error body."""
        detail = error["error"]
        if self.name == "anthropic":
            return detail["details"]["error_code"]
        if self.name == "gemini":
            return detail["details"][0]["metadata"]["code"]
        return detail["code"]


GEMINI_CALL = "v1beta/models/gemini-2.0-flash:generateContent"
ROUTES = [
    Route(
        "openai",
        "/openai/v1/",
        "chat/completions",
        "/v1/chat/completions",
        {"Authorization": f"Bearer {PROXY_KEY}"},
        {"model": MODEL, "messages": [{"role": "user", "content": TEXT}]},
    ),
    Route(
        "anthropic",
        "/anthropic/",
        "v1/messages",
        "/v1/messages",
        {"x-api-key": PROXY_KEY},
        {"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": TEXT}]},
    ),
    Route(
        "gemini",
        "/gemini/",
        GEMINI_CALL,
        f"/{GEMINI_CALL}",
        {"x-goog-api-key": PROXY_KEY},
        {"contents": [{"role": "user", "parts": [{"text": TEXT}]}]},
    ),
]


def spellings(canonical: str) -> dict[str, bool]:
    """Other spellings of a canonical path, and whether each still means it (else a 400)."""
    first, _, rest = canonical.partition("/")
    return {
        "x%2F..%2F" + canonical.replace("/", "%2F"): True,
        f".%2F{canonical}": True,
        f"/{canonical}": True,
        f"{canonical}/": True,
        f"{first}//{rest}": True,
        f"./{first}/./{rest}/.": True,
        f"{first}%2F{rest}": True,
        f"{canonical}%3F": False,
        f"{canonical}%23": False,
        f"{canonical};x": False,
        f"{canonical}%3Bx": False,
        f"{canonical}%00": False,
        f"{first}%5C{rest}": False,
        f"{first}%252F{rest}": False,
        f"{canonical}%FF": False,
    }


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with running_proxy() as running:
        yield running


async def post(
    http: aiohttp.ClientSession, rig: Rig, route: Route, path: str, *, session: str, body: bytes
) -> tuple[int, dict[str, Any], str | None]:
    """Send one call on a raw (still encoded) path; the status, the JSON body, our code."""
    url = URL(f"{rig.url}{route.prefix}{path}", encoded=True)
    headers = {**route.credential, "X-Loopwarden-Session": session}
    headers["Content-Type"] = "application/json"
    async with http.post(url, data=body, headers=headers) as response:
        return response.status, await response.json(), response.headers.get("x-loopwarden-code")


@pytest.mark.parametrize("route", ROUTES, ids=lambda route: route.name)
async def test_issue9_no_spelling_of_the_path_steps_around_the_guard(
    rig: Rig, route: Route
) -> None:
    body = json.dumps(route.body).encode()
    async with aiohttp.ClientSession() as http:
        for number, (path, means_it) in enumerate(spellings(route.canonical).items()):
            before = len(rig.upstream.requests)
            answers = [
                await post(http, rig, route, path, session=f"s{number}", body=body)
                for _ in range(8)
            ]
            reached = rig.upstream.requests[before:]
            if means_it:
                assert len(reached) == 5, path
                assert {r.raw_path for r in reached} == {route.upstream}, path
                assert [code for _, _, code in answers[5:]] == ["loop_detected"] * 3, path
            else:
                assert reached == [], path
                assert {status for status, _, _ in answers} == {400}, path
                assert {route.code(error) for _, error, _ in answers} == {"invalid_path"}, path


@pytest.mark.parametrize(
    ("route", "path"),
    [
        (ROUTES[0], "..%2F..%2Fadmin%2Fcircuits"),
        (ROUTES[0], "../../admin/circuits"),
        (ROUTES[0], "chat/..%2F..%2F..%2Fadmin%2Fcircuits"),
        (ROUTES[1], "..%2Fadmin%2Fcircuits"),
        (ROUTES[2], "v1beta/..%2F..%2Fadmin%2Fcircuits"),
    ],
    ids=["openai-encoded", "openai-plain", "openai-deep", "anthropic", "gemini"],
)
async def test_issue9_a_path_climbing_out_of_the_base_url_is_a_400(
    rig: Rig, route: Route, path: str
) -> None:
    async with aiohttp.ClientSession() as http:
        status, error, _ = await post(http, rig, route, path, session="s", body=b"{}")
        get = URL(f"{rig.url}{route.prefix}{path}", encoded=True)
        async with http.get(get, headers=route.credential) as listing:
            assert listing.status == 400
    assert status == 400
    assert route.code(error) == "invalid_path"
    assert not any(r.path.startswith("/admin") for r in rig.upstream.requests)
    assert rig.upstream.requests == []


HOSTILE_BODIES = {
    "deep nesting": b'{"model": "m", "messages": [' + b"[" * 200 + b"]" * 200 + b"]}",
    "5000 digits": b'{"model": "m", "messages": [], "n": ' + b"7" * 5000 + b"}",
    "NaN": b'{"model": "m", "messages": [], "temperature": NaN}',
    "overflow": b'{"model": "m", "messages": [], "temperature": 1e999}',
    "not UTF-8": b'{"model": "m\xff", "messages": []}',
    "truncated": b'{"model": "m", "messages": [',
}


@pytest.mark.parametrize("route", ROUTES, ids=lambda route: route.name)
async def test_issue9_a_hostile_body_is_a_400_and_the_next_call_is_served(
    rig: Rig, route: Route
) -> None:
    good = json.dumps(route.body).encode()
    async with aiohttp.ClientSession() as http:
        for why, body in HOSTILE_BODIES.items():
            status, error, _ = await post(http, rig, route, route.canonical, session="s", body=body)
            assert status == 400, why
            assert route.code(error) == "invalid_json", why
            assert rig.upstream.requests == [], why
            assert (await post(http, rig, route, route.canonical, session=why, body=good))[0] == 200
            rig.upstream.requests.clear()


def test_issue9_canonical_paths() -> None:
    assert canonical_path("x/../chat/completions") == "chat/completions"
    assert canonical_path("//chat//completions/./") == "chat/completions"
    assert canonical_path("") == ""
    assert upstream_path("v1beta/models/gemini-2.0-flash:generateContent") == (
        "v1beta/models/gemini-2.0-flash:generateContent"
    )
    assert upstream_path("files/caf\u00e9 ok") == "files/caf%C3%A9%20ok"
    for bad, why in [
        ("..", "climbs"),
        ("a/../../b", "climbs"),
        ("a%2Fb", "percent"),
        ("a?b", "'?'"),
        ("a#b", "'#'"),
        ("a;b", "';'"),
        ("a\\b", "backslash"),
        ("a\x00b", "control"),
        ("a b", "space"),
    ]:
        with pytest.raises(PathError, match=why):
            canonical_path(bad)


@given(st.lists(st.sampled_from(["a", "b", ".", "..", "", "c:d"]), max_size=12))
def test_a_canonical_path_is_its_own_canonical_form(segments: list[str]) -> None:
    try:
        canonical = canonical_path("/".join(segments))
    except PathError:
        return
    assert canonical_path(canonical) == canonical
    assert canonical_path(upstream_path(canonical)) == canonical
    assert not {".", "..", ""} & set(canonical.split("/")) or canonical == ""
