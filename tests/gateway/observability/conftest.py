"""The OTLP receiver with loopwarden's tracer exporting to it, for the tracing tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.config import TelemetryConfig
from gateway.observability.telemetry import reset_tracing, setup_tracing
from tests.fakes.otlp_receiver import OtlpReceiver


@pytest.fixture
async def receiver(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[OtlpReceiver]:
    """The receiver, the tracer exporting to it; only flushes export (no schedule)."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "3600000")
    async with OtlpReceiver() as received:
        setup_tracing(TelemetryConfig(otlp_endpoint=received.endpoint), "loopwarden-test")
        try:
            yield received
        finally:
            await asyncio.to_thread(reset_tracing)
