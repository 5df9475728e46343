"""Tools the openai-agent tests give the model, named `tests.gateway.agents.tools_for_tests:…`."""

from __future__ import annotations

import asyncio

_polls: dict[str, int] = {}


def get_job_status(job_id: str) -> str:
    """Report a job's status: IN_PROGRESS three times, then COMPLETE (per job id)."""
    _polls[job_id] = _polls.get(job_id, 0) + 1
    return "IN_PROGRESS" if _polls[job_id] <= 3 else "COMPLETE"


def get_status(service: str) -> dict[str, str]:
    """Report a service's status; this one is stuck and always says pending."""
    return {"service": service, "state": "pending"}


async def lookup_order(order_id: int) -> dict[str, object]:
    """Look an order up (an async tool)."""
    await asyncio.sleep(0)
    return {"order_id": order_id, "status": "shipped"}


def read_broken(path: str) -> str:
    """A tool that always fails."""
    raise OSError(f"cannot read {path}")


def search_orders(
    query: str,
    *,
    limit: int = 10,
    min_total: float = 0.0,
    include_closed: bool = False,
    tags: list[str] | None = None,
    filters: dict[str, str] | None = None,
    note: object = None,
) -> list[str]:
    """Search orders by text.

    Longer description that must not reach the schema.
    """
    return [query]
