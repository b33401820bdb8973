"""The queue forecast: what the exporter learns over cycles for it, and the forecast made
from a cycle's snapshot again every ``queue_forecast.interval`` (``exporter.model.forecast``).

What it learns:

- **Run times**, of the pods that ended on their own (succeeded or failed, not taken away),
  by namespace and family (``family``: the app label, else the controller's name less the
  suffix Kubernetes generates). A running pod's remaining time is the median of what those
  that ran longer than it has still had left; a waiting one's run time, their median. With
  none such of its family it asks the next level: the namespace, then the cluster;
  with none at all, a running pod is taken to run as long again as it has run, and a
  waiting one for longer than the horizon.
- **Each pool's maximum** from the cluster autoscaler's ``TriggeredScaleUp`` (``{group
  1->2 (max: 4)}``), unless ``queue_forecast.max_nodes`` sets it.
- **Each pool's scale-up delay**: from a scale-up triggered for it to its next node Ready,
  the median of the last ones seen; until one is, ``queue_forecast.scale_up_delay``.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from exporter.config import QueueForecast
from exporter.model.forecast import (
    Busy,
    Expected,
    Forecast,
    PoolBounds,
    Queued,
    Quota,
    expected_starts,
)
from exporter.model.pending import (
    KUEUE_GATE,
    SCALE_UP_PATIENCE_SECONDS,
    WaitFigures,
    Waiting,
    free_units,
)
from exporter.model.records import (
    NodeInfo,
    PodConstraints,
    PodInfo,
    Toleration,
    WorkloadInfo,
)
from exporter.model.scheduling_words import Triggered, autoscaler_words
from exporter.model.snapshot import Snapshot

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
ANY_TAINT = (Toleration(None, "Exists", "", None),)
ALWAYS_ON = frozenset({"ReplicaSet", "Deployment", "StatefulSet", "DaemonSet"})
"""Controllers whose pods run until someone stops them: they never free their GPUs."""
GANG = "workload/"
"""The prefix of a gang's uid in the forward play."""
TAKEN = frozenset({"Terminated", "NodeLost", "Preempted", "Evicted",
                   "DeletionByTaintManager"})


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
                pod.reason in TAKEN or pod.uid in self._seen:
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


@dataclass(frozen=True, slots=True)
class Arrival:
    """A pod or Kueue Workload as it was submitted, to be submitted again."""

    unix: float
    namespace: str
    name: str
    """Its family."""
    pods: int
    gpus_per_pod: int
    constraints: PodConstraints
    priority: int
    always_on: bool
    quota: str | None


