"""A GPU reading is placed on the node its own labels name, never on the target's."""

from __future__ import annotations

import pytest

from exporter.placement import Placement
from exporter.sources.dcgm import DeviceReading, PodOnDevice
from tests.exporter.test_compute import node, pod

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
