"""Each chat adapter without its library: an ImportError that names the extra to install."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from gateway.app.errors import LoopwardenError

ADAPTERS = [
    ("loopwarden_integrations.discord_py", "discord", "loopwarden[discord]"),
    ("loopwarden_integrations.telegram_ptb", "telegram", "loopwarden[telegram]"),
    ("loopwarden_integrations.aiogram", "aiogram", "loopwarden[aiogram]"),
    ("loopwarden_integrations.slack_bolt", "slack_bolt", "loopwarden[slack]"),
]


@pytest.mark.parametrize(("module", "library", "extra"), ADAPTERS)
def test_issue15_an_adapter_without_its_library_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, library: str, extra: str
) -> None:
    # As if it were not installed: the package and any of its modules already imported.
    for name in [library, *(n for n in sys.modules if n.startswith(f"{library}."))]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ImportError) as caught:
        importlib.import_module(module)
    assert extra in str(caught.value)
    assert isinstance(caught.value, LoopwardenError)


def test_issue15_room_guard_imports_without_any_chat_library() -> None:
    blocked = ["discord", "telegram", "aiogram", "slack_bolt", "slack_sdk"]
    code = (
        f"import sys; sys.modules.update(dict.fromkeys({blocked!r}))\n"
        "from loopwarden_integrations import RoomGuard\n"
        "print(RoomGuard(bot_id='b').outgoing('r', 'NO_REPLY'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"
