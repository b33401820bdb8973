"""The warehouse's memory stays bounded however long it runs: what DuckDB keeps of the
files it reads, and what the warehouse remembers of pods, Workloads and queues that come
and go."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exporter.demo import caught_up, demo_config, step_both
from exporter.model import compute
from exporter.model.records import DELETED, ClusterQueueInfo, FlavorQuota
from exporter.runtime.app import open_exporter
from exporter.sinks.warehouse import Warehouse
from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.exporter.test_compute import node, pod, reading, states
from tests.exporter.test_warehouse import workload
from tests.timing import limit


def usage(start: float) -> list[compute.UsageRow]:
    st = states([node()], {"n1": [reading(pods=("a",), DCGM_FI_PROF_GR_ENGINE_ACTIVE=0.5)]})
    return compute.usage_rows(st, start, 30.0)


def duckdb_memory(wh: Warehouse) -> dict[str, int]:
    return dict(wh.con.execute(
        "SELECT tag, memory_usage_bytes FROM duckdb_memory()").fetchall())


def test_staged_files_are_not_kept_in_memory_once_read(tmp_path: Path) -> None:
    """A flush reads each staged file once and deletes it: DuckDB keeps neither its bytes
    (external file cache) nor an entry per file name (object cache), which grew by one
    per file for as long as the file was open."""
    wh = Warehouse(tmp_path / "w.duckdb", "c", interval=60.0)
    for cycle in range(40):
        wh.add_usage(usage(cycle * 30.0))
        wh.maybe_flush(cycle * 30.0 + 30.0)
    assert wh.rows_written["gpu_usage"] == 20
    held = duckdb_memory(wh)
    assert held["EXTERNAL_FILE_CACHE"] == 0
    assert held["OBJECT_CACHE"] == 0
    wh.close()


def test_the_pods_of_a_churning_cluster_are_forgotten_once_written(tmp_path: Path) -> None:
    """Pods come and go, ten at a time, a thousand over the run: the warehouse remembers
    the ten alive, and every pod's last row says it ended."""
    wh = Warehouse(tmp_path / "w.duckdb", "c", interval=60.0)
    alive: list[Any] = []
    for i in range(1000):
        now = 100.0 + 30 * i
        alive.append(pod(uid=f"u{i}", name=f"job-{i}", created_unix=now, scheduled_unix=now))
        if len(alive) > 10:
            gone = alive.pop(0)
            wh.add_pods([pod(uid=gone.uid, name=gone.name, created_unix=gone.created_unix,
                             scheduled_unix=gone.scheduled_unix, phase=DELETED,
                             finished_unix=now)], now, lambda p: "t")
            wh.forget_pod(gone.uid)
        wh.add_pods(alive, now, lambda p: "t")
        assert len(wh.changes.pod_signatures) == len(wh.changes.pod_models) == len(alive)
        if i % 100 == 99:
            wh.flush(now)
    wh.flush(100.0 + 30 * 1000)
    (ended,) = wh.con.execute("SELECT count(*) FROM gpu_pods_current WHERE phase = "
                              f"'{DELETED}'").fetchone()  # type: ignore[misc]
    assert ended == 990
    wh.close()


def test_the_workloads_of_a_churning_queue_are_forgotten_once_deleted(tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "w.duckdb", "c", interval=60.0)
    for i in range(500):
        listed = [workload(uid=f"wl{j}") for j in range(max(0, i - 4), i + 1)]
        wh.add_workloads(listed, 100.0 + i, lambda w: "t", lambda w: "cq", complete=True)
        assert len(wh.changes.workload_signatures) == len(wh.changes.workload_rows) == len(listed)
    wh.close()


def queue(name: str) -> ClusterQueueInfo:
    return ClusterQueueInfo(name, "cohort", {"h100": FlavorQuota(8.0, None, 0.0, 0.0)}, 0, 0)


def test_the_quotas_of_deleted_cluster_queues_are_forgotten(tmp_path: Path) -> None:
    """Queues made and deleted one after another (a queue per experiment): the warehouse
    remembers the quotas of those the cluster has, and writes one row for each queue."""
    wh = Warehouse(tmp_path / "w.duckdb", "c", interval=60.0)
    for i in range(300):
        wh.add_quotas([queue("main"), queue(f"experiment-{i}")], 100.0 + i)
        assert set(wh.changes.quota_signatures) == {("main", "h100"), (f"experiment-{i}", "h100")}
    wh.flush(400.0)
    (n,) = wh.con.execute("SELECT count(*) FROM kueue_quotas").fetchone()  # type: ignore[misc]
    assert n == 301
    wh.close()


async def test_the_exporter_forgets_the_pods_the_cluster_deleted(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    """Short jobs, one after another, each deleted once it has ended: through the
    exporter's own cycles, the warehouse remembers only pods the cluster still lists."""
    sim: SimulatorServer = await make_server(make_scenario(completed_pod_ttl=60))
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    async with open_exporter(cfg) as exporter:
        async with asyncio.timeout(limit(10)):
            await exporter.kube.wait_synced()
        wh = exporter.warehouse
        assert wh is not None
        submitted = set()
        for _ in range(12):
            submitted |= {p.uid for p in sim.cluster.submit("shared", run_seconds=30)}
            await caught_up(sim, exporter)
            await step_both(sim, exporter, 2)
        await step_both(sim, exporter, 6)
        listed = set(exporter.kube.pods)
        assert submitted - listed, "no pod was deleted"
        assert set(wh.changes.pod_signatures) <= listed
        assert set(wh.changes.pod_models) <= listed
