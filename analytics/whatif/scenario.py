"""A trace and a layout joined into the simulator's scenario: the week's jobs submitted
at their times, on the layout's node pools, queues and incidents.

Each job becomes a traced job (``simulator.scenario.TracedJob``) of a workload template
shared by the jobs of one shape (namespace, GPUs asked for, pods, queue, priority,
startup); an always-on controller present from the start becomes a workload of
replicas. What cannot be replayed on the layout is left out and said so in ``notes``:
jobs no pool offers the GPUs of (after the layout's moves), incidents and stockouts of
pools the layout lacks.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from analytics.whatif.layout import Layout, Move
from analytics.whatif.trace import Job, models
from exporter.model.catalog import GPU_MODELS
from simulator.scenario import (
    Fault,
    Namespace,
    Pool,
    Scenario,
    Workload,
    parse_scenario,
)

UNSCHEDULABLE = {"cloud.google.com/gke-nodepool": "no-such-pool"}
"""The node selector of a job no node of its cluster could take (``schedulable: false``):
a pool no layout has, so that it waits in the replay as it did in the week."""


@dataclass(slots=True)
class Built:
    scenario: Scenario
    notes: list[str] = field(default_factory=list)
    """What the replay leaves out or changes, in a person's words."""
    jobs: int = 0
    """Traced jobs and always-on controllers in it."""
    names: dict[str, str] = field(default_factory=dict)
    """The teams and namespaces that are not DNS labels, as the scenario names them (a DNS
    label each, ``_dns``), to their names in the trace: what the figures are told under."""


def fits(job: Job, model: str, mig_profile: str | None, clients: int) -> bool:
    """Whether the job's pods fit the memory of a GPU of ``model`` (its MIG slice, or its
    share among ``clients`` time-sharing it); a job of unknown memory is taken to fit."""
    if job.memory_gib is None or model not in GPU_MODELS:
        return True
    gpu = GPU_MODELS[model]
    profile = gpu.mig_profiles.get(mig_profile or "")
    mib = profile.memory_mib if profile is not None else gpu.memory_mib / max(clients, 1)
    return job.memory_gib * 1024 <= mib


def moved(job: Job, moves: Sequence[Move], clients: int = 1) -> Job:
    """The job after the first of the layout's moves that matches it, unless its memory
    does not fit the GPUs it would move to (``clients``: a time-shared GPU's)."""
    for m in moves:
        if m.match.matches(job):
            t = m.to
            model = t.gpu_model or job.gpu_model
            sharing = job.sharing if t.sharing is None else t.sharing
            mig = t.mig_profile if t.mig_profile is not None else \
                (None if t.gpu_model else job.mig_profile)
            if not fits(job, model, mig, clients if sharing else 1):
                return job
            gpus = job.gpus_per_pod if t.mig_profile is None and t.sharing is not True else 1
            return replace(job, gpu_model=t.gpu_model or job.gpu_model,
                           spot=job.spot if t.spot is None else t.spot,
                           sharing=job.sharing if t.sharing is None else t.sharing,
                           mig_profile=t.mig_profile if t.mig_profile is not None
                           else (None if t.gpu_model else job.mig_profile),
                           queue=t.queue if t.queue is not None else job.queue,
                           gpus_per_pod=gpus, run_seconds=job.run_seconds * t.run_scale)
    return job


def _selects(pool: Pool, job: Job) -> bool:
    return (pool.accelerator in models(job.gpu_model) and pool.spot == job.spot
            and (pool.sharing is not None) == job.sharing
            and pool.mig_partition_size == job.mig_profile)


def _units(pool: Pool) -> int:
    return pool.gpus_per_node * pool.units_per_gpu


@functools.lru_cache(maxsize=1 << 16)
def _dns(text: str, limit: int) -> str:
    """A DNS label of at most ``limit`` characters for any name, unique per name."""
    clean = "".join(c if c.isalnum() and c.isascii() else "-" for c in text.lower()).strip("-")
    if clean and clean == text and len(clean) <= limit:
        return clean
    digest = hashlib.sha256(text.encode()).hexdigest()[:6]
    return f"{clean[: limit - 7].strip('-') or 'x'}-{digest}"


def pod_workloads(j: Job) -> tuple[str, ...]:
    """The names a replayed job's pods carry as their controller (``workload``): its
    Job's, or, for an always-on controller carried in, its workload's."""
    return (_dns(j.job, 63), _dns(j.job, 40)) if j.kind == "always_on" else (_dns(j.job, 63),)


