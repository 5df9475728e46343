"""The call-loop state seam: CallLoopGuard decisions and the request log, per state backend."""

from gateway.calls.store import CallLogEntry, CallOutcome, CallStore, MemoryCallStore

__all__ = ["CallLogEntry", "CallOutcome", "CallStore", "MemoryCallStore"]
