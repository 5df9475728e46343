"""`loopwarden proxy`, `circuits list|reopen` and `calls export|preview-rule` (issue 6)."""

from __future__ import annotations

import asyncio
import csv
import io
import os
import signal
import socket
import sys
from pathlib import Path

import openai
import pytest

from gateway.calls.export import CSV_COLUMNS
from gateway.cli.main import main
from tests.fakes.llm_upstream import FakeLLM
from tests.gateway.proxy.proxy_helpers import (
    MODEL,
    PROXY_KEY,
    UPSTREAM_KEY,
    Rig,
    proxy_yaml,
    running_proxy,
)

RULES = """
rules:
  - {name: once-per-session, fields: [session], max_calls: 1, window_seconds: 1h}
"""


def sqlite_state(tmp_path: Path) -> str:
    return f"{{backend: sqlite, path: '{tmp_path / 'state.sqlite3'}'}}"


async def loop_until_paused(rig: Rig, session: str = "run-1") -> None:
    async with openai.AsyncOpenAI(
        base_url=f"{rig.url}/openai/v1",
        api_key=PROXY_KEY,
        default_headers={"X-Loopwarden-Session": session},
    ) as sdk:
        for _ in range(5):
            await sdk.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "again"}]
            )
        with pytest.raises(openai.RateLimitError):
            await sdk.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "again"}]
            )
    await rig.proxy.settle()


async def run_cli(*argv: str) -> tuple[int, str, str]:
    """The CLI in a worker thread (it runs its own event loop), with its output captured."""
    out, err = io.StringIO(), io.StringIO()

    def call() -> int:
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        try:
            return main(list(argv))
        finally:
            sys.stdout, sys.stderr = saved

    code = await asyncio.to_thread(call)
    return code, out.getvalue(), err.getvalue()


async def test_issue6_circuits_list_and_reopen_with_sqlite_state(tmp_path: Path) -> None:
    state = sqlite_state(tmp_path)
    async with running_proxy(state=state) as rig:
        path = tmp_path / "loopwarden.yaml"
        path.write_text(proxy_yaml(rig.upstream.url, state=state), encoding="utf-8")
        await loop_until_paused(rig)

        code, out, _ = await run_cli("circuits", "list", "--config", str(path))
        assert code == 0
        header, line = out.strip().splitlines()
        assert header.split() == ["CIRCUIT", "LEFT", "REFUSED", "REASON"]
        assert line.split()[0] == "billing-bot/session=run-1"
        assert line.split()[-1] == "loop_detected"

        circuit = "billing-bot/session=run-1"
        assert await run_cli("circuits", "reopen", circuit, "--config", str(path)) == (
            0,
            f"reopened {circuit}\n",
            "",
        )
        # The running proxy shares the file: its calls go through again at once.
        assert await rig.store.paused() == []
        await loop_until_paused(rig)
        code, out, _ = await run_cli("circuits", "reopen", "nobody", "--config", str(path))
        assert (code, out) == (1, "nobody was not paused (its repeat counts start afresh)\n")


async def test_issue6_calls_export_writes_the_log_as_csv(tmp_path: Path) -> None:
    state = sqlite_state(tmp_path)
    async with running_proxy(state=state) as rig:
        await loop_until_paused(rig)
        path = tmp_path / "loopwarden.yaml"
        path.write_text(proxy_yaml(rig.upstream.url, state=state), encoding="utf-8")
        code, out, _ = await run_cli("calls", "export", "--csv", "--config", str(path))
        assert code == 0
        code_recent, recent, _ = await run_cli(
            "calls", "export", "--csv", "--since", "1h", "--config", str(path)
        )
    rows = list(csv.DictReader(io.StringIO(out)))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [r["outcome"] for r in rows] == ["forwarded"] * 5 + ["loop_detected"]
    assert {r["agent"] for r in rows} == {"billing-bot"}
    assert rows[0]["input_tokens"] == "11"
    assert rows[0]["cost_estimated"] == "false"
    assert rows[-1]["cost_estimated"] == "true"
    assert rows[-1]["status"] == ""
    assert float(rows[-1]["cost"]) > 0
    assert (code_recent, len(list(csv.DictReader(io.StringIO(recent))))) == (0, 6)


