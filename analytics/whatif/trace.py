"""A week's jobs as a replayable trace: what each job asked for, when, and how long it ran.

A trace is a CSV file, one row per job (``COLUMNS``), that a person can read and edit. It
is made from the warehouse (``of_week``: the week's GPU pods grouped into their Jobs, each
with its request, the time it was submitted, its run time and its bottleneck class), or
read from a plain pods CSV of another cluster or a published trace
(``analytics.whatif.pods_csv``), or read back (``read``) after ``write``.

A job's run time is the GPU time its pods held, scheduled to finished, over their restarts
(a reclaimed or failed pod's replacement carries on its work), less the time each spent
starting (pulling its image), divided by its pods; the pods Kueue evicted or a deadline
deleted ran work that was lost and are left out. A job still running at the week's end has
its run time to the end (a lower bound); one that never started gets the median run of
the week's jobs of its namespace and shape (``run_basis`` says which).
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from analytics import queries
from analytics.figures.bottlenecks import classify_arrow
from analytics.store import Param, Store, batches
from analytics.week import POD_LOOKBACK, Week
from analytics.workspace import Workspace
from exporter.model.bottleneck import STALL_GR, THROTTLE_BITS
from exporter.model.catalog import GPU_MODELS
from simulator.profiles import activity

JobKind = Literal["job", "always_on"]
RunBasis = Literal["measured", "lower_bound", "estimated"]
PROFILES = ("healthy", "input_bound", "small_batch", "comm_bound", "memory_bound", "idle",
            "throttled")
"""The workload profiles a replay can run: the bottleneck classes of the report."""


@dataclass(frozen=True, slots=True)
class Job:
    job: str
    namespace: str
    team: str
    kind: JobKind
    submitted: datetime
    pods: int
    gpus_per_pod: int
    gpu_model: str
    spot: bool
    sharing: bool
    mig_profile: str | None
    queue: str | None
    priority_class: str | None
    priority: int
    run_seconds: float
    run_basis: RunBasis
    startup_seconds: float
    profile: str
    utilization: float | None
    reclaims: int
    restarts: int
    schedulable: bool
    node_pool: str | None
    deadline_seconds: float | None = None
    memory_gib: float | None = None


COLUMNS: dict[str, str] = {
    "job": "The Job's name; for kind always_on its Deployment or StatefulSet.",
    "namespace": "Its namespace.",
    "team": "Its team, as the exporter decided it.",
    "kind": "job (runs, then ends) or always_on (a Deployment's or StatefulSet's pods, "
            "running all week).",
    "submitted": "When it was submitted (RFC 3339): its Kueue Workload's creation, else its "
                 "first pods'.",
    "pods": "Pods of the job that run at once (replicas, for always_on).",
    "gpus_per_pod": "nvidia.com/gpu each pod requests.",
    "gpu_model": "The accelerator, as GKE names it (nvidia-h100-80gb); the models a job "
                 "accepts, joined by | (nvidia-tesla-a100|nvidia-h100-80gb): it runs on a "
                 "pool of any of them.",
    "spot": "true: it runs on Spot VMs (it ran on them, so it tolerates them).",
    "sharing": "true: its pods ask for a time-shared GPU.",
    "mig_profile": "The MIG profile its pods ask for (1g.5gb); empty for whole GPUs.",
    "queue": "The Kueue LocalQueue it was submitted to; empty for none.",
    "priority_class": "Its PriorityClass.",
    "priority": "Its pods' priority.",
    "run_seconds": "Seconds each pod runs, startup excluded (see run_basis).",
    "run_basis": "measured; lower_bound: still running at the week's end; estimated: "
                 "never started in the week, the median of its namespace's jobs of its "
                 "shape.",
    "startup_seconds": "Seconds from being scheduled to running (image pull), per pod.",
    "profile": "What its GPUs do: the report's bottleneck class (healthy, input_bound, "
               "small_batch, comm_bound, memory_bound, idle, throttled).",
    "utilization": "Its measured mean utilisation (0-1); empty if unknown.",
    "reclaims": "Its pods a Spot reclaim ended in the week.",
    "restarts": "Its pods replaced after failing (reclaims included).",
    "schedulable": "false: no node of the cluster could take it (it selects a node pool "
                   "or label no node has); it waits in every replay.",
    "node_pool": "The node pool it ran on (for reading; the replay places it by "
                 "gpu_model, spot, sharing and mig_profile).",
    "deadline_seconds": "Seconds after its submission its pods were deleted still waiting "
                        "(its Job's activeDeadlineSeconds, or a person giving up); the "
                        "replay deletes them as late. Empty: never.",
    "memory_gib": "The most GPU memory one of its pods used on a GPU (GiB): a move to a "
                  "MIG slice or a time-shared GPU takes only jobs it fits. Empty: unknown.",
}
"""The trace file's columns, in order, with what each holds (docs/whatif.md)."""

