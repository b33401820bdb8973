"""Kubernetes state: nodes, GPU pods, namespaces and the events about pods, kept current by
list + watch.

Each kind runs one loop: list (raw JSON), then watch from the list's resourceVersion with
bookmarks and a server-side timeout, resuming from the last version seen. It relists on
410 Gone, and when a watch stays silent longer than the watchdog (no event, no bookmark:
a hung watch is a known GKE failure). Every answer is checked before it is read: an error
status (a list's or a watch's, or a watch's ERROR event) or an answer that is not a list
keeps the last good view, marks the kind down, is counted by its ``label`` (``http_503``,
``http_403``, ``refused``, ``timeout``...) and retried with exponential backoff, full
jitter, capped. Each outage is logged when it begins (a 403 with the RBAC grant it lacks)
and when it ends, with its duration and failed attempts; a kind answered 403 is in
``denied`` (with the grant it lacks) until it lists again. Kueue's API group is discovered
the same way: each failure counted by label in ``discovery_errors``, logged once per
episode. Pods deleted from the cluster are
remembered until the next snapshot takes them, so queue wait and cost keep their creation
and scheduling times, and ``deleted_pod`` gives their last state (ended, whatever phase
they were deleted in).

Events are watched like the other kinds (``involvedObject.kind=Pod``, listed page by page)
but never waited for (``OPTIONAL_KINDS``): a cluster whose RBAC does not grant them is
watched all the same, the kind counted down and denied, and an API that does not serve
them (404) is asked again every ``NOT_SERVED_RETRY``. Of them only what the causes of a
wait need is kept (``pod_events``): per pod that asks for GPUs and is ``Pending``, the
newest event of each reason in ``EVENT_REASONS``, its message cut at
``EVENT_MESSAGE_CHARS``; an update of an event replaces it, a list adds to what is kept
(the API server drops events after an hour; the pod may still wait for the same reason).
A pod's events go when the pod runs, ends or is deleted, those of a pod never listed
``EVENT_UNKNOWN_POD_TTL`` after the last came, and beyond ``MAX_EVENT_PODS`` pods they are
dropped, counted in ``rejected_objects``.

``node_info``, ``pod_info`` and ``pod_event`` are pure: Kubernetes JSON in, frozen records
out. The pods of a template share one ``PodConstraints`` (``ConstraintsTable``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import replace
from datetime import datetime
from typing import Any

import aiohttp

from exporter.backoff import Backoff
from exporter.errors import SourceDataError, SourceError, SourceTimeout, SourceUnavailable
from exporter.logs import Episodes, ctx
from exporter.metrics.health import WatchStats
from exporter.model.records import (
    DELETED,
    NO_CONSTRAINTS,
    ClusterQueueInfo,
    LocalQueueInfo,
    NodeInfo,
    PodConstraints,
    PodEvent,
    PodInfo,
    Requirement,
    Taint,
    Toleration,
    WorkloadInfo,
)
from exporter.sources import kueue
from exporter.sources.kube_client import CredentialError, KubeClient

log = logging.getLogger(__name__)

Obj = dict[str, Any]
GPU = "nvidia.com/gpu"
PATHS = {"nodes": "/api/v1/nodes", "pods": "/api/v1/pods", "namespaces": "/api/v1/namespaces",
         "events": "/api/v1/events",
         **{k: f"/apis/{kueue.GROUP_VERSION}/{k}"
            for k in ("workloads", "clusterqueues", "localqueues")}}
"""Each kind's collection, at the cluster scope."""
SELECTORS = {"events": {"fieldSelector": "involvedObject.kind=Pod"}}
"""What a kind's lists and watches ask for (events: those about pods)."""
PAGED = {"events": 500}
"""Kinds listed page by page (``limit`` and ``continue``), each page applied as it comes:
a cluster keeps an hour of events, a hundred thousand in a large one."""
OPTIONAL_KINDS = ("events",)
"""Watched and counted like the others, never waited for: without them (a ClusterRole
that does not grant them) the view goes on, and only the causes of waits lack the
scheduler's and the autoscaler's words."""
EVENT_REASONS = frozenset({
    "FailedScheduling", "TriggeredScaleUp", "NotTriggerScaleUp", "FailedScaleUp",
    "ScaleUpTimedOut", "Preempted", "Pulling", "Pulled", "Failed", "BackOff"})
