"""How fast CallLoopGuard fingerprints and decides a call, against plain blake2b in the same run.

Run: .venv/bin/python -m bench.call_loop_bench
"""

from __future__ import annotations

import hashlib
import json
import random
import timeit
from collections.abc import Callable, Mapping, Sequence

from guards.call_loop import (
    CallLoopGuard,
    UniquenessRule,
    circuit_key,
    fingerprint_call,
)

MODEL = "gpt-4o-mini"
WORDS = (
    "please", "check", "the", "order", "status", "for", "this", "customer", "and", "extract",
    "invoice", "totals", "from", "attached", "page", "then", "summarise", "what", "changed",
    "since", "last", "run", "whether", "a", "refund", "is", "due", "according", "to", "policy",
    "of", "billing", "team",
)  # fmt: skip

Conversation = list[Mapping[str, object]]


def prose(size: int, rng: random.Random) -> str:
    """Chat-like text with a volatile token (id, date, time, long number) every ~12 words."""
    words: list[str] = []
    length = 0
    while length < size:
        roll = rng.random()
        if roll < 0.02:
            word = f"order {rng.randint(10_000, 99_999_999)}"
        elif roll < 0.04:
            word = f"at {rng.randint(0, 23)}:{rng.randint(0, 59):02d}"
        elif roll < 0.05:
            word = f"on 2026-11-{rng.randint(1, 30):02d}"
        elif roll < 0.06:
            word = f"ref {rng.getrandbits(48):012x}"
        elif roll < 0.08:
            word = f"page {rng.randint(1, 40)}"
        else:
            word = rng.choice(WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:size]


def tool_result(size: int, rng: random.Random) -> str:
    """A JSON tool result: ids, timestamps, small numbers (digit-dense, the hard case)."""
    rows = []
    length = 2
    while length < size:
        row = json.dumps(
            {
                "id": f"{rng.getrandbits(40)}",
                "created": f"2026-11-{rng.randint(1, 30):02d}T{rng.randint(0, 23):02d}:00:00Z",
                "status": rng.choice(["open", "paid", "refunded"]),
                "amount": rng.randint(1, 999),
            }
        )
        rows.append(row)
        length += len(row) + 2
    return ("[" + ", ".join(rows) + "]")[:size]


def chat(size: int, rng: random.Random) -> Conversation:
    """A chat history of ~500-byte turns, `size` bytes in all."""
    turns: Conversation = [{"role": "system", "content": prose(400, rng)}]
    role = "user"
    while len(json.dumps(turns)) < size:
        turns.append({"role": role, "content": prose(500, rng)})
        role = "assistant" if role == "user" else "user"
    return turns


def last_two_heavy(
    size: int, rng: random.Random, text: Callable[[int, random.Random], str]
) -> Conversation:
    """Worst case: the whole size sits in the last two messages, which are normalised."""
    return [
        {"role": "user", "content": text(size // 2, rng)},
        {"role": "assistant", "content": text(size // 2, rng)},
    ]


def tool_round(size: int, rng: random.Random) -> Conversation:
    """An agent round: an assistant tool call, then a JSON tool result of about `size`."""
    call = {"name": "list_orders", "arguments": json.dumps({"customer": "c-1042", "page": 2})}
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_Nn8aFV3BP0qHkfOMx7", "type": "function", "function": call}],
        },
        {
            "role": "tool",
            "tool_call_id": "call_Nn8aFV3BP0qHkfOMx7",
            "content": tool_result(size, rng),
        },
    ]


def per_call(action: Callable[[], object]) -> float:
    """Seconds per call of `action`: the best of many short runs (robust on a busy machine)."""
    timer = timeit.Timer(action)
    number, elapsed = timer.autorange()
    number = max(1, int(number * 0.01 / elapsed))
    return min(timer.repeat(repeat=60, number=number)) / number


def bench_fingerprint(name: str, messages: Sequence[Mapping[str, object]]) -> None:
    """Print fingerprint_call's time next to blake2b over the conversation's bytes."""
    raw = json.dumps(messages).encode()

    def fingerprint() -> str:
        return fingerprint_call(MODEL, messages)

    def baseline() -> str:
        return hashlib.blake2b(raw, digest_size=16).hexdigest()

    ours = per_call(fingerprint)
    plain = per_call(baseline)
    print(
        f"{name:<44} {len(raw) / 1024:6.1f} KB  fingerprint_call {ours * 1e6:8.1f} us"
        f"   blake2b {plain * 1e6:6.1f} us   ratio {ours / plain:5.1f}x"
    )


class CheckLoad:
    """A stream of check() calls over 1000 circuits, half of them matching a rule filter."""

    def __init__(self, guard: CallLoopGuard) -> None:
        rng = random.Random(7)
        self.guard = guard
        self.circuits = [circuit_key("agent", f"session-{i}") for i in range(1000)]
        self.fingerprints = [f"{rng.getrandbits(128):032x}" for _ in range(1000)]
        self.index = 0

    def fields(self) -> dict[str, str]:
        """The header fields of the next call (also built by the baseline)."""
        self.index += 1
        i = self.index
        feature = "invoices" if i % 2 else "chat"
        return {"session": f"session-{i % 1000}", "step": f"p{i}", "feature": feature}

    def check(self) -> None:
        """One decision."""
        fields = self.fields()
        self.guard.check(
            circuit=self.circuits[self.index % 1000],
            fingerprint=self.fingerprints[self.index % 1000],
            fields=fields,
            now=self.index * 0.001,
        )

    def baseline(self) -> None:
        """The same fields and one blake2b of the fingerprint: the floor of any decision."""
        self.fields()
        fingerprint = self.fingerprints[self.index % 1000].encode()
        hashlib.blake2b(fingerprint, digest_size=16).hexdigest()


def bench_check() -> None:
    """Print check()'s time per call over many circuits, with and without two rules."""
    rules = (
        UniquenessRule("once-per-step", ("session", "step"), 1, 86_400.0),
        UniquenessRule("invoices", ("session", "prompt"), 3, 600.0, filters={"feature": "inv*"}),
    )
    for label, guard_rules in (("no rules", ()), ("two rules", rules)):
        load = CheckLoad(CallLoopGuard(rules=guard_rules))
        ours = per_call(load.check)
        plain = per_call(load.baseline)
        print(
            f"{'check(), 1000 circuits, ' + label:<44}          check() {ours * 1e6:8.2f} us"
            f"   fields+blake2b {plain * 1e6:5.2f} us   ratio {ours / plain:5.1f}x"
        )


def main() -> None:
    """Run every benchmark and print one line each."""
    rng = random.Random(42)
    print("CallLoopGuard benchmark (best of 60 short runs; baselines measured in the same run)")
    bench_fingerprint("4 KB chat (system + turns)", chat(4096, rng))
    bench_fingerprint("4 KB, all in the last two messages", last_two_heavy(4096, rng, prose))
    bench_fingerprint("4 KB agent round (tool call + JSON result)", tool_round(4096, rng))
    bench_fingerprint("64 KB chat (system + turns)", chat(65_536, rng))
    bench_fingerprint("64 KB, all in the last two messages", last_two_heavy(65_536, rng, prose))
    bench_fingerprint("64 KB agent round (tool call + JSON result)", tool_round(65_536, rng))
    bench_check()


if __name__ == "__main__":
    main()