assert list(COLUMNS) == [f.name for f in fields(Job)]


MODELS_SEPARATOR = "|"
"""Between the GPU models a job accepts (``nvidia-tesla-a100|nvidia-h100-80gb``): a
character no GPU model's name has and no CSV quotes."""


@functools.lru_cache(maxsize=1 << 12)
def models(gpu_model: str) -> tuple[str, ...]:
    """The GPU models a ``gpu_model`` accepts, in its order: one, or several."""
    return tuple(dict.fromkeys(m.strip() for m in gpu_model.split(MODELS_SEPARATOR)
                               if m.strip()))


def models_text(accepted: Iterable[str]) -> str:
    """The ``gpu_model`` of a job that accepts ``accepted`` models."""
    return MODELS_SEPARATOR.join(dict.fromkeys(m.strip() for m in accepted if m.strip()))


class TraceError(ValueError):
    """A trace or pods file that cannot be read; the message names the file and line."""


# ----------------------------------------------------------------------------- the week

POD_STATES = """
SELECT cluster, pod_uid, namespace, pod, team, workload, owner_kind, gpu_model, gpus,
       created, scheduled, finished, phase, reason, priority, priority_class, queue,
       COALESCE(queued, created) AS queued
FROM {gpu_pods}
WHERE updated >= @lookback AND updated < @end AND (@cluster IS NULL OR cluster = @cluster)
QUALIFY ROW_NUMBER() OVER (PARTITION BY cluster, pod_uid ORDER BY updated DESC) = 1
"""
"""Each GPU pod's latest state by the week's end (``analytics.queries.POD_STATES`` with
its priority and Kueue queue)."""

POOLS = """
SELECT cluster, pod_uid, ANY_VALUE(node_pool) AS node_pool,
       ANY_VALUE(mig_profile) AS mig_profile
FROM {gpu_usage}
WHERE time >= @start AND time < @end AND state = 'allocated' AND pod_uid IS NOT NULL
  AND (@cluster IS NULL OR cluster = @cluster)
GROUP BY cluster, pod_uid
"""
"""The node pool each pod ran on in the week, and its MIG profile."""

SHARED_POOLS = """
SELECT DISTINCT node_pool
FROM (SELECT node_pool, time, device_id, COUNT(DISTINCT pod_uid) AS pods
      FROM {gpu_usage}
      WHERE time >= @start AND time < @end AND state = 'allocated'
        AND (@cluster IS NULL OR cluster = @cluster)
      GROUP BY node_pool, time, device_id)
WHERE pods > 1
"""
"""The node pools one of whose GPUs two pods held in the same interval: time-shared."""