"""The reasons of the pod events kept (the scheduler's, the cluster autoscaler's, the
kubelet's image pulls); ``Failed`` and ``BackOff`` only about an image."""
_REASONS = {r: r for r in EVENT_REASONS}
_IMAGE_REASONS = frozenset({"Failed", "BackOff"})
EVENT_MESSAGE_CHARS = 1024
"""An event's message is kept this long (the length the API server allows a note, and
the scheduler cuts its messages at)."""
MAX_EVENT_PODS = 10_000
"""The waiting pods whose events are kept at most (four events take some 1.8 KB a pod,
1 KB where the pods of a job are told the same); the events of more are dropped, counted
as rejected."""
EVENT_UNKNOWN_POD_TTL = 900.0
"""How long the events of a pod the pods watch has not delivered are kept after the last
of them came (its pod may be listed next, or may be gone)."""
EVENT_SWEEP_SECONDS = 60.0
NOT_SERVED_RETRY = 600.0
"""How often an optional kind the API answers 404 (does not serve) is asked for again."""
CONSTRAINTS_KEPT = 4096
"""Distinct pod constraints shared at most (``ConstraintsTable``)."""
WORDS_KEPT = 4096
"""Distinct event messages shared at most (``SharedWords``)."""
KUEUE_KINDS = ("workloads", "clusterqueues", "localqueues")
"""Watched when Kueue's API is served (its CRDs installed)."""
KUEUE_PROBE_INTERVAL = 600.0
"""How often a cluster without Kueue is asked again whether it has it now."""


