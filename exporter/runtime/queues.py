"""The queues: Kueue's Workloads by the object they were made for, a pod's admission,
each Workload's team and ClusterQueue, and the waits the counters observe (a pod's queue
wait once it is scheduled, a Workload's each time it is admitted)."""

from __future__ import annotations

from collections.abc import Callable

from exporter.config import Config
from exporter.model import compute
from exporter.model.records import PodInfo, WorkloadInfo, gpu_model
from exporter.model.totals import Totals
from exporter.sources import ClusterSource


class Queues:
    """The Kueue index of the cluster's Workloads, rebuilt every cycle."""

    def __init__(self, config: Config, kube: ClusterSource) -> None:
        self.config = config
        self.kube = kube
        self._index: dict[tuple[str, str, str], WorkloadInfo] = {}
        """Kueue's Workloads by (namespace, kind, name) of the object they were made for."""

    def observe(self, totals: Totals, team: Callable[[PodInfo], str], now: float) -> None:
        """The waits of the cycle: of each pod scheduled since the last, of each Workload
        admitted (again) since."""
        self._index = {(w.namespace, w.owner_kind, w.owner_name): w
                       for w in self.kube.workloads.values()}
        waited = totals.waited
        for pod in self.kube.pods.values():
            if pod.gpus > 0 and pod.scheduled_unix is not None and pod.uid not in waited:
                group = (pod.namespace, team(pod), gpu_model(pod, self.kube.nodes))
                wl = self.workload_of(pod)
                totals.observe_wait(pod.uid, group, compute.queue_wait_seconds(
                    pod, now, wl.created_unix if wl else None))
        admitted = totals.admitted
        for uid in [u for u in admitted if u not in self.kube.workloads]:
            del admitted[uid]
        for wl in self.kube.workloads.values():
            if wl.admitted_unix is not None:
                key = (self.cluster_queue_of(wl), wl.local_queue, wl.namespace,
                       self.workload_team(wl))
                wait = compute.admission_wait_seconds(wl.queued_unix, wl.admitted_unix, now)
                totals.observe_admission(wl.uid, wl.admitted_unix, key, wait)

    def workload_of(self, pod: PodInfo) -> WorkloadInfo | None:
        """The Kueue Workload of the pod's Job (or JobSet), if Kueue queued it."""
        if not self._index:
            return None
        jobset = pod.labels.get("jobset.sigs.k8s.io/jobset-name")
        if jobset:
            return self._index.get((pod.namespace, "JobSet", jobset))
        return self._index.get((pod.namespace, pod.owner_kind, pod.workload))

    def admission_of(self, pod: PodInfo) -> compute.Admission | None:
        wl = self.workload_of(pod)
        if wl is None:
            return None
        wait = None if wl.admitted_unix is None else compute.admission_wait_seconds(
            wl.queued_unix, wl.admitted_unix, wl.admitted_unix)
        return compute.Admission(wl.created_unix, wait, self.cluster_queue_of(wl))

    def workload_team(self, wl: WorkloadInfo) -> str:
        return compute.team_of(wl.labels, wl.namespace, self.kube.namespace_labels,
                               self.config.team_label, self.kube.synced["namespaces"].is_set())

    def cluster_queue_of(self, wl: WorkloadInfo) -> str:
        """The ClusterQueue that admitted it, else its LocalQueue's ("" if unknown)."""
        if wl.cluster_queue:
            return wl.cluster_queue
        lq = self.kube.local_queues.get((wl.namespace, wl.local_queue))
        return lq.cluster_queue if lq else ""