POD_WAITS = """
SELECT cluster, uid AS pod_uid,
       SUM(IF(cause = 'starting', seconds, 0)) AS starting_seconds,
       LOGICAL_AND(cause = 'unschedulable') AS unschedulable,
       ANY_VALUE(NULLIF(node_pool, '')) AS fits_pool
FROM {gpu_pending}
WHERE time >= @start AND time < @end AND kind = 'pod'
  AND (@cluster IS NULL OR cluster = @cluster)
GROUP BY cluster, uid
"""
"""Each pod that waited in the week: how long it spent starting (scheduled, its image
pulled), whether every interval it waited was for no node at all, and a pool it fits."""

ALWAYS_ON = """
SELECT cluster, namespace, workload, MAX(pods) AS replicas
FROM (SELECT cluster, namespace, workload, time, COUNT(DISTINCT pod_uid) AS pods
      FROM {gpu_usage}
      WHERE time >= @start AND time < @end AND state = 'allocated' AND pod_uid IS NOT NULL
        AND (@cluster IS NULL OR cluster = @cluster)
      GROUP BY cluster, namespace, workload, time)
GROUP BY cluster, namespace, workload
"""
"""The most pods of each controller that held GPUs at once: a Deployment's replicas."""

POOL_PROVISIONING = """
SELECT node_pool, ANY_VALUE(provisioning) AS provisioning
FROM {gpu_usage}
WHERE time >= @start AND time < @end AND (@cluster IS NULL OR cluster = @cluster)
GROUP BY node_pool
"""

NEVER_ADMITTED = """
SELECT namespace, workload, owner_name, team, gpu_model, gpus, queued, local_queue,
       priority_class
FROM (SELECT * FROM {kueue_workloads}
      WHERE updated >= @lookback AND updated < @end AND (@cluster IS NULL OR cluster = @cluster)
      QUALIFY ROW_NUMBER() OVER (PARTITION BY cluster, workload_uid ORDER BY updated DESC) = 1)
WHERE admitted IS NULL AND gpus > 0 AND (finished IS NULL OR finished > @start)
  AND queued < @end
"""
"""The Kueue Workloads waiting for admission in the week and not admitted by its end."""


def of_week(store: Store, week: Week, cluster: str | None = None) -> list[Job]:
    """The week's jobs (every pod that waited or held a GPU in it, grouped into its Job),
    read from the warehouse."""
    base: dict[str, Param] = {"start": week.start, "end": week.end, "cluster": cluster,
                              "team": None}
    ws = Workspace()
    ws.load("pods", batches(store, queries.PODS, base | {
        "stall_gr": STALL_GR, "throttle_bits": THROTTLE_BITS}), classify_arrow)
    usage = ws.frame("SELECT pod_uid, bottleneck, gpu_seconds, utilization, provisioning, "
                     "peak_memory_bytes FROM pods")
    states = store.query(POD_STATES, base | {"lookback": week.start - POD_LOOKBACK})
    pools = store.query(POOLS, base)
    waits = store.query(POD_WAITS, base)
    shared = set(store.query(SHARED_POOLS, base).node_pool.dropna())
    replicas = store.query(ALWAYS_ON, base)
    provisioning = dict(store.query(POOL_PROVISIONING, base).itertuples(index=False))
    jobs = jobs_of_pods(_pod_frame(states, usage, pools, waits), week, shared, replicas,
                        provisioning)
    awaiting = store.query(NEVER_ADMITTED, base | {"lookback": week.start - POD_LOOKBACK})
    return estimate_runs(jobs + _never_admitted(awaiting, jobs))


NODE_GPUS = 8
"""GPUs per pod a Workload with no pod yet is split into (the largest node of most
models): the warehouse records its GPUs, not its pod sets."""


