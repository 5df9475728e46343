"""Run every benchmark, each in its own process so that memory figures stay clean.

`python -m bench` (or `make bench`); `python -m bench --quick` runs the smaller workloads.
"""

from __future__ import annotations

import subprocess
import sys

BENCHES = (
    "bench.bot_loop_bench",
    "bench.loop_guard_bench",
    "bench.call_loop_bench",
    "bench.pipeline_bench",
    "bench.console_bench",
    "bench.telegram_bench",
    "bench.matrix_bench",
    "bench.room_guard_bench",
    "bench.state_bench",
    "bench.proxy_bench",
    "bench.replay_bench",
    "bench.silence_bench",
    "bench.history_bench",
    "bench.calls_query_bench",
    "bench.room_memory_bench",
    "bench.tracing_bench",
)


def main(argv: list[str] | None = None) -> int:
    """Run each benchmark module with the given arguments; non-zero if any failed."""
    args = sys.argv[1:] if argv is None else argv
    failed = []
    for name in BENCHES:
        print(f"\n=== {name} ===", flush=True)
        if subprocess.run([sys.executable, "-m", name, *args], check=False).returncode:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
