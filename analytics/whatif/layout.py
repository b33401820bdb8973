"""A cluster layout to replay a week on: node pools, placement, Kueue's queues, Spot's
reclaims, the week's incidents, and jobs moved to other GPUs.

``of_week`` reads the week's own layout from the warehouse, for a person to copy and
change (``write`` puts it in YAML with what each part means); ``load`` reads a layout file
back, checked field by field (``LayoutError`` names the field). Node pools, Kueue's queues,
incidents and stockouts are the simulator's own (``simulator.scenario``), so a layout reads
like a scenario's cluster half.

What the warehouse does not record is inferred and said so in the file: a pool autoscales
when pods waited for its scale-ups or it grew during the week (bounds: the fewest and most
nodes it had; the provisioning delay: the median wait for a scale-up); a pool is
time-shared when two pods held one of its GPUs at once (clients: the most seen); Spot
reclaims are the nodes whose pods a reclaim ended; a ClusterQueue preempts when one of its
Workloads was requeued.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Self

import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from analytics import queries
from analytics.store import Param, Store
from analytics.week import POD_LOOKBACK, QUOTA_LOOKBACK, Week
from analytics.whatif.trace import Job
from exporter.model.catalog import GPU_MODELS
from exporter.model.durations import Duration
from simulator.scenario import (
    Accelerator,
    Autoscaling,
    ClusterQueue,
    Fault,
    FlavorQuota,
    Kueue,
    LocalQueue,
    Pool,
    Sharing,
    Stockout,
    format_error,
)


class LayoutError(ValueError):
    """A layout file that cannot be used; the message names the field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


DEFAULT_RECLAIMS_PER_NODE_DAY = 0.1
"""Spot reclaims per node and day where the week measured none. Google publishes no
reclaim rate for Spot VMs (they "can be preempted at any time", and the rate varies by
zone, machine and hour): this is an assumption to replace with your own history. A layout
written from a week with Spot nodes carries that week's rate."""

DEFAULT_RESTART_COST = 1800.0
"""Run time a reclaimed pod loses and runs again: the work since its last checkpoint,
taken as half a 1-hour checkpoint interval."""

DEFAULT_PROVISIONING_DELAY = 300.0
"""A new GPU node's time to Ready where the week saw no scale-up to measure it by."""


class SpotReclaims(_Model):
    """How Spot VMs are reclaimed in a replay: pools whose reclaims the layout lists under
    ``incidents`` are reclaimed then (that week's work lost is already in its jobs' run
    times); every other Spot pool at ``per_node_day``, at random times (seeded), each
    reclaimed pod losing ``restart_cost`` of its run."""

    per_node_day: float = Field(default=DEFAULT_RECLAIMS_PER_NODE_DAY, ge=0, le=24)
    restart_cost: Duration = DEFAULT_RESTART_COST


class JobMatch(_Model):
    """Which of the trace's jobs a move applies to: every field given must match."""

    team: str | None = None
    namespace: str | None = None
    gpu_model: Accelerator | None = None
    spot: bool | None = None
    sharing: bool | None = None

    def matches(self, job: Job) -> bool:
        return ((self.team is None or job.team == self.team)
                and (self.namespace is None or job.namespace == self.namespace)
                and (self.gpu_model is None or job.gpu_model == self.gpu_model)
                and (self.spot is None or job.spot == self.spot)
                and (self.sharing is None or job.sharing == self.sharing))


class JobChange(_Model):
    """What a move changes: the GPUs the jobs ask for, and how their run time changes
    with them (a slower GPU: ``run_scale`` > 1)."""

    gpu_model: Accelerator | None = None
    spot: bool | None = None
    sharing: bool | None = None
    mig_profile: str | None = None
    queue: str | None = None
    run_scale: float = Field(default=1.0, gt=0, le=100)


class Move(_Model):
    """Jobs of the trace moved to other GPUs: ``to`` applied to each job ``match``es."""

    match: JobMatch
    to: JobChange


Placement = Literal["compact", "spread"]


