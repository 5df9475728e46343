"""Two proxy replicas on one Redis share circuits, pauses and the request log (issue 6)."""

from __future__ import annotations

import asyncio
import io
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from gateway.alerts_free import NOTHING  # noqa: F401  (placeholder removed below)
