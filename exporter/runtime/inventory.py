"""The device inventory: the GPUs and MIG instances each node has, admitted from DCGM's
readings and Kubernetes' counts, remembered while they are away, retired when neither
reports them for ``dcgm.retire_after``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from exporter.logs import Episodes
from exporter.metrics.health import SourceHealth
from exporter.model import compute
from exporter.model.records import DeviceReading, NodeInfo
from exporter.model.totals import Totals


class Inventory:
    """Node -> device id -> identity of every device known, and when DCGM last saw each."""

    def __init__(self, max_devices_per_target: int, retire_after: float,
                 health: SourceHealth, episodes: Episodes,
                 devices: dict[str, dict[str, compute.DeviceIdentity]] | None = None) -> None:
        self.max_devices_per_target = max_devices_per_target
        self.retire_after = retire_after
        self.devices: dict[str, dict[str, compute.DeviceIdentity]] = devices or {}
        self.last_seen: dict[str, float] = {}
        """Device id -> when DCGM last reported it (since start), for retiring it."""
        self._health = health
        self._episodes = episodes

    def admit(self, readings: dict[str, list[DeviceReading]],
              nodes: Mapping[str, NodeInfo], now: float) -> None:
        """Drop the readings of GPUs beyond what their node holds (``compute.admit``):
        counted as ``too_many_devices``, never devices; logged when a node begins to report
        too many and when it no longer does."""
        for name, devs in readings.items():
            known = {i.gpu_uuid for i in self.devices.get(name, {}).values()}
            kept, excess = compute.admit(devs, known, nodes.get(name),
                                         self.max_devices_per_target)
            episode = (name, "rejected:too_many_devices")
            if excess:
                readings[name] = kept
                self._health.rejected["too_many_devices"] += sum(len(d.fields) for d in excess)
                self._episodes.failed(episode, now, "more gpus than the node holds", node=name,
                                      reported=len({d.uuid for d in devs}),
                                      kept=len({d.uuid for d in kept}))
            else:
                self._episodes.recovered(episode, now, "no more gpus than the node holds",
                                         node=name)

    def remember(self, readings: Mapping[str, Sequence[DeviceReading]],
                 nodes: Mapping[str, NodeInfo], now: float) -> None:
        """Go on from a snapshot: its new devices added, deleted nodes dropped, then the
        devices ``compute.retire`` says to forget retired (their series go with the next
        snapshot, their open incidents end)."""
        self.devices = compute.remember(self.devices, readings, nodes)
        for devs in readings.values():
            for d in devs:
                self.last_seen[d.device_id] = now
        for known in self.devices.values():
            for device_id in known:
                self.last_seen.setdefault(device_id, now)  # loaded at start: from now
        self.devices = compute.retire(self.devices, nodes, self.last_seen, now,
                                      self.retire_after)
        kept = {device_id for known in self.devices.values() for device_id in known}
        if len(kept) != len(self.last_seen):
            self.last_seen = {d: t for d, t in self.last_seen.items() if d in kept}

    def copy(self) -> dict[str, dict[str, compute.DeviceIdentity]]:
        return {node: dict(devices) for node, devices in self.devices.items()}

    def forget_gone(self, totals: Totals, states: Sequence[compute.DeviceState],
                    nodes: Mapping[str, NodeInfo]) -> None:
        """The counters of GPUs no longer known (retired, or their node deleted) leave
        /metrics. The names of GPUs known only from Kubernetes (``<node>/k8s-<index>``, a
        few per node) stay while their node does."""
        live = {d.gpu_uuid for d in states}
        for devs in self.devices.values():
            live.update(i.gpu_uuid for i in devs.values())

        def gone(uuid: str) -> bool:
            node, k8s, _ = uuid.rpartition("/k8s-")
            return uuid not in live and not (k8s and node in nodes)

        t = totals  # nearly every GPU is live: only the others are looked at
        for uuid in [u for u in t.up_seconds.keys() - live if gone(u)]:
            del t.up_seconds[uuid]
        for key in [k for k in t.down_seconds if k[0] not in live and gone(k[0])]:
            del t.down_seconds[key]
        for table in (t.xid_events, t.last_xid, t.gpu_joules):
            for xkey in [k for k in table if k[1] not in live and gone(k[1])]:
                del table[xkey]
