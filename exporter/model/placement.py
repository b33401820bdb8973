"""Which node a GPU reading belongs to, from what the reading itself says.

A dcgm-exporter answer is placed GPU by GPU, never by the URL it came from (a static target
may be a Service in front of every node's exporter, each answer from another node):

1. its ``Hostname``/``hostname`` label, when that names a node;
2. else the node of a pod on the GPU (its ``namespace``/``pod`` labels);
3. else the node of the pod ``Hostname`` names (several dcgm-exporter versions print their
   own pod's name there);
4. else the node of the exporter that answered: the discovered pod's, or the pod or node
   whose address is the target URL's host.

A GPU none of these places is on no known node: the caller counts and logs it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from exporter.model.records import DeviceReading, NodeInfo, PodInfo


class Placement:
    """Built once per cycle from the Kubernetes view; call it for each reading."""

    def __init__(self, nodes: Mapping[str, NodeInfo], pods: Iterable[PodInfo]) -> None:
        self.nodes = nodes
        placed = [(p, p.node) for p in pods if p.node]
        self._by_pod = {(p.namespace, p.name): node for p, node in placed}
        names = Counter(p.name for p, _ in placed)
        self._by_name = {p.name: node for p, node in placed if names[p.name] == 1}
        """Pod name -> node, for names no two namespaces share."""
        self._by_address = {n.address: n.name for n in nodes.values() if n.address}
        self._by_address.update((p.ip, node) for p, node in placed if p.ip)

    def __call__(self, dev: DeviceReading, exporter_node: str | None = None) -> str | None:
        if dev.hostname in self.nodes:
            return dev.hostname
        for p in dev.pods:
            if node := self._by_pod.get((p.namespace, p.pod)):
                return node
        if dev.hostname and (node := self._by_name.get(dev.hostname)):
            return node
        return exporter_node if exporter_node in self.nodes else None

    def by_address(self, url: str) -> str | None:
        """The node of the pod (or the node) a target URL points at, if it is one."""
        return self._by_address.get(urlsplit(url).hostname or "")