class Forecasts:
    """What the forecast learns, and the last one made."""

    def __init__(self, config: QueueForecast) -> None:
        self.config = config
        self.runs = RunTimes()
        self.pools = Pools()
        self.last = Forecast()
        self._arrivals: deque[Arrival] = deque()
        self._arrived: OrderedDict[str, None] = OrderedDict()

    def observe(self, snap: Snapshot, waits: WaitFigures, shapes: Mapping[str, NodeInfo],
                workload_of: Callable[[PodInfo], WorkloadInfo | None],
                cluster_queue_of: Callable[[WorkloadInfo], str]) -> Forecast:
        """Learn from the snapshot; forecast again when due."""
        for pod in (*snap.pods.values(), *snap.ended_pods):
            self.runs.learn(pod)
        self.pools.learn(snap, set(shapes))
        self._arrive(snap, workload_of, cluster_queue_of)
        cfg = self.config
        due = self.last.made_unix is None or snap.now - self.last.made_unix >= cfg.interval \
            or snap.now < self.last.made_unix
        if not cfg.enabled or not due:
            return self.last
        cpu = time.process_time()
        starts, assumed = self._forecast(snap, waits, shapes, workload_of, cluster_queue_of)
        self.last = Forecast(starts, snap.now, time.process_time() - cpu, assumed)
        return self.last

    def _arrive(self, snap: Snapshot, workload_of: Callable[[PodInfo], WorkloadInfo | None],
                cluster_queue_of: Callable[[WorkloadInfo], str]) -> None:
        """Remember the pods and Workloads submitted within ``arrivals``."""
        window = self.config.arrivals
        if window <= 0:
            return
        quotas = snap.cluster_queues
        new: list[Arrival] = []
        for pod in snap.pods.values():
            if pod.gpus <= 0 or pod.uid in self._arrived or \
                    (snap.kueue and workload_of(pod) is not None):
                continue  # a Kueue Workload's pods arrive with it
            self._seen(pod.uid)
            new.append(Arrival(pod.created_unix, pod.namespace,
                               family(pod.namespace, pod.labels, pod.workload), 1, pod.gpus,
                               pod.constraints, pod.priority, pod.owner_kind in ALWAYS_ON,
                               None))
        for wl in snap.workloads.values():
            if wl.gpus <= 0 or wl.uid in self._arrived:
                continue
            self._seen(wl.uid)
            per_pod = wl.gpus_per_pod or wl.gpus
            cq = cluster_queue_of(wl)
            new.append(Arrival(wl.created_unix, wl.namespace,
                               family(wl.namespace, wl.labels, wl.owner_name),
                               max(1, wl.gpus // per_pod), per_pod, _workload_constraints(wl),
                               wl.priority, False, cq if cq in quotas else None))
        self._arrivals.extend(sorted(new, key=lambda a: a.unix))
        while self._arrivals and self._arrivals[0].unix < snap.now - window:
            self._arrivals.popleft()

    def _seen(self, uid: str) -> None:
        self._arrived[uid] = None
        if len(self._arrived) > KEPT_UIDS:
            self._arrived.popitem(last=False)

    def _to_come(self, now: float) -> list[Queued]:
        """The arrivals of the last window, a window later: those still to come."""
        window = self.config.arrivals
        out = []
        for i, a in enumerate(self._arrivals):
            when = a.unix + window
            if when <= now:
                continue
            out.append(Queued(f"arrival-{i}", a.pods, a.gpus_per_pod, a.constraints,
                              a.priority, when, None if a.always_on else
                              self.runs.run(a.namespace, a.name), quota=a.quota,
                              expected=True))
        return out

    def _forecast(self, snap: Snapshot, waits: WaitFigures, shapes: Mapping[str, NodeInfo],
                  workload_of: Callable[[PodInfo], WorkloadInfo | None],
                  cluster_queue_of: Callable[[WorkloadInfo], str]
                  ) -> tuple[dict[str, Expected], int]:
        now, cfg = snap.now, self.config
        quotas = _quotas(snap)

        def quota_of(pod: PodInfo) -> str | None:
            wl = workload_of(pod) if snap.kueue else None
            cq = cluster_queue_of(wl) if wl is not None else ""
            return cq if cq in quotas else None

        busy: list[Busy] = []
        assumed = 0
        for pod in snap.pods.values():
            if not pod.node or pod.gpus <= 0 or pod.phase not in ("Pending", "Running"):
                continue
            name = family(pod.namespace, pod.labels, pod.workload)
            if pod.owner_kind in ALWAYS_ON:
                continue  # holds its GPUs past any horizon
            if pod.phase == "Running" and pod.scheduled_unix is not None:
                elapsed = max(0.0, now - pod.scheduled_unix)
                if self.runs.run(pod.namespace, name) is None:
                    assumed += 1
                ends = now + self.runs.remaining(pod.namespace, name, elapsed)
            else:
                run = self.runs.run(pod.namespace, name)
                if run is None:
                    continue
                ends = now + run
            busy.append(Busy(pod.node, pod.gpus, ends, quota_of(pod)))
        queue: list[Queued] = []
        gangs: dict[str, list[Queued]] = {}  # a Workload's uid -> its pods gated by Kueue
        for w in waits.waiting:
            q = self._queued(w, snap, quota_of, cluster_queue_of, quotas)
            if q is None:
                continue
            gated = snap.pods.get(w.uid) if q.quota is not None and w.kind == "pod" else None
            wl = workload_of(gated) if gated is not None else None
            if wl is not None:
                gangs.setdefault(wl.uid, []).append(q)
            else:
                queue.append(q)
        queue += [_gang(uid, pods) for uid, pods in gangs.items()]
        queue += self._to_come(now)
        stocking = {w.verdict.pool for w in waits.waiting if w.verdict.cause == "stockout"}
        bounds = {pool: PoolBounds(shape, cfg.max_nodes.get(pool,
                                                           self.pools.max_nodes.get(pool)),
                                   self.pools.delay(pool, cfg.scale_up_delay),
                                   pool in stocking)
                  for pool, shape in shapes.items()}
        free = free_units(snap.nodes, snap.pods.values())
        starts = expected_starts(now, snap.nodes, free, busy, queue, bounds, quotas,
                                 cfg.horizon)
        for uid, pods in gangs.items():  # Kueue admits a Workload's pods all at once
            gang = starts.pop(f"{GANG}{uid}")
            starts.update((q.uid, gang) for q in pods)
        return starts, assumed

    def _queued(self, w: Waiting, snap: Snapshot,
                quota_of: Callable[[PodInfo], str | None],
                cluster_queue_of: Callable[[WorkloadInfo], str],
                quotas: Mapping[str, Quota]) -> Queued | None:
        if w.kind == "pod":
            pod = snap.pods.get(w.uid)
            if pod is None:
                return None
            if pod.owner_kind in ALWAYS_ON:
                runs = None
            else:
                runs = self.runs.run(pod.namespace, family(pod.namespace, pod.labels,
                                                           pod.workload))
            gated = KUEUE_GATE in pod.scheduling_gates
            cq = quota_of(pod)
            return Queued(pod.uid, 1, pod.gpus, pod.constraints, pod.priority,
                          pod.created_unix, runs, bound=pod.node is not None,
                          quota=cq if gated else None, holds=None if gated else cq)
        wl = snap.workloads.get(w.uid)
        if wl is None:
            return None
        per_pod = wl.gpus_per_pod or wl.gpus
        cq = cluster_queue_of(wl)
        return Queued(wl.uid, max(1, wl.gpus // per_pod), per_pod, _workload_constraints(wl),
                      wl.priority,
                      wl.queued_unix, self.runs.run(wl.namespace,
                                                    family(wl.namespace, wl.labels,
                                                           wl.owner_name)),
                      quota=cq if cq in quotas else None)


def _gang(uid: str, pods: list[Queued]) -> Queued:
    """The pods of one Kueue Workload waiting for its admission, as one unit: admitted and
    placed all at once."""
    first = min(pods, key=lambda q: q.since)
    return replace(first, uid=f"{GANG}{uid}", pods=len(pods),
                   gpus_per_pod=max(q.gpus_per_pod for q in pods),
                   priority=max(q.priority for q in pods))


def _workload_constraints(wl: WorkloadInfo) -> PodConstraints:
    """Where a Workload with no pod yet may run: the accelerator it selects."""
    return PodConstraints(
        {"cloud.google.com/gke-accelerator": wl.accelerator} if wl.accelerator else {},
        (), ANY_TAINT)


def _quotas(snap: Snapshot) -> dict[str, Quota]:
    out = {}
    for name, cq in snap.cluster_queues.items():
        if not cq.flavors:
            continue
        limits = [f.borrowing_limit_gpus for f in cq.flavors.values()]
        out[name] = Quota(
            sum(f.nominal_gpus for f in cq.flavors.values()),
            sum(f.used_gpus for f in cq.flavors.values()),
            None if any(b is None for b in limits) else sum(b for b in limits if b is not None),
            cq.cohort)
    return out
