"""deploy/: the files parse and agree with the code; the Dockerfile's install steps run.

No Docker engine or cluster is needed: the compose file and the Kubernetes manifests are
read with PyYAML and checked against the code (image, port, probe paths, config path,
secrets), the example config goes through `loopwarden check-config`, the systemd unit
through `systemd-analyze verify`, and the Dockerfile's own COPY and RUN install steps
are replayed into a fresh virtual environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from gateway import __version__
from gateway.admin.access import AdminAccess
from gateway.admin.api import admin_api_routes
from gateway.admin.service import AdminService
from gateway.app.http import Readiness, create_app
from gateway.app.runtime import Gateway
from gateway.cli.main import main as cli_main
from gateway.config import Config, HttpConfig, load_config, parse_config
from gateway.observability.metrics import Metrics
from gateway.state.memory import MemoryStateStore

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
IMAGE = f"loopwarden:{__version__}"
PORT = HttpConfig().port
CONFIG_DIR = "/etc/loopwarden"
CONFIG_PATH = f"{CONFIG_DIR}/loopwarden.yaml"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}")

Doc = dict[str, Any]


# The Dockerfile


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: its keyword and its text (continuations joined)."""

    keyword: str
    text: str

    def exec_form(self) -> list[str]:
        """The JSON (exec) form of ENTRYPOINT, CMD or the CMD of a HEALTHCHECK."""
        form = json.loads(self.text[self.text.index("[") :])
        assert isinstance(form, list)
        return [str(part) for part in form]


def dockerfile() -> list[Instruction]:
    """The instructions of deploy/Dockerfile, comments dropped, continuations joined."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in (DEPLOY / "Dockerfile").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, text = (pending + line).partition(" ")
        instructions.append(Instruction(keyword.upper(), text.strip()))
        pending = ""
    return instructions


def only(keyword: str) -> Instruction:
    """The one instruction with this keyword (the last one, as Docker applies it)."""
    found = [i for i in dockerfile() if i.keyword == keyword]
    assert found, f"no {keyword} in the Dockerfile"
    return found[-1]


def env_of(instruction: Instruction) -> dict[str, str]:
    """The variables an ENV instruction sets."""
    return dict(pair.split("=", 1) for pair in shlex.split(instruction.text))


def http_routes() -> set[str]:
    """The paths the gateway's HTTP server serves (before connectors add theirs)."""
    state = MemoryStateStore()
    app = create_app(
        readiness=lambda: Readiness(stopping=False, not_connected=()), metrics=Metrics()
    )
    app.add_routes(admin_api_routes(AdminService(Config(), state), state, AdminAccess(None)))
    return {route.resource.canonical for route in app.router.routes() if route.resource}


def test_the_image_is_slim_python_run_as_a_user_on_the_gateways_port() -> None:
    assert only("FROM").text == "python:3.11-slim"
    user = only("USER").text.split(":")[0]
    assert user not in ("root", "0")
    assert only("EXPOSE").text == str(PORT)
    assert only("ENTRYPOINT").exec_form() == ["loopwarden", "run", "--config", CONFIG_PATH]
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'loopwarden = "gateway.cli.main:main"' in pyproject
    assert any("'.[all]'" in i.text for i in dockerfile() if i.keyword == "RUN")


def test_the_health_check_asks_healthz_on_the_exposed_port() -> None:
    check = only("HEALTHCHECK")
    command = check.exec_form()
    assert check.text.split("CMD")[0].strip().startswith("--interval")
    assert command[:2] == ["python", "-c"]
    assert f"http://127.0.0.1:{PORT}/healthz" in command[2]
    assert "/healthz" in http_routes()
    assert "curl" not in check.text


async def test_the_health_check_command_passes_on_a_live_gateway_and_fails_without_one() -> None:
    command = only("HEALTHCHECK").exec_form()
    gateway = Gateway(parse_config("http: {host: 127.0.0.1, port: 0}"))
    await gateway.start()
    try:
        live = command[2].replace(f":{PORT}/", f":{gateway.port}/")
        assert await _exit_code(sys.executable, "-c", live) == 0
    finally:
        await gateway.stop(2.0)
    assert await _exit_code(sys.executable, "-c", live) != 0


async def _exit_code(*command: str) -> int:
    """Run a command without blocking the event loop (the gateway under test runs on it)."""
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    return await asyncio.wait_for(process.wait(), 30)


def test_every_file_the_image_copies_exists() -> None:
    for copy in (i for i in dockerfile() if i.keyword == "COPY"):
        *sources, _ = shlex.split(copy.text)
        for source in sources:
            assert (ROOT / source).exists(), source