def _never_admitted(awaiting: pd.DataFrame, jobs: list[Job]) -> list[Job]:
    """The Jobs Kueue held back all week: no pod, only their Workload's wait. The warehouse
    records a Workload's GPUs and model, not its pods: each takes the pods and Spot of the
    week's jobs of its namespace, queue and model with as many GPUs, else pods of at most
    ``NODE_GPUS`` GPUs on demand."""
    known = {(j.namespace, j.job) for j in jobs}
    like = {(j.namespace, j.queue, j.gpu_model, j.pods * j.gpus_per_pod): j for j in jobs}
    out = []
    for r in awaiting.itertuples(index=False):
        name = str(r.owner_name if isinstance(r.owner_name, str) else r.workload)
        if (r.namespace, name) in known or not r.gpus or pd.isna(r.queued):
            continue
        gpus = int(r.gpus)
        queue = str(r.local_queue) if isinstance(r.local_queue, str) else None
        sibling = like.get((str(r.namespace), queue, str(r.gpu_model), gpus))
        pods = sibling.pods if sibling else max(1, math.ceil(gpus / NODE_GPUS))
        out.append(Job(
            job=name, namespace=str(r.namespace),
            team=str(r.team) if isinstance(r.team, str) else str(r.namespace), kind="job",
            submitted=pd.Timestamp(r.queued).to_pydatetime().astimezone(UTC), pods=pods,
            gpus_per_pod=math.ceil(gpus / pods),
            gpu_model=str(r.gpu_model) if isinstance(r.gpu_model, str) else "",
            spot=sibling.spot if sibling else False,
            sharing=sibling.sharing if sibling else False, mig_profile=None, queue=queue,
            priority_class=str(r.priority_class) if isinstance(r.priority_class, str)
            else None, priority=0, run_seconds=math.nan, run_basis="estimated", startup_seconds=0.0,
            profile="healthy", utilization=None, reclaims=0, restarts=0, schedulable=True,
            node_pool=None))
    return out


def _pod_frame(states: pd.DataFrame, usage: pd.DataFrame, pools: pd.DataFrame,
               waits: pd.DataFrame) -> pd.DataFrame:
    """One row per pod: its latest state, where it ran, what it did, how it waited."""
    p = states.merge(pools.drop(columns="cluster"), on="pod_uid", how="left") \
        .merge(usage, on="pod_uid", how="left") \
        .merge(waits.drop(columns="cluster"), on="pod_uid", how="left")
    return p.assign(starting_seconds=p.starting_seconds.fillna(0.0),
                    unschedulable=p.unschedulable.astype("boolean").fillna(False))


def _ts(t: pd.Series) -> np.ndarray:
    """Times as Unix seconds (NaN for none)."""
    times = pd.to_datetime(t, utc=True)
    out: np.ndarray = (times - pd.Timestamp(0, tz="UTC")).dt.total_seconds().to_numpy(
        dtype="float64", na_value=np.nan)
    return out


