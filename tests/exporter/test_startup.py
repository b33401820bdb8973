"""Start-up, case by case: a setting the host refuses is one line naming the setting and
the fix, exit 2 (``MISTAKES``); a setting that cannot be read or is invalid is one line
naming its file or variable, exit 1 (``CONFIG_MISTAKES``); never a traceback, and
``--check-config`` finds the same ones without starting anything. A stop while the
exporter starts is one log line and exit 0."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.config import load_config
from exporter.demo import demo_config
from exporter.errors import StartupError
from exporter.runtime.app import open_exporter, serve
from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.conftest import write_kubeconfig
from tests.timing import limit

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
    "kubeconfig naming a missing certificate-authority file": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": str(_kubeconfig(
            tmp, {"certificate-authority": "ca.crt"}, {"token": "t"}))},
        "kubernetes.kubeconfig"),
    "kubeconfig naming a missing client key": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": str(_kubeconfig(
            tmp, {}, {"client-certificate": str(_write(tmp / "c.crt", "x")),
                      "client-key": str(tmp / "c.key")}))},
        "kubernetes.kubeconfig"),
    "kubeconfig whose exec plugin is not installed": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": str(_kubeconfig(
            tmp, {}, {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                               "command": "no-such-auth-plugin"}}))},
        "kubernetes.kubeconfig"),
    "kubeconfig whose current context is not one of its contexts": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": str(_kubeconfig(
            tmp, {}, {"token": "t"}, current="other"))},
        "kubernetes.kubeconfig"),
    "kubeconfig that is not UTF-8": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG":
                        str(_write_bytes(tmp / "kc", b"current-context: caf\xe9\n"))},
        "kubernetes.kubeconfig"),
    "empty SMTP password file": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_REPORT__SMTP__PASSWORD_FILE":
                        str(_write(tmp / "password", "\n"))},
        "report.smtp.password_file"),
    "SMTP password file that is not UTF-8": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_REPORT__SMTP__PASSWORD_FILE":
                        str(_write_bytes(tmp / "password", b"s\xffcret"))},
        "report.smtp.password_file"),
}

CONFIG_MISTAKES: dict[str, tuple[Mistake, str]] = {
    "a JSON-valued variable that is not JSON": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_BUDGETS": "{not json"},
        "environment: GKE_GPU_EXPORTER_BUDGETS: not JSON (Expecting property name enclosed "
        "in double quotes: line 1 column 2 (char 1)); it takes JSON, e.g. "
        "GKE_GPU_EXPORTER_BUDGETS='{\"key\": value}'"),
    "a list variable that is not JSON": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_DCGM__TARGETS": "http://a:9400"},
        "environment: GKE_GPU_EXPORTER_DCGM__TARGETS: not JSON (Expecting value: line 1 "
        "column 1 (char 0)); it takes JSON, e.g. GKE_GPU_EXPORTER_DCGM__TARGETS='[\"value\"]'"),
    "a variable that is not UTF-8": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_CLUSTER": "caf\udce9"},
        "environment: GKE_GPU_EXPORTER_CLUSTER: not UTF-8: byte 0xe9 at offset 3"),
    "a variable's invalid value": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_REPORT__BILLING_TABLE": "billing.export"},
        "environment: GKE_GPU_EXPORTER_REPORT__BILLING_TABLE: report.billing_table: "
        "'billing.export' is not PROJECT.DATASET.TABLE (the Cloud Billing detailed export, "
        "e.g. my-project.billing.gcp_billing_export_resource_v1_01A2B3_C4D5E6_F7A8B9)"),
    "a config file that is not UTF-8": (
        lambda tmp, _: {"config": str(_write_bytes(tmp / "c.yaml", b"cluster: caf\xe9\n"))},
        "{tmp}/c.yaml: config: not UTF-8: byte 0xe9 at offset 12"),
    "a config file that is not YAML": (
        lambda tmp, _: {"config": str(_write(tmp / "c.yaml", "cluster: prod\ndcgm: [a\n"))},
        "{tmp}/c.yaml: config: not valid YAML at line 3, column 1: expected ',' or ']', but "
        "got '<stream end>' (while parsing a flow sequence from line 2)"),
    "a config file that is a list": (
        lambda tmp, _: {"config": str(_write(tmp / "c.yaml", "- cluster\n"))},
        "{tmp}/c.yaml: a config is a YAML mapping of settings, not a list"),
    "a missing config file": (
        lambda tmp, _: {"config": str(tmp / "absent.yaml")},
        "{tmp}/absent.yaml: config: cannot read: No such file or directory"),
    "a price book that is not UTF-8": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_PRICES__BOOK":
                        str(_write_bytes(tmp / "book.yaml", b"as_of: caf\xe9\n"))},
        "{tmp}/book.yaml: price book: not UTF-8: byte 0xe9 at offset 10"),
    "a price book that is not YAML": (
        lambda tmp, _: {"GKE_GPU_EXPORTER_PRICES__BOOK":
                        str(_write(tmp / "book.yaml", "regions:\n  a: b\n c: d\n"))},
        "{tmp}/book.yaml: price book: not valid YAML at line 3, column 2: expected <block "
        "end>, but found '<block mapping start>' (while parsing a block mapping from line 1)"),
    "a login over SMTP without TLS": (
        lambda tmp, _: {"config": str(_write(tmp / "c.yaml", (
            "cluster: prod\nreport:\n  smtp:\n    host: mail.example.com\n    port: 25\n"
            "    security: none\n    username: bot\n")))},
        "{tmp}/c.yaml: report.smtp: a login over security: none sends the password in "
        "clear; use starttls or ssl (or set allow_plaintext_auth: true)"),
}
"""Settings that cannot be read or are invalid: each one line naming its source, exit 1."""


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _kubeconfig(tmp: Path, cluster: dict[str, Any], user: dict[str, Any],
                current: str = "c") -> Path:
    """A kubeconfig of one context, its cluster and user given these fields."""
    return _write(tmp / "kc", yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": current,
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443"} | cluster}],
        "users": [{"name": "u", "user": user}]}))


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
                          capture_output=True, text=True, timeout=limit(60), check=False, env=env,
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


@pytest.mark.parametrize("flags", [[], ["--check-config"]], ids=["run", "check-config"])
@pytest.mark.parametrize("mistake", CONFIG_MISTAKES)
def test_a_setting_that_cannot_be_read_is_one_line_naming_its_source(
        tmp_path: Path, busy_port: int, mistake: str, flags: list[str]) -> None:
    make, line = CONFIG_MISTAKES[mistake]
    env = good_env(tmp_path) | make(tmp_path, busy_port)
    config = env.pop("config", None)
    proc = exporter(*(["--config", config] if config else []), *flags, env=env,
                    cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines() == [f"error: {line.replace('{tmp}', str(tmp_path))}"]
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


# ------------------------------------------------------------- a stop while it starts

STOP_SECONDS = 15.0
"""How soon a stop during start-up must end the process: inside a pod's grace period
(30 s), with room for a loaded machine."""


def _entries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _stop_when(proc: subprocess.Popen[str], ready: Callable[[], bool],
               signum: signal.Signals) -> float:
    """Send ``signum`` once ``ready()``; the seconds until the process ended."""
    deadline = time.monotonic() + 60
    while not ready():
        assert proc.poll() is None, f"ended before the signal: rc {proc.returncode}"
        assert time.monotonic() < deadline, "never reached the step"
        time.sleep(0.05)
    sent = time.monotonic()
    proc.send_signal(signum)
    proc.wait(timeout=limit(30))
    return time.monotonic() - sent


def _start(tmp: Path, env: dict[str, str], *args: str) -> tuple[subprocess.Popen[str], Path]:
    log = tmp / "stderr.log"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "exporter", "run", *args],
                                stdout=subprocess.DEVNULL, stderr=err, text=True, env=env,
                                cwd=tmp)
    return proc, log


def _logged(log: Path, message: str) -> Callable[[], bool]:
    return lambda: any(e["message"] == message for e in _entries(log)) \
        if log.stat().st_size else False


def _stopped_once(log: Path, after: str, signum: signal.Signals) -> None:
    """After the ``after`` line, exactly one: stopped during start-up, by ``signum``."""
    entries = _entries(log)
    at = [i for i, e in enumerate(entries) if e["message"] == after]
    rest = entries[at[-1] + 1:] if at else entries
    assert [(e["message"], e["signal"], e["during"]) for e in rest] == [
        ("stopped", signum.name, "start-up")], rest


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_during_the_first_kubernetes_sync_exits_0_with_one_line(
        tmp_path: Path, signum: signal.Signals) -> None:
    """The API accepts connections and never answers: the first sync waits, the stop ends it
    at once (as PID 1 the pod would otherwise wait out its grace period)."""
    with socket.socket() as api:
        api.bind(("127.0.0.1", 0))
        api.listen(64)
        server = f"http://127.0.0.1:{api.getsockname()[1]}"
        env = good_env(tmp_path) | {
            "GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": str(write_kubeconfig(tmp_path, server))}
        proc, log = _start(tmp_path, env)
        took = _stop_when(proc, _logged(log, "serving"), signum)
    assert proc.returncode == 0, log.read_text()
    assert took < STOP_SECONDS
    _stopped_once(log, "serving", signum)
    assert "Traceback" not in log.read_text()


def test_a_stop_while_the_exec_plugin_runs_exits_0_with_one_line(tmp_path: Path) -> None:
    """The kubeconfig's exec plugin hangs at start (a login that never answers)."""
    began = tmp_path / "plugin-began"
    plugin = _write(tmp_path / "plugin", f"#!{sys.executable}\nimport pathlib, time\n"
                    f"pathlib.Path({str(began)!r}).touch()\ntime.sleep(30)\n")
    plugin.chmod(0o755)
    env = good_env(tmp_path) | {"GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": str(_kubeconfig(
        tmp_path, {}, {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                "command": str(plugin)}}))}
    proc, log = _start(tmp_path, env)
    took = _stop_when(proc, began.exists, signal.SIGTERM)
    assert proc.returncode == 0, log.read_text()
    assert took < STOP_SECONDS
    _stopped_once(log, "starting", signal.SIGTERM)


