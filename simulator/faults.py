"""A scenario's faults on the simulated cluster, and their ends: Spot reclaims (the node
deleted, its pods ended ``Terminated``, a pool without autoscaling refilled), nodes
NotReady (powered off, their pods lost after ``not_ready_eviction``), XIDs (a fatal one
takes its GPU down and fails its pods), DCGM endpoints failing, driver reloads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.model.catalog import FATAL_XIDS

if TYPE_CHECKING:
    from simulator.cluster import Cluster
    from simulator.scenario import Fault


def due(c: Cluster, t: float) -> None:
    """Apply the scenario's faults whose offset has come by ``t``."""
    while c._fault_cursor < len(c._faults) and \
            c.start + c._faults[c._fault_cursor][1].at <= t + 1e-9:
        apply(c, c._faults[c._fault_cursor][1])
        c._fault_cursor += 1


def apply(c: Cluster, fault: Fault) -> None:
    """``fault`` now."""
    until = c.now + fault.duration
    pool = c._pools[fault.pool_name]
    if fault.kind == "spot_preemption":
        node = c._node_in_pool(pool.name, fault.node_index)
        if node is None:
            return
        c.truth.interruption(node.name, pool.name, c.now,
                             sorted({p.uid for p in node.units if p is not None}))
        c._rework = fault.restart_cost
        try:
            c._delete_node(node, "Terminated")
        finally:
            c._rework = 0.0
        if pool.autoscaling is None:
            c.autoscaler.recreate(pool, c.now + pool.recreate_delay)
        return
    node = c._node_in_pool(pool.name, fault.node_index)
    if node is None:
        return
    if fault.kind == "driver_reload":
        if node.ready:  # a powered-off node's driver loads when it boots
            c._reset_counters(node, "driver_reload")
        return
    c._faulty[node.name] = node
    if fault.kind == "endpoint":
        assert fault.mode is not None
        node.endpoint_mode = fault.mode
        node.endpoint_until = until
    elif fault.kind == "node_not_ready":
        if node.ready:
            for gpu in node.gpus:
                c._close_gpu(gpu)
            node.ready = False
            c._reshape()
            node.ready_since = c.now
            c.truth.down_start(node.name, [g.uuid for g in node.gpus], "node_not_ready",
                               c.now)
        node.not_ready_until = max(node.not_ready_until, until)
        c._dirty_nodes[node.name] = node
    elif fault.kind == "xid":
        assert fault.code is not None
        gpu = node.gpus[fault.gpu]
        c._close_gpu(gpu)
        gpu.xid = fault.code
        gpu.fault_until = max(gpu.fault_until, until)
        if fault.code in FATAL_XIDS and gpu.down_reason is None:
            reason = "gpu_missing" if fault.code == 79 else "xid"
            node.set_down(gpu, reason)
            c._reshape()
            c.truth.down_start(node.name, [gpu.uuid], reason, c.now, xid=fault.code)
            victims = {d_pod for d in gpu.devices for d_pod in d.occupants}
            for pod in sorted(victims, key=lambda p: p.name):
                c._finish(pod, "Failed", "Error", 1,
                          f"CUDA error: unspecified launch failure (Xid {fault.code})")
            c._dirty_nodes[node.name] = node


def end(c: Cluster, t: float) -> None:
    """The faults over by ``t``: endpoints answer, nodes are Ready, GPUs are back."""
    for node in [c._faulty[k] for k in sorted(c._faulty)]:
        if node.deleted:
            del c._faulty[node.name]
            continue
        if node.endpoint_mode != "ok" and node.endpoint_until <= t + 1e-9:
            node.endpoint_mode = "ok"
        if not node.ready and node.not_ready_until <= t + 1e-9:
            for gpu in node.gpus:
                c._close_gpu(gpu)
            node.ready = True
            c._reshape()
            node.ready_since = t
            c.truth.down_end(node.name, [g.uuid for g in node.gpus], "node_not_ready", t)
            c._reset_counters(node, "node_restart")  # its driver loaded at boot
            c._dirty_nodes[node.name] = node
        for gpu in node.gpus:
            if gpu.xid and gpu.fault_until <= t + 1e-9:
                c._close_gpu(gpu)
                if gpu.down_reason is not None:
                    c.truth.down_end(node.name, [gpu.uuid], gpu.down_reason, t)
                node.set_down(gpu, None)
                c._reshape()
                gpu.xid = 0
                c._dirty_nodes[node.name] = node
        if node.ready and node.endpoint_mode == "ok" and not any(g.xid for g in node.gpus):
            del c._faulty[node.name]


def evict_not_ready(c: Cluster, t: float) -> None:
    """The pods of nodes NotReady for ``not_ready_eviction`` by ``t`` fail (``NodeLost``)."""
    for node in [c._faulty[k] for k in sorted(c._faulty)]:
        if node.ready or t - node.ready_since < c.scenario.not_ready_eviction - 1e-9:
            continue
        for pod in sorted({p for p in node.units if p is not None}, key=lambda p: p.name):
            c._finish(pod, "Failed", "NodeLost", 137,
                      f"Node {node.name} which was running pod {pod.name} "
                      "is unresponsive")
