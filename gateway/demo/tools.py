"""The Python tools of the demo's `openai` bots: each answers the same thing every time.

`find_document` is finder's tool: the archive is "still being indexed", so every search
returns the one result, and the LoopGuard sees a call that never progresses (it warns,
then blocks, then halts finder's turn). `read_inbox` is oracle's: the inbox stays
empty, so every request oracle sends its model after reading it is the one before, and
the CallLoopGuard refuses the 6th.

Decisions where DESIGN.md is silent:
- `read_inbox` returns a list, as an inbox reader would. The LoopGuard annotates only
  dict and string results, so its warnings never reach oracle's model and oracle's
  requests stay identical: the CallLoopGuard, not the LoopGuard, is what stops it.
"""

from __future__ import annotations


def find_document(query: str) -> dict[str, object]:
    """Search the archive for a document (the demo's archive is never done indexing)."""
    return {"query": query, "found": False, "status": "the archive is still being indexed"}


def read_inbox() -> list[str]:
    """Read the new messages in the inbox (the demo's inbox stays empty)."""
    return []
