"""Configuration: file, environment over file, one clear message per bad setting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.config import load_config, variables
from exporter.errors import ConfigError
from exporter.files import not_utf8_text
from exporter.model.prices import load_price_book
from tests.conftest import write_kubeconfig
from tests.timing import limit

EXAMPLE = Path(__file__).parent.parent.parent / "examples" / "config.yaml"


def test_example_config_is_valid() -> None:
    cfg = load_config(EXAMPLE)
    assert cfg.interval == 30 and cfg.dcgm.timeout == 10
    assert cfg.prices.discounts == {"a100-pool": 0.1}
    assert cfg.prices.negotiated == {"a3": 0.05, "nvidia-l4": 0.08}
    assert [(c.gpu, c.gpus, c.term) for c in cfg.prices.commitments] == [
        ("nvidia-h100-80gb", 16, "3y")]


def test_environment_overrides_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GKE_GPU_EXPORTER_INTERVAL", "15s")
    monkeypatch.setenv("GKE_GPU_EXPORTER_DCGM__TIMEOUT", "5")
    monkeypatch.setenv("GKE_GPU_EXPORTER_SLA__TARGET", "0.999")
    cfg = load_config(EXAMPLE)
    assert (cfg.interval, cfg.dcgm.timeout, cfg.sla.target) == (15, 5, 0.999)
    assert cfg.cluster == "prod-us-central1"  # the rest still from the file


@pytest.mark.parametrize(("yaml", "message"), [
    ("intervall: 30s", "intervall: unknown setting; did you mean interval?"),
    ("dcgm: {timout: 5}", "dcgm.timout: unknown setting; did you mean timeout?"),
    ("report: {min_coverge: 0.3}", "report.min_coverge: unknown setting; did you mean "
     "min_coverage?"),
    ("colour: blue", "colour: unknown setting"),
    ("interval: soon", "interval: 'soon' is not a duration"),
    ("dcgm: {timeout: 60s}", "dcgm.timeout must be shorter than interval"),
    ("dcgm: {targets: [ftp://x]}", "target 'ftp://x' is not an http(s) URL"),
    ("prices: {discounts: {p: 1.5}}", "discount for pool 'p' must be in [0, 1)"),
    ("sla: {target: 1.5}", "sla.target: Input should be less than 1"),
    ("[1, 2]", "a config is a YAML mapping"),
    ("allocation: {label: 'cost center'}", "allocation.label: String should match pattern"),
    ("allocation: {annotation: '/x'}", "allocation.annotation: String should match pattern"),
    ("dcgm: {prometheus: {url: 'http://p:9090'}, cloud_monitoring: {project: my-proj-1}}",
     "choose one DCGM source"),
    ("{cluster: 'a\" OR x', dcgm: {cloud_monitoring: {project: my-proj-1}}}",
     "cluster cannot be quoted into a Cloud Monitoring filter"),
    ("dcgm: {cloud_monitoring: {project: my-proj-1, cluster: 'a\"'}}",
     "dcgm.cloud_monitoring.cluster: String should match pattern"),
    ("cloud_monitoring: {enabled: true, project: my-proj-1}",
     "cloud_monitoring.project and .location are required"),
    ("cloud_monitoring: {interval: 5s}", "cloud_monitoring.interval must be at least 10 s"),
    ("cloud_monitoring: {families: [cost_usd, cost_usdd]}",
     "cloud_monitoring.families: no gauge or counter named 'cost_usdd'"),
    ("cloud_monitoring: {families: [queue_wait_seconds]}",   # a histogram: not written
     "cloud_monitoring.families: no gauge or counter named 'queue_wait_seconds'"),
    ("log_level: loud", "log_level: Input should be 'debug', 'info', 'warning' or 'error'"),
    ("kubernetes: {watchdog: 5m, max_staleness: 5m}",
     "kubernetes.max_staleness must be longer than kubernetes.watchdog plus "
     "kubernetes.request_timeout"),
])
def test_bad_settings_are_named(tmp_path: Path, yaml: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert message in str(err.value)


@pytest.mark.parametrize(("variable", "line"), [
    ("GKE_GPU_EXPORTER_INTERVALL", "environment: GKE_GPU_EXPORTER_INTERVALL: no such setting; "
     "did you mean GKE_GPU_EXPORTER_INTERVAL?"),
    ("GKE_GPU_EXPORTER_DCGM__TIMOUT", "environment: GKE_GPU_EXPORTER_DCGM__TIMOUT: no such "
     "setting; did you mean GKE_GPU_EXPORTER_DCGM__TIMEOUT?"),
    ("GKE_GPU_EXPORTER_REPORT__SMTP__PASWORD_FILE", "environment: "
     "GKE_GPU_EXPORTER_REPORT__SMTP__PASWORD_FILE: no such setting; did you mean "
     "GKE_GPU_EXPORTER_REPORT__SMTP__PASSWORD_FILE?"),
    ("GKE_GPU_EXPORTER_DCGM_TIMEOUT", "environment: GKE_GPU_EXPORTER_DCGM_TIMEOUT: no such "
     "setting; did you mean GKE_GPU_EXPORTER_DCGM__TIMEOUT?"),   # one _ where __ nests
    ("gke_gpu_exporter_log_levle", "environment: gke_gpu_exporter_log_levle: no such "
     "setting; did you mean GKE_GPU_EXPORTER_LOG_LEVEL?"),
    ("GKE_GPU_EXPORTER_XYZ", "environment: GKE_GPU_EXPORTER_XYZ: no such setting (the "
     "settings are GKE_GPU_EXPORTER_<FIELD>, nested with __)"),
])
def test_an_unknown_variable_names_the_nearest_setting(
        monkeypatch: pytest.MonkeyPatch, variable: str, line: str) -> None:
    monkeypatch.setenv(variable, "5")
    with pytest.raises(ConfigError) as err:
        load_config(EXAMPLE)
    assert str(err.value).splitlines() == [line]


@pytest.mark.parametrize("variable", [
    "GKE_GPU_EXPORTER_INTERVAL", "GKE_GPU_EXPORTER_REPORT__SMTP__PASSWORD",
    "GKE_GPU_EXPORTER_BUDGETS__ML",   # a key of a mapping
    "GKE_GPU_EXPORTER_LOG_FORMAT",    # read before the configuration
    "GKE_GPU_EXPORTER_PRICES__DISCOUNTS__A100_POOL", "gke_gpu_exporter_interval",
])
def test_every_setting_has_its_variable(monkeypatch: pytest.MonkeyPatch,
                                        variable: str) -> None:
    """A variable that names a setting (or a key of a mapping setting) is no mistake."""
    monkeypatch.setenv(variable, "20" if "INTERVAL" in variable.upper() else "0.5")
    if "LOG_FORMAT" in variable:
        monkeypatch.setenv(variable, "json")
    config = load_config(EXAMPLE)
    assert config.interval == 20 or "INTERVAL" not in variable.upper()


def test_every_mistake_in_the_configuration_is_reported_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each setting's errors, all the errors between settings that are valid themselves,
    and unknown variables, each on its line."""
    monkeypatch.setenv("GKE_GPU_EXPORTER_SLA__TARGT", "0.99")
    path = tmp_path / "c.yaml"
    path.write_text("""
interval: 10s
dcgm: {timeout: 30s, targets: [ftp://a, gopher://b]}
warehouse: {enabled: false, interval: 5s}
report: {schedule: mon 07:00, timezone: Mars/Olympus, sender: nobody}
prices: {discounts: {a: 1.5, b: 2}}
cloud_monitoring: {enabled: true, interval: 5s}
""")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert sorted(str(err.value).splitlines()) == sorted([
        "environment: GKE_GPU_EXPORTER_SLA__TARGT: no such setting; did you mean "
        "GKE_GPU_EXPORTER_SLA__TARGET?",
        f"{path}: dcgm: target 'ftp://a' is not an http(s) URL",
        f"{path}: dcgm: target 'gopher://b' is not an http(s) URL",
        f"{path}: report: unknown time zone 'Mars/Olympus'",
        f"{path}: report: not an email address: 'nobody'",
        f"{path}: prices: discount for pool 'a' must be in [0, 1), got 1.5",
        f"{path}: prices: discount for pool 'b' must be in [0, 1), got 2.0",
        f"{path}: cloud_monitoring: cloud_monitoring.project and .location are required when "
        "cloud_monitoring is enabled",
        f"{path}: cloud_monitoring: cloud_monitoring.interval must be at least 10 s",
        f"{path}: (top level): warehouse.interval must be >= interval",
    ])  # (dcgm.timeout against interval, and report.schedule, wait on dcgm and report)


