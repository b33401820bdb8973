"""A GPU reading is placed on the node its own labels name, never on the target's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from exporter.demo import demo_config
from exporter.model.placement import Placement
from exporter.model.records import DeviceReading, PodOnDevice
from exporter.runtime.app import open_exporter
from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.conftest import FIXTURES, Handler
from tests.exporter.test_compute import node, pod
from tests.exporter.test_exporter import families
from tests.timing import limit

HOSTNAME = "i-030791dc5a37cd257"
"""The capture's ``Hostname``: a node of the cluster it was taken on, not of this one."""

NODES = {n.name: n for n in (node("gke-l4-1", address="10.0.0.1"),
                             node("gke-t4-1", address="10.0.0.2"))}
PODS = [pod(uid="w", namespace="ml", name="train-0", node="gke-l4-1", ip="10.4.0.7"),
        pod(uid="e", namespace="gpu-operator", name="nvidia-dcgm-exporter-x7k2p",
            node="gke-t4-1", ip="10.4.1.9"),
        pod(uid="a", namespace="a", name="twin", node="gke-l4-1"),
        pod(uid="b", namespace="b", name="twin", node="gke-t4-1")]


def dev(hostname: str = "", pods: tuple[tuple[str, str], ...] = ()) -> DeviceReading:
    return DeviceReading("GPU-1", "0", hostname, "NVIDIA L4", None, None,
                         [PodOnDevice(ns, name, "c") for ns, name in pods])


@pytest.mark.parametrize(("case", "reading", "exporter_node", "node"), [
    ("Hostname names a node", dev("gke-l4-1"), "gke-t4-1", "gke-l4-1"),
    ("the pod on the GPU", dev("", (("ml", "train-0"),)), None, "gke-l4-1"),
    ("Hostname is the exporter pod's name", dev("nvidia-dcgm-exporter-x7k2p"), None,
     "gke-t4-1"),
    ("a pod name two namespaces share tells nothing", dev("twin"), None, None),
    ("nothing in the labels: the exporter that answered", dev("localhost"), "gke-t4-1",
     "gke-t4-1"),
    ("the exporter's node is gone", dev(""), "gke-gone", None),
    ("nothing at all", dev("dcgm-exporter-unknown"), None, None),
])
def test_placement(case: str, reading: DeviceReading, exporter_node: str | None,
                   node: str | None) -> None:
    assert Placement(NODES, PODS)(reading, exporter_node) == node


@pytest.mark.parametrize(("url", "node"), [
    ("http://10.4.1.9:9400/metrics", "gke-t4-1"),      # an exporter pod's IP
    ("http://10.0.0.1:9400/metrics", "gke-l4-1"),      # hostNetwork: the node's IP
    ("http://dcgm-exporter.gpu-operator.svc:9400/metrics", None),   # a Service: no node
])
def test_target_address(url: str, node: str | None) -> None:
    assert Placement(NODES, PODS).by_address(url) == node


async def test_a_gpu_no_label_places_is_counted_and_logged_once(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        serve: Callable[[Handler], Awaitable[str]]) -> None:
    """A real capture whose ``Hostname`` is a node of another cluster, with no pod on its
    GPU, behind a static target that is no pod or node here."""
    capture = (FIXTURES / "dcgm" / "dcgm-exporter_L4_kops_driver580.prom").read_text()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=capture)

    url = await serve(metrics)
    sim: SimulatorServer = await make_server(make_scenario())
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    cfg = cfg.model_copy(update={"dcgm": cfg.dcgm.model_copy(update={"targets": [url]})})
    async with open_exporter(cfg) as exporter:
        async with asyncio.timeout(limit(10)):
            await exporter.kube.wait_synced()
        for _ in range(3):
            await exporter.cycle(sim.cluster.now)
        fams = families(exporter.metrics.text)
    rejected = dict((labels["reason"], v) for labels, v in
                    fams["gke_gpu_exporter_rejected_samples_total"])
    assert rejected["unknown_node"] > 0 and rejected["unknown_node"] % 3 == 0  # every cycle
    assert ({"cluster": exporter.config.cluster, "source": "dcgm", "target": url}, 1.0) in \
        fams["gke_gpu_exporter_source_up"]
    assert not any(labels.get("node") for labels, _ in fams.get("gke_gpu_available", []))
    logged = [r for r in caplog.records if r.getMessage() == "gpu on no known node"]
    assert len(logged) == 1
    assert getattr(logged[0], "ctx", {})["hostname"] == HOSTNAME
