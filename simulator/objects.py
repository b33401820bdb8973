"""Kubernetes API objects (Node, Pod, Namespace) for the simulated cluster, shaped as GKE's.

Pure functions from simulator state to the JSON a real API server returns, labels and
conditions included, so that kubectl and kubernetes_asyncio read them unchanged.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from simulator.placement import UNREACHABLE, Placement, node_labels, node_taints
from simulator.rng import hex_id, key, uuid_str
from simulator.scenario import Namespace, Scenario, Workload

if TYPE_CHECKING:
    from simulator.cluster import Node, Pod

Obj = dict[str, Any]

DCGM_NAMESPACE = "gke-managed-system"
DCGM_LABELS = {"app.kubernetes.io/name": "gke-managed-dcgm-exporter",
               "k8s-app": "dcgm-exporter"}
DCGM_PORT = 9400
DISRUPTIONS = frozenset({"Terminated", "NodeLost", "ScaleDown"})
"""Reasons a pod ended because its node went (``DisruptionTarget=True``)."""


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def namespace(ns: Namespace, created: float, seed: int) -> Obj:
    labels = {"kubernetes.io/metadata.name": ns.name, **ns.labels}
    if ns.team:
        labels["team"] = ns.team
    return {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns.name, "uid": uuid_str(seed, key("ns/" + ns.name)),
                     "creationTimestamp": rfc3339(created), "labels": labels},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def node(n: Node, scenario: Scenario, now: float) -> Obj:
    pool = n.pool
    cpu, memory = _machine_size(pool.machine_type)
    labels = {**node_labels(pool, scenario), "kubernetes.io/hostname": n.name}
    taints = node_taints(pool)
    if not n.ready:
        taints.append({"key": UNREACHABLE, "effect": "NoSchedule",
                       "timeAdded": rfc3339(n.ready_since)})
        taints.append({"key": UNREACHABLE, "effect": "NoExecute",
                       "timeAdded": rfc3339(n.ready_since)})
    gpus = str(len(n.units))
    if n.ready:
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "kubelet is posting ready status"}
    else:
        ready = {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                 "message": "Kubelet stopped posting node status."}
    ready |= {"lastHeartbeatTime": rfc3339(now), "lastTransitionTime": rfc3339(n.ready_since)}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": n.name, "uid": n.uid, "creationTimestamp": rfc3339(n.created_at),
                     "labels": labels,
                     "annotations": {"container.googleapis.com/instance_id":
                                     str(key(n.name) % 10**19)}},
        "spec": {"providerID": f"gce://{scenario.project}/{pool.zone}/{n.name}",
                 "podCIDR": f"10.52.{n.ordinal % 256}.0/24", "taints": taints},
        "status": {
            "capacity": {"cpu": str(cpu), "memory": f"{memory}Gi", "pods": "110",
                         "ephemeral-storage": "98831908Ki", "nvidia.com/gpu": gpus},
            "allocatable": {"cpu": f"{cpu * 1000 - 1930}m", "memory": f"{memory - 8}Gi",
                            "pods": "110", "ephemeral-storage": "47060071478",
                            "nvidia.com/gpu": str(n.allocatable)},
            "conditions": [
                {"type": "MemoryPressure", "status": "False",
                 "reason": "KubeletHasSufficientMemory",
                 "message": "kubelet has sufficient memory available",
                 "lastHeartbeatTime": rfc3339(now), "lastTransitionTime": rfc3339(n.created_at)},
                ready,
            ],
            "addresses": [{"type": "InternalIP", "address": n.address},
                          {"type": "Hostname", "address": n.name}],
            "nodeInfo": {
                "architecture": "amd64", "operatingSystem": "linux",
                "osImage": "Container-Optimized OS from Google",
                "kernelVersion": "6.6.97+", "containerRuntimeVersion": "containerd://2.0.6",
                "kubeletVersion": scenario.kubernetes_version,
                "kubeProxyVersion": scenario.kubernetes_version,
                "machineID": n.uid.replace("-", ""), "systemUUID": n.uid,
                "bootID": n.uid,
            },
        },
    }


def _machine_size(machine_type: str) -> tuple[int, int]:
    """vCPUs and GiB of memory of a GCE machine type."""
    known = {
        "a3-ultragpu-8g": (224, 2952), "a3-highgpu-8g": (208, 1872), "a2-ultragpu-8g": (96, 1360),
        "a2-ultragpu-4g": (48, 680), "a2-ultragpu-2g": (24, 340), "a2-ultragpu-1g": (12, 170),
        "a2-megagpu-16g": (96, 1360), "a2-highgpu-8g": (96, 680), "a2-highgpu-4g": (48, 340),
        "a2-highgpu-2g": (24, 170), "a2-highgpu-1g": (12, 85), "g2-standard-96": (96, 384),
        "g2-standard-48": (48, 192), "g2-standard-24": (24, 96), "g2-standard-8": (8, 32),
        "n1-standard-64": (64, 240), "n1-standard-32": (32, 120), "n1-standard-16": (16, 60),
        "n1-standard-8": (8, 30),
    }
    return known[machine_type]


def container_name(w: Workload) -> str:
    return "main" if w.kind != "notebook" else "jupyter"


def image(w: Workload, scenario: Scenario) -> str:
    return f"us-docker.pkg.dev/{scenario.project}/ml/{w.name}:latest"


def image_bytes(w: Workload) -> int:
    """The size of ``w``'s image: 4 to 20 GB, as ML images are."""
    return 4_000_000_000 + key("image/" + w.name) % 16_000_000_000


