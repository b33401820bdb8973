"""When the cluster can next change: the steps ``Cluster.advance_to`` takes.

A step changes the cluster only when something is due at its end or the step before it
changed something. What can be due is a timer the cluster already holds:

- a traced job's submission, a workload's next arrival, a fault's start;
- a fault's end (an endpoint answering again, a node Ready again, a GPU's XID over) and
  the eviction of a NotReady node's pods;
- a pod's containers started, a pod's run done, its graceful deletion or its removal after
  ``completed_pod_ttl`` (not in a headless cluster, where nothing lists it), a Job's
  ``activeDeadlineSeconds``;
- the autoscaler's resizes done (nodes joining, or a stockout's failure told), a group's
  backoff over, and a node idle for ``scale_down_delay``.

Between two such times a step repeats the last one's outcome: Kueue admits nothing new
(what it decides from changes only when a Workload comes or goes), the scheduler binds
nothing new (no pod came, no GPU was freed) and the autoscaler asks for nothing new (no pod
came, no resize is done), since what they decide from has not changed. The one exception is
a scale-up: the autoscaler scales one group a loop, so the step after it runs too, and a
second group may follow. What a step skipped would have said again (a repeated
``NotTriggerScaleUp``) changes no truth. ``tests/simulator/test_clock.py`` runs scenarios
both ways and compares their truth.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.cluster import Cluster


ENDED = ("Succeeded", "Failed")
"""A pod in these phases holds nothing: its removal after ``completed_pod_ttl`` changes only
what the API lists, so a headless cluster does not step for it (it goes at a later step)."""


def on_grid(c: Cluster, t: float) -> float:
    """The first step boundary at or after ``t``, and after now."""
    k = math.ceil((t - c.start) / c.step - 1e-9)
    return max(c.start + k * c.step, c.now + c.step)


def next_change(c: Cluster) -> float | None:
    """The earliest time a timer of ``c`` is due after now; None when none is set."""
    due: list[float] = []
    if c._traced_cursor < len(c._traced):
        due.append(c.start + c._traced[c._traced_cursor].at)
    due += [at for _, at in c._arrivals.values()]
    if c._fault_cursor < len(c._faults):
        due.append(c.start + c._faults[c._fault_cursor][1].at)
    for node in c._faulty.values():
        if node.deleted:
            continue
        if node.endpoint_mode != "ok":
            due.append(node.endpoint_until)
        if not node.ready:
            due += [node.not_ready_until, node.ready_since + c.scenario.not_ready_eviction]
        due += [g.fault_until for g in node.gpus if g.xid]
    for heap in (c._starting, c._ends, c._deadlines):
        if heap:
            due.append(heap[0][0])
    due += [at for at, pod in c._to_delete if not (c.headless and pod.phase in ENDED)]
    a = c.autoscaler
    due += [attempt.due for attempt in a.attempts]
    due += [b.until for b in a.backoff.values()]
    due += [n.empty_since + n.pool.autoscaling.scale_down_delay for n in c.nodes.values()
            if n.empty_since is not None and not n.deleted and n.pool.autoscaling is not None]
    later = [t for t in due if t > c.now + 1e-9]
    return min(later) if later else None
