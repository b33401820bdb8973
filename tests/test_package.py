"""What users install: the built wheel, in a fresh virtualenv, with an empty, read-only HOME.

The rest of the suite runs on the editable install, which reads every file straight from the
checkout and so cannot see one the wheel leaves out. These tests build the wheel from the
checkout's files and install it without extras, as ``pip install gke-gpu-exporter`` and the
container image do. Tests marked ``wheel`` need the package index (``pip`` fetches the build
backend and the dependencies); ``pytest -m wheel`` selects them, ``-m "not wheel"`` skips them.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from analytics.week import week_containing
from simulator.scenario import load_scenario
from tests.conftest import write_kubeconfig

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("exporter", "analytics", "simulator")
# What `report weekly` and `demo` need and the exporter service must not load.
REPORT_STACK = ("pandas", "pyarrow", "matplotlib", "jinja2", "sqlglot", "google.cloud.bigquery",
                "kubernetes_asyncio")
REPORT_STACK_PREFIXES = tuple(f"{name}." for name in REPORT_STACK)
# Building fetches setuptools; installing fetches every dependency (pandas, pyarrow, matplotlib,
# DuckDB, the Google Cloud clients).
INSTALL_TIMEOUT = 840
WHEEL_TIMEOUT = 900
# Variables that would point the product at this checkout, this virtualenv or this user.
DROPPED = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV",
           "MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME",
           "XDG_STATE_HOME", "XDG_RUNTIME_DIR")


def _run(cmd: Sequence[str | Path], *, env: dict[str, str], cwd: Path | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, (f"{' '.join(proc.args)} exited {proc.returncode}\n"
                                  f"{proc.stdout}\n{proc.stderr}")
    return proc


def _host(directory: Path) -> dict[str, str]:
    """What ``run`` needs from the host: a kubeconfig, a free port."""
    return {"GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": str(write_kubeconfig(directory)),
            "GKE_GPU_EXPORTER_PORT": "0"}


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in DROPPED and not k.startswith("GKE_GPU_EXPORTER_")}
    env["HOME"] = str(home)
    return env


def _user_pip_config() -> list[tuple[Path, Path]]:
    """pip's per-user configuration files, each with its place relative to a HOME."""
    home = Path.home()
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    return [(home / ".pip" / "pip.conf", Path(".pip/pip.conf")),
            (xdg / "pip" / "pip.conf", Path(".config/pip/pip.conf"))]