def build(jobs: Sequence[Job], layout: Layout, start: datetime, end: datetime, step: float,
          seed: int = 1) -> Built:
    """The scenario that replays ``jobs`` from ``start`` to ``end`` on ``layout``."""
    notes: list[str] = []
    offset = step / 2
    begin, finish = start.timestamp(), end.timestamp()
    clients = max((p.sharing.max_shared_clients_per_gpu for p in layout.pools
                   if p.sharing is not None), default=1)
    jobs = [j for j in jobs if j.submitted.timestamp() < finish]
    if layout.moves:
        matched = [j for j in jobs if any(m.match.matches(j) for m in layout.moves)]
        after = [moved(j, layout.moves, clients) for j in jobs]
        kept = sum(1 for j, a in zip(jobs, after, strict=True)
                   if a is j and any(m.match.matches(j) for m in layout.moves))
        notes.append(f"{len(matched) - kept} jobs moved by the layout's moves"
                     + (f"; {kept} left where they were: their memory does not fit"
                        if kept else ""))
        jobs = after
    priorities = dict(layout.priority_classes)
    teams: dict[str, Counter[str]] = {}
    names: dict[str, str] = {}
    templates: dict[tuple[object, ...], Workload] = {}
    traced: list[dict[str, object]] = []  # TracedJob fields
    skipped: Counter[str] = Counter()
    skipped_hours: dict[str, float] = {}
    local = {(q.namespace, q.name) for q in layout.kueue.local_queues} if layout.kueue else set()
    quota = {(lq.namespace, lq.name): {f.accelerator for cq in layout.kueue.cluster_queues
                                       if cq.name == lq.cluster_queue for f in cq.flavors}
             for lq in layout.kueue.local_queues} if layout.kueue else {}
    for j in sorted(jobs, key=lambda j: (j.submitted, j.namespace, j.job)):
        fits = [p for p in layout.pools if _selects(p, j)] \
            if all(m in GPU_MODELS for m in models(j.gpu_model)) else []
        if not fits or j.gpus_per_pod > max(_units(p) for p in fits):
            what = _describe(j)
            skipped[what] += 1
            skipped_hours[what] = skipped_hours.get(what, 0.0) + \
                j.pods * j.gpus_per_pod * (j.run_seconds or 0) / 3600
            continue
        offered = {p.accelerator for p in fits}
        accepted = [m for m in models(j.gpu_model) if m in offered]  # first: its Kueue flavor
        namespace, team = _dns(j.namespace, 63), _dns(j.team, 63)
        names.update({k: v for k, v in ((namespace, j.namespace), (team, j.team)) if k != v})
        teams.setdefault(namespace, Counter())[team] += 1
        cls = j.priority_class or f"priority-{j.priority}"
        priorities.setdefault(cls, j.priority)
        queue = j.queue if (j.namespace, j.queue) in local and \
            accepted[0] in quota.get((j.namespace, j.queue or ""), set()) else None
        startup = math.ceil(j.startup_seconds / step - 0.5) * step if j.startup_seconds else 0
        carried = j.submitted.timestamp() < begin + offset
        always = j.kind == "always_on" and carried
        deadline = None if j.deadline_seconds is None else \
            max(step, math.ceil(j.deadline_seconds / step - 1e-9) * step)
        shape: tuple[object, ...] = (
            namespace, j.gpu_model, j.spot, j.sharing, j.mig_profile, j.gpus_per_pod,
            j.pods, queue, cls, startup, j.schedulable, deadline) + \
            ((j.job,) if always else ())
        template = templates.get(shape)
        if template is None:
            name = _dns(j.job, 40) if always else f"w{len(templates)}-{_dns(namespace, 30)}"
            template = templates[shape] = Workload(
                name=name, kind="serving" if always else "finetuning", namespace=namespace,
                accelerator=accepted[0], spot=j.spot,
                accelerators=accepted[1:], accelerator_selector=len(accepted) == 1,
                sharing="time-sharing" if j.sharing else None,
                mig_partition_size=j.mig_profile, gpus_per_pod=j.gpus_per_pod, pods=j.pods,
                replicas=j.pods if always else None,
                arrivals_per_day=None if always else 0.0, startup=startup,
                priority_class=cls, profiles={j.profile: 1.0},  # type: ignore[dict-item]
                queue=queue, node_selector={} if j.schedulable else UNSCHEDULABLE,
                active_deadline=deadline, max_retries=1000)
        if always:
            continue
        run = j.run_seconds if j.kind == "job" else finish - max(begin, j.submitted.timestamp())
        if j.run_basis == "lower_bound" or j.kind == "always_on":
            run += step  # still running at the week's end: it does not end in the replay
        traced.append({"name": _dns(j.job, 63), "workload": template.name,
                       "at": j.submitted.timestamp() - begin, "run": max(step, run),
                       "profile": j.profile})  # a TracedJob's, checked with the scenario
    for what, n in sorted(skipped.items()):
        notes.append(f"{n} jobs ({skipped_hours[what]:,.0f} GPU-hours) left out: no pool of "
                     f"the layout offers {what}")
    faults, fault_notes = _faults(layout, begin, finish, seed)
    stockouts = [s for s in layout.stockouts if (p := layout.pool(s.pool)) is not None
                 and p.autoscaling is not None]
    if len(stockouts) < len(layout.stockouts):
        notes.append(f"{len(layout.stockouts) - len(stockouts)} stockouts left out: their "
                     "pools are not in the layout, or do not autoscale")
    notes += fault_notes
    namespaces = [Namespace(name=ns, team=c.most_common(1)[0][0] if c.most_common(1)[0][0]
                            != ns else None) for ns, c in sorted(teams.items())]
    scenario = parse_scenario({
        "cluster": _dns(layout.cluster, 40), "region": layout.region, "seed": seed,
        "start": start, "step": step, "priority_classes": priorities,
        "namespaces": [n.model_dump() for n in namespaces] or [{"name": "default"}],
        "pools": [p.model_dump() for p in layout.pools],
        "workloads": [w.model_dump() for w in templates.values()],
        "jobs": traced,
        "faults": [f.model_dump() for f in faults],
        "stockouts": [s.model_dump() for s in stockouts],
        "kueue": layout.kueue.model_dump() if layout.kueue else None,
        "placement": layout.placement,
    }, f"the replay of {layout.cluster}")
    return Built(scenario, notes, len(traced) + sum(1 for w in scenario.workloads
                                                   if w.replicas is not None), names)


