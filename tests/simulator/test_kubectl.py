"""kubectl, the real binary, reads the simulated cluster."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.timing import limit

KUBECTL = shutil.which("kubectl")


async def kubectl(kubeconfig: Path, *args: str) -> str:
    assert KUBECTL is not None, "kubectl is required (apt-get install kubernetes-client)"
    proc = await asyncio.create_subprocess_exec(
        KUBECTL, "--kubeconfig", str(kubeconfig), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), limit(30))
    assert proc.returncode == 0, err.decode()
    return out.decode()


@pytest.fixture
async def sim(make_server: Callable[..., Any],
              make_scenario: Callable[..., Scenario]) -> SimulatorServer:
    server: SimulatorServer = await make_server(make_scenario())
    server.cluster.submit("train", run_seconds=3600)
    server.cluster.submit("train")
    await server.advance(120)
    return server


async def test_get_nodes_wide(sim: SimulatorServer, tmp_path: Path) -> None:
    out = await kubectl(sim.write_outputs(tmp_path).kubeconfig, "get", "nodes", "-o", "wide")
    header, *rows = out.splitlines()
    assert header.split()[:5] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert "INTERNAL-IP" in header and "CONTAINER-RUNTIME" in header
    assert len(rows) == 4
    for node in sim.cluster.live_nodes():
        row = next(r for r in rows if r.startswith(node.name))
        assert row.split()[1] == "Ready" and node.address in row


async def test_get_pods_all_namespaces(sim: SimulatorServer, tmp_path: Path) -> None:
    out = await kubectl(sim.write_outputs(tmp_path).kubeconfig, "get", "pods", "-A")
    rows = [r.split() for r in out.splitlines()[1:]]
    by_name = {r[1]: r for r in rows}
    for pod in sim.cluster.pods.values():
        ns, _, _, status = by_name[pod.name][:4]
        assert ns == pod.namespace and status == pod.phase
    assert sum(r[0] == "gke-managed-system" for r in rows) == 4


async def test_get_pods_watch(sim: SimulatorServer, tmp_path: Path) -> None:
    assert KUBECTL is not None
    kubeconfig = sim.write_outputs(tmp_path).kubeconfig
    proc = await asyncio.create_subprocess_exec(
        KUBECTL, "--kubeconfig", str(kubeconfig), "get", "pods", "-A", "--watch",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        header = await asyncio.wait_for(proc.stdout.readline(), limit(20))
        assert header.split()[:2] == [b"NAMESPACE", b"NAME"]
        new = sim.cluster.submit("urgent", run_seconds=600)[0]
        lines: list[bytes] = []
        while not any(new.name.encode() in line for line in lines):
            lines.append(await asyncio.wait_for(proc.stdout.readline(), limit(20)))
        row = next(line for line in lines if new.name.encode() in line).split()
        assert row[0] == b"team-b" and row[3] == b"Pending"  # the H100 node is full
        await sim.advance(3600)  # the first job finishes; the new pod is scheduled
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), limit(20))
            if new.name.encode() in line and line.split()[3] == b"Running":
                break
    finally:
        proc.kill()
        await proc.wait()


async def test_get_events_and_a_pod_being_created(make_server: Callable[..., Any],
                                                  make_scenario: Callable[..., Scenario],
                                                  tmp_path: Path) -> None:
    scenario = make_scenario()
    workloads = [w.model_copy(update={"startup": 600.0}) if w.name == "half" else w
                 for w in scenario.workloads]
    server: SimulatorServer = await make_server(scenario.model_copy(
        update={"workloads": workloads}))
    pod = server.cluster.submit("half")[0]
    server.cluster.submit("train")
    await server.advance(120)
    kubeconfig = server.write_outputs(tmp_path).kubeconfig
    out = await kubectl(kubeconfig, "get", "pods", "-n", "team-b")
    assert next(r for r in out.splitlines() if r.startswith(pod.name)).split()[2] == \
        "ContainerCreating"
    out = await kubectl(kubeconfig, "get", "events", "-A")
    header, *rows = out.splitlines()
    assert header.split() == ["NAMESPACE", "LAST", "SEEN", "TYPE", "REASON", "OBJECT",
                              "MESSAGE"]
    reasons = {r.split()[3] for r in rows}
    assert {"Scheduled", "Pulling", "FailedScheduling"} <= reasons