async def test_issue6_preview_rule_counts_what_a_rule_would_have_stopped(tmp_path: Path) -> None:
    state = sqlite_state(tmp_path)
    async with running_proxy(state=state) as rig:
        await loop_until_paused(rig, "run-1")
        await loop_until_paused(rig, "run-2")
    path = tmp_path / "loopwarden.yaml"
    path.write_text(proxy_yaml("http://127.0.0.1:9", RULES, state=state), encoding="utf-8")
    code, out, _ = await run_cli(
        "calls", "preview-rule", "--rule", "once-per-session", "--config", str(path)
    )
    assert (code, out) == (
        0,
        "rule once-per-session would have stopped 10 of 12 logged calls in the last 7 d\n",
    )
    inline = "{name: twice, fields: [session], max_calls: 2, window_seconds: 24h}"
    code, out, _ = await run_cli("calls", "preview-rule", "--rule", inline, "--config", str(path))
    assert "would have stopped 8 of 12" in out
    code, _, err = await run_cli(
        "calls", "preview-rule", "--rule", "no-such-rule", "--config", str(path)
    )
    assert code == 2
    assert err.startswith("config error: --rule: no rule named 'no-such-rule'")


@pytest.mark.parametrize(
    "argv",
    [
        ["circuits", "list"],
        ["circuits", "reopen", "billing-bot"],
        ["calls", "export", "--csv"],
        [
            "calls",
            "preview-rule",
            "--rule",
            "{name: x, fields: [session], max_calls: 1, window_seconds: 60}",
        ],
    ],
)
async def test_with_memory_state_the_commands_point_at_the_admin_api(
    tmp_path: Path, argv: list[str]
) -> None:
    path = tmp_path / "loopwarden.yaml"
    path.write_text(proxy_yaml("http://127.0.0.1:9"), encoding="utf-8")
    code, out, err = await run_cli(*argv, "--config", str(path))
    assert (code, out) == (2, "")
    assert "state.backend: memory" in err
    assert "/admin/circuits" in err


def test_proxy_without_a_proxy_section_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "loopwarden.yaml"
    path.write_text("state: {backend: memory}\n", encoding="utf-8")
    assert main(["proxy", "--config", str(path)]) == 2
    assert capsys.readouterr().err.startswith("config error: proxy: required")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_issue6_loopwarden_proxy_serves_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    async with FakeLLM() as upstream:
        path = tmp_path / "loopwarden.yaml"
        path.write_text(proxy_yaml(upstream.url, port=port), encoding="utf-8")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway",
            "proxy",
            "--config",
            str(path),
            "--log-level",
            "DEBUG",
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert process.stderr is not None
        try:
            started = b""
            while b"proxy listening" not in started:
                started = await asyncio.wait_for(process.stderr.readline(), timeout=20)
            assert b", on uvloop" in started  # issue10: served on uvloop by default
            async with openai.AsyncOpenAI(
                base_url=f"http://127.0.0.1:{port}/openai/v1", api_key=PROXY_KEY
            ) as sdk:
                for _ in range(5):
                    await sdk.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": "hello"}]
                    )
                with pytest.raises(openai.RateLimitError):
                    await sdk.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": "hello"}]
                    )
            process.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(process.wait(), timeout=10)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        logs = (await process.stderr.read()).decode()
    assert code == 0
    assert "proxy stopped" in logs
    assert "loop detected" in logs
    assert UPSTREAM_KEY not in logs
    assert PROXY_KEY not in logs
    assert len(upstream.requests) == 5
