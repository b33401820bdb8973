"""What the queue forecast learns over cycles (``exporter.runtime.forecasts``).

- **Run times**, of the pods that ended on their own (succeeded or failed, not taken away),
  by namespace and family (``family``: the app label, else the controller's name less the
  suffix Kubernetes generates). A running pod's remaining time is the median of what those
  that ran longer than it has still had left; a waiting one's run time, their median. With
  none such of its family it asks the next level: the namespace, then the cluster; with
  none at all, a running pod is taken to run as long again as it has run, and a waiting
  one for longer than the horizon.
- **Each pool's maximum** from the cluster autoscaler's ``TriggeredScaleUp`` (``{group
  1->2 (max: 4)}``, summed over the pool's instance groups: one per zone).
- **Each pool's scale-up delay**: from a scale-up triggered for it to its next node Ready,
  the median of the last ones seen.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from exporter.model.pending import SCALE_UP_PATIENCE_SECONDS
from exporter.model.records import PodInfo
from exporter.model.scheduling_words import Triggered, autoscaler_words
from exporter.model.snapshot import Snapshot
from exporter.runtime.waits import DISRUPTED_REASONS

FAMILY_LABELS = ("app.kubernetes.io/name", "app")
_GENERATED = re.compile(r"-(?:[bcdfghjklmnpqrstvwxz2456789]{5}|[0-9]{6,})$")
"""The suffix Kubernetes' ``generateName`` adds (five of its consonants and digits), or a
CronJob's scheduled time."""
MIN_SAMPLES = 1
KEPT_RUNS = 200
"""Run times kept per family (the newest)."""
KEPT_UIDS = 100_000
KEPT_DELAYS = 20
STALE_TRIGGER_SECONDS = 2 * SCALE_UP_PATIENCE_SECONDS
"""A scale-up not brought by then is given up (twice the autoscaler's patience)."""


def family(namespace: str, labels: Mapping[str, str], controller: str) -> str:
    """What a pod's runs are compared with: its app label, else its controller's name
    less a generated suffix."""
    for key in FAMILY_LABELS:
        if labels.get(key):
            return labels[key]
    name = controller
    while (stripped := _GENERATED.sub("", name)) != name and stripped:
        name = stripped
    return name


class RunTimes:
    """Run times of ended pods: by (namespace, family), by namespace, and of all."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, ...], deque[float]] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()

    def learn(self, pod: PodInfo) -> None:
        if pod.finished_unix is None or pod.phase not in ("Succeeded", "Failed") or \
                pod.gpus <= 0 or pod.scheduled_unix is None or pod.disrupted or \
                pod.reason in DISRUPTED_REASONS or pod.uid in self._seen:
            return
        name = family(pod.namespace, pod.labels, pod.workload)
        self._seen[pod.uid] = None
        if len(self._seen) > KEPT_UIDS:
            self._seen.popitem(last=False)
        run = max(0.0, pod.finished_unix - pod.scheduled_unix)
        for key in ((pod.namespace, name), (pod.namespace,), ()):
            self._runs.setdefault(key, deque(maxlen=KEPT_RUNS)).append(run)

    def _levels(self, namespace: str, name: str) -> list[deque[float]]:
        return [d for key in ((namespace, name), (namespace,), ())
                if (d := self._runs.get(key)) is not None]

    def remaining(self, namespace: str, name: str, elapsed: float) -> float:
        """The median time left of runs like it that lasted longer than ``elapsed``."""
        for runs in self._levels(namespace, name):
            longer = [r - elapsed for r in runs if r > elapsed]
            if len(longer) >= MIN_SAMPLES:
                return statistics.median(longer)
        return max(elapsed, 60.0)

    def run(self, namespace: str, name: str) -> float | None:
        """The median run of runs like it; None when none is known."""
        for runs in self._levels(namespace, name):
            if len(runs) >= MIN_SAMPLES:
                return statistics.median(runs)
        return None


@dataclass
class Pools:
    """Each pool's maximum and scale-up delay, as the autoscaler and the nodes show them."""

    groups: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Instance group -> its pool and its maximum (GKE has a group per zone)."""
    delays: dict[str, deque[float]] = field(default_factory=dict)
    _triggered: dict[str, float] = field(default_factory=dict)
    """Pool -> when a scale-up not brought yet was first said."""
    _ready: dict[str, int] | None = None
    """Pool -> its Ready nodes at the last cycle (None before the first)."""
    _read: dict[tuple[str, float], None] = field(default_factory=dict)
    """The scale-up events read: (pod, when said)."""

    @property
    def max_nodes(self) -> dict[str, int]:
        """Pool -> the most nodes its groups may run, all zones together."""
        out: dict[str, int] = {}
        for pool, most in self.groups.values():
            out[pool] = out.get(pool, 0) + most
        return out

    def learn(self, snap: Snapshot, pools: set[str]) -> None:
        read: dict[tuple[str, float], None] = {}
        for events in snap.events.values():
            said = events.get("TriggeredScaleUp")
            if said is None:
                continue
            key = (said.pod_uid, said.last_unix)
            read[key] = None
            if key in self._read:
                continue  # read at an earlier cycle
            words = autoscaler_words(said.reason, said.message)
            if not isinstance(words, Triggered):
                continue
            for group in words.groups:
                pool = _pool_of(group.name, pools)
                if pool is None:
                    continue
                if group.max_nodes is not None:
                    self.groups[group.name] = (pool, group.max_nodes)
                if said.last_unix <= snap.now and \
                        snap.now - said.last_unix <= STALE_TRIGGER_SECONDS:
                    self._triggered[pool] = min(self._triggered.get(pool, math.inf),
                                                said.last_unix)
        self._read = read
        ready: dict[str, int] = {}
        for node in snap.nodes.values():
            if node.ready and node.pool:
                ready[node.pool] = ready.get(node.pool, 0) + 1
        for pool, n in ready.items():
            before = n if self._ready is None else self._ready.get(pool, 0)
            if n > before and pool in self._triggered:
                self.delays.setdefault(pool, deque(maxlen=KEPT_DELAYS)).append(
                    max(0.0, snap.now - self._triggered.pop(pool)))
        for pool in [p for p, t in self._triggered.items()
                     if snap.now - t > STALE_TRIGGER_SECONDS]:
            del self._triggered[pool]  # given up: the autoscaler's own patience
        self._ready = ready

    def delay(self, pool: str, default: float) -> float:
        seen = self.delays.get(pool)
        return statistics.median(seen) if seen else default


def _pool_of(group: str, pools: set[str]) -> str | None:
    """The pool a GKE instance group belongs to (``gke-CLUSTER-POOL-HASH-grp``): the
    longest pool name it holds between dashes."""
    found = [p for p in pools if f"-{p}-" in f"-{group}-"]
    return max(found, key=len, default=None)
