"""The exporter on the simulator: /metrics contents, failure containment, readiness."""

from __future__ import annotations

import asyncio
import os
import platform
import re
import subprocess
from collections.abc import AsyncIterator, Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.demo import caught_up, demo_config, step_both
from exporter.metrics.families import (
    BY_NAME,
    CLOUD_MONITORING_DEFAULT,
    READING_LABELS,
    samples,
    series,
)
from exporter.runtime.app import http_app, open_exporter
from exporter.runtime.scheduled_report import ReportStats
from exporter.runtime.service import Exporter
from exporter.sinks.cloud_monitoring import points
from exporter.sinks.prometheus import Exposition
from simulator.scenario import Fault, Scenario
from simulator.server import SimulatorServer
from tests.conftest import start_exporter
from tests.timing import limit

GOLDEN = Path(__file__).parent.parent / "golden" / "metrics.txt"
VOLATILE = {"gke_gpu_exporter_cycle_duration_seconds", "gke_gpu_exporter_scrape_duration_seconds"}
VERSIONS = {"gke_gpu_exporter_build_info"}
"""Families whose label values are versions of the installed software: masked."""
WALL_CLOCK = {"gke_gpu_exporter_source_last_success_timestamp_seconds"}
"""Families whose values are partly wall-clock times (Kubernetes answers): masked."""


@pytest.fixture
async def running(make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
                  tmp_path: Path) -> AsyncIterator[tuple[SimulatorServer, Exporter]]:
    sim: SimulatorServer = await make_server(make_scenario())
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    async with open_exporter(cfg) as exporter:
        async with asyncio.timeout(limit(10)):
            await exporter.kube.wait_synced()
        for w in ("train", "shared", "shared", "slice", "spotjob"):
            sim.cluster.submit(w, profile="healthy", run_seconds=7200)
        await caught_up(sim, exporter)  # the watches have seen the new pods
        await exporter.cycle(sim.cluster.now)
        await step_both(sim, exporter, 10)
        yield sim, exporter


def families(text: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def normalised(text: bytes) -> list[str]:
    """Sample lines, volatile families dropped, ports, versions and times masked, sorted:
    golden-file form."""
    lines = []
    for fam in text_string_to_metric_families(text.decode()):
        if fam.name in VOLATILE:
            continue
        for s in fam.samples:
            labels = ",".join(
                f'{k}="{"VERSION" if s.name in VERSIONS and k.endswith("version")
                        else re.sub(r":[0-9]+/", ":PORT/", v)}"'
                for k, v in sorted(s.labels.items()))
            value = "TIME" if s.name in WALL_CLOCK else f"{s.value:.6g}"
            lines.append(f"{s.name}{{{labels}}} {value}")
    return sorted(lines)


async def test_metrics_match_the_golden_file(running: tuple[SimulatorServer, Exporter]) -> None:
    _, exporter = running
    got = normalised(exporter.metrics.text)
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text("\n".join(got) + "\n")
    assert got == GOLDEN.read_text().splitlines()


def _by_state(exporter: Exporter, family: str) -> dict[str, float]:
    """A family's samples this cycle summed by their ``state`` label."""
    assert exporter.view is not None
    f = BY_NAME[family]
    at = f.labels.index("state")
    out: dict[str, float] = {}
    for labels, value in samples(exporter.view, f):
        out[labels[at]] = out.get(labels[at], 0.0) + value
    return out


async def test_the_gpu_gauges_are_what_the_counters_integrate(
        running: tuple[SimulatorServer, Exporter]) -> None:
    """Over the next cycles, GPU-seconds (and utilised GPU-seconds) per second by state are
    the GPUs (and utilised GPUs) each cycle shows: the dashboards' counts read the gauges,
    in the counters' unit."""
    sim, exporter = running
    for _ in range(3):
        gpus = _by_state(exporter, "state_gpus")
        used = _by_state(exporter, "utilized_gpus")
        seconds = _by_state(exporter, "gpu_seconds")
        utilized = _by_state(exporter, "utilized_gpu_seconds")
        await step_both(sim, exporter, 1)
        step = sim.cluster.step
        assert {"allocated", "unallocated"} <= gpus.keys()
        for state, n in gpus.items():
            assert (_by_state(exporter, "gpu_seconds")[state] - seconds.get(state, 0.0)) / step \
                == pytest.approx(n, abs=1e-9), state
            assert (_by_state(exporter, "utilized_gpu_seconds").get(state, 0.0)
                    - utilized.get(state, 0.0)) / step == pytest.approx(used.get(state, 0.0),
                                                                        abs=1e-9), state