class Layout(_Model):
    cluster: str = "whatif"
    region: str = "us-central1"
    placement: Placement = "compact"
    """Which node a pod goes to: compact (bin-packing: the node it leaves with the fewest
    free GPUs) or spread (the most)."""
    pools: list[Pool] = Field(min_length=1)
    kueue: Kueue | None = None
    priority_classes: dict[str, int] = Field(default_factory=lambda: {"default": 0})
    spot: SpotReclaims = SpotReclaims()
    incidents: list[Fault] = Field(default_factory=list)
    """The week's incidents, replayed at the same offsets from its start: XID errors,
    nodes NotReady, Spot reclaims (``node``: the INDEX-th node of the pool alive then)."""
    stockouts: list[Stockout] = Field(default_factory=list)
    """Times the zone had no capacity (or the project no quota) for an autoscaled pool's
    scale-ups."""
    moves: list[Move] = Field(default_factory=list)
    """Jobs moved to other GPUs before the replay (Spot, a cheaper model, MIG)."""

    @model_validator(mode="after")
    def _names(self) -> Self:
        names = [p.name for p in self.pools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"pools: {', '.join(twice)} named twice")
        return self

    def pool(self, name: str) -> Pool | None:
        return next((p for p in self.pools if p.name == name), None)


# ----------------------------------------------------------------------------- files

HEADER = """\
# A cluster layout for `gke-gpu-exporter whatif --layout FILE` (docs/whatif.md).
#
# {origin}
# Copy it, change what you want to try, and replay the week on it:
#   pools             node pools: accelerator, gpus_per_node, nodes (or autoscaling
#                     {{min_nodes, max_nodes, provisioning_delay}}), spot, zone,
#                     sharing {{max_shared_clients_per_gpu}} or mig_partition_size
#   placement         compact (bin-packing) or spread
#   kueue             ClusterQueues (quota per accelerator, cohort, preemption) and
#                     LocalQueues
#   spot              per_node_day: reclaims of Spot pools not listed under incidents;
#                     restart_cost: run time a reclaimed pod loses
#   incidents         the week's XIDs, NotReady nodes and Spot reclaims, at their offsets
#   stockouts         when an autoscaled pool could not grow
#   moves             jobs moved to other GPUs, e.g.
#                       - match: {{team: ranking, gpu_model: nvidia-h100-80gb}}
#                         to: {{spot: true}}
# Durations are seconds or strings like 90s, 30m, 1d6h.
"""


def duration_text(seconds: float) -> str | float:
    """A duration as the shortest of ``1d4h30m`` and the like; seconds as they are when
    not whole."""
    if seconds != int(seconds):
        return seconds
    s = int(seconds)
    if s == 0:
        return "0s"
    out = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            out += f"{s // size}{unit}"
            s %= size
    return out


_DURATIONS = {"provisioning_delay", "scale_down_delay", "recreate_delay", "at", "duration",
              "restart_cost"}


