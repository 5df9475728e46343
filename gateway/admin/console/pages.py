"""The console's pages, as data: which product lists which, in what order.

Decisions where DESIGN.md is silent:
- A page is listed (in the nav, and at `/console/<slug>`) only when its script,
  `static/pages/<slug>.js`, ships in the package: a page without its script would be an
  empty frame. The console's first listed page is what `/console/` shows.
- The gateway lists Rooms, Activity, Circuits, Calls, Rules and Audit; the proxy
  Circuits, Calls, Rules, Spend and Audit. Spend is the proxy's (DESIGN.md §6 budgets
  live in `proxy.budgets`, read by `GET /admin/spend?by=&period=`); the gateway's
  `policy.spend` budgets are per room and shown on each room's card on Rooms, so the
  gateway does not link Spend, and `/console/spend` there is the console's 404 page.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Literal

Product = Literal["gateway", "proxy"]


@dataclass(frozen=True, slots=True)
class ConsolePage:
    """One page: its address under /console/, its script's name, and its nav title."""

    slug: str
    title: str


ROOMS = ConsolePage("rooms", "Rooms")
ACTIVITY = ConsolePage("activity", "Activity")
CIRCUITS = ConsolePage("circuits", "Circuits")
CALLS = ConsolePage("calls", "Calls")
RULES = ConsolePage("rules", "Rules")
SPEND = ConsolePage("spend", "Spend")
AUDIT = ConsolePage("audit", "Audit")
NOT_FOUND = ConsolePage("not-found", "Page not found")
"""What an address that is no page of the console shows (in the frame, with a 404)."""

PAGES: dict[Product, tuple[ConsolePage, ...]] = {
    "gateway": (ROOMS, ACTIVITY, CIRCUITS, CALLS, RULES, AUDIT),
    "proxy": (CIRCUITS, CALLS, RULES, SPEND, AUDIT),
}


def static_files() -> Traversable:
    """The console's own static files in the package (`gateway/admin/console/static`)."""
    return resources.files("gateway.admin.console") / "static"


def shipped(pages: tuple[ConsolePage, ...]) -> tuple[ConsolePage, ...]:
    """The pages whose script is in the package, in order."""
    return tuple(page for page in pages if (static_files() / "pages" / f"{page.slug}.js").is_file())