def jobs_of_pods(pods: pd.DataFrame, week: Week, shared_pools: set[str],
                 replicas: pd.DataFrame, provisioning: Mapping[str, str]) -> list[Job]:
    """Group the week's pods into jobs (``_pod_frame``'s columns), a job per namespace and
    controller, every sum over all jobs at once."""
    start, end = week.start.timestamp(), week.end.timestamp()
    p = pods.assign(queued_s=_ts(pods.queued), created_s=_ts(pods.created),
                    scheduled_s=_ts(pods.scheduled), finished_s=_ts(pods.finished))
    p = p[(p.queued_s < end) & (p.finished_s.isna() | (p.finished_s > start))
          & p.gpus.fillna(0).gt(0)]
    if p.empty:
        return []
    p = p.assign(workload=p.workload.fillna(p.pod), team=p.team.fillna(p.namespace)) \
        .sort_values(["namespace", "workload", "created_s", "pod"], ignore_index=True)
    key = ["namespace", "workload"]
    ran = p.scheduled_s.notna() & (p.phase != "Deleted")
    held = ((p.finished_s.fillna(end).clip(upper=end) - p.scheduled_s.clip(lower=start))
            .clip(lower=0).where(ran, 0.0))
    starting = p.starting_seconds.clip(upper=held).where(ran, 0.0)
    w = p.gpu_seconds.fillna(0.0)
    measured = w.where(p.utilization.notna(), 0.0)
    first_created = p.groupby(key).created_s.transform("min")
    first_queued = p.groupby(key).queued_s.transform("min")
    gave_up = (p.finished_s - first_queued).where(
        (p.phase == "Deleted") & p.scheduled_s.isna() & p.finished_s.notna())
    p = p.assign(
        ran=ran, held=held, starting=starting, work=held - starting,
        running=ran & (p.finished_s.isna() | (p.finished_s > end)),
        first_wave=p.created_s <= first_created + 1e-6, open=p.finished_s.isna(),
        spot=p.provisioning == "spot", known=p.provisioning.notna(),
        reclaimed=p.reason == "Terminated", restarted=(p.phase == "Failed") & ran,
        w=w, wu=(p.utilization * w).fillna(0.0), measured=measured, gave_up=gave_up)
    g = p.groupby(key, sort=True)
    per = g.agg(
        owner_kind=("owner_kind", "first"), team=("team", "first"),
        queued=("queued_s", "min"), wave=("first_wave", "sum"), open=("open", "any"),
        ran=("ran", "sum"), work=("work", "sum"), starting=("starting", "sum"),
        running=("running", "any"), node_pool=("node_pool", "last"),
        fits_pool=("fits_pool", "first"), spot=("spot", "any"), known=("known", "any"),
        gpus=("gpus", "max"), gpu_model=("gpu_model", "first"),
        mig_profile=("mig_profile", "first"), queue=("queue", "first"),
        priority_class=("priority_class", "first"), priority=("priority", "max"),
        reclaims=("reclaimed", "sum"), restarts=("restarted", "sum"),
        unschedulable=("unschedulable", "all"), gave_up=("gave_up", "max"),
        w=("w", "sum"), wu=("wu", "sum"), measured=("measured", "sum"),
        memory=("peak_memory_bytes", "max"))
    classes = p[p.bottleneck.notna()].groupby([*key, "bottleneck"]).w.sum()
    majority: dict[tuple[str, str], str] = {
        (r.namespace, r.workload): r.bottleneck for r in classes.sort_values(
            ascending=False, kind="stable").reset_index().drop_duplicates(key)
        .itertuples(index=False)}
    always = {(r.namespace, r.workload): int(r.replicas)
              for r in replicas.itertuples(index=False)}
    jobs = []
    for r in per.reset_index().itertuples(index=False):
        namespace, name = r.namespace, r.workload
        owner = r.owner_kind if isinstance(r.owner_kind, str) else "Job"
        always_on = owner not in ("Job", "Workload") and bool(r.open)
        pods = always.get((namespace, name), int(r.wave)) if always_on else int(r.wave)
        pods = max(pods, 1)
        pool = r.node_pool if isinstance(r.node_pool, str) else None
        where = pool or (r.fits_pool if isinstance(r.fits_pool, str) else None)
        spot = bool(r.spot) if r.known else provisioning.get(where or "") == "spot"
        basis: RunBasis = "estimated" if not r.ran else \
            "lower_bound" if r.running else "measured"
        util = float(r.wu / r.measured) if r.measured > 0 else None
        jobs.append(Job(
            job=str(name), namespace=str(namespace), team=str(r.team),
            kind="always_on" if always_on else "job",
            submitted=datetime.fromtimestamp(float(r.queued), UTC), pods=pods,
            gpus_per_pod=int(r.gpus), gpu_model=_text(r.gpu_model) or "", spot=spot,
            sharing=where in shared_pools, mig_profile=_text(r.mig_profile),
            queue=_text(r.queue), priority_class=_text(r.priority_class),
            priority=int(r.priority) if pd.notna(r.priority) else 0,
            run_seconds=float(r.work) / pods if r.ran else math.nan, run_basis=basis,
            startup_seconds=float(r.starting) / int(r.ran) if r.ran else 0.0,
            profile=profile_of(_text(majority.get((namespace, name))), util),
            utilization=util, reclaims=int(r.reclaims), restarts=int(r.restarts),
            schedulable=bool(r.ran) or not bool(r.unschedulable), node_pool=pool,
            deadline_seconds=float(r.gave_up) if not r.ran and pd.notna(r.gave_up)
            else None,
            memory_gib=float(r.memory) / 2**30 if pd.notna(r.memory) else None))
    return jobs


