"""A GPU pod deleted from the cluster, in any phase, ends in the warehouse."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from exporter.demo import caught_up, demo_config, step_both
from exporter.runtime.app import open_exporter
from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.timing import limit

CASES = [
    # (case, the pod's phase when deleted, grace period of the deletion,
    #  phase of its last gpu_pods row, what its finish time is)
    ("running, force-deleted", "Running", 0, "Deleted", "noticed"),
    ("running, deleted gracefully", "Running", 10, "Deleted", "deletionTimestamp"),
    ("pending, deleted", "Pending", 30, "Deleted", "noticed"),
    ("succeeded, then deleted", "Succeeded", 10, "Succeeded", "ended"),
]


@pytest.mark.parametrize(("case", "phase_then", "grace", "phase", "finished"), CASES,
                         ids=[c[0] for c in CASES])
async def test_deleted_pod_has_ended_in_gpu_pods(
        case: str, phase_then: str, grace: int, phase: str, finished: str,
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    """Its last row has a finish time (the deletionTimestamp, else the cycle that noticed it
    gone) and an ended phase; a pod that had ended keeps both."""
    sim: SimulatorServer = await make_server(make_scenario())
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    async with open_exporter(cfg) as exporter:
        async with asyncio.timeout(limit(10)):
            await exporter.kube.wait_synced()
        pods = {"Running": sim.cluster.submit("train", run_seconds=7200)[0],  # all 8 H100s
                "Pending": sim.cluster.submit("urgent", run_seconds=60)[0],  # so: waits
                "Succeeded": sim.cluster.submit("shared", run_seconds=60)[0]}
        await caught_up(sim, exporter)
        await exporter.cycle(sim.cluster.now)
        await step_both(sim, exporter, 3)
        pod = pods[phase_then]
        assert pod.phase == phase_then
        asked = sim.cluster.now
        await sim.delete_pod(pod, grace_seconds=grace)
        await step_both(sim, exporter, 2)
        assert pod.uid not in exporter.kube.pods

        wh = exporter.warehouse
        assert wh is not None
        wh.flush(sim.cluster.now, partial=True)
        row = wh.con.execute(
            "SELECT phase, epoch(finished), epoch(scheduled), queue_wait_seconds "
            "FROM gpu_pods_current WHERE pod_uid = ?", [pod.uid]).fetchone()
        assert row is not None
        want = {"noticed": asked + sim.cluster.step, "deletionTimestamp": asked + grace,
                "ended": pod.finished_at}[finished]
        assert row[:2] == (phase, want)
        if phase_then == "Pending":  # never scheduled: no queue wait either
            assert row[2:] == (None, None)
        else:
            assert row[2] == pod.scheduled_at


async def test_a_pod_gone_while_no_exporter_watched_ends_at_the_next_start(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    """No deletion event reaches an exporter that was not running: the pod the warehouse
    still shows live and the cluster no longer lists ends when the next one notices."""
    sim: SimulatorServer = await make_server(make_scenario())
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    async with open_exporter(cfg) as exporter:
        async with asyncio.timeout(limit(10)):
            await exporter.kube.wait_synced()
        gone, kept = (sim.cluster.submit(w, run_seconds=7200)[0] for w in ("train", "shared"))
        await caught_up(sim, exporter)
        await exporter.cycle(sim.cluster.now)
        await step_both(sim, exporter, 2)
    await sim.delete_pod(gone, grace_seconds=0)           # while no exporter runs
    await sim.advance(sim.cluster.step)
    async with open_exporter(cfg) as exporter:
        async with asyncio.timeout(limit(10)):
            await exporter.kube.wait_synced()
        await exporter.cycle(sim.cluster.now)
        noticed = sim.cluster.now
        wh = exporter.warehouse
        assert wh is not None
        wh.flush(noticed, partial=True)
        rows = dict(wh.con.execute(
            "SELECT pod_uid, (phase, epoch(finished)) FROM gpu_pods_current "
            "WHERE pod_uid IN (?, ?)", [gone.uid, kept.uid]).fetchall())
    assert rows == {gone.uid: ("Deleted", noticed), kept.uid: ("Running", None)}
