"""Server-side printing: ``meta.k8s.io/v1`` Tables, which ``kubectl get`` asks for.

Columns are the ones a real API server prints for nodes, pods and namespaces (``-o wide``
shows the priority-1 columns). Ages are measured against the simulator's clock.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

Obj = dict[str, Any]

_COLUMNS: dict[str, list[tuple[str, str, int]]] = {
    "Node": [("Name", "name", 0), ("Status", "", 0), ("Roles", "", 0), ("Age", "", 0),
             ("Version", "", 0), ("Internal-IP", "", 1), ("External-IP", "", 1),
             ("OS-Image", "", 1), ("Kernel-Version", "", 1), ("Container-Runtime", "", 1)],
    "Pod": [("Name", "name", 0), ("Ready", "", 0), ("Status", "", 0), ("Restarts", "", 0),
            ("Age", "", 0), ("IP", "", 1), ("Node", "", 1), ("Nominated Node", "", 1),
            ("Readiness Gates", "", 1)],
    "Namespace": [("Name", "name", 0), ("Status", "", 0), ("Age", "", 0)],
    "Event": [("Last Seen", "", 0), ("Type", "", 0), ("Reason", "", 0), ("Object", "", 0),
              ("Subobject", "", 1), ("Source", "", 1), ("Message", "", 0),
              ("First Seen", "", 1), ("Count", "", 1), ("Name", "name", 1)],
    # Kueue's printer columns (``+kubebuilder:printcolumn`` of its v1beta2 types)
    "Workload": [("Name", "name", 0), ("Queue", "", 0), ("Reserved in", "", 0),
                 ("Admitted", "", 0), ("Finished", "", 0), ("Age", "date", 0)],
    "ClusterQueue": [("Name", "name", 0), ("Cohort", "", 0), ("Strategy", "", 1),
                     ("Pending Workloads", "", 0), ("Admitted Workloads", "", 1)],
    "LocalQueue": [("Name", "name", 0), ("ClusterQueue", "", 0), ("Pending Workloads", "", 0),
                   ("Admitted Workloads", "", 0)],
}
_INTEGER = frozenset({"Restarts", "Pending Workloads", "Admitted Workloads", "Count"})


def human_duration(seconds: float) -> str:
    """kubectl's age format: 45s, 12m, 3h4m, 5d2h, 400d."""
    s = int(max(0, seconds))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = s // 3600
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if d < 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 365 * 2:
        return f"{d}d"
    return f"{d // 365}y"


def _age(obj: Obj, now: float) -> str:
    return _since(obj["metadata"]["creationTimestamp"], now)


def _since(stamp: str, now: float) -> str:
    """How long ago an RFC 3339 time (seconds, or microseconds) was, as kubectl prints it."""
    stamp = stamp.split(".")[0].rstrip("Z") + "Z"
    return human_duration(now - datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z").timestamp())


def _event_cells(obj: Obj, now: float) -> list[Any]:
    """kubectl's event columns: a series' last observation, else ``lastTimestamp``."""
    series = obj.get("series") or {}
    created = obj["metadata"]["creationTimestamp"]
    last = str(series.get("lastObservedTime") or obj.get("lastTimestamp")
               or obj.get("eventTime") or created)
    first = str(obj.get("firstTimestamp") or obj.get("eventTime") or created)
    inv = obj.get("involvedObject", {})
    source = obj.get("source", {}).get("component") or obj.get("reportingComponent", "")
    if host := obj.get("source", {}).get("host"):
        source += f", {host}"
    return [_since(last, now), obj.get("type", ""), obj.get("reason", ""),
            f"{inv.get('kind', '').lower()}/{inv.get('name', '')}", inv.get("fieldPath", ""),
            source, obj.get("message", ""), _since(first, now),
            series.get("count") or obj.get("count") or 1, obj["metadata"]["name"]]


def column_definitions(kind: str) -> list[Obj]:
    return [{"name": name, "type": "integer" if name in _INTEGER else "string",
             "format": fmt, "description": name, "priority": prio}
            for name, fmt, prio in _COLUMNS[kind]]


def _cells(kind: str, obj: Obj, now: float) -> list[Any]:
    meta, status = obj["metadata"], obj.get("status", {})
    if kind == "Node":
        ready: Obj = next((c for c in status.get("conditions", []) if c["type"] == "Ready"),
                          {})
        state = "Ready" if ready.get("status") == "True" else "NotReady"
        if obj.get("spec", {}).get("unschedulable"):
            state += ",SchedulingDisabled"
        addr = {a["type"]: a["address"] for a in status.get("addresses", [])}
        info = status.get("nodeInfo", {})
        return [meta["name"], state, "<none>", _age(obj, now), info.get("kubeletVersion", ""),
                addr.get("InternalIP", "<none>"), addr.get("ExternalIP", "<none>"),
                info.get("osImage", ""), info.get("kernelVersion", ""),
                info.get("containerRuntimeVersion", "")]
    if kind == "Pod":
        statuses = status.get("containerStatuses", [])
        n_ready = sum(1 for c in statuses if c.get("ready"))
        total = len(obj["spec"]["containers"])
        shown = status.get("phase", "Unknown")
        for c in statuses:
            state = c.get("state", {})
            term = state.get("terminated") or state.get("waiting")
            if term and term.get("reason"):
                shown = term["reason"]
        if status.get("reason"):
            shown = status["reason"]
        return [meta["name"], f"{n_ready}/{total}", shown,
                sum(c.get("restartCount", 0) for c in statuses), _age(obj, now),
                status.get("podIP", "<none>"), obj["spec"].get("nodeName", "<none>"),
                "<none>", "<none>"]
    if kind == "Event":
        return _event_cells(obj, now)
    if kind == "Workload":
        cond = {c["type"]: c["status"] for c in status.get("conditions", [])}
        return [meta["name"], obj["spec"].get("queueName", ""),
                status.get("admission", {}).get("clusterQueue", ""), cond.get("Admitted", ""),
                cond.get("Finished", ""), _age(obj, now)]
    if kind == "ClusterQueue":
        return [meta["name"], obj["spec"].get("cohortName", ""),
                obj["spec"].get("queueingStrategy", ""), status.get("pendingWorkloads", 0),
                status.get("admittedWorkloads", 0)]
    if kind == "LocalQueue":
        return [meta["name"], obj["spec"].get("clusterQueue", ""),
                status.get("pendingWorkloads", 0), status.get("admittedWorkloads", 0)]
    return [meta["name"], status.get("phase", "Active"), _age(obj, now)]


def row(kind: str, obj: Obj, now: float) -> Obj:
    return {"cells": _cells(kind, obj, now),
            "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                       "metadata": obj["metadata"]}}


def table(kind: str, objs: list[Obj], now: float, rv: str, with_columns: bool = True) -> Obj:
    out: Obj = {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
                "metadata": {"resourceVersion": rv},
                "rows": [row(kind, o, now) for o in objs]}
    out["columnDefinitions"] = column_definitions(kind) if with_columns else []
    return out
