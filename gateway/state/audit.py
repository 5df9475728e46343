"""The audit trail's two logs, as every StateStore backend keeps them.

- `admin`: what admins did: a listed admin's chat commands (done or rejected), the admin
  API's calls with the token, and a signed-in console's changes. Each backend keeps its
  newest entries (memory 1,000, sqlite `audit_keep`, 10,000, redis 10,000).
- `others`: every other attempt: a non-admin's refused command, a bot's, a console
  request refused for its CSRF token, a failed console sign-in, and a person's own
  `/new` or `/loop forget` in a DM (allowed, but not an admin's act). At most
  `OTHERS_KEEP` entries, and at most `OTHERS_PER_SENDER` of one sender (platform and
  user id): a sender's next attempt drops that sender's oldest, so one sender cannot
  push the others out.
No entry of `others` ever drops one of `admin`: a chat user typing `/loop reset` a
thousand times leaves every admin action where it was. Entries written before the two
logs existed stay where they were (the admin log), until pushed out.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable

from gateway.state.base import AuditEntry

OTHERS_KEEP = 1_000
OTHERS_PER_SENDER = 50


def sender(entry: AuditEntry) -> tuple[str, str]:
    """Who an entry of `others` counts against: its platform and user id."""
    return entry.platform, entry.user_id


def newest_first(
    admin: Iterable[AuditEntry], others: Iterable[AuditEntry], limit: int
) -> list[AuditEntry]:
    """The newest `limit` of two logs' reads (each newest first), merged by time.

    At equal times the admin entry comes first.
    """
    merged = heapq.merge(admin, others, key=lambda entry: -entry.at)
    return list(itertools.islice(merged, max(limit, 0)))
