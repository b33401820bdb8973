"""One cycle's inputs: the answers of the reading source placed on their nodes, with the
Kubernetes view they were placed by, frozen as a ``Snapshot`` for ``compute``.

``place_answers`` is pure: the targets, their answers and the ``Placement`` of this cycle's
view in; the readings by node, which nodes are unknown and what could not be placed out.
A failed target's nodes are unknown this cycle (those its last answer covered, and the
node it runs on), never down: nothing says their GPUs are. A target that answers for every
node (a query API) makes every node unknown when it fails.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from exporter.model.placement import Placement
from exporter.model.records import (
    ClusterQueueInfo,
    DeviceReading,
    NodeInfo,
    PodEvent,
    PodInfo,
    TargetScrape,
    WorkloadInfo,
)


@dataclass(slots=True)
class Placed:
    """The readings of one round of answers, by node."""

    readings: dict[str, list[DeviceReading]] = field(default_factory=dict)
    """Node -> its devices; a node whose own exporter answered is there, if with none."""
    unknown_nodes: set[str] = field(default_factory=set)
    complete: bool = True
    """Whether the answers list every GPU of the nodes they cover (per-container
    sources do not: a GPU no container uses is absent, not missing)."""
    covered: dict[str, set[str]] = field(default_factory=dict)
    """Target -> the nodes its answer covered."""
    unplaced: dict[str, tuple[int, DeviceReading]] = field(default_factory=dict)
    """Target -> samples of devices on no known node, and the first such device."""


def place_answers(targets: Mapping[str, str | None],
                  answers: Sequence[TargetScrape | Exception], place: Placement,
                  whole_cluster: bool, last_covered: Mapping[str, Collection[str]]) -> Placed:
    """Each answer's devices on their nodes (``Placement``); ``targets``: URL -> the node
    it runs on, if known; ``last_covered``: the nodes each target's last answer covered."""
    out = Placed()
    for url, answer in zip(targets, answers, strict=True):
        exporter_node = None if whole_cluster else targets[url] or place.by_address(url)
        if not isinstance(answer, TargetScrape):
            if whole_cluster:
                out.unknown_nodes.update(place.nodes)
            else:
                out.unknown_nodes.update(last_covered.get(url, ()))
                if exporter_node:
                    out.unknown_nodes.add(exporter_node)
            continue
        out.complete &= answer.complete
        if exporter_node:  # it answered: a GPU of its node it lacks is missing
            out.readings.setdefault(exporter_node, [])
        covered: set[str] = set()
        lost, stray = 0, None
        for dev in answer.result.devices:
            node = place(dev, exporter_node)
            if node is None:
                lost += len(dev.fields)
                stray = stray or dev
                continue
            out.readings.setdefault(node, []).append(dev)
            covered.add(node)
        out.covered[url] = covered
        if stray is not None:
            out.unplaced[url] = (lost, stray)
    return out


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one cycle computes from: taken once, never changed."""

    now: float
    """The cycle's time (Unix seconds): the wall clock's, or the simulator's."""
    nodes: Mapping[str, NodeInfo]
    pods: Mapping[str, PodInfo]
    """The pods Kubernetes lists, by UID."""
    ended_pods: tuple[PodInfo, ...]
    """Pods deleted since the last snapshot, as they were last seen."""
    readings: Mapping[str, Sequence[DeviceReading]]
    """Node -> the devices its answers reported, no more than the node holds."""
    unknown_nodes: frozenset[str]
    """Nodes no answer covered this cycle: no state, no cost, no downtime."""
    complete: bool
    """Whether the readings list every GPU of the nodes they cover."""
    nodes_listed: bool = True
    """Whether the nodes come from a list of the API (not the empty view before one)."""
    kueue: bool = False
    """Whether the cluster serves Kueue's API."""
    workloads: Mapping[str, WorkloadInfo] = field(default_factory=dict)
    """Kueue's Workloads, by UID."""
    cluster_queues: Mapping[str, ClusterQueueInfo] = field(default_factory=dict)
    """Kueue's ClusterQueues, by name."""
    events: Mapping[str, Mapping[str, PodEvent]] = field(default_factory=dict)
    """Pod UID -> the newest event about it of each reason."""