def test_the_dockerfile_install_steps_install_the_project(tmp_path: Path) -> None:
    """Replay WORKDIR, COPY, ENV and the RUN steps that create the venv and pip install.

    Only the venv location is moved (its ENV variable points into tmp_path), and
    `PIP_NO_DEPS=1` keeps pip from downloading the runtime dependencies: the build
    backend (setuptools, wheel) still comes from the configured package index, as for
    `make`. Other RUN steps (useradd) change the system and are not replayed.
    """
    context = tmp_path / "context"
    venv = tmp_path / "venv"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # `python` in the RUN line is this interpreter, as the image's is its Python 3.11.
    (bin_dir / "python").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PIP_NO_DEPS="1")
    workdir = context
    installs = 0
    for step in dockerfile():
        if step.keyword == "WORKDIR":
            workdir = context / step.text.lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif step.keyword == "ENV":
            variables = env_of(step)
            if "VIRTUAL_ENV" in variables:
                variables["VIRTUAL_ENV"] = str(venv)
            env.update({k: v for k, v in variables.items() if k != "PATH"})
        elif step.keyword == "COPY":
            *sources, target = shlex.split(step.text)
            for source in sources:
                _copy(ROOT / source, workdir / target)
        elif step.keyword == "RUN" and ("pip install" in step.text or "-m venv" in step.text):
            done = subprocess.run(
                ["/bin/sh", "-c", step.text],
                check=False,
                cwd=workdir,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stdout + done.stderr
            installs += 1
    assert installs == 1
    assert (venv / "bin" / "loopwarden").exists()
    probe = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import importlib.metadata as m, json, guards.bot_loop; "
            "print(json.dumps([m.requires('loopwarden'), "
            "[str(f) for f in m.files('loopwarden')]]))",
        ],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    requires, files = json.loads(probe.stdout)
    assert any(r.startswith("loopwarden[") and 'extra == "all"' in r for r in requires)
    for extra, package in (
        ("discord", "discord.py"),
        ("telegram", "python-telegram-bot"),
        ("slack", "slack-bolt"),
        ("redis", "redis"),
    ):
        assert any(r.startswith(package) and f'extra == "{extra}"' in r for r in requires)
    for shipped in ("gateway/state/redis.py", "connectors/room/demo.yaml", "guards/py.typed"):
        assert shipped in files or not (ROOT / shipped).exists(), shipped


def _copy(source: Path, target: Path) -> None:
    """COPY semantics for a file or a directory, leaving out caches."""
    if source.is_dir():
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    else:
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target / source.name)


# The example config


def dummy_env() -> dict[str, str]:
    """A value for every variable the example config names."""
    text = (DEPLOY / "loopwarden.yaml").read_text(encoding="utf-8")
    env = {name: "dummy-" + name.lower() for name, _ in _VAR.findall(text)}
    env["PUBLIC_BASE_URL"] = "https://bots.example.com"
    return env


def required_variables(text: str) -> set[str]:
    """Variables a config names without a default."""
    return {name for name, default in _VAR.findall(text) if not default}


def test_the_example_config_is_valid_and_production_shaped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = dummy_env()
    config = load_config(DEPLOY / "loopwarden.yaml", env=env)
    assert config.state.backend == "redis"
    assert env["REDIS_PASSWORD"] in config.state.url.get_secret_value()
    assert (config.http.host, config.http.port) == ("0.0.0.0", PORT)
    assert config.http.admin_token is not None
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli_main(["check-config", str(DEPLOY / "loopwarden.yaml")]) == 0


def test_the_example_config_writes_every_token_as_a_variable() -> None:
    text = (DEPLOY / "loopwarden.yaml").read_text(encoding="utf-8")
    for key in ("token", "bot_token", "signing_secret", "webhook_secret", "api_key"):
        for value in re.findall(rf"^\s*{key}:\s*(\S+)", text, re.MULTILINE):
            assert value.startswith("${"), (key, value)


# docker compose


def compose() -> Doc:
    """deploy/compose.yaml, parsed (anchors and merge keys resolved by PyYAML)."""
    loaded = yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def test_compose_runs_two_gateways_of_the_image_beside_redis() -> None:
    services = compose()["services"]
    gateways = {name: s for name, s in services.items() if s.get("image") == IMAGE}
    assert sorted(gateways) == ["gateway-1", "gateway-2"]
    assert services["redis"]["image"].startswith("redis:")
    host_ports = []
    for service in gateways.values():
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).exists()
        [mapping] = service["ports"]
        host, container = mapping.split(":")
        assert int(container) == PORT
        host_ports.append(host)
        assert f"./loopwarden.yaml:{CONFIG_PATH}:ro" in service["volumes"]
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
    assert len(set(host_ports)) == 2


