"""The Matrix tests' homeserver: one real Synapse per test worker, and a client per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.fakes.synapse_server import SynapseClient, SynapseMissing, SynapseServer


@pytest.fixture(scope="session")
def synapse_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SynapseServer]:
    """A Synapse with generous rate limits, shared by the worker's tests (unique usernames)."""
    try:
        server = SynapseServer(tmp_path_factory.mktemp("synapse"))
    except SynapseMissing as exc:
        pytest.fail(str(exc))
    with server:
        yield server


@pytest.fixture
async def synapse(synapse_server: SynapseServer) -> AsyncIterator[SynapseClient]:
    """Set-up calls (register, create_room, join, send_text, messages) on the shared Synapse."""
    async with SynapseClient(synapse_server) as client:
        yield client