def _ts(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def node_info(obj: Obj) -> NodeInfo:
    meta, status = obj["metadata"], obj.get("status", {})
    labels = meta.get("labels") or {}
    ready: Obj = next((c for c in status.get("conditions") or []
                       if c.get("type") == "Ready"), {})
    addresses = {a["type"]: a["address"] for a in status.get("addresses") or []}
    clients = labels.get("cloud.google.com/gke-max-shared-clients-per-gpu")
    return NodeInfo(
        name=meta["name"],
        pool=labels.get("cloud.google.com/gke-nodepool", ""),
        accelerator=labels.get("cloud.google.com/gke-accelerator"),
        provisioning="spot" if labels.get("cloud.google.com/gke-spot") == "true" or
        labels.get("cloud.google.com/gke-provisioning") == "spot" else "on-demand",
        zone=labels.get("topology.kubernetes.io/zone", ""),
        instance_type=labels.get("node.kubernetes.io/instance-type", ""),
        ready=ready.get("status") == "True",
        capacity_gpus=int((status.get("capacity") or {}).get(GPU, 0)),
        allocatable_gpus=int((status.get("allocatable") or {}).get(GPU, 0)),
        clients_per_gpu=int(clients) if clients and clients.isdigit() else 1,
        mig_profile=labels.get("cloud.google.com/gke-gpu-partition-size"),
        address=addresses.get("InternalIP", ""),
        labels=dict(labels),
        taints=tuple(Taint(str(t.get("key") or ""), str(t.get("value") or ""),
                           str(t.get("effect") or ""))
                     for t in (obj.get("spec") or {}).get("taints") or []
                     if isinstance(t, dict)),
        unschedulable=bool((obj.get("spec") or {}).get("unschedulable")),
    )


def _workload(meta: Obj, labels: dict[str, str]) -> tuple[str, str]:
    owners = meta.get("ownerReferences") or []
    owner = next((o for o in owners if o.get("controller")), owners[0] if owners else None)
    if owner is None:
        return meta["name"], "Pod"
    name, kind = owner["name"], owner["kind"]
    template_hash = labels.get("pod-template-hash")
    if kind == "ReplicaSet" and template_hash and name.endswith("-" + template_hash):
        return name[: -len(template_hash) - 1], "Deployment"
    return name, kind


ConstraintsKey = tuple[tuple[tuple[str, str], ...], tuple[tuple[Requirement, ...], ...],
                       tuple[Toleration, ...]]
"""A pod's constraints as a hashable value: its node selector's items, sorted, its
required node-affinity terms and its tolerations."""


def constraints_key(spec: Obj) -> ConstraintsKey:
    """Where a pod's spec lets it run: ``nodeSelector``, the terms of
    ``requiredDuringSchedulingIgnoredDuringExecution`` (a ``matchFields`` requirement on
    key ``metadata.name``, the node's name) and ``tolerations``."""
    selector = spec.get("nodeSelector") or {}
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = tuple(
        tuple(_requirement(e) for e in t.get("matchExpressions") or [])
        + tuple(_requirement(e, "metadata.name") for e in t.get("matchFields") or [])
        for t in required.get("nodeSelectorTerms") or [] if isinstance(t, dict))
    tolerations = tuple(
        Toleration(key=str(t["key"]) if t.get("key") else None,
                   operator=str(t.get("operator") or "Equal"), value=str(t.get("value") or ""),
                   effect=str(t["effect"]) if t.get("effect") else None)
        for t in spec.get("tolerations") or [] if isinstance(t, dict))
    return (tuple(sorted((str(k), str(v)) for k, v in selector.items())), terms, tolerations)


def _requirement(e: Obj, key: str | None = None) -> Requirement:
    return Requirement(key or str(e.get("key") or ""), str(e.get("operator") or ""),
                       tuple(str(v) for v in e.get("values") or ()))


def pod_constraints(spec: Obj) -> PodConstraints:
    """A pod's constraints (``constraints_key``) as a record of its own."""
    return _constraints(constraints_key(spec))


def _constraints(key: ConstraintsKey) -> PodConstraints:
    selector, affinity, tolerations = key
    if not (selector or affinity or tolerations):
        return NO_CONSTRAINTS
    return PodConstraints(dict(selector), affinity, tolerations)


class ConstraintsTable:
    """One ``PodConstraints`` per distinct set of constraints: the pods of a template (a
    Job's, a Deployment's) share one record instead of each holding its own copy of the
    same selector, terms and tolerations. It remembers at most ``size`` sets, dropping
    the oldest first (the pods that hold one keep it)."""

    def __init__(self, size: int = CONSTRAINTS_KEPT) -> None:
        self._size = size
        self._known: dict[ConstraintsKey, PodConstraints] = {}

    def __call__(self, spec: Obj) -> PodConstraints:
        key = constraints_key(spec)
        if not any(key):
            return NO_CONSTRAINTS
        got = self._known.get(key)
        if got is None:
            if len(self._known) >= self._size:
                del self._known[next(iter(self._known))]
            got = self._known[key] = _constraints(key)
        return got

    def __len__(self) -> int:
        return len(self._known)


class SharedWords:
    """One string per distinct event message: the pods of a job are told the same by the
    scheduler and the autoscaler, and keep one copy of it between them. It remembers at
    most ``size`` messages, dropping the oldest first (the events that hold one keep it)."""

    def __init__(self, size: int = WORDS_KEPT) -> None:
        self._size = size
        self._known: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        got = self._known.get(text)
        if got is None:
            if len(self._known) >= self._size:
                del self._known[next(iter(self._known))]
            got = self._known[text] = text
        return got


def _waiting_reason(status: Obj) -> str | None:
    """Why its containers wait, while none of them runs: an init container's waiting
    reason first (they run first), else a container's."""
    containers = status.get("containerStatuses") or []
    if any((cs.get("state") or {}).get("running") for cs in containers):
        return None
    for cs in (*(status.get("initContainerStatuses") or []), *containers):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return str(waiting["reason"])
    return None


def pod_info(obj: Obj, annotations: Collection[str] = (),
             constraints: Callable[[Obj], PodConstraints] = pod_constraints) -> PodInfo:
    """The pod as the exporter keeps it; of its annotations, only those named (the others,
    ``kubectl.kubernetes.io/last-applied-configuration`` among them, can be large); its
    constraints as ``constraints`` gives them (a ``ConstraintsTable`` shares them)."""
    meta, spec, status = obj["metadata"], obj.get("spec", {}), obj.get("status", {})
    labels = meta.get("labels") or {}
    notes = (meta.get("annotations") or {}) if annotations else {}
    gpus = 0
    ports: dict[str, int] = {}
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        want = (res.get("limits") or {}).get(GPU) or (res.get("requests") or {}).get(GPU)
        gpus += int(want or 0)
        for p in c.get("ports") or []:
            if p.get("name") and p.get("containerPort"):
                ports[p["name"]] = int(p["containerPort"])
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    sched = conditions.get("PodScheduled", {})
    unscheduled = sched if sched.get("status") == "False" else {}
    finished = None
    reason = status.get("reason")
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            t = _ts(term.get("finishedAt"))
            finished = max(finished or 0.0, t or 0.0) or None
            reason = reason or term.get("reason")
    workload, owner_kind = _workload(meta, labels)
    return PodInfo(
        uid=meta.get("uid", ""), namespace=meta.get("namespace", ""), name=meta["name"],
        node=spec.get("nodeName"), phase=status.get("phase", "Unknown"), gpus=gpus,
        created_unix=_ts(meta.get("creationTimestamp")) or 0.0,
        scheduled_unix=_ts(sched.get("lastTransitionTime")) if sched.get("status") == "True"
        else None,
        finished_unix=finished, labels=dict(labels), workload=workload, owner_kind=owner_kind,
        priority=int(spec.get("priority") or 0),
        priority_class=spec.get("priorityClassName") or "",
        queue=labels.get("kueue.x-k8s.io/queue-name"),
        accelerator=(spec.get("nodeSelector") or {}).get("cloud.google.com/gke-accelerator"),
        reason=reason, container_ports=ports, ip=status.get("podIP"),
        deleted_unix=_ts(meta.get("deletionTimestamp")),
        annotations={k: str(notes[k]) for k in annotations if k in notes},
        constraints=constraints(spec),
        scheduling_gates=tuple(str(g.get("name") or "") for g in spec.get("schedulingGates")
                               or [] if isinstance(g, dict)),
        unschedulable_reason=str(unscheduled.get("reason") or "") or None
        if unscheduled else None,
        unschedulable_message=str(unscheduled.get("message") or ""),
        unschedulable_unix=_ts(unscheduled.get("lastTransitionTime")),
        waiting_reason=_waiting_reason(status),
        disrupted=(conditions.get("DisruptionTarget") or {}).get("status") == "True",
    )


def pod_event(obj: Obj) -> PodEvent | None:
    """An Event about a pod, as the events watch keeps it; None for one about another kind
    or of a reason not in ``EVENT_REASONS``. Reads ``core/v1``'s fields (``involvedObject``,
    ``source.component``, ``firstTimestamp``, ``lastTimestamp``, ``count``) and those an
    event recorded through ``events.k8s.io/v1`` has instead (``eventTime``, ``series``,
    ``reportingComponent``; ``regarding``, ``note``, ``reportingController`` and the
    ``deprecated`` fields in that API's own shape). ``SourceDataError`` (or ``KeyError``,
    ``TypeError``, ``ValueError``) for one that cannot be read."""
    about = obj.get("involvedObject") or obj.get("regarding") or {}
    if about.get("kind") != "Pod":
        return None
    reason = str(obj.get("reason") or "")
    if reason not in EVENT_REASONS:
        return None
    message = str(obj.get("message") or obj.get("note") or "")
    if reason in _IMAGE_REASONS and "image" not in message.lower():
        return None
    uid = about.get("uid")
    if not uid:
        raise SourceDataError("kubernetes", "events", "an event about a pod names no pod uid")
    series = obj.get("series") or {}
    source = obj.get("source") or obj.get("deprecatedSource") or {}
    said = _ts(obj.get("eventTime"))
    last = _ts(obj.get("lastTimestamp") or obj.get("deprecatedLastTimestamp")) or \
        _ts(series.get("lastObservedTime")) or said
    first = _ts(obj.get("firstTimestamp") or obj.get("deprecatedFirstTimestamp")) or said \
        or last or _ts((obj.get("metadata") or {}).get("creationTimestamp"))
    last = last or first
    if first is None or last is None:
        raise SourceDataError("kubernetes", "events", "an event with no time")
    count = obj.get("count") or obj.get("deprecatedCount") or series.get("count") or 1
    return PodEvent(
        namespace=str(about.get("namespace") or (obj.get("metadata") or {}).get("namespace")
                      or ""),
        pod=str(about.get("name") or ""), pod_uid=str(uid), reason=reason,
        message=message[:EVENT_MESSAGE_CHARS],
        component=str(source.get("component") or obj.get("reportingComponent")
                      or obj.get("reportingController") or ""),
        first_unix=first, last_unix=max(first, last), count=int(count))


def _waits_for_gpus(pod: PodInfo) -> bool:
    """Whether the events about a pod can tell why it waits: it asks for GPUs and is
    ``Pending`` (the causes of a wait read no other pod's)."""
    return pod.gpus > 0 and pod.phase == "Pending"


_ENDED = frozenset({"Succeeded", "Failed", DELETED})


def deleted_pod(pod: PodInfo, noticed: float) -> PodInfo:
    """The last state of a pod deleted from the cluster, ``noticed`` gone at that time.

    A pod that had ended keeps its phase and finish time. Any other (deleted while Pending
    or Running: a force deletion, a lost node, a cancelled job) ends in phase ``Deleted``,
    finished at its ``deletionTimestamp`` or, without one or if it was noticed gone earlier,
    when it was noticed gone. A pod never scheduled stays so."""
    when = noticed if pod.deleted_unix is None else min(pod.deleted_unix, noticed)
    if pod.phase in _ENDED:
        return pod if pod.finished_unix is not None else replace(pod, finished_unix=when)
    return replace(pod, phase=DELETED, finished_unix=when)


class KubeSource:
    """Nodes, pods and namespaces of one cluster, and the events about its GPU pods,
    current within a watch's latency."""

    name = "kubernetes"

    def __init__(self, api: KubeClient, *, watch_timeout: float = 300.0,
                 watchdog: float = 120.0, request_timeout: float = 30.0,
                 backoff: Callable[[], Backoff] = Backoff,
                 clock: Callable[[], float] = time.time,
                 annotations: Collection[str] = (),
                 max_event_pods: int = MAX_EVENT_PODS) -> None:
        self._api = api
        self._annotations = tuple(annotations)
        """The pod annotations kept (``allocation.annotation``)."""
        self._constraints = ConstraintsTable()
        """The pods' constraints, shared between the pods of a template."""
        self._words = SharedWords()
        """The events' messages, shared between the pods told the same."""
        self.pod_events: dict[str, dict[str, PodEvent]] = {}
        """Pod uid -> reason -> the newest event of that reason about the pod, for the pods
        that ask for GPUs and wait (``Pending``), or are not known yet. A pod's table is
        replaced, never changed in place: a shallow copy of this one is a snapshot."""
        self._max_event_pods = max_event_pods
        self._event_heard: dict[str, float] = {}
        """Pod uid -> when (``clock``) an event last came about a pod not known then."""
        self._next_event_sweep = 0.0
        self._clock = clock
        self._watch_timeout = watch_timeout
        self._watchdog = watchdog
        self._request_timeout = request_timeout
        self._backoff = backoff
        self.nodes: dict[str, NodeInfo] = {}
        self.pods: dict[str, PodInfo] = {}
        self.namespace_labels: dict[str, dict[str, str]] = {}
        self.deleted_pods: dict[str, PodInfo] = {}
        self.stats: dict[str, WatchStats] = {k: WatchStats() for k in ("nodes", "pods",
                                                                       "namespaces",
                                                                       *OPTIONAL_KINDS)}
        self.synced: dict[str, asyncio.Event] = {k: asyncio.Event() for k in self.stats}
        self.up: dict[str, bool] = dict.fromkeys(self.stats, False)
        self.resource_versions: dict[str, int] = dict.fromkeys(self.stats, 0)
        """The last resourceVersion each kind has applied."""
        self._episodes = Episodes(log)
        self.last_success: dict[str, float] = {}
        """When each kind last heard from the API (a list, a watch event or bookmark, a
        watch the server ended), on ``clock``; absent before its first list."""
        self._tasks: list[asyncio.Task[None]] = []
        self.workloads: dict[str, WorkloadInfo] = {}
        """Kueue's Workloads by uid (empty without Kueue)."""
        self.cluster_queues: dict[str, ClusterQueueInfo] = {}
        self.local_queues: dict[tuple[str, str], LocalQueueInfo] = {}
        self.kueue: bool | None = None
        """Whether the cluster serves Kueue's API; None until asked."""
        self._paths = dict(PATHS)
        """Each kind's collection (Kueue's at the version the cluster serves)."""
        self._kueue_asked = asyncio.Event()
        self.rejected_objects: dict[str, int] = {}
        """Objects of a kind skipped because they could not be read, by kind."""
        self.denied: dict[str, str] = {}
        """Kind -> what RBAC grant it lacks, while its requests are answered 403."""
        self.discovery_up: dict[str, bool] = {}
        """API group -> whether its last discovery was answered (served or not); absent
        before the first."""
        self.discovery_errors: dict[tuple[str, str], int] = {}
        """(API group, ``SourceError.label``) -> failed discoveries."""
        self.discovery_error: dict[str, str] = {}
        """API group -> the last failed discovery's error, while it fails."""

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._run("nodes", self._apply_node)),
            asyncio.create_task(self._run("pods", self._apply_pod)),
            asyncio.create_task(self._run("namespaces", self._apply_namespace)),
            asyncio.create_task(self._run("events", self._apply_event)),
            asyncio.create_task(self._find_kueue()),
        ]

    async def _find_kueue(self) -> None:
        """Watch Kueue's Workloads and queues once its API is served (``v1beta2``, else the
        ``v1beta1`` of Kueue before 0.15); ask again every ``KUEUE_PROBE_INTERVAL`` while it
        is not (absent Kueue, nothing else changes), sooner after an answer that says
        neither."""
        backoff = self._backoff()
        while True:
            found: str | None = None
            unknown: str | None = None
            label = ""
            for version in kueue.GROUP_VERSIONS:
                try:
                    resp = await self._api.get(f"/apis/{version}",
                                               total_seconds=self._request_timeout)
                    status = resp.status
                    resp.release()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    err = _translate("workloads", "discover", exc, self._request_timeout)
                    unknown, label = err.reason, err.label
                    break
                if status == 200:
                    found = version
                    break
                if status != 404:
                    unknown, label = f"HTTP {status} on discovery of {version}", \
                        f"http_{status}"
                    break
            group = kueue.GROUP
            if unknown is not None:
                self.discovery_up[group] = False
                self.discovery_error[group] = unknown
                self.discovery_errors[(group, label)] = \
                    self.discovery_errors.get((group, label), 0) + 1
                fields: dict[str, Any] = {"group": group, "reason": label, "error": unknown}
                if label == "http_403":
                    fields["rbac"] = ("cannot get the API group's discovery document: grant "
                                      "get on the non-resource URL /apis/* (the default "
                                      "system:discovery role does)")
                self._kueue_asked.set()   # the view goes on; readiness says what it lacks
                self._episodes.failed(("kueue", "discovery"), self._clock(),
                                      "kueue discovery failed", **fields)
                await asyncio.sleep(backoff.next())
                continue
            self.discovery_up[group] = True
            self.discovery_error.pop(group, None)
            self._kueue_asked.set()   # the view goes on, with or without Kueue
            backoff.reset()
            self._episodes.recovered(("kueue", "discovery"), self._clock(),
                                     "kueue discovery recovered", group=group)
            if found is None:
                self.kueue = False
                await asyncio.sleep(KUEUE_PROBE_INTERVAL)
                continue
            self.kueue = True
            for kind in KUEUE_KINDS:
                self._paths[kind] = f"/apis/{found}/{kind}"
                self.stats[kind] = WatchStats()
                self.synced[kind] = asyncio.Event()
                self.up[kind] = False
                self.resource_versions[kind] = 0
            self._tasks += [asyncio.create_task(self._run(k, self._apply_kueue(k)))
                            for k in KUEUE_KINDS]
            log.info("kueue found: watching its workloads and queues", extra=ctx(api=found))
            return

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []

    async def wait_synced(self) -> None:
        """Return once every kind has been listed at least once (Kueue's too, when the
        cluster has it), but for ``OPTIONAL_KINDS``."""
        await self._kueue_asked.wait()
        for kind, ev in list(self.synced.items()):
            if kind not in OPTIONAL_KINDS:
                await ev.wait()

    def age(self, kind: str) -> float | None:
        """Seconds since ``kind`` last heard from the API; None before its first list."""
        last = self.last_success.get(kind)
        return None if last is None else max(0.0, self._clock() - last)

    def take_deleted_pods(self) -> list[PodInfo]:
        """Pods deleted since the last call, in their last known state."""
        out = list(self.deleted_pods.values())
        self.deleted_pods.clear()
        return out

    # ------------------------------------------------------------------ applying events

    def _apply_node(self, etype: str, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if etype == "DELETED":
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = node_info(obj)

    def _apply_pod(self, etype: str, obj: Obj) -> None:
        info = pod_info(obj, self._annotations, self._constraints)
        if etype == "DELETED":
            self.pods.pop(info.uid, None)
            self.deleted_pods[info.uid] = info
            self._forget_events(info.uid)
        else:
            self.pods[info.uid] = info
            if not _waits_for_gpus(info):
                self._forget_events(info.uid)

    def _apply_event(self, etype: str, obj: Obj) -> None:
        """Keep a pod's event if it is the newest of its reason about the pod. An event's
        own deletion (the API server keeps them an hour) leaves it: the pod may still wait
        for the same reason, said no more."""
        if etype == "DELETED":
            return
        try:
            event = pod_event(obj)
        except (SourceDataError, KeyError, TypeError, ValueError, AttributeError) as exc:
            self._reject("events", obj, exc)
            return
        if event is not None:
            self._keep_event(event)

    def _keep_event(self, event: PodEvent) -> None:
        now = self._clock()
        self._sweep_events(now)
        uid = event.pod_uid
        pod = self.pods.get(uid)
        if pod is not None and not _waits_for_gpus(pod):
            return
        held = self.pod_events.get(uid)
        if held is None:
            if len(self.pod_events) >= self._max_event_pods:
                self.rejected_objects["events"] = self.rejected_objects.get("events", 0) + 1
                self._episodes.failed(("events", "full"), now, "pod events dropped",
                                      resource="events", max_pods=self._max_event_pods)
                return
            self._episodes.recovered(("events", "full"), now, "pod events kept again",
                                     resource="events")
            held = {}
        old = held.get(event.reason)
        if old is not None and old.last_unix > event.last_unix:
            return  # an older one of the same reason, come late
        same = next(iter(held.values()), event)  # one copy of the pod's names per pod
        event = replace(event, message=self._words(event.message),
                        component=self._words(event.component), reason=_REASONS[event.reason],
                        pod_uid=same.pod_uid, namespace=same.namespace, pod=same.pod)
        self.pod_events[uid] = {**held, event.reason: event}
        if pod is None:
            self._event_heard[uid] = now

    def _sweep_events(self, now: float) -> None:
        """Forget the events of pods not known ``EVENT_UNKNOWN_POD_TTL`` after the last of
        them came (once a minute at most, and only while the pods are listed)."""
        if now < self._next_event_sweep or not self.synced["pods"].is_set():
            return
        self._next_event_sweep = now + EVENT_SWEEP_SECONDS
        for uid, heard in list(self._event_heard.items()):
            if uid in self.pods:
                del self._event_heard[uid]
            elif now - heard > EVENT_UNKNOWN_POD_TTL:
                self._forget_events(uid)

    def _forget_events(self, uid: str) -> None:
        self.pod_events.pop(uid, None)
        self._event_heard.pop(uid, None)

    def _apply_namespace(self, etype: str, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if etype == "DELETED":
            self.namespace_labels.pop(name, None)
        else:
            self.namespace_labels[name] = dict(obj["metadata"].get("labels") or {})

    def _kueue_object(self, kind: str, obj: Obj) -> tuple[Any, Any] | None:
        """(key, record) of a Kueue object; None (counted, logged once) if unreadable."""
        try:
            if kind == "workloads":
                w = kueue.workload_info(obj)
                return w.uid, w
            if kind == "clusterqueues":
                q = kueue.cluster_queue_info(obj)
                return q.name, q
            lq = kueue.local_queue_info(obj)
            return (lq.namespace, lq.name), lq
        except (SourceDataError, KeyError, TypeError, ValueError, AttributeError) as exc:
            self._reject(kind, obj, exc)
            return None

    def _reject(self, kind: str, obj: Any, exc: Exception) -> None:
        """Count an object of ``kind`` that cannot be read; log the first of an episode."""
        self.rejected_objects[kind] = self.rejected_objects.get(kind, 0) + 1
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        self._episodes.failed((kind, "object"), self._clock(), "kubernetes object skipped",
                              resource=kind, name=str(name), error=str(exc)[:300])

    def _kueue_table(self, kind: str) -> dict[Any, Any]:
        tables: dict[str, dict[Any, Any]] = {
            "workloads": self.workloads, "clusterqueues": self.cluster_queues,
            "localqueues": self.local_queues}
        return tables[kind]

    def _apply_kueue(self, kind: str) -> Callable[[str, Obj], None]:
        def apply(etype: str, obj: Obj) -> None:
            got = self._kueue_object(kind, obj)
            if got is None:
                return
            table = self._kueue_table(kind)
            if etype == "DELETED":
                table.pop(got[0], None)
            else:
                table[got[0]] = got[1]
        return apply

    def _replace(self, kind: str, items: list[Obj]) -> None:
        """A fresh list replaces the store; objects gone from it count as deleted."""
        if kind in KUEUE_KINDS:
            table = self._kueue_table(kind)
            fresh = dict(got for o in items if (got := self._kueue_object(kind, o)))
            table.clear()
            table.update(fresh)
        elif kind == "pods":
            fresh = {}
            for obj in items:
                info = pod_info(obj, self._annotations, self._constraints)
                fresh[info.uid] = info
            for uid, old in self.pods.items():
                if uid not in fresh:
                    self.deleted_pods[uid] = old
                    self._forget_events(uid)
            self.pods = fresh
            for uid in [u for u in self.pod_events
                        if u in fresh and not _waits_for_gpus(fresh[u])]:
                self._forget_events(uid)
        elif kind == "events":  # a list adds to what the watch kept (events expire)
            for obj in items:
                self._apply_event("ADDED", obj)
        elif kind == "nodes":
            self.nodes = {n.name: n for n in map(node_info, items)}
        else:
            self.namespace_labels = {o["metadata"]["name"]: dict(o["metadata"].get("labels")
                                                                 or {}) for o in items}

    # ------------------------------------------------------------------ the loop

    async def _run(self, kind: str, apply: Callable[[str, Obj], None]) -> None:
        stats = self.stats[kind]
        backoff = self._backoff()
        while True:
            verb = "list"
            try:
                rv = await self._list(kind)
                backoff.reset()
                verb = "watch"
                await self._watch(kind, apply, rv)
            except asyncio.CancelledError:
                raise
            except _Relist as exc:
                log.info("relisting", extra=ctx(resource=kind, cause=str(exc)))
                continue
            except Exception as exc:  # one failing watch never stops the others
                err = _translate(kind, verb, exc, self._request_timeout)
                if err.status == 404 and kind in OPTIONAL_KINDS and verb == "list":
                    self.up[kind] = False  # not served: no error, asked again in a while
                    self._episodes.failed((kind, "served"), self._clock(),
                                          "kubernetes kind not served", resource=kind,
                                          error=err.reason, retry_in_seconds=NOT_SERVED_RETRY)
                    await asyncio.sleep(NOT_SERVED_RETRY)
                    continue
                stats.errors += 1
                stats.reasons[err.label] = stats.reasons.get(err.label, 0) + 1
                stats.last_error = err.reason
                self.up[kind] = False
                delay = backoff.next()
                fields: dict[str, Any] = {"resource": kind, "verb": verb, "reason": err.label}
                if err.status is not None:
                    fields["status"] = err.status
                if err.status == 403:
                    fields["rbac"] = self.denied[kind] = rbac_hint(kind, verb)
                fields |= {"error": err.reason, "retry_in_seconds": round(delay, 2)}
                if not self._episodes.failed((kind, "api"), self._clock(),
                                             "kubernetes request failed", **fields):
                    log.debug("kubernetes request failed", extra=ctx(**fields))
                await asyncio.sleep(delay)

    async def _list(self, kind: str) -> str:
        params = dict(SELECTORS.get(kind, {}))
        while True:  # one page, or (``PAGED``) until the last
            if kind in PAGED:
                params["limit"] = str(PAGED[kind])
            resp = await self._api.get(self._paths[kind], params or None,
                                       total_seconds=self._request_timeout)
            if resp.status == 410 and "continue" in params:
                resp.release()
                raise _Relist("list continuation expired (410)")
            if resp.status != 200:
                raise await _http_error(kind, "list", resp)
            try:
                raw = await resp.read()
            finally:
                resp.release()
            items, rv, more = list_page(kind, raw)
            self._replace(kind, items)
            if not (more and kind in PAGED):
                break
            params["continue"] = more
        self.stats[kind].lists += 1
        self.up[kind] = True
        self.denied.pop(kind, None)
        self.last_success[kind] = self._clock()
        self.synced[kind].set()
        self._episodes.recovered((kind, "api"), self._clock(), "kubernetes recovered",
                                 resource=kind)
        self._episodes.recovered((kind, "served"), self._clock(), "kubernetes kind served",
                                 resource=kind)
        self.resource_versions[kind] = int(rv)
        return rv

    async def _watch(self, kind: str, apply: Callable[[str, Obj], None], rv: str) -> None:
        stats = self.stats[kind]
        while True:
            params = {**SELECTORS.get(kind, {}), "watch": "1", "resourceVersion": rv,
                      "allowWatchBookmarks": "true",
                      "timeoutSeconds": str(int(self._watch_timeout))}
            try:  # the watchdog covers the request too: a stalled server hangs it
                async with asyncio.timeout(self._watchdog):
                    resp = await self._api.get(self._paths[kind], params,
                                               total_seconds=self._watch_timeout + 30)
            except TimeoutError:
                stats.watchdog_relists += 1
                raise _Relist(f"watch silent for {self._watchdog:g} s") from None
            if resp.status != 200:
                raise await _http_error(kind, "watch", resp)
            try:
                while True:
                    try:
                        async with asyncio.timeout(self._watchdog):
                            line = await resp.content.readline()
                    except TimeoutError:
                        stats.watchdog_relists += 1
                        raise _Relist(f"watch silent for {self._watchdog:g} s") from None
                    if not line:  # the server ended the watch (its timeout)
                        stats.watch_restarts += 1
                        self.last_success[kind] = self._clock()
                        break
                    if not line.strip():
                        continue
                    etype, obj = watch_event(kind, line)
                    if etype == "ERROR":
                        status = _WatchError.of(obj)
                        if status.code == 410:
                            stats.expired += 1
                            raise _Relist("resource version expired (410)")
                        raise status
                    self.last_success[kind] = self._clock()
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    self.resource_versions[kind] = int(rv)
                    if etype in ("ADDED", "MODIFIED", "DELETED"):
                        apply(etype, obj)
            finally:
                resp.close()  # an unfinished stream's connection cannot be reused


class _Relist(Exception):
    """Drop the watch and list again."""


class _WatchError(Exception):
    """A watch's ERROR event: a Status with its code and reason."""

    def __init__(self, code: int | None, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason

    @classmethod
    def of(cls, status: Obj) -> _WatchError:
        code = status.get("code")
        return cls(code if isinstance(code, int) else None,
                   f"{status.get('reason')}: {status.get('message')}")


def watch_event(kind: str, line: bytes) -> tuple[str, Obj]:
    """The type and object of a watch line; ``SourceDataError`` if it is no event."""
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    if isinstance(event, dict) and event.get("kind") == "Status" and "type" not in event:
        return "ERROR", event  # a bare Status instead of an event
    if not isinstance(event, dict) or not isinstance(event.get("type"), str) or \
            not isinstance(event.get("object"), dict):
        text = line[:200].decode("utf-8", errors="replace").strip()
        raise SourceDataError("kubernetes", kind, f"watch line is not an event: {text}")
    return event["type"], event["object"]


def list_body(kind: str, raw: bytes) -> tuple[list[Obj], str]:
    """The items and resourceVersion of a list answer; ``SourceDataError`` if it is none."""
    items, rv, _ = list_page(kind, raw)
    return items, rv


def list_page(kind: str, raw: bytes) -> tuple[list[Obj], str, str]:
    """The items, resourceVersion and ``continue`` token ("" on the last page) of a list
    answer; ``SourceDataError`` if it is none."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise SourceDataError("kubernetes", kind, f"list answer is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        body = {}
    meta = body.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    items = body.get("items")
    if body.get("kind") == "Status" or not rv or not isinstance(items, list | None):
        raise SourceDataError("kubernetes", kind, "list answer has no items and "
                              f"resourceVersion: {raw[:200]!r}")
    more = meta.get("continue") if isinstance(meta, dict) else None
    return items or [], str(rv), str(more or "")


def rbac_hint(kind: str, verb: str) -> str:
    """What a 403 on ``verb`` of ``kind`` lacks (deploy/rbac.yaml grants it)."""
    return (f"cannot {verb} {kind} at the cluster scope: grant get/list/watch on {kind} to "
            "the exporter's ClusterRole (deploy/rbac.yaml)")


async def _http_error(kind: str, verb: str, resp: Any) -> SourceUnavailable:
    """An answer other than 200, as an error with its status and the Status' message."""
    try:
        raw = await resp.content.read(64 * 1024)
    except (aiohttp.ClientError, TimeoutError):
        raw = b""
    finally:
        resp.release()
    message = ""
    with contextlib.suppress(ValueError):
        body = json.loads(raw)
        if isinstance(body, dict):
            message = str(body.get("message") or "")
    message = message or raw[:200].decode("utf-8", errors="replace").strip()
    return SourceUnavailable("kubernetes", kind, f"HTTP {resp.status} on {verb}: {message}",
                             status=resp.status)


def _translate(kind: str, verb: str, exc: Exception, timeout: float) -> SourceError:
    """A failure of a request, as the exporter's error (library errors end here)."""
    if isinstance(exc, SourceError):
        return exc
    if isinstance(exc, _WatchError):  # a watch's ERROR event: a Status
        return SourceUnavailable("kubernetes", kind,
                                 f"HTTP {exc.code} on {verb}: {exc.reason}",
                                 status=exc.code or None)
    if isinstance(exc, CredentialError):
        return SourceUnavailable("kubernetes", kind, f"{verb}: {exc}", label="credentials")
    if isinstance(exc, TimeoutError):
        return SourceTimeout("kubernetes", kind, f"no answer to {verb} in {timeout:g} s")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return SourceUnavailable("kubernetes", kind, f"{verb}: {exc}", label="refused")
    if isinstance(exc, aiohttp.ClientError):
        return SourceUnavailable("kubernetes", kind, f"{verb}: {type(exc).__name__}: {exc}")
    return SourceDataError("kubernetes", kind, f"{verb}: {type(exc).__name__}: {exc}")
