"""The rows of ``gpu_pods``, ``availability_events``, ``kueue_quotas`` and
``kueue_workloads`` waiting for the next flush, and what was last written of each pod,
ClusterQueue flavor and Workload: a row is buffered only when its object changed. Every row
has a deterministic id (``row_id``), so a row written twice is written once."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable
from datetime import UTC, datetime
from typing import Any

import duckdb

from exporter.model.compute import Admission
from exporter.model.records import (
    DELETED,
    WORKLOAD_ADMITTED,
    WORKLOAD_PENDING,
    ClusterQueueInfo,
    PodInfo,
    WorkloadInfo,
)
from exporter.sinks.batch_files import literal
from exporter.sinks.schema import KUEUE_WORKLOADS
from exporter.sinks.warehouse.tables import DAY

OPEN_WORKLOAD_STATES = (WORKLOAD_PENDING, WORKLOAD_ADMITTED)


def row_id(*parts: object) -> str:
    return hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=16).hexdigest()


def _ts(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, UTC)


class Changes:
    """The cluster's rows of the small tables, buffered until ``flush`` takes them."""

    def __init__(self, cluster: str,
                 connection: Callable[[], duckdb.DuckDBPyConnection]) -> None:
        self.cluster = cluster
        self._connection = connection
        self.pods: dict[str, dict[str, Any]] = {}
        """Rows by id: every state a pod passed through since the last flush."""
        self.pod_signatures: dict[str, tuple[Any, ...]] = {}
        self.pod_models: dict[str, str] = {}
        self.events: list[dict[str, Any]] = []
        self.quotas: dict[str, dict[str, Any]] = {}
        self.quota_signatures: dict[tuple[str, str], tuple[Any, ...]] = {}
        self.workloads: dict[str, dict[str, Any]] = {}
        """Rows by id: every state a Workload passed through since the last flush."""
        self.workload_rows: dict[str, dict[str, Any]] = {}
        """Each Workload's last row, by uid: what a row for its deletion repeats."""
        self.workload_signatures: dict[str, tuple[Any, ...]] = {}

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        return self._connection()

    def add_pods(self, pods: Iterable[PodInfo], now: float,
                 team_of: Callable[[PodInfo], str],
                 model_of: Callable[[PodInfo], str] = lambda p: p.accelerator or "",
                 allocation_of: Callable[[PodInfo], str] = lambda p: "",
                 admission_of: Callable[[PodInfo], Admission | None] = lambda p: None) -> None:
        """Buffer a row for each GPU pod whose state changed. ``model_of`` gives its GPU
        model (its selector's, else its node's); a pod keeps the last model known for it
        once its node is gone."""
        for p in pods:
            if p.gpus <= 0:
                continue
            signature = (p.phase, p.node, p.scheduled_unix, p.finished_unix, p.reason)
            if self.pod_signatures.get(p.uid) == signature:
                continue  # unchanged since it was last written
            self.pod_signatures[p.uid] = signature
            model = self.pod_models[p.uid] = model_of(p) or self.pod_models.get(p.uid, "")
            kueue = admission_of(p)
            queued = min(p.created_unix, kueue.queued_unix) if kueue else p.created_unix
            wait = None if p.scheduled_unix is None else p.scheduled_unix - queued
            key = row_id(self.cluster, p.uid, *signature)
            self.pods[key] = {
                "id": key, "cluster": self.cluster,
                "pod_uid": p.uid, "namespace": p.namespace, "pod": p.name,
                "team": team_of(p), "workload": p.workload,
                "owner_kind": p.owner_kind, "gpus": p.gpus, "gpu_model": model or None,
                "node": p.node, "phase": p.phase, "created": _ts(p.created_unix),
                "scheduled": _ts(p.scheduled_unix), "finished": _ts(p.finished_unix),
                "queue_wait_seconds": wait, "reason": p.reason, "priority": p.priority,
                "priority_class": p.priority_class, "queue": p.queue, "updated": _ts(now),
                "allocation": allocation_of(p) or None, "queued": _ts(queued),
                "admission_wait_seconds": kueue.wait_seconds if kueue else None,
                "cluster_queue": (kueue.cluster_queue or None) if kueue else None}

    def add_quotas(self, queues: Iterable[ClusterQueueInfo], now: float) -> None:
        """Buffer a row for each ClusterQueue GPU flavor whose quota changed, or that has
        no row of this UTC day yet (so the last quota outlives the retention). ``queues``
        are all the cluster has: what is remembered of the others (deleted) is forgotten."""
        day = now - now % DAY
        listed: set[tuple[str, str]] = set()
        for q in queues:
            for flavor, f in q.flavors.items():
                listed.add((q.name, flavor))
                signature = (q.cohort, f.nominal_gpus, f.borrowing_limit_gpus, day)
                if self.quota_signatures.get((q.name, flavor)) == signature:
                    continue
                self.quota_signatures[q.name, flavor] = signature
                self.quotas[f"{q.name}/{flavor}"] = {
                    "id": row_id(self.cluster, q.name, flavor, *signature),
                    "cluster": self.cluster, "cluster_queue": q.name, "cohort": q.cohort,
                    "flavor": flavor, "nominal_gpus": f.nominal_gpus,
                    "borrowing_limit_gpus": f.borrowing_limit_gpus, "updated": _ts(now)}
        for gone in self.quota_signatures.keys() - listed:
            del self.quota_signatures[gone]

    def add_workloads(self, workloads: Iterable[WorkloadInfo], now: float,
                      team_of: Callable[[WorkloadInfo], str],
                      cluster_queue_of: Callable[[WorkloadInfo], str],
                      complete: bool) -> None:
        """Buffer a row for each Kueue Workload whose state changed. With ``complete`` (the
        Workloads are all the cluster has), one written before that is no longer among
        them and had not finished gets a last row, ``Deleted`` at ``now``."""
        present = set()
        for w in workloads:
            present.add(w.uid)
            queue = cluster_queue_of(w)
            signature = (w.state, w.queued_unix, w.admitted_unix, w.finished_unix, queue,
                         w.gpus)
            if self.workload_signatures.get(w.uid) == signature:
                continue  # unchanged since it was last written
            self.workload_signatures[w.uid] = signature
            row = {
                "cluster": self.cluster, "workload_uid": w.uid, "namespace": w.namespace,
                "workload": w.name, "owner_kind": w.owner_kind or None,
                "owner_name": w.owner_name or None, "team": team_of(w),
                "local_queue": w.local_queue or None,
                "cluster_queue": queue or None, "gpus": w.gpus,
                "gpu_model": w.accelerator or None,
                "priority_class": w.priority_class or None, "state": w.state,
                "created": _ts(w.created_unix), "queued": _ts(w.queued_unix),
                "admitted": _ts(w.admitted_unix), "finished": _ts(w.finished_unix)}
            self._workload_state(row, now)
        if complete:
            for uid in [u for u in self.workload_rows if u not in present]:
                last = self.workload_rows.pop(uid)
                self.workload_signatures.pop(uid, None)
                if last["state"] in OPEN_WORKLOAD_STATES:
                    self._workload_state(last | {"state": DELETED, "finished": _ts(now)}, now,
                                         last=True)

    def _workload_state(self, row: dict[str, Any], now: float, last: bool = False) -> None:
        """Buffer ``row`` (a ``kueue_workloads`` row, less its id and time) as observed at
        ``now``; remembered unless it is the Workload's ``last``."""
        row = {k: v for k, v in row.items() if k not in ("id", "updated")}
        if not last:
            self.workload_rows[row["workload_uid"]] = row
        key = row_id(self.cluster, row["workload_uid"], row["state"], row["queued"],
                     row["admitted"], row["finished"], row["cluster_queue"])
        self.workloads[key] = row | {"id": key, "updated": _ts(now)}

    def finish_vanished_workloads(self, present: Collection[str], now: float) -> int:
        """End the Workloads the table still shows waiting or admitted that the cluster no
        longer lists: gone while no exporter watched. Their last row is written again with
        state ``Deleted`` and ``finished`` at ``now``, when it was noticed."""
        found = self.con.execute(
            f"SELECT * FROM {KUEUE_WORKLOADS.name} WHERE cluster = {literal(self.cluster)} "
            f"QUALIFY row_number() OVER (PARTITION BY workload_uid ORDER BY updated DESC) = 1")
        names = [c[0] for c in found.description or ()]
        rows = [dict(zip(names, values, strict=True)) for values in found.fetchall()]
        listed = set(present)
        gone = [r for r in rows
                if r["state"] in OPEN_WORKLOAD_STATES and r["workload_uid"] not in listed]
        for row in gone:
            self._workload_state(row | {"state": DELETED, "finished": _ts(now)}, now, last=True)
        return len(gone)

    def finish_vanished(self, present: Collection[str], now: float) -> int:
        """End the pods the table still shows live that the cluster no longer lists: gone
        while no exporter watched (a restart, an outage). Their last row is written again
        with phase ``Deleted`` and ``finished`` at ``now``, when it was noticed."""
        uids = ", ".join(map(literal, present))
        found = self.con.execute(
            f"SELECT * FROM gpu_pods_current WHERE cluster = {literal(self.cluster)} AND "
            f"finished IS NULL AND pod_uid NOT IN (SELECT unnest([{uids}]::VARCHAR[]))")
        names = [c[0] for c in found.description or ()]
        rows = [dict(zip(names, values, strict=True)) for values in found.fetchall()]
        for row in rows:
            row |= {"phase": DELETED, "finished": _ts(now), "updated": _ts(now)}
            row["id"] = row_id(self.cluster, row["pod_uid"], DELETED, row["node"],
                               row["scheduled"], now, row["reason"])
            self.pods[row["id"]] = row
        return len(rows)

    def add_event(self, node: str, pool: str, gpu_uuid: str, reason: str, start: float,
                  end: float) -> None:
        self.events.append({
            "id": row_id(self.cluster, gpu_uuid, reason, start), "cluster": self.cluster,
            "node": node, "node_pool": pool, "gpu_uuid": gpu_uuid, "reason": reason,
            "start_time": _ts(start), "end_time": _ts(end), "seconds": end - start})

    def forget_pod(self, uid: str) -> None:
        """Drop the change-tracking of a pod that is gone for good."""
        self.pod_signatures.pop(uid, None)
        self.pod_models.pop(uid, None)
