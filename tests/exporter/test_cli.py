"""The command line as users run it: the installed ``gke-gpu-exporter`` script."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.conftest import free_port, write_kubeconfig
from tests.timing import limit

SCRIPT = Path(sys.executable).with_name("gke-gpu-exporter")
JSON_LOGS = {"GKE_GPU_EXPORTER_LOG_FORMAT": "json"}


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=limit(60),
                          check=False, env=os.environ | JSON_LOGS | (env or {}), cwd=cwd)


def host_ok(directory: Path) -> dict[str, str]:
    """Settings start-up accepts on this host: a kubeconfig, any free port."""
    return {"GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": str(write_kubeconfig(directory)),
            "GKE_GPU_EXPORTER_PORT": "0"}


def log_lines(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def test_version_is_the_installed_package_version() -> None:
    proc = cli("--version")
    assert proc.returncode == 0
    assert proc.stdout == f"gke-gpu-exporter {metadata.version('gke-gpu-exporter')}\n"


@pytest.mark.parametrize("where", ["before", "after"])
def test_log_level_debug_shows_debug_lines(tmp_path: Path, where: str) -> None:
    """``--log-level`` works before the subcommand (global) and after ``run``."""
    (tmp_path / "c.yaml").write_text("cluster: c1\n")
    run = ["run", "--config", "c.yaml", "--check-config"]
    proc = cli(*(["--log-level", "debug", *run] if where == "before"
                 else [*run, "--log-level", "debug"]), env=host_ok(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (loaded,) = [e for e in log_lines(proc.stderr) if e["message"] == "config loaded"]
    assert loaded["severity"] == "DEBUG" and loaded["settings"]["cluster"] == "c1"


@pytest.mark.parametrize(("yaml", "env", "flag", "debug"), [
    ("log_level: debug", {}, [], True),
    ("{}", {"GKE_GPU_EXPORTER_LOG_LEVEL": "debug"}, [], True),
    ("log_level: debug", {}, ["--log-level", "info"], False),
    ("log_level: info", {}, ["--log-level", "debug"], True),
    ("{}", {}, [], False),
])
def test_config_log_level_applies_and_the_command_line_wins(
        tmp_path: Path, yaml: str, env: dict[str, str], flag: list[str], debug: bool) -> None:
    (tmp_path / "c.yaml").write_text(yaml)
    proc = cli(*flag, "run", "--config", "c.yaml", "--check-config",
               env=host_ok(tmp_path) | env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert any(e["severity"] == "DEBUG" for e in log_lines(proc.stderr)) is debug


@pytest.mark.parametrize(("level", "info_lines"), [("info", True), ("warning", False)])
async def test_log_level_warning_quiets_the_running_exporter(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path, level: str, info_lines: bool) -> None:
    sim: SimulatorServer = await make_server(make_scenario())
    port = free_port()
    env = os.environ | JSON_LOGS | {
        "GKE_GPU_EXPORTER_INTERVAL": "2", "GKE_GPU_EXPORTER_PORT": str(port),
        "GKE_GPU_EXPORTER_LISTEN_ADDRESS": "127.0.0.1", "GKE_GPU_EXPORTER_DCGM__TIMEOUT": "1",
        "GKE_GPU_EXPORTER_WAREHOUSE__ENABLED": "false",
        "GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": str(sim.write_outputs(tmp_path).kubeconfig)}
    proc = await asyncio.create_subprocess_exec(str(SCRIPT), "--log-level", level, "run",
                                                env=env, stderr=asyncio.subprocess.PIPE)
    try:
        async with aiohttp.ClientSession() as s, asyncio.timeout(limit(60)):
            while True:
                try:
                    async with s.get(f"http://127.0.0.1:{port}/readyz") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.2)
    finally:
        proc.terminate()
        async with asyncio.timeout(limit(30)):
            _, err = await proc.communicate()
    assert proc.returncode == 0
    severities = {e["message"]: e["severity"] for e in log_lines(err.decode())}
    if info_lines:
        assert {"starting", "serving", "stopped"} <= severities.keys()
    else:
        assert "INFO" not in severities.values()


@pytest.mark.parametrize(("command", "out"), [
    (("whatif",), "whatif-out"), (("report", "weekly"), "report-out"),
    (("report", "reconcile"), "report-out")])
def test_each_command_s_help_names_the_folder_it_writes_to(command: tuple[str, ...],
                                                          out: str) -> None:
    result = cli(*command, "--help")
    assert result.returncode == 0
    assert f"(default ./{out})" in " ".join(result.stdout.split())