def _describe(j: Job) -> str:
    parts = [f"{j.gpus_per_pod} x {j.gpu_model or 'no GPU model'}",
             "spot" if j.spot else "on-demand"]
    if j.sharing:
        parts.append("time-shared")
    if j.mig_profile:
        parts.append(f"MIG {j.mig_profile}")
    return " ".join(parts)


def _faults(layout: Layout, begin: float, finish: float, seed: int
            ) -> tuple[list[Fault], list[str]]:
    """The layout's incidents on its pools, and Spot reclaims at ``spot.per_node_day``
    for every Spot pool whose reclaims it does not list: a Poisson process per node,
    thinned (a reclaim aimed at a node index not alive then takes nothing)."""
    notes: list[str] = []
    kept = []
    for f in layout.incidents:
        pool = layout.pool(f.pool_name)
        if pool is None or f.at >= finish - begin or \
                (f.kind == "xid" and f.gpu >= pool.gpus_per_node) or \
                (f.kind == "spot_preemption" and not pool.spot):
            continue
        kept.append(f)
    if len(kept) < len(layout.incidents):
        notes.append(f"{len(layout.incidents) - len(kept)} incidents left out: their pools "
                     "are not in the layout (or no longer fit them)")
    listed = {f.pool_name for f in kept if f.kind == "spot_preemption"}
    rate = layout.spot.per_node_day / 86400
    generated = 0
    for pool in layout.pools:
        if not pool.spot or pool.name in listed or rate <= 0:
            continue
        most = max(pool.nodes, pool.autoscaling.max_nodes if pool.autoscaling else 0)
        if most == 0:
            continue
        rng = random.Random(f"{seed}/{pool.name}/reclaims")
        t = rng.expovariate(rate * most)
        while t < finish - begin:
            kept.append(Fault(at=t, kind="spot_preemption",
                              node=f"{pool.name}/{rng.randrange(most)}",
                              restart_cost=layout.spot.restart_cost))
            generated += 1
            t += rng.expovariate(rate * most)
    if generated:
        notes.append(f"{generated} Spot reclaims drawn at {layout.spot.per_node_day:g} per "
                     f"node-day, each costing {layout.spot.restart_cost / 60:g} min of rework")
    return sorted(kept, key=lambda f: f.at), notes

