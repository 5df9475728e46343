"""The package as a user installs it: a wheel and an sdist that build without a warning, and
a wheel that runs `check-config` and the demo from a fresh virtual environment.

The fresh environment gets the wheel alone (`--no-deps`, no editable install, no checkout
on its path, run from a temporary folder); its dependencies come from this environment's
site-packages through a `.pth` line, whose own `.pth` files (the editable install's hook
among them) are not read. So a package-data file missing from the wheel, or an import of
a module that is not shipped (a test helper), fails here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.gateway.demo_process import DEMO_ARGS, run_demo_until_cut

ROOT = Path(__file__).resolve().parents[2]
WAIT_SECONDS = 60.0
EXAMPLE_ENV = {
    "LOOPWARDEN_ADMIN_TOKEN": "an-admin-token-long-enough",
    "OPENAI_API_KEY": "sk-test",
    "PUBLIC_BASE_URL": "https://bots.example.org",
    "REDIS_PASSWORD": "a-redis-password",
    "SLACK_BOT_TOKEN": "xoxb-test",
    "SLACK_SIGNING_SECRET": "a-signing-secret-long-enough",
    "TELEGRAM_TOKEN": "123456:ABCDEF",
    "TELEGRAM_WEBHOOK_SECRET": "a-webhook-secret-long-enough",
}
SHIPPED = (
    "gateway/admin/console/templates/login.html",
    "gateway/admin/console/static/console.js",
    "gateway/replay/static/report.html",
    "gateway/static/uPlot.iife.min.js",
    "connectors/room/demo.yaml",
    "guards/py.typed",
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel and sdist `python -m build` makes of this checkout, and what it printed.

    It builds a copy of the files git tracks, so nothing is written into the checkout.
    """
    source = tmp_path_factory.mktemp("source")
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, tracked.split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
        capture_output=True,
        text=True,
        check=False,
        env=_clean_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out, done.stdout + done.stderr


@pytest.fixture(scope="module")
def venv(built: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment holding the wheel alone (its dependencies borrowed)."""
    dist, _ = built
    home = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(home)], check=True)
    python = home / "bin" / "python"
    (wheel,) = dist.glob("loopwarden-*.whl")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
    subprocess.run([*install, "--no-deps", "--no-index", str(wheel)], check=True)
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "borrowed-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return home


def _clean_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    return {**env, **extra}


def test_issue22_build_makes_a_wheel_and_an_sdist_without_a_warning(
    built: tuple[Path, str],
) -> None:
    dist, output = built
    assert len(list(dist.glob("loopwarden-*.whl"))) == 1
    assert len(list(dist.glob("loopwarden-*.tar.gz"))) == 1
    warnings = [line for line in output.splitlines() if "warning" in line.lower()]
    assert warnings == []


def test_issue22_the_wheel_ships_its_data_and_license_and_no_tests(
    built: tuple[Path, str],
) -> None:
    dist, _ = built
    (wheel,) = dist.glob("loopwarden-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in SHIPPED:
        assert shipped in names
    assert any(name.endswith("licenses/LICENSE") for name in names)
    assert not [name for name in names if name.startswith(("tests/", "bench/"))]
    metadata = next(name for name in names if name.endswith("METADATA"))
    assert "License-Expression: MIT" in zipfile.ZipFile(wheel).read(metadata).decode()


def test_issue22_the_installed_wheel_checks_the_example_config(venv: Path, tmp_path: Path) -> None:
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import gateway; print(gateway.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env=_clean_env(),
    ).stdout
    assert where.startswith(str(venv))
    config = ROOT / "deploy" / "loopwarden.yaml"
    done = subprocess.run(
        [str(venv / "bin" / "loopwarden"), "check-config", str(config)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env=_clean_env(**EXAMPLE_ENV),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr


async def test_issue22_the_installed_wheel_runs_the_demo_until_the_room_answers(
    venv: Path, tmp_path: Path
) -> None:
    command = [str(venv / "bin" / "loopwarden"), *DEMO_ARGS]
    run = await run_demo_until_cut(
        command, wait_seconds=WAIT_SECONDS, cwd=tmp_path, env=_clean_env()
    )
    assert run.returncode == 0, run.errors
    assert "Traceback" not in run.errors
