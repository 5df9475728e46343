"""Shared state behind one seam: memory (default), sqlite and redis backends."""

from gateway.state.base import AuditEntry, StateStore
from gateway.state.memory import MemoryStateStore

__all__ = ["AuditEntry", "MemoryStateStore", "StateStore"]