def test_a_stop_while_the_config_is_read_exits_0_with_one_line(tmp_path: Path) -> None:
    """Before the event loop runs: the config file is a pipe nobody writes to yet."""
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    proc, log = _start(tmp_path, good_env(tmp_path), "--config", str(fifo))
    writer: list[int] = []

    def reading() -> bool:  # a writer can open the pipe once the reader has
        try:
            writer.append(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            return False
        return True

    try:
        took = _stop_when(proc, reading, signal.SIGTERM)
    finally:
        for fd in writer:
            os.close(fd)
    assert proc.returncode == 0, log.read_text()
    assert took < STOP_SECONDS
    _stopped_once(log, "", signal.SIGTERM)


@pytest.mark.parametrize(("mistake", "named"), [
    ("kubeconfig naming a missing certificate-authority file",
     "cannot read the certificate-authority {tmp}/ca.crt: No such file or directory"),
    ("kubeconfig whose exec plugin is not installed",
     "the exec credential plugin no-such-auth-plugin is not on PATH"),
    ("empty SMTP password file", "the SMTP password file {tmp}/password: empty"),
])
def test_run_refuses_what_check_config_refuses_with_the_same_line(
        tmp_path: Path, busy_port: int, mistake: str, named: str) -> None:
    """One set of checks: ``run`` never passes ``--check-config`` and then refuses."""
    make, setting = MISTAKES[mistake]
    env = good_env(tmp_path) | make(tmp_path, busy_port)
    checked, ran = (exporter(*flags, env=env, cwd=tmp_path)
                    for flags in (["--check-config"], []))
    assert checked.stderr == ran.stderr
    assert checked.stderr.startswith(f"error: {setting}: "
                                     f"{named.replace('{tmp}', str(tmp_path))}")