def _text(v: object) -> str | None:
    return v if isinstance(v, str) and v else None


def estimate_runs(jobs: list[Job]) -> list[Job]:
    """A job that never started gets the median run of its namespace's jobs of its shape
    (else of every job of its model, else an hour)."""
    measured = [j for j in jobs if j.run_basis != "estimated"]

    def median(keep: Iterable[Job]) -> float | None:
        runs = [j.run_seconds for j in keep]
        return float(np.median(runs)) if runs else None

    out = []
    for j in jobs:
        if j.run_basis == "estimated":
            shape = (j.namespace, j.gpu_model, j.gpus_per_pod, j.pods)
            run = median(m for m in measured
                         if (m.namespace, m.gpu_model, m.gpus_per_pod, m.pods) == shape) \
                or median(m for m in measured if m.gpu_model == j.gpu_model) or 3600.0
            j = replace(j, run_seconds=run)
        out.append(j)
    return out


@functools.cache
def profile_utilization() -> dict[str, float]:
    """Each profile's mean utilisation (GR engine active) over a run, as the simulator
    draws it: a job whose class the counters could not tell replays with the profile
    nearest its measured utilisation."""
    return {p: float(np.mean([activity(p, 1, 2, step, True, False, False).gr_engine_active
                              for step in range(SAMPLE_STEPS)])) for p in PROFILES}


SAMPLE_STEPS = 600


def profile_of(bottleneck: str | None, utilization: float | None) -> str:
    """The profile a job replays with: its bottleneck class, else the profile whose mean
    utilisation is nearest its own, else healthy."""
    if bottleneck in PROFILES:
        return str(bottleneck)
    if utilization is None or math.isnan(utilization):
        return "healthy"
    means = profile_utilization()
    return min(means, key=lambda p: abs(means[p] - utilization))


# ----------------------------------------------------------------------------- files

def write(jobs: Iterable[Job], path: Path) -> Path:
    """The trace as CSV, ``COLUMNS`` in order, times in RFC 3339."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS)
        for j in jobs:
            w.writerow([_cell(v) for v in asdict(j).values()])
    return path


def _cell(v: object) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, datetime):
        return v.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(v, float):
        return f"{v:.6g}" if abs(v) < 1e6 else f"{v:.0f}"
    return str(v)


BOOLEANS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}


def read(path: Path) -> list[Job]:
    """A trace file written by ``write`` (and perhaps edited); ``TraceError`` names the
    line and column of the first bad cell."""
    rows = csv_rows(path, "jobs")
    missing = [c for c in COLUMNS if c not in rows[0]]
    if missing:
        raise TraceError(f"{path}: missing columns {', '.join(missing)} (a trace has "
                         f"{', '.join(COLUMNS)})")
    return [_job_of_row(row, f"{path}:{line}") for line, row in enumerate(rows, start=2)]


def csv_rows(path: Path, what: str) -> list[dict[str, str]]:
    """A CSV file's rows, at least one; ``TraceError`` when it cannot be read."""
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(f"{path}: cannot read it: {exc}") from None
    if not rows:
        raise TraceError(f"{path}: no {what}")
    return rows