def test_the_errors_between_valid_settings_are_all_reported(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("interval: 10s\ndcgm: {timeout: 30s}\nwarehouse: {enabled: false, "
                    "interval: 5s}\nreport: {schedule: mon 07:00}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).splitlines() == [
        f"{path}: (top level): warehouse.interval must be >= interval",
        f"{path}: (top level): dcgm.timeout must be shorter than interval",
        f"{path}: (top level): report.schedule needs the warehouse: the report is read "
        "from it"]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_check_config_exit_codes(tmp_path: Path) -> None:
    """0: all is well; 1: the config is invalid (2, the host refusing a setting: test_startup).
    The example config runs in a pod: here it reads a kubeconfig and the SMTP password from
    tmp_path, and writes there."""
    host = {"GKE_GPU_EXPORTER_KUBERNETES__IN_CLUSTER": "false",
            "GKE_GPU_EXPORTER_WAREHOUSE__PATH": str(tmp_path / "w.duckdb"),
            "GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": str(write_kubeconfig(tmp_path)),
            "GKE_GPU_EXPORTER_PORT": "0",
            "GKE_GPU_EXPORTER_REPORT__SMTP__PASSWORD_FILE": str(_write(tmp_path / "pw", "x"))}
    ok = subprocess.run([sys.executable, "-m", "exporter", "run", "--config", str(EXAMPLE),
                         "--check-config"], capture_output=True, text=True, timeout=limit(60),
                        check=False, env=os.environ | host, cwd=tmp_path)
    assert ok.returncode == 0 and ok.stdout.startswith("config ok")
    bad = tmp_path / "bad.yaml"
    bad.write_text("prices: {region: mars-north1}")
    proc = subprocess.run([sys.executable, "-m", "exporter", "run", "--config", str(bad),
                           "--check-config"], capture_output=True, text=True, timeout=limit(60),
                          check=False)
    assert proc.returncode == 1
    assert "no prices for region 'mars-north1'" in proc.stderr
    assert "Traceback" not in proc.stderr
    bad.write_text("prices: {region: us-centrl1}\nkubernetes: {kubeconfig: /no/such/file}")
    proc = subprocess.run([sys.executable, "-m", "exporter", "run", "--config", str(bad),
                           "--check-config"], capture_output=True, text=True, timeout=limit(60),
                          check=False)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 2, "the region and the host's problem, in one round"
    assert "no prices for region 'us-centrl1' (did you mean 'us-central1'?)" in errors[0]
    assert "kubernetes.kubeconfig" in errors[1]


def test_check_config_rejects_a_bad_log_level(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("log_level: verbose")
    proc = subprocess.run([sys.executable, "-m", "exporter", "run", "--config", str(bad),
                           "--check-config"], capture_output=True, text=True, timeout=limit(60),
                          check=False)
    assert proc.returncode == 1
    assert "log_level: Input should be 'debug', 'info', 'warning' or 'error'" in proc.stderr


def test_shipped_price_book_prices_every_known_gpu() -> None:
    book = load_price_book(None, "us-central1")
    assert book.hourly("nvidia-l4", "spot") is not None
    assert book.hourly("nvidia-l4", "spot") < book.hourly("nvidia-l4", "on-demand")  # type: ignore[operator]


def test_price_book_may_leave_models_unpriced_but_must_price_a_gpu(tmp_path: Path) -> None:
    path = tmp_path / "book.yaml"
    path.write_text("regions: {us-central1: {nvidia-l4: {on_demand: 0.7, spot: 0.3}}}")
    book = load_price_book(path, "us-central1")
    assert book.hourly("nvidia-l4", "spot") == 0.3
    assert book.hourly("nvidia-a100-80gb", "on-demand") is None  # unpriced when met
    assert book.sources == (str(path),)
    path.write_text("regions: {us-central1: {}}")
    with pytest.raises(ConfigError, match="region us-central1 prices no GPU"):
        load_price_book(path, "us-central1")
    path.write_text("regions: {us-central1: {nvidia-l4: {on_demand: 0.7, spot: 0.3}}}\n"
                    "machines: {us-central1: {g2-standard-8: {on_demand: 0.3}}}")
    with pytest.raises(ConfigError, match="g2-standard-8 needs an accelerator and a number"):
        load_price_book(path, "us-central1")


# ------------------------------------------------- any input: a config or one line per mistake

_NAMES = [variable.removeprefix("GKE_GPU_EXPORTER_").lower() for variable, _ in variables()]
"""Every setting's name (``dcgm__timeout``), the keys generated files are made of."""
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                     st.text(max_size=20), st.sampled_from(["30s", "1h", "-1", "mon 07:00"]))
_DOCUMENTS = st.recursive(
    _SCALARS, lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.sampled_from(_NAMES).map(
            lambda n: n.rsplit("__", 1)[-1]), st.text(max_size=8)), inner, max_size=4)),
    max_leaves=12)