async def test_promtool_check_metrics_is_clean(running: tuple[SimulatorServer, Exporter]
                                               ) -> None:
    _, exporter = running
    proc = await asyncio.to_thread(subprocess.run, ["promtool", "check", "metrics"],
                                   input=exporter.metrics.text, capture_output=True,
                                   timeout=limit(60), check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()


async def test_catalogue(running: tuple[SimulatorServer, Exporter]) -> None:
    sim, exporter = running
    fams = families(exporter.metrics.text)
    util = fams["gke_gpu_utilization_ratio"]
    assert len(util) == sum(len(g.devices) for n in sim.cluster.live_nodes() for g in n.gpus)
    assert {lbl["source"] for lbl, _ in util} == {"gr_engine_active"}
    (avail,) = fams["gke_gpu_cluster_available_gpus"]
    assert avail[1] == 8 + 4 + 1 + 4
    bottleneck = {lbl["pod"]: lbl["class"] for lbl, _ in fams["gke_gpu_pod_bottleneck"]}
    assert set(bottleneck.values()) == {"healthy"} and len(bottleneck) == 5
    assert any(lbl["state"] == "allocated" and v > 0
               for lbl, v in fams["gke_gpu_cost_usd_total"])
    assert fams["gke_gpu_effective_cost_usd_per_utilized_hour"]


async def test_build_info_names_what_is_running(running: tuple[SimulatorServer, Exporter]
                                                ) -> None:
    _, exporter = running
    (build,) = families(exporter.metrics.text)["gke_gpu_exporter_build_info"]
    assert build == ({"cluster": exporter.config.cluster,
                      "version": metadata.version("gke-gpu-exporter"),
                      "python_version": platform.python_version(),
                      "duckdb_version": metadata.version("duckdb")}, 1.0)
    assert "# HELP gke_gpu_exporter_build_info Always 1" in exporter.metrics.text.decode()


async def test_scheduled_reports_and_retention_are_counted(
        running: tuple[SimulatorServer, Exporter]) -> None:
    sim, exporter = running
    fams = families(exporter.metrics.text)
    assert "gke_gpu_exporter_reports_total" not in fams   # no schedule: no series
    c = exporter.config.cluster
    assert ({"cluster": c, "table": "gpu_usage", "reason": "rolled_up"}, 0.0) in \
        fams["gke_gpu_exporter_warehouse_rows_removed_total"]
    exporter.report = ReportStats(runs={"ok": 2, "failed": 1, "thin": 1}, last_success=1.8e9)
    await step_both(sim, exporter, 1)
    fams = families(exporter.metrics.text)
    assert sorted(fams["gke_gpu_exporter_reports_total"], key=str) == [
        ({"cluster": c, "outcome": "failed"}, 1.0), ({"cluster": c, "outcome": "ok"}, 2.0),
        ({"cluster": c, "outcome": "thin"}, 1.0)]
    assert fams["gke_gpu_exporter_report_last_success_timestamp_seconds"] == [
        ({"cluster": c}, 1.8e9)]
    assert "gke_gpu_exporter_report_coverage_ratio" not in fams   # no week reported yet
    exporter.report.coverage = ("2026-W47", 0.25)
    await step_both(sim, exporter, 1)
    assert families(exporter.metrics.text)["gke_gpu_exporter_report_coverage_ratio"] == [
        ({"cluster": c, "week": "2026-W47"}, 0.25)]


async def test_cloud_monitoring_writes_catalogue_families(
        running: tuple[SimulatorServer, Exporter]) -> None:
    """The families written to Cloud Monitoring by default exist, named without prefix and
    ``_total``; cluster goes to the resource and empty labels are no labels."""
    _, exporter = running
    text = exporter.metrics.text.decode()
    for f in CLOUD_MONITORING_DEFAULT:
        assert f"# TYPE gke_gpu_{f} gauge" in text or f"# TYPE gke_gpu_{f}_total counter" in text
    assert exporter.view is not None
    got = list(points(exporter.view, [BY_NAME[f] for f in CLOUD_MONITORING_DEFAULT]))
    assert {"cost_usd", "gpu_seconds", "up_seconds", "cluster_available_gpus"} <= \
        {p.family for p in got}
    assert {p.kind for p in got if p.family == "cost_usd"} == {"counter"}
    assert {p.kind for p in got if p.family == "pending_gpus"} <= {"gauge"}
    assert all("cluster" not in dict(p.labels) and all(v for _, v in p.labels) for p in got)


async def test_the_structured_series_are_those_of_the_text(
        running: tuple[SimulatorServer, Exporter]) -> None:
    """What remote write sends (``families.series``) is what /metrics shows, series for
    series, empty labels left out as Prometheus leaves them out."""
    _, exporter = running
    assert exporter.view is not None
    shown = {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if v)), s.value)
             for fam in text_string_to_metric_families(exporter.metrics.text.decode())
             for s in fam.samples}
    structured = {(s.name, tuple(sorted(s.labels)), s.value) for s in series(exporter.view)}
    assert structured == shown and len(shown) > 400


