"""The policy cache: one resolution per room and overrides, shared by rooms of one source."""

from __future__ import annotations

from gateway.app.policies import PolicyCache
from tests.fakes.inmemory import rig_config


def test_policy_cache_shares_one_policy_per_source() -> None:
    config = rig_config(
        "channels: [{match: {channel: 'C9*'}, policy: {bot_loop: {max_events_per_window: 3}}}]"
    )
    cache = PolicyCache(config, max_rooms=2)
    default = cache.resolve("room", "A", None, {})
    assert default.policy is config.policy
    ruled = [cache.resolve("room", f"C9{i}", None, {}) for i in range(5)]
    assert all(entry is ruled[0] for entry in ruled)
    assert ruled[0].bot_loop.max_events_per_window == 3
    overridden = cache.resolve("room", "C91", None, {"bot_loop.max_events_per_window": 7})
    assert overridden.bot_loop.max_events_per_window == 7
    assert cache.resolve("room", "C91", None, {}) is ruled[0]