def pod(p: Pod, scenario: Scenario, placement: Placement) -> Obj:
    w = p.workload
    job = p.job
    labels: dict[str, str] = {**w.labels, "app.kubernetes.io/name": w.name,
                              "workload-kind": w.kind}
    if p.team and all(ns.team_on_pods for ns in scenario.namespaces if ns.name == p.namespace):
        labels["team"] = p.team
    if job.owner_kind == "Job":
        labels |= {"batch.kubernetes.io/job-name": job.name, "job-name": job.name,
                   "batch.kubernetes.io/controller-uid": job.uid}
        if w.pods > 1:
            labels["batch.kubernetes.io/job-completion-index"] = str(p.index)
    elif job.owner_kind == "ReplicaSet":
        labels["pod-template-hash"] = job.name.rsplit("-", 1)[-1]
    else:
        labels["statefulset.kubernetes.io/pod-name"] = p.name
    if w.queue:
        labels["kueue.x-k8s.io/queue-name"] = w.queue
    if job.queued is not None:  # what Kueue sets on the pods of a Job it admitted
        labels["kueue.x-k8s.io/podset"] = "main"
    constraints = placement.constraints(w)
    gpus = str(p.gpus)
    container: Obj = {
        "name": container_name(w),
        "image": image(w, scenario),
        "resources": {"requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": gpus},
                      "limits": {"nvidia.com/gpu": gpus}},
    }
    spec: Obj = {
        "containers": [container],
        "nodeSelector": dict(constraints.node_selector),
        "tolerations": [dict(t) for t in constraints.tolerations],
        "priority": p.priority,
        "priorityClassName": w.priority_class,
        "preemptionPolicy": "Never",
        "restartPolicy": "Never" if job.owner_kind == "Job" else "Always",
        "schedulerName": "default-scheduler",
        "serviceAccountName": "default",
        "terminationGracePeriodSeconds": 30,
    }
    if (affinity := constraints.affinity_object()) is not None:
        spec["affinity"] = affinity
    if job.owner_kind == "Job" and w.active_deadline is not None:
        spec["activeDeadlineSeconds"] = int(w.active_deadline)
    conditions: list[Obj] = []
    status: Obj = {"phase": p.phase, "qosClass": "Burstable"}
    if p.node is not None and p.scheduled_at is not None:
        spec["nodeName"] = p.node.name
        conditions.append({"type": "PodScheduled", "status": "True",
                           "lastTransitionTime": rfc3339(p.scheduled_at)})
        status["hostIP"] = p.node.address
        status["podIP"] = p.ip
        status["podIPs"] = [{"ip": p.ip}]
        status["startTime"] = rfc3339(p.scheduled_at)
        running = p.phase == "Running"
        since = rfc3339(p.finished_at or (p.running_at if running else p.scheduled_at) or 0)
        conditions += [
            {"type": "Initialized", "status": "True",
             "lastTransitionTime": rfc3339(p.scheduled_at)},
            {"type": "ContainersReady", "status": "True" if running else "False",
             "lastTransitionTime": since},
            {"type": "Ready", "status": "True" if running else "False",
             "lastTransitionTime": since},
        ]
        status["containerStatuses"] = [_container_status(p, container)]
    elif p.unschedulable_since is not None:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                           "message": p.unschedulable_message,
                           "lastTransitionTime": rfc3339(p.unschedulable_since)})
    if p.phase == "Failed" and p.reason in DISRUPTIONS:
        status["reason"] = p.reason
        status["message"] = p.message
        conditions.append({"type": "DisruptionTarget", "status": "True",
                           "reason": "TerminationByKubelet", "message": p.message,
                           "lastTransitionTime": rfc3339(p.finished_at or 0)})
    status["conditions"] = conditions
    meta: Obj = {
        "name": p.name, "namespace": p.namespace, "uid": p.uid,
        "creationTimestamp": rfc3339(p.created_at), "labels": labels,
        "ownerReferences": [{"apiVersion": "batch/v1" if job.owner_kind == "Job"
                             else "apps/v1", "kind": job.owner_kind, "name": job.name,
                             "uid": job.uid, "controller": True,
                             "blockOwnerDeletion": True}],
    }
    if w.annotations or job.queued is not None:
        meta["annotations"] = dict(w.annotations)
        if job.queued is not None:
            meta["annotations"]["kueue.x-k8s.io/workload"] = job.queued.name
    if p.deletion_at is not None:  # terminating: deleted gracefully, removed at this time
        meta["deletionTimestamp"] = rfc3339(p.deletion_at)
        meta["deletionGracePeriodSeconds"] = p.deletion_grace_seconds
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": status}