def _pip_cache_dir() -> str:
    """Where pip of this environment caches downloads, so a second run downloads nothing."""
    home = Path.home()
    return os.environ.get("PIP_CACHE_DIR") or \
        str(Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache") / "pip")


UV = Path(sys.executable).with_name("uv")
"""The installer ``make`` installs with, where there is one (else pip): the same wheel and
dependencies from the same index, from the cache the checkout's own install filled."""


def _uv_cache_dir() -> str:
    home = Path.home()
    return os.environ.get("UV_CACHE_DIR") or \
        str(Path(os.environ.get("XDG_CACHE_HOME") or home / ".cache") / "uv")


def _install(venv: Path, wheel: Path) -> list[str | Path]:
    """The command that installs ``wheel`` (and its dependencies, no extras) into ``venv``."""
    if UV.is_file():
        return [UV, "pip", "install", "--quiet", "--python", venv / "bin" / "python", wheel]
    return [venv / "bin" / "python", "-m", "pip", "install", "--quiet", wheel]


@pytest.fixture(scope="session")
def source_files() -> list[str]:
    """The checkout's files as git sees them: tracked, and new ones that are not ignored."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"the package check lists files with git: {exc}")
    return sorted(f for f in out.split("\0") if f and (ROOT / f).is_file())


@pytest.fixture(scope="session")
def install_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """pip's environment: a fresh HOME and XDG directories, the machine's pip settings.

    The package index and certificates may be configured per user; that file is machine
    set-up, not product state, so it is copied into the fresh HOME.
    """
    home = tmp_path_factory.mktemp("install-home")
    env = _clean_env(home)
    env["PIP_CACHE_DIR"] = _pip_cache_dir()
    env["UV_CACHE_DIR"] = _uv_cache_dir()
    for var, sub in (("XDG_CONFIG_HOME", ".config"), ("XDG_CACHE_HOME", ".cache"),
                     ("XDG_DATA_HOME", ".local/share")):
        env[var] = str(home / sub)
    for src, rel in _user_pip_config():
        if src.is_file():
            (home / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, home / rel)
    return env


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory, source_files: list[str],
          install_env: dict[str, str]) -> Path:
    """The wheel, built from a copy of the checkout's files (the checkout stays untouched)."""
    src = tmp_path_factory.mktemp("source")
    for name in source_files:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    build = [UV, "build", "--wheel", "--out-dir", dist, src] if UV.is_file() else \
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", dist, src]
    _ok(_run(build, env=install_env, timeout=INSTALL_TIMEOUT))
    (built,) = dist.glob("gke_gpu_exporter-*.whl")
    return built


@pytest.fixture(scope="session")
def wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


@pytest.mark.wheel
@pytest.mark.timeout(WHEEL_TIMEOUT)
def test_wheel_holds_every_file_of_the_packages(source_files: list[str],
                                                wheel_files: set[str]) -> None:
    """Templates, scenarios, the price book: every file under the packages ships."""
    expected = [f for f in source_files if f.split("/", 1)[0] in PACKAGES]
    assert "analytics/templates/report.html" in expected
    missing = [f for f in expected if f not in wheel_files]
    assert not missing, "not in the wheel: " + ", ".join(missing)


@pytest.mark.wheel
@pytest.mark.timeout(WHEEL_TIMEOUT)
def test_wheel_carries_the_license(wheel_files: set[str]) -> None:
    if not (ROOT / "LICENSE").is_file():
        pytest.skip("the checkout has no LICENSE")
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in wheel_files), \
        sorted(n for n in wheel_files if ".dist-info/" in n)


def _as_unprivileged() -> list[str]:
    """A command prefix under which root obeys file modes, like the image's non-root user.

    Root writes into a directory whatever its mode says; without the capabilities that let
    it (DAC override, and FOWNER to change modes), a read-only HOME is read-only for it too.
    """
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    prefix = [setpriv or "setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]
    probe = None if setpriv is None else \
        subprocess.run([*prefix, "true"], capture_output=True, text=True, check=False)
    if probe is None or probe.returncode != 0:
        pytest.skip("running as root, and cannot drop the capabilities that write through a "
                    f"read-only HOME: {probe.stderr.strip() if probe else 'no setpriv'}")
    return prefix


@dataclass(frozen=True)
class Runs:
    """The installed product run once in a sandbox, with what each command printed."""

    venv: Path
    home: Path
    work: Path
    week: str
    check_config: subprocess.CompletedProcess[str]
    demo: subprocess.CompletedProcess[str]
    report: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, wheel: Path,
         install_env: dict[str, str]) -> Iterator[Runs]:
    """Install the wheel without extras into a new virtualenv; run `run --check-config`,
    `demo` and `report weekly` from it, with an empty read-only HOME and MPLCONFIGDIR unset."""
    prefix = _as_unprivileged()
    venv = tmp_path_factory.mktemp("venv")
    _ok(_run([sys.executable, "-m", "venv", venv], env=install_env))
    _ok(_run(_install(venv, wheel), env=install_env, timeout=INSTALL_TIMEOUT))

    home = tmp_path_factory.mktemp("home")
    work = tmp_path_factory.mktemp("work")
    (work / "tmp").mkdir()
    env = _clean_env(home)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}"
    env["TMPDIR"] = str(work / "tmp")
    week = week_containing(load_scenario("default").start).label
    exe = [*prefix, venv / "bin" / "gke-gpu-exporter"]
    home.chmod(0o555)
    try:
        yield Runs(
            venv=venv, home=home, work=work, week=week,
            check_config=_run([*exe, "run", "--check-config"], env=env | _host(work),
                              cwd=work),
            demo=_run([*exe, "demo", "--duration", "2h", "--out", work / "demo"],
                      env=env, cwd=work),
            report=_run([*exe, "report", "weekly", "--store",
                         f"duckdb:{work / 'demo' / 'warehouse.duckdb'}", "--week", week,
                         "--out", work / "report", "--force"],  # a 2-hour week
                        env=env, cwd=work))
    finally:
        home.chmod(0o755)