def test_the_per_device_families_open_the_catalogue() -> None:
    """/metrics writes them in one pass over the devices, before the rest in table order."""
    from exporter.metrics.families import DEVICE_FAMILIES, FAMILIES

    assert FAMILIES[:len(tuple(DEVICE_FAMILIES))] == tuple(DEVICE_FAMILIES)


async def test_failing_target_is_absent_not_zero_and_comes_back(
        running: tuple[SimulatorServer, Exporter]) -> None:
    sim, exporter = running
    node = next(n for n in sim.cluster.live_nodes() if n.pool.name == "h100")
    uuids = {g.uuid for g in node.gpus}
    await sim.inject(Fault(at=0, kind="endpoint", node="h100/0", mode="error", duration=60))
    await exporter.cycle(sim.cluster.now)
    fams = families(exporter.metrics.text)
    assert not any(lbl["uuid"] in uuids for lbl, _ in fams["gke_gpu_utilization_ratio"])
    assert not any(lbl["uuid"] in uuids for lbl, _ in fams["gke_gpu_state"])
    up = {lbl["target"]: v for lbl, v in fams["gke_gpu_exporter_source_up"]
          if lbl["source"] == "dcgm"}
    assert up[sim.endpoint_url(node)] == 0 and sum(up.values()) == len(up) - 1
    other = [lbl for lbl, _ in fams["gke_gpu_utilization_ratio"] if lbl["pool"] == "l4"]
    assert other, "other targets unaffected"
    await step_both(sim, exporter, 2)
    fams = families(exporter.metrics.text)
    assert uuids <= {lbl["uuid"] for lbl, _ in fams["gke_gpu_utilization_ratio"]}


async def test_readyz_waits_for_the_first_cycle(make_server: Callable[..., Any],
                                               make_scenario: Callable[..., Scenario],
                                               tmp_path: Path) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    sim: SimulatorServer = await make_server(make_scenario())
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    async with open_exporter(cfg) as exporter, \
            TestClient(TestServer(http_app(exporter))) as client:
        assert (await client.get("/readyz")).status == 503
        assert (await client.get("/healthz")).status == 200
        await exporter.kube.wait_synced()
        await exporter.cycle(sim.cluster.now)
        assert (await client.get("/readyz")).status == 200
        body = await (await client.get("/metrics")).text()
        assert "gke_gpu_cluster_available_gpus" in body


