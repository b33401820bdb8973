"""Start-up mistakes: one line naming the setting and the fix, exit 2, never a traceback;
``--check-config`` finds the same ones without starting anything."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.app import open_exporter, serve
from exporter.config import load_config
from exporter.demo import demo_config
from exporter.errors import StartupError
from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.conftest import write_kubeconfig

Mistake = Callable[[Path, int], dict[str, str]]
"""(tmp_path, a port in use) -> the settings that make the mistake."""

MISTAKES: dict[str, tuple[Mistake, str]] = {
    "missing kubeconfig": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": str(tmp / "absent")},
        "kubernetes.kubeconfig"),
    "default kubeconfig absent": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": "",
                        "KUBECONFIG": str(tmp / "absent")},
        "kubernetes.kubeconfig"),
    "kubeconfig that is not one": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG":
                        str(_write(tmp / "kc", "clusters: [\n"))},
        "kubernetes.kubeconfig"),
    "kubeconfig without a current context": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG":
                        str(_write(tmp / "kc", "apiVersion: v1\nkind: Config\n"))},
        "kubernetes.kubeconfig"),
    "in cluster outside a pod": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_KUBERNETES__IN_CLUSTER": "true"},
        "kubernetes.in_cluster"),
    "missing price book": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_PRICES__BOOK": str(tmp / "absent.yaml")},
        "prices.book"),
    "missing SMTP password file": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_REPORT__SMTP__PASSWORD_FILE": str(tmp / "absent")},
        "report.smtp.password_file"),
    "SMTP password file that is a directory": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_REPORT__SMTP__PASSWORD_FILE": str(tmp)},
        "report.smtp.password_file"),
    "missing SMTP CA bundle": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_REPORT__SMTP__CA_FILE": str(tmp / "ca.pem")},
        "report.smtp.ca_file"),
    "missing warehouse directory": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_WAREHOUSE__PATH": str(tmp / "no" / "w.duckdb")},
        "warehouse.path"),
    "port in use": (
        lambda tmp, busy: {"GKE_GPU_EXPORTER_PORT": str(busy)},
        "port"),
    "listen address that is no address": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_LISTEN_ADDRESS": "no-such-host.invalid"},
        "listen_address"),
    "listen address of another host": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_LISTEN_ADDRESS": "192.0.2.1"},
        "listen_address"),
}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something already listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def good_env(tmp: Path) -> dict[str, str]:
    """Settings this host accepts: the base every mistake changes one thing of."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GKE_GPU_EXPORTER_", "KUBERNETES_SERVICE_"))}
    return env | {"GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": str(write_kubeconfig(tmp)),
                  "GKE_GPU_EXPORTER_WAREHOUSE__PATH": str(tmp / "w.duckdb"),
                  "GKE_GPU_EXPORTER_LISTEN_ADDRESS": "127.0.0.1",
                  "GKE_GPU_EXPORTER_PORT": "0", "GKE_GPU_EXPORTER_LOG_FORMAT": "json"}


def exporter(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "exporter", "run", *args],
                          capture_output=True, text=True, timeout=60, check=False, env=env,
                          cwd=cwd)


@pytest.mark.parametrize("flags", [[], ["--check-config"]], ids=["run", "check-config"])
@pytest.mark.parametrize("mistake", MISTAKES)
def test_startup_mistake_is_one_line_naming_the_setting(
        tmp_path: Path, busy_port: int, mistake: str, flags: list[str]) -> None:
    make, setting = MISTAKES[mistake]
    env = good_env(tmp_path) | make(tmp_path, busy_port)
    if not env.get("GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG"):
        del env["GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG"]
    proc = exporter(*flags, env=env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: {setting}: ")
    assert proc.stdout == ""
    assert not (tmp_path / "w.duckdb").exists(), "nothing was started"


def test_check_config_passes_on_a_host_that_accepts_the_settings(tmp_path: Path) -> None:
    proc = exporter("--check-config", env=good_env(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("config ok:")
    assert not (tmp_path / "w.duckdb").exists(), "checked, not created"


def test_every_mistake_is_reported_at_once(tmp_path: Path, busy_port: int) -> None:
    env = good_env(tmp_path) | {
        "GKE_GPU_EXPORTER_KUBERNETES__IN_CLUSTER": "true",
        "GKE_GPU_EXPORTER_WAREHOUSE__PATH": str(tmp_path / "no" / "w.duckdb"),
        "GKE_GPU_EXPORTER_PORT": str(busy_port)}
    proc = exporter("--check-config", env=env, cwd=tmp_path)
    assert proc.returncode == 2
    assert [line.split(":")[1].strip() for line in proc.stderr.splitlines()] == [
        "kubernetes.in_cluster", "warehouse.path", "port"]


def test_every_missing_file_is_reported_at_once(tmp_path: Path) -> None:
    env = good_env(tmp_path) | {
        "GKE_GPU_EXPORTER_PRICES__BOOK": str(tmp_path / "book.yaml"),
        "GKE_GPU_EXPORTER_REPORT__SMTP__PASSWORD_FILE": str(tmp_path / "password"),
        "GKE_GPU_EXPORTER_REPORT__SMTP__CA_FILE": str(tmp_path / "ca.pem")}
    proc = exporter("--check-config", env=env, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"error: prices.book: cannot read the price book {tmp_path}/book.yaml (No such file "
        "or directory): mount it there, or leave prices.book unset for the shipped one",
        f"error: report.smtp.password_file: the SMTP password file {tmp_path}/password: "
        "cannot read: No such file or directory: mount the secret there, or give the "
        "password in GKE_GPU_EXPORTER_REPORT__SMTP__PASSWORD",
        f"error: report.smtp.ca_file: cannot read the CA bundle {tmp_path}/ca.pem (No such "
        "file or directory): mount it there, or leave report.smtp.ca_file unset for the "
        "system's"]


def test_a_misspelt_variable_is_named_with_the_setting_it_meant(tmp_path: Path) -> None:
    env = good_env(tmp_path) | {"GKE_GPU_EXPORTER_REPORT__SMTP__PASWORD_FILE": "/x"}
    proc = exporter("--check-config", env=env, cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "error: environment: GKE_GPU_EXPORTER_REPORT__SMTP__PASWORD_FILE: no such setting; "
        "did you mean GKE_GPU_EXPORTER_REPORT__SMTP__PASSWORD_FILE?"]


def test_an_invalid_config_file_still_exits_1(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("interval: 0s\n")
    proc = exporter("--config", "c.yaml", "--check-config", env=good_env(tmp_path),
                    cwd=tmp_path)
    assert proc.returncode == 1
    assert "interval must be at least 1 s" in proc.stderr


async def test_kubernetes_credentials_failing_at_start_name_the_setting(tmp_path: Path) -> None:
    """Past the checks (the file went away since), the client's error is translated."""
    cfg = load_config(None, overrides={
        "kubernetes": {"kubeconfig": str(tmp_path / "gone")},
        "warehouse": {"path": str(tmp_path / "w.duckdb")}})
    with pytest.raises(StartupError) as err:
        async with open_exporter(cfg):
            pass
    assert err.value.setting == "kubernetes.kubeconfig"


async def test_a_port_taken_at_start_names_the_setting(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path, busy_port: int) -> None:
    """Taken between the check and the start: the bind's error is translated."""
    sim: SimulatorServer = await make_server(make_scenario())
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    async with open_exporter(cfg) as exporter:
        with pytest.raises(StartupError) as err:
            await serve(exporter, "127.0.0.1", busy_port)
    assert err.value.setting == "port" and f"{busy_port} is in use" in str(err.value)