def _container_status(p: Pod, container: Obj) -> Obj:
    """The status of a bound pod's container: being created (its image pulled) until it
    runs, running, or terminated."""
    running = p.phase == "Running"
    out: Obj = {"name": container["name"], "image": container["image"], "ready": running,
                "restartCount": 0, "started": running}
    if p.phase == "Pending":
        return out | {"imageID": "", "state": {"waiting": {"reason": "ContainerCreating"}}}
    ran = p.running_at is not None and (p.finished_at is None or p.running_at <= p.finished_at)
    out |= {"imageID": f"{container['image'].rsplit(':', 1)[0]}@sha256:"
                       f"{hex_id(key(p.workload.name), length=64)}",
            "containerID": f"containerd://{p.uid.replace('-', '')}{p.uid.replace('-', '')}"}
    started = rfc3339(p.running_at) if ran and p.running_at is not None else None
    if running:
        return out | {"state": {"running": {"startedAt": started}}}
    assert p.finished_at is not None
    term: Obj = {"exitCode": p.exit_code, "reason": p.reason,
                 "finishedAt": rfc3339(p.finished_at)}
    if started is not None:
        term["startedAt"] = started
    if p.message:
        term["message"] = p.message
    return out | {"state": {"terminated": term}}


def dcgm_exporter_pod(n: Node, scenario: Scenario, port: int = DCGM_PORT) -> Obj:
    """GKE's managed dcgm-exporter DaemonSet pod on node ``n`` (host network)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": n.dcgm_pod_name, "namespace": DCGM_NAMESPACE,
            "uid": uuid_str(scenario.seed, key("dcgm/" + n.name)),
            "creationTimestamp": rfc3339(n.created_at), "labels": dict(DCGM_LABELS),
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                 "name": "dcgm-exporter", "controller": True,
                                 "uid": uuid_str(scenario.seed, key("dcgm-exporter"))}],
        },
        "spec": {
            "nodeName": n.name, "hostNetwork": True, "priority": 2000001000,
            "priorityClassName": "system-node-critical",
            "containers": [{"name": "dcgm-exporter",
                            "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-ubuntu22.04",
                            "ports": [{"name": "metrics", "containerPort": port,
                                       "protocol": "TCP"}]}],
        },
        "status": {
            "phase": "Running", "hostIP": n.address, "podIP": n.address,
            "podIPs": [{"ip": n.address}], "startTime": rfc3339(n.created_at),
            "containerStatuses": [{
                "name": "dcgm-exporter", "ready": True, "restartCount": 0, "started": True,
                "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.1-4.6.0-ubuntu22.04",
                "imageID": "nvcr.io/nvidia/k8s/dcgm-exporter@sha256:"
                           + hex_id(key("dcgm-exporter"), length=64),
                "state": {"running": {"startedAt": rfc3339(n.created_at)}}}],
            "conditions": [{"type": "PodScheduled", "status": "True",
                            "lastTransitionTime": rfc3339(n.created_at)},
                           {"type": "Ready", "status": "True",
                            "lastTransitionTime": rfc3339(n.created_at)}],
        },
    }