async def test_a_scrape_during_a_cycle_gets_the_last_cycle_exactly(
        running: tuple[SimulatorServer, Exporter]) -> None:
    """A scrape that lands while a cycle awaits its sources (a target hangs) and the
    watches change the Kubernetes view meanwhile is served the previous cycle's
    exposition, byte for byte; the cycle's own follows once it ends."""
    from aiohttp.test_utils import TestClient, TestServer

    from exporter.sinks.prometheus import ExpositionWriter

    sim, exporter = running
    await step_both(sim, exporter, 1)
    assert exporter.view is not None
    before = exporter.view
    published = ExpositionWriter().render(before)  # the cycle's, before anything changes
    await sim.inject(Fault(at=0, kind="endpoint", node="h100/0", mode="hang", duration=60))
    async with TestClient(TestServer(http_app(exporter))) as client:
        cycle = asyncio.create_task(exporter.cycle(sim.cluster.now))
        await asyncio.sleep(0.05)
        sim.cluster.submit("train", profile="healthy", run_seconds=7200)
        await sim.advance(0)
        await caught_up(sim, exporter)  # the watches moved on while the cycle waits
        assert not cycle.done() and exporter.view is before
        assert await (await client.get("/metrics")).read() == published
        await cycle
        after = await (await client.get("/metrics")).read()
    assert exporter.view is not before
    assert after == ExpositionWriter().render(exporter.view) != published


async def test_a_cycle_shows_the_cluster_its_snapshot_took_while_it_awaits_the_warehouse(
        running: tuple[SimulatorServer, Exporter]) -> None:
    """Pods the watches deliver while a cycle waits for its warehouse write are not in
    that cycle's view (its states are of the snapshot before them); the next cycle
    shows them."""
    import threading

    sim, exporter = running
    warehouse = exporter.warehouse
    assert warehouse is not None
    writing, go_on = threading.Event(), threading.Event()
    add_usage = warehouse.add_usage

    def held(rows: Any) -> None:
        writing.set()
        go_on.wait(30)
        add_usage(rows)

    warehouse.add_usage = held  # type: ignore[method-assign]
    await sim.advance(sim.cluster.step)
    await caught_up(sim, exporter)
    cycle = asyncio.create_task(exporter.cycle(sim.cluster.now))
    try:
        assert await asyncio.to_thread(writing.wait, 30)
        before = set(exporter.kube.pods)
        sim.cluster.submit("train", profile="healthy", run_seconds=7200)
        await sim.advance(0)
        await caught_up(sim, exporter)  # the watches moved on while the cycle writes
        new = set(exporter.kube.pods) - before
        assert new and not cycle.done()
    finally:
        go_on.set()
    await cycle
    assert exporter.view is not None
    assert new.isdisjoint(p.uid for p in exporter.view.pods)
    warehouse.add_usage = add_usage  # type: ignore[method-assign]
    await step_both(sim, exporter, 1)
    assert exporter.view is not None and new <= {p.uid for p in exporter.view.pods}