def _clean_output(proc: subprocess.CompletedProcess[str]) -> None:
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out
    assert "MPLCONFIGDIR" not in out, out  # matplotlib's warning about an unwritable HOME


@pytest.mark.wheel
@pytest.mark.timeout(WHEEL_TIMEOUT)
def test_installed_product_is_the_wheel(runs: Runs) -> None:
    """The commands run the installed packages, not the checkout."""
    code = "import exporter, analytics; print(exporter.__file__); print(analytics.__file__)"
    proc = _ok(_run([runs.venv / "bin" / "python", "-c", code], env=_clean_env(runs.home),
                    cwd=runs.work))
    for line in proc.stdout.split():
        assert Path(line).is_relative_to(runs.venv), line


@pytest.mark.wheel
@pytest.mark.timeout(WHEEL_TIMEOUT)
def test_installed_check_config_exits_0(runs: Runs) -> None:
    assert runs.check_config.returncode == 0, runs.check_config.stderr
    assert runs.check_config.stdout.startswith("config ok:")
    _clean_output(runs.check_config)


@pytest.mark.wheel
@pytest.mark.timeout(WHEEL_TIMEOUT)
def test_installed_demo_writes_warehouse_and_report(runs: Runs) -> None:
    assert runs.demo.returncode == 0, runs.demo.stdout + runs.demo.stderr
    assert (runs.work / "demo" / "warehouse.duckdb").is_file()
    assert (runs.work / "demo" / "report" / "report.html").is_file()
    assert f"Weekly report {runs.week}" in runs.demo.stdout
    _clean_output(runs.demo)


@pytest.mark.wheel
@pytest.mark.timeout(WHEEL_TIMEOUT)
def test_installed_weekly_report_from_the_demo_warehouse(runs: Runs) -> None:
    assert runs.report.returncode == 0, runs.report.stdout + runs.report.stderr
    assert (runs.work / "report" / "report.html").is_file()
    _clean_output(runs.report)


@pytest.mark.wheel
@pytest.mark.timeout(WHEEL_TIMEOUT)
def test_installed_product_writes_nothing_under_home(runs: Runs) -> None:
    """No DuckDB extension directory, no matplotlib cache: HOME stays empty."""
    assert not (runs.home / ".duckdb").exists()
    assert sorted(str(p.relative_to(runs.home)) for p in runs.home.rglob("*")) == []
    assert stat.S_IMODE(runs.home.stat().st_mode) == 0o555


def test_run_leaves_the_report_stack_unloaded(tmp_path: Path) -> None:
    """`run` (here its --check-config path, which imports the service) keeps memory small:
    pandas, pyarrow, matplotlib, jinja2, sqlglot, the BigQuery client and a Kubernetes
    client library stay unloaded (the cycle benchmark checks the same after cycles)."""
    code = ("import json, sys\n"
            "from exporter.cli import main\n"
            "rc = main(['run', '--check-config'])\n"
            "print(json.dumps({'rc': rc, 'modules': sorted(sys.modules)}))\n")
    proc = _ok(_run([sys.executable, "-c", code], env=_clean_env(tmp_path) | _host(tmp_path),
                    cwd=tmp_path))
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["rc"] == 0
    modules: list[str] = result["modules"]
    assert "exporter.runtime.app" in modules
    loaded = [m for m in modules if m in REPORT_STACK or m.startswith(REPORT_STACK_PREFIXES)]
    assert loaded == []