def test_compose_passes_every_secret_the_config_needs_from_the_environment() -> None:
    needed = required_variables((DEPLOY / "loopwarden.yaml").read_text(encoding="utf-8"))
    for name in ("gateway-1", "gateway-2"):
        environment: Mapping[str, str] = compose()["services"][name]["environment"]
        assert needed <= set(environment), needed - set(environment)
        for key, value in environment.items():
            assert str(value).startswith("${") or key == "REDIS_HOST", (key, value)


# Kubernetes


def manifests() -> Iterator[tuple[str, Doc]]:
    """(file name, document) for every manifest under deploy/k8s."""
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                yield path.name, cast(Doc, doc)


def manifest(kind: str, name: str) -> Doc:
    """The one manifest of this kind and name."""
    found = [d for _, d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


def test_kustomize_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_the_deployment_runs_two_replicas_with_the_codes_probes_and_port() -> None:
    deployment = manifest("Deployment", "loopwarden")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    [container] = pod["containers"]
    assert container["image"] == IMAGE
    [port] = container["ports"]
    assert port["containerPort"] == PORT
    routes = http_routes()
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert container[probe]["httpGet"]["path"] == path
        assert container[probe]["httpGet"]["port"] == port["name"]
        assert path in routes
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["config"]["mountPath"] == CONFIG_DIR
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "loopwarden-config"


def test_the_configmap_holds_the_example_config() -> None:
    configmap = manifest("ConfigMap", "loopwarden-config")
    text = (DEPLOY / "loopwarden.yaml").read_text(encoding="utf-8")
    assert configmap["data"][Path(CONFIG_PATH).name] == text


def test_the_secret_and_env_give_every_variable_the_config_needs() -> None:
    deployment = manifest("Deployment", "loopwarden")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    [source] = container["envFrom"]
    secret = manifest("Secret", source["secretRef"]["name"])
    given = set(secret["stringData"]) | {e["name"] for e in container.get("env", [])}
    needed = required_variables((DEPLOY / "loopwarden.yaml").read_text(encoding="utf-8"))
    assert needed <= given, needed - given
    assert set(secret["stringData"].values()) == {"change-me"}


def test_the_services_reach_the_gateway_and_redis() -> None:
    service = manifest("Service", "loopwarden")
    [port] = service["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (PORT, "http")
    deployment = manifest("Deployment", "loopwarden")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    redis = manifest("Service", "redis")
    redis_deployment = manifest("Deployment", "loopwarden-redis")
    assert redis["spec"]["selector"] == redis_deployment["spec"]["selector"]["matchLabels"]
    config = load_config(DEPLOY / "loopwarden.yaml", env={**dummy_env(), "REDIS_HOST": "redis"})
    assert "@redis:6379/" in config.state.url.get_secret_value()


# systemd


def unit() -> str:
    """deploy/loopwarden.service."""
    return (DEPLOY / "loopwarden.service").read_text(encoding="utf-8")


def test_the_unit_runs_the_gateway_sandboxed() -> None:
    text = unit()
    [exec_start] = re.findall(r"^ExecStart=(.+)$", text, re.MULTILINE)
    command = shlex.split(exec_start)
    assert command[0].endswith("/bin/loopwarden")
    assert command[1:] == ["run", "--config", CONFIG_PATH]
    for directive in (
        "DynamicUser=yes",
        "StateDirectory=loopwarden",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "NoNewPrivileges=yes",
        "KillSignal=SIGTERM",
    ):
        assert re.search(rf"^{re.escape(directive)}$", text, re.MULTILINE), directive


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    # A root of our own: the unit, the system's units it depends on, and an executable
    # where ExecStart expects the gateway (verify checks that it exists).
    root = tmp_path / "root"
    units = root / "etc" / "systemd" / "system"
    units.mkdir(parents=True)
    (units / "loopwarden.service").write_text(unit(), encoding="utf-8")
    system_units = next(
        p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if p.is_dir()
    )
    (root / "usr" / "lib" / "systemd").mkdir(parents=True)
    (root / "usr" / "lib" / "systemd" / "system").symlink_to(system_units)
    [exec_start] = re.findall(r"^ExecStart=(\S+)", unit(), re.MULTILINE)
    binary = root / exec_start.lstrip("/")
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n", encoding="utf-8")
    binary.chmod(0o755)
    done = subprocess.run(
        [analyze, "verify", f"--root={root}", "loopwarden.service"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    # verify exits 0 even for unknown keys and bad values: its complaints about our unit
    # are lines that name it.
    complaints = [line for line in done.stderr.splitlines() if "loopwarden.service" in line]
    assert done.returncode == 0, done.stderr
    assert complaints == []
