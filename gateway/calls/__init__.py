"""The call-loop state seam: CallLoopGuard decisions and the request log, per state backend."""

from gateway.calls.entry import CallLogEntry, CallOutcome
from gateway.calls.store import CallStore, MemoryCallStore

__all__ = ["CallLogEntry", "CallOutcome", "CallStore", "MemoryCallStore"]