def _job_of_row(row: Mapping[str, str], where: str) -> Job:
    def text(c: str) -> str:
        return (row.get(c) or "").strip()

    def fail(c: str, why: str) -> TraceError:
        return TraceError(f"{where}: {c} {text(c)!r}: {why}")

    def number(c: str, *, whole: bool = False, minimum: float = 0.0) -> float:
        try:
            v = float(text(c))
        except ValueError:
            raise fail(c, "not a number") from None
        if math.isnan(v) or v < minimum or (whole and v != int(v)):
            raise fail(c, f"must be {'a whole number ' if whole else 'a number '}>= "
                          f"{minimum:g}")
        return v

    def flag(c: str) -> bool:
        v = BOOLEANS.get(text(c).lower())
        if v is None:
            raise fail(c, "must be true or false")
        return v

    kind = text("kind")
    if kind not in ("job", "always_on"):
        raise fail("kind", "must be job or always_on")
    model = text("gpu_model")
    if not models(model) or any(m not in GPU_MODELS for m in models(model)):
        raise fail("gpu_model", f"not one of {', '.join(sorted(GPU_MODELS))} (or several "
                                f"joined by {MODELS_SEPARATOR})")
    basis = text("run_basis") or "measured"
    if basis not in ("measured", "lower_bound", "estimated"):
        raise fail("run_basis", "must be measured, lower_bound or estimated")
    profile = text("profile") or "healthy"
    if profile not in PROFILES:
        raise fail("profile", f"not one of {', '.join(PROFILES)}")
    util = number("utilization") if text("utilization") else None
    return Job(
        job=text("job") or _missing(where, "job"), namespace=text("namespace") or
        _missing(where, "namespace"), team=text("team") or text("namespace"),
        kind=kind,  # type: ignore[arg-type]
        submitted=parse_time(text("submitted"), f"{where}: submitted"),
        pods=int(number("pods", whole=True, minimum=1)),
        gpus_per_pod=int(number("gpus_per_pod", whole=True, minimum=1)),
        gpu_model=models_text(models(model)), spot=flag("spot"), sharing=flag("sharing"),
        mig_profile=text("mig_profile") or None, queue=text("queue") or None,
        priority_class=text("priority_class") or None,
        priority=int(number("priority", whole=True, minimum=-(2**31)))
        if text("priority") else 0,
        run_seconds=number("run_seconds", minimum=1.0) if kind == "job" or
        text("run_seconds") else 0.0,
        run_basis=basis,  # type: ignore[arg-type]
        startup_seconds=number("startup_seconds") if text("startup_seconds") else 0.0,
        profile=profile, utilization=util,
        reclaims=int(number("reclaims", whole=True)) if text("reclaims") else 0,
        restarts=int(number("restarts", whole=True)) if text("restarts") else 0,
        schedulable=flag("schedulable") if text("schedulable") else True,
        node_pool=text("node_pool") or None,
        deadline_seconds=number("deadline_seconds", minimum=1.0)
        if text("deadline_seconds") else None,
        memory_gib=number("memory_gib") if text("memory_gib") else None)


def _missing(where: str, column: str) -> str:
    raise TraceError(f"{where}: {column} is empty")


def parse_time(text: str, where: str) -> datetime:
    """RFC 3339 (a ``Z`` or an offset), or Unix seconds; naive times are UTC."""
    if not text:
        raise TraceError(f"{where}: empty")
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(value):
            try:
                return datetime.fromtimestamp(value, UTC)
            except (OverflowError, OSError, ValueError):
                raise TraceError(f"{where}: {text!r} is out of range as Unix seconds") \
                    from None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise TraceError(f"{where}: {text!r} is not an RFC 3339 time or Unix seconds") \
            from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def window(jobs: Sequence[Job], days: float = 7.0) -> Week:
    """The replay window of a trace with no week: ``days`` from the midnight (UTC) before
    its first submission."""
    first = min(j.submitted for j in jobs)
    start = first.replace(hour=0, minute=0, second=0, microsecond=0)
    return Week(start, start + timedelta(days=days))