def _file_bytes() -> st.SearchStrategy[bytes]:
    """YAML of settings-like documents, raw bytes, and YAML with bytes cut or changed."""
    dumped = _DOCUMENTS.map(lambda d: yaml.safe_dump(d, allow_unicode=True).encode())
    damaged = st.tuples(dumped, st.integers(0, 200), st.binary(max_size=3)).map(
        lambda t: t[0][:t[1]] + t[2] + t[0][t[1]:])
    return st.one_of(dumped, st.binary(max_size=64), damaged)


def _clean_environment(mp: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("GKE_GPU_EXPORTER_"):
            mp.delenv(name)


@settings(max_examples=150, deadline=None)
@given(data=_file_bytes())
def test_any_config_file_is_a_config_or_one_line_per_mistake_naming_it(
        tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("config") / "c.yaml"
    path.write_bytes(data)
    with pytest.MonkeyPatch.context() as mp:
        _clean_environment(mp)
        try:
            load_config(path, environ={})
        except ConfigError as exc:
            lines = str(exc).splitlines()
            assert lines and all(line.startswith(f"{path}: ") for line in lines), lines


_VALUES = st.one_of(
    st.text(max_size=30).filter(lambda v: "\x00" not in v),
    st.binary(max_size=12).map(lambda b: b.decode("utf-8", "surrogateescape"))
    .filter(lambda v: "\x00" not in v),
    _DOCUMENTS.map(json.dumps))


@settings(max_examples=200, deadline=None)
@given(variable=st.sampled_from([v for v, _ in variables()]), value=_VALUES)
def test_any_variable_value_is_a_config_or_one_line_per_mistake(
        variable: str, value: str) -> None:
    """A value that cannot be read names its variable; every line names a source."""
    with pytest.MonkeyPatch.context() as mp:
        _clean_environment(mp)
        mp.setenv(variable, value)
        try:
            load_config(None, environ={variable: value})
        except ConfigError as exc:
            lines = str(exc).splitlines()
            assert lines and all(line.startswith(("environment: ", "config: "))
                                 for line in lines), lines
            if not_utf8_text(value) is not None:
                assert lines == [f"environment: {variable}: {not_utf8_text(value)}"]


_BOOKS = st.fixed_dictionaries({"regions": st.dictionaries(
    st.sampled_from(["us-central1", "europe-west1"]), _DOCUMENTS, max_size=2)},
    optional={"machines": _DOCUMENTS, "as_of": _SCALARS, "sources": _DOCUMENTS})


@settings(max_examples=200, deadline=None)
@given(data=st.one_of(_BOOKS.map(lambda d: yaml.safe_dump(d).encode()), _file_bytes()))
def test_any_price_book_is_a_book_or_one_line_naming_it(
        tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("book") / "book.yaml"
    path.write_bytes(data)
    try:
        load_price_book(path, "us-central1")
    except ConfigError as exc:
        (line,) = str(exc).splitlines()
        assert line.startswith(f"{path}: ")
