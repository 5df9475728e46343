"""Run every benchmark in turn: `python -m bench` (or `make bench`); `--quick` shrinks them."""

from __future__ import annotations

import importlib
import sys

BENCHES = (
    "bench.bot_loop_bench",
    "bench.loop_guard_bench",
    "bench.call_loop_bench",
    "bench.pipeline_bench",
    "bench.telegram_bench",
    "bench.state_bench",
    "bench.proxy_bench",
)


def main() -> int:
    """Run each benchmark module's `main()` with this process's arguments."""
    failures = 0
    for name in BENCHES:
        print(f"\n=== {name} ===", flush=True)
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            print(f"skipped: {exc}")
            continue
        result = module.main()
        failures += 1 if result else 0
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
