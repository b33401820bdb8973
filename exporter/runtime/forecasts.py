"""The queue forecast: made from a cycle's snapshot again every
``queue_forecast.interval`` (``exporter.model.forecast``), from what
``exporter.runtime.forecast_history`` learns over cycles: the waiting pods and Workloads
(a Workload's pods gated by Kueue as one), the running pods' expected ends, each pool's
bounds, the ClusterQueues' quotas."""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

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
    WaitFigures,
    Waiting,
    free_units,
)
from exporter.model.records import (
    NodeInfo,
    PodConstraints,
    PodInfo,
    WorkloadInfo,
)
from exporter.model.snapshot import Snapshot
from exporter.runtime.forecast_history import KEPT_UIDS, Pools, RunTimes, family
from exporter.runtime.waits import workload_constraints

ALWAYS_ON = frozenset({"ReplicaSet", "Deployment", "StatefulSet", "DaemonSet"})
"""Controllers whose pods run until someone stops them: they never free their GPUs."""
GANG = "workload/"
"""The prefix of a gang's uid in the forward play."""


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
                               max(1, wl.gpus // per_pod), per_pod, workload_constraints(wl),
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
        return Queued(wl.uid, max(1, wl.gpus // per_pod), per_pod, workload_constraints(wl),
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