def _readable(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _readable(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_readable(v, key) for v in value]
    if key in _DURATIONS and isinstance(value, int | float) and not isinstance(value, bool):
        return duration_text(float(value))
    return value


def dump(layout: Layout, origin: str) -> str:
    """The layout as YAML, under a header that says where it came from and what to
    change; defaults left out, so what is written is what the week had."""
    data = layout.model_dump(mode="json", exclude_defaults=True)
    data["pools"] = [{"name": p.name, "accelerator": p.accelerator,
                      "gpus_per_node": p.gpus_per_node, "nodes": p.nodes, "zone": p.zone,
                      "spot": p.spot} | p.model_dump(mode="json", exclude_defaults=True)
                     for p in layout.pools]
    data = {"cluster": layout.cluster, "region": layout.region,
            "placement": layout.placement} | data
    data["spot"] = layout.spot.model_dump(mode="json")
    body = yaml.safe_dump(_readable(data), sort_keys=False, default_flow_style=None,
                          width=96)
    return HEADER.format(origin=origin) + "\n" + body


def write(layout: Layout, path: Path, origin: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump(layout, origin))
    return path


def load(path: Path) -> Layout:
    try:
        text = path.read_text()
    except OSError as exc:
        raise LayoutError(f"{path}: cannot read the layout: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise LayoutError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise LayoutError(f"{path}: a layout is a YAML mapping of fields")
    return parse(data, str(path))


def parse(data: Mapping[str, Any], source: str = "layout") -> Layout:
    try:
        return Layout.model_validate(data)
    except ValidationError as exc:
        raise LayoutError(format_error(source, exc)) from None


# ----------------------------------------------------------------------------- the week

POOL_INTERVALS = """
SELECT node_pool, time, COUNT(DISTINCT node) AS nodes, ANY_VALUE(gpu_model) AS gpu_model,
       ANY_VALUE(provisioning) AS provisioning, ANY_VALUE(zone) AS zone,
       ANY_VALUE(mig_profile) AS mig_profile
FROM {gpu_usage}
WHERE time >= @start AND time < @end AND (@cluster IS NULL OR cluster = @cluster)
  AND node_pool IS NOT NULL
GROUP BY node_pool, time
"""
"""Each pool's nodes in each interval of the week."""

NODES = """
SELECT node_pool, node, COUNT(DISTINCT gpu_uuid) AS gpus, MIN(time) AS first_seen,
       MAX(time) AS last_seen
FROM {gpu_usage}
WHERE time >= @start AND time < @end AND (@cluster IS NULL OR cluster = @cluster)
  AND node IS NOT NULL
GROUP BY node_pool, node
"""

GPUS = """
SELECT gpu_uuid, ANY_VALUE(gpu_index) AS gpu_index, MAX(last_xid) AS last_xid
FROM {gpu_usage}
WHERE time >= @start AND time < @end AND (@cluster IS NULL OR cluster = @cluster)
GROUP BY gpu_uuid
"""

SHARED = """
SELECT node_pool, MAX(pods) AS clients
FROM (SELECT node_pool, time, device_id, COUNT(DISTINCT pod_uid) AS pods
      FROM {gpu_usage}
      WHERE time >= @start AND time < @end AND state = 'allocated'
        AND (@cluster IS NULL OR cluster = @cluster)
      GROUP BY node_pool, time, device_id)
GROUP BY node_pool
"""
"""The most pods that held one GPU of each pool at once."""

INTERVALS = """
SELECT COUNT(DISTINCT time) AS intervals, MIN(interval_seconds) AS interval_seconds
FROM {gpu_usage}
WHERE time >= @start AND time < @end AND (@cluster IS NULL OR cluster = @cluster)
"""

SCALING = """
SELECT node_pool, cause, uid, time, seconds, evidence
FROM {gpu_pending}
WHERE time >= @start AND time < @end AND (@cluster IS NULL OR cluster = @cluster)
  AND cause IN ('scaling_up', 'stockout', 'preempted') AND node_pool IS NOT NULL
  AND node_pool != ''
"""
"""What waited for a pool's scale-ups (how long, and when they met a stockout), and the
pods replacing reclaimed ones, which wait for the same scale-ups."""

RECLAIMED = """
SELECT node, MIN(finished) AS at
FROM (SELECT * FROM {gpu_pods}
      WHERE updated >= @lookback AND updated < @end AND (@cluster IS NULL OR cluster = @cluster)
      QUALIFY ROW_NUMBER() OVER (PARTITION BY cluster, pod_uid ORDER BY updated DESC) = 1)
WHERE reason = 'Terminated' AND finished >= @start AND finished < @end AND node IS NOT NULL
GROUP BY node
"""
"""The Spot nodes a reclaim took, and when: the nodes whose pods ended ``Terminated``."""

QUOTAS = """
SELECT cluster_queue, cohort, flavor, nominal_gpus, borrowing_limit_gpus
FROM {kueue_quotas}
WHERE updated >= @quota_since AND updated < @end AND (@cluster IS NULL OR cluster = @cluster)
QUALIFY ROW_NUMBER() OVER (PARTITION BY cluster, cluster_queue, flavor
                           ORDER BY updated DESC) = 1
"""

QUEUES = """
SELECT namespace, local_queue, cluster_queue, gpu_model,
       LOGICAL_OR(queued > created) AS requeued
FROM {kueue_workloads}
WHERE updated >= @lookback AND updated < @end AND (@cluster IS NULL OR cluster = @cluster)
  AND local_queue IS NOT NULL
GROUP BY namespace, local_queue, cluster_queue, gpu_model
"""

PRIORITIES = """
SELECT priority_class, MAX(priority) AS priority
FROM {gpu_pods}
WHERE updated >= @lookback AND updated < @end AND (@cluster IS NULL OR cluster = @cluster)
  AND priority_class IS NOT NULL
GROUP BY priority_class
"""


def of_week(store: Store, week: Week, cluster: str | None, name: str, region: str,
            step: float) -> Layout:
    """The layout the week ran on, as far as the warehouse tells it."""
    base: dict[str, Param] = {"start": week.start, "end": week.end, "cluster": cluster,
                              "lookback": week.start - POD_LOOKBACK,
                              "quota_since": week.start - QUOTA_LOOKBACK}
    intervals = store.query(POOL_INTERVALS, base)
    if intervals.empty:
        raise LayoutError(f"the warehouse has no GPU rows in {week.label}"
                          + (f" for cluster {cluster}" if cluster else ""))
    nodes = store.query(NODES, base)
    shared = dict(store.query(SHARED, base).itertuples(index=False))
    scaling = store.query(SCALING, base)
    counted = store.query(INTERVALS, base).iloc[0]
    reclaimed = store.query(RECLAIMED, base)
    pools = [_pool(str(pool), g, nodes[nodes.node_pool == pool], int(shared.get(pool, 1)),
                   scaling[scaling.node_pool == pool], int(counted.intervals), step)
             for pool, g in intervals.groupby("node_pool", sort=True)]
    incidents = _incidents(store.query(queries.INCIDENTS, base), store.query(GPUS, base),
                           reclaimed, nodes, week.start, step)
    priorities = {str(k): int(v) for k, v in store.query(PRIORITIES, base)
                  .itertuples(index=False)} | {"default": 0}
    spot_nodes = sum(float(g.nodes.sum()) * float(counted.interval_seconds or step) / 86400
                     for _, g in intervals[intervals.provisioning == "spot"]
                     .groupby("node_pool"))
    rate = DEFAULT_RECLAIMS_PER_NODE_DAY if not spot_nodes or reclaimed.empty \
        else round(len(reclaimed) / spot_nodes, 4)
    return Layout(
        cluster=name, region=region, pools=pools,
        kueue=_kueue(store.query(QUOTAS, base), store.query(QUEUES, base)),
        priority_classes=priorities, spot=SpotReclaims(per_node_day=rate),
        incidents=incidents, stockouts=_stockouts(scaling, intervals, pools, week.start, step))


def _pool(name: str, g: pd.DataFrame, nodes: pd.DataFrame, clients: int,
          scaling: pd.DataFrame, intervals: int, step: float) -> Pool:
    """A pool as the week saw it."""
    first = g.sort_values("time").iloc[0]
    counts = g.set_index("time").nodes
    start_nodes = int(counts.iloc[0]) if first.time == g.time.min() else 0
    least = 0 if len(counts) < intervals else int(counts.min())
    most = int(counts.max())
    model = str(first.gpu_model)
    per_node = int(nodes.gpus.max()) if not nodes.empty else 1
    offered = GPU_MODELS[model].machine_types if model in GPU_MODELS else {}
    if offered and per_node not in offered:
        per_node = min((n for n in offered if n >= per_node), default=max(offered))
    mig = first.mig_profile if isinstance(first.mig_profile, str) else None
    grew = most > start_nodes  # (a node missing a few intervals is a failed scrape)
    autoscaling = None
    if scaling.cause.isin(["scaling_up", "stockout"]).any() or grew:
        waits = scaling[scaling.cause == "scaling_up"].groupby("uid").seconds.sum()
        delay = float(waits.median()) if len(waits) else DEFAULT_PROVISIONING_DELAY
        autoscaling = Autoscaling(min_nodes=least, max_nodes=max(most, 1),
                                  provisioning_delay=max(step, round(delay / step) * step))
    return Pool(
        name=name, accelerator=model, gpus_per_node=per_node,  # type: ignore[arg-type]
        nodes=start_nodes if autoscaling is not None else max(start_nodes, most),
        zone=str(first.zone) if isinstance(first.zone, str) else "us-central1-a",
        spot=first.provisioning == "spot",
        sharing=Sharing(max_shared_clients_per_gpu=min(48, clients))
        if clients > 1 and mig is None else None,
        mig_partition_size=mig, autoscaling=autoscaling)


def _node_index(nodes: pd.DataFrame, pool: str, node: str, at: pd.Timestamp) -> int | None:
    """The node's place among its pool's nodes alive at ``at``, oldest first."""
    alive = nodes[(nodes.node_pool == pool) & (nodes.first_seen <= at)
                  & (nodes.last_seen >= at - pd.Timedelta(hours=1))] \
        .sort_values(["first_seen", "node"])
    names = list(alive.node)
    return names.index(node) if node in names else None


def _offset(t: pd.Timestamp, start: datetime, step: float) -> float:
    seconds = float((t.to_pydatetime() - start).total_seconds())
    return max(0.0, math.floor(seconds / step) * step)


def _incidents(events: pd.DataFrame, gpus: pd.DataFrame, reclaimed: pd.DataFrame,
               nodes: pd.DataFrame, start: datetime, step: float) -> list[Fault]:
    """The week's incidents as faults to replay: one per NotReady node, one per GPU that
    went missing or had a fatal XID, one per Spot reclaim."""
    index = gpus.set_index("gpu_uuid")
    out: list[tuple[float, str, Fault]] = []
    seen: set[tuple[str, object]] = set()
    for e in events.sort_values(["start_time", "node"]).itertuples(index=False):
        pool, node = str(e.node_pool), str(e.node)
        i = _node_index(nodes, pool, node, e.start_time)
        if i is None or (e.reason == "node_not_ready" and (node, e.start_time) in seen):
            continue
        seen.add((node, e.start_time))
        at = _offset(e.start_time, start, step)
        duration = max(step, round(float(e.seconds) / step) * step)
        if e.reason == "node_not_ready":
            fault = Fault(at=at, kind="node_not_ready", node=f"{pool}/{i}", duration=duration)
        else:
            gpu = index.loc[e.gpu_uuid] if e.gpu_uuid in index.index else None
            code = 79 if e.reason == "gpu_missing" else int(gpu.last_xid) \
                if gpu is not None and pd.notna(gpu.last_xid) and int(gpu.last_xid) in (
                    48, 64, 74, 95) else 48
            g = int(gpu.gpu_index) if gpu is not None and pd.notna(gpu.gpu_index) else 0
            fault = Fault(at=at, kind="xid", node=f"{pool}/{i}", gpu=g, code=code,
                          duration=duration)
        out.append((at, node, fault))
    pools: dict[str, str] = {str(n): str(p) for n, p in
                             zip(nodes.node, nodes.node_pool, strict=True)}
    for r in reclaimed.sort_values("at").itertuples(index=False):
        owner = pools.get(str(r.node))
        if owner is None:
            continue
        i = _node_index(nodes, owner, str(r.node), r.at - pd.Timedelta(seconds=step))
        out.append((_offset(r.at, start, step), str(r.node), Fault(
            at=_offset(r.at, start, step), kind="spot_preemption",
            node=f"{owner}/{i if i is not None else 0}")))
    return [f for _, _, f in sorted(out, key=lambda x: (x[0], x[1]))]


def _stockouts(scaling: pd.DataFrame, intervals: pd.DataFrame, pools: list[Pool],
               start: datetime, step: float) -> list[Stockout]:
    """When an autoscaled pool could not grow: the runs of intervals in which pods waited
    for it (scaling up, or replacing reclaimed pods) while it was below its maximum. A run
    with a stockout recorded is one from its start (a stockout often begins with the
    reclaim that shows it) to its last stockout; a run without one is a stockout when it
    lasted longer than a scale-up takes, up to a scale-up before its end."""
    out = []
    for pool in pools:
        if pool.autoscaling is None:
            continue
        g = scaling[scaling.node_pool == pool.name]
        mine = intervals[intervals.node_pool == pool.name]
        nodes = dict(zip((t.to_pydatetime() for t in mine.time), mine.nodes, strict=True))
        short = {t.to_pydatetime() for t in g.time
                 if nodes.get(t.to_pydatetime(), 0) < pool.autoscaling.max_nodes}
        if not short:
            continue
        out_at = {t.to_pydatetime() for t in g[g.cause == "stockout"].time}
        quota = g[g.cause == "stockout"].evidence.fillna("").str.contains(
            "quota", case=False).any()
        times = sorted(short | out_at)
        runs: list[list[datetime]] = [[times[0]]]
        for t in times[1:]:
            if (t - runs[-1][-1]).total_seconds() <= step + 1e-6:
                runs[-1].append(t)
            else:
                runs.append([t])
        delay = pool.autoscaling.provisioning_delay
        for run in runs:
            hit = [t for t in run if t in out_at]
            length = (run[-1] - run[0]).total_seconds() + step
            duration = (hit[-1] - run[0]).total_seconds() + step if hit else \
                length - delay if length > delay + step else 0.0
            if duration > 0:
                out.append(Stockout(pool=pool.name, at=max(0.0, (run[0] - start)
                                                           .total_seconds()),
                                    duration=duration,
                                    reason="quota_exceeded" if quota else "out_of_resources"))
    return out


def _kueue(quotas: pd.DataFrame, queues: pd.DataFrame) -> Kueue | None:
    """Kueue's ClusterQueues (each flavor named for its accelerator, or for the model
    the Workloads it admitted asked for) and LocalQueues, as last seen in the week."""
    if quotas.empty:
        return None
    model_of = {str(q): str(m) for q, m in queues.groupby("cluster_queue").gpu_model
                .agg(lambda s: s.mode().iloc[0] if s.notna().any() else "").items()}
    requeued = set(queues[queues.requeued.fillna(False).astype(bool)].cluster_queue)
    cqs = []
    for name, g in quotas.groupby("cluster_queue", sort=True):
        flavors: dict[str, FlavorQuota] = {}
        for r in g.sort_values("flavor").itertuples(index=False):
            model = str(r.flavor) if r.flavor in GPU_MODELS else model_of.get(str(name), "")
            if model not in GPU_MODELS or model in flavors:
                continue
            flavors[model] = FlavorQuota(
                accelerator=model,  # type: ignore[arg-type]
                nominal_gpus=int(r.nominal_gpus or 0),
                borrowing_limit_gpus=int(r.borrowing_limit_gpus)
                if pd.notna(r.borrowing_limit_gpus) and r.cohort else None)
        if not flavors:
            continue
        cohort = g.cohort.dropna()
        cqs.append(ClusterQueue(
            name=str(name), cohort=str(cohort.iloc[0]) if len(cohort) and cohort.iloc[0]
            else None, flavors=list(flavors.values()),
            preemption="LowerPriority" if name in requeued else "Never"))
    if not cqs:
        return None
    known = {q.name for q in cqs}
    local = {(str(r.namespace), str(r.local_queue)): str(r.cluster_queue)
             for r in queues.itertuples(index=False) if r.cluster_queue in known}
    return Kueue(cluster_queues=cqs, local_queues=[
        LocalQueue(name=lq, namespace=ns, cluster_queue=cq)
        for (ns, lq), cq in sorted(local.items())])


def with_priorities(layout: Layout, jobs: Iterable[Job]) -> Layout:
    """The layout with every priority class the trace names (at its pods' priority)."""
    found = {j.priority_class: j.priority for j in jobs if j.priority_class}
    merged = found | layout.priority_classes
    return layout.model_copy(update={"priority_classes": merged}) \
        if merged != layout.priority_classes else layout