async def test_metrics_are_rendered_and_compressed_once_per_cycle(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    """Every scrape of a cycle gets the same exposition; one that accepts gzip gets it
    compressed, compressed once for all of them."""
    import gzip

    from aiohttp.test_utils import TestClient, TestServer

    sim: SimulatorServer = await make_server(make_scenario())
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    async with open_exporter(cfg) as exporter, \
            TestClient(TestServer(http_app(exporter)), auto_decompress=False) as client:
        await exporter.kube.wait_synced()
        await exporter.cycle(sim.cluster.now)
        plain = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
        assert "Content-Encoding" not in plain.headers
        text = await plain.read()
        assert text is not None and text == exporter.metrics.text
        assert int(plain.headers["Content-Length"]) == len(text)
        assert exporter.metrics.parts is exporter.metrics.parts  # rendered once, kept
        zipped = [await client.get("/metrics", headers={"Accept-Encoding": "gzip, deflate"})
                  for _ in range(2)]
        assert all(r.headers["Content-Encoding"] == "gzip" for r in zipped)
        bodies = [await r.read() for r in zipped]
        assert bodies[0] == bodies[1] and gzip.decompress(bodies[0]) == text
        assert len(bodies[0]) * 4 < len(text)
        first = exporter.metrics.gzip
        assert exporter.metrics.gzip is first          # not compressed again
        await step_both(sim, exporter, 1)
        assert gzip.decompress(exporter.metrics.gzip) == exporter.metrics.text != text


@pytest.mark.parametrize("lines", [[], [b"a 1\n"], [b"x%d 1\n" % i for i in range(10_000)]],
                         ids=["empty", "one line", "10,000 lines"])
def test_an_exposition_is_sent_and_compressed_as_its_joined_text(lines: list[bytes]) -> None:
    import gzip

    exposition = Exposition(lines, sum(map(len, lines)))
    text = b"".join(lines)
    assert b"".join(exposition.chunks()) == text and exposition.size == len(text)
    assert all(len(c) > 0 for c in exposition.chunks())
    assert gzip.decompress(exposition.gzip(1)) == text
    # gzip's magic, deflate, no flags (no name), no time: the same for the same text
    assert exposition.gzip(1)[:8] == b"\x1f\x8b\x08\x00\x00\x00\x00\x00"


async def test_run_serves_and_stops_on_sigterm(make_server: Callable[..., Any],
                                               make_scenario: Callable[..., Scenario],
                                               tmp_path: Path) -> None:
    sim: SimulatorServer = await make_server(make_scenario())
    kubeconfig = sim.write_outputs(tmp_path).kubeconfig
    env = os.environ | {"GKE_GPU_EXPORTER_INTERVAL": "2", "GKE_GPU_EXPORTER_PORT": "0",
                        "GKE_GPU_EXPORTER_LISTEN_ADDRESS": "127.0.0.1",
                        "GKE_GPU_EXPORTER_DCGM__TIMEOUT": "1",
                        "GKE_GPU_EXPORTER_WAREHOUSE__INTERVAL": "2",
                        "GKE_GPU_EXPORTER_WAREHOUSE__PATH": str(tmp_path / "w.duckdb"),
                        "GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": str(kubeconfig)}
    proc, port = await start_exporter(env)
    async with aiohttp.ClientSession() as s, asyncio.timeout(limit(30)):
        while True:
            async with s.get(f"http://127.0.0.1:{port}/readyz") as resp:
                if resp.status == 200:
                    break
            await asyncio.sleep(0.2)
        async with s.get(f"http://127.0.0.1:{port}/metrics") as resp:
            assert "gke_gpu_utilization_ratio" in await resp.text()
    proc.terminate()
    async with asyncio.timeout(limit(30)):
        assert await proc.wait() == 0
    assert (tmp_path / "w.duckdb").exists()


async def test_each_physical_gpu_has_its_dcgm_readings_once(
        running: tuple[SimulatorServer, Exporter]) -> None:
    """Temperature, power and SM clock as DCGM reads them, one series per GPU (a MIG
    GPU's instances share it), labelled as the per-GPU dashboard chooses."""
    _, exporter = running
    fams = families(exporter.metrics.text)
    gpus = {d.gpu_uuid for d in exporter.states}
    for name in ("gke_gpu_temperature_celsius", "gke_gpu_power_watts",
                 "gke_gpu_sm_clock_hertz"):
        uuids = [labels["uuid"] for labels, _ in fams[name]]
        assert sorted(uuids) == sorted(gpus), name
        assert all(set(labels) == set(READING_LABELS) for labels, _ in fams[name])
    clocks = [v for _, v in fams["gke_gpu_sm_clock_hertz"]]
    assert all(1e8 < v < 3e9 for v in clocks)   # MHz read, hertz shown
    assert any(d.mig_profile for d in exporter.states)


async def test_a_restarted_exporter_goes_on_with_the_months_spend(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    """What the teams spent this month before a restart stays in their month-to-date
    figure, which the budget forecast reads."""
    sim: SimulatorServer = await make_server(make_scenario())
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    sim.cluster.submit("train", profile="healthy", run_seconds=7200)

    async def run(steps: int) -> dict[str, float]:
        async with open_exporter(cfg) as exporter:
            async with asyncio.timeout(limit(10)):
                await exporter.kube.wait_synced()
            await caught_up(sim, exporter)
            await exporter.cycle(sim.cluster.now)
            await step_both(sim, exporter, steps)
            assert exporter.warehouse is not None
            exporter.warehouse.flush(sim.cluster.now)
            return {labels["team"]: v for labels, v in
                    families(exporter.metrics.text)["gke_gpu_team_month_cost_usd"]}

    before = await run(6)
    after = await run(1)
    assert before and set(after) == set(before)
    assert all(after[team] > before[team] > 0 for team in before)
