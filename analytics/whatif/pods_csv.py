"""A plain CSV of pods, from another cluster or a published trace, as a trace's jobs.

One row a pod (``POD_COLUMNS``): when it was created, scheduled and deleted, what it
asked for, its team. Pods of one ``job`` created together run together; a pod deleted
while it still waited withdraws at its deletion; one still running at the file's last
time runs past the replay's window. Every bad row is told at once, by file, line and
column (``TraceError``).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from analytics.week import Week
from analytics.whatif import measure
from analytics.whatif.measure import Measured
from analytics.whatif.trace import (
    BOOLEANS,
    MODELS_SEPARATOR,
    Job,
    RunBasis,
    TraceError,
    csv_rows,
    estimate_runs,
    models_text,
    parse_time,
    profile_of,
    read,
)
from exporter.model.catalog import GPU_MODELS

POD_COLUMNS: dict[str, str] = {
    "created": "Required. When the pod was created (RFC 3339 or Unix seconds).",
    "scheduled": "When it was bound to a node; empty if never.",
    "deleted": "When it ended (finished or deleted); empty if it had not (`finished` is "
               "read too).",
    "gpus": "Required. GPUs it requested; a fraction below 1 (0.5) asks for a time-shared "
            "GPU: one time-sharing slot, whatever the fraction.",
    "gpu_model": "Required. The accelerator (nvidia-h100-80gb, nvidia-l4, ...), or the "
                 "models it accepts joined by | (nvidia-tesla-a100|nvidia-h100-80gb).",
    "team": "Required. Its team.",
    "namespace": "Its namespace (default: the team).",
    "pod": "Its name (default: pod-<line>).",
    "job": "The job it belongs to: pods of one job, created together, run together "
           "(default: each pod its own job).",
    "queue": "A Kueue LocalQueue.",
    "spot": "true if it runs on Spot VMs.",
    "utilization": "Its mean GPU utilisation, 0-1 (or 0-100 %): picks the nearest profile. "
                   "Without it, utilisation is unknown: the figures that need it read —.",
    "priority": "Its priority.",
}
"""The columns ``of_pods_csv`` reads; unknown columns are ignored."""


BAD_ROWS_TOLD = 20
"""How many bad rows a ``TraceError`` of a pods CSV lists (it counts the rest)."""


@dataclass(frozen=True, slots=True)
class Pod:
    """A row of a pods CSV, read."""

    created: datetime
    scheduled: datetime | None
    ended: datetime | None
    gpus: float
    gpu_model: str
    """One model, or the acceptable ones joined by ``MODELS_SEPARATOR``."""
    team: str
    namespace: str
    pod: str
    job: str
    queue: str | None
    spot: bool
    utilization: float | None
    priority: int


@dataclass(frozen=True, slots=True)
class PodsFile:
    """A pods CSV, read: its pods, the columns it has, and its jobs."""

    path: Path
    pods: list[Pod]
    columns: frozenset[str]
    jobs: list[Job]

    @property
    def until(self) -> datetime:
        """The file's latest time: where its record ends."""
        return max(t for p in self.pods for t in (p.created, p.scheduled, p.ended)
                   if t is not None)


def of_pods_csv(path: Path) -> list[Job]:
    """The jobs of a plain pods CSV (``read_pods``)."""
    return read_pods(path).jobs


def read_pods(path: Path) -> PodsFile:
    """A plain pods CSV (``POD_COLUMNS``) and its jobs; ``TraceError`` names every row it
    cannot read (the first ``BAD_ROWS_TOLD``, a line each, by file, line and column; then
    how many more)."""
    rows = csv_rows(path, "pods")
    header = frozenset(k.strip().lower() for k in rows[0] if k)
    missing = [c for c in ("created", "gpus", "gpu_model", "team") if c not in header]
    if missing:
        raise TraceError(f"{path}: missing columns {', '.join(missing)} (a pods file has "
                         f"{', '.join(POD_COLUMNS)})")
    pods = []
    bad: list[str] = []
    for line, row in enumerate(rows, start=2):
        extra: object = row.get(None)  # type: ignore[call-overload]
        if isinstance(extra, list):  # csv.DictReader's cells past the header's
            bad.append(f"{path}:{line}: {len(row) - 1 + len(extra)} cells, the header "
                       f"has {len(row) - 1} (a comma in a cell needs quotes; join models "
                       f"with {MODELS_SEPARATOR})")
            continue
        try:
            pods.append(_pod_row({k.strip().lower(): (v or "").strip()
                                  for k, v in row.items() if k}, f"{path}:{line}", line))
        except TraceError as exc:
            bad.append(str(exc))
    if bad:
        more = len(bad) - BAD_ROWS_TOLD
        raise TraceError("\n".join(bad[:BAD_ROWS_TOLD] + (
            [f"{path}: {more:,} more rows it cannot read"] if more > 0 else [])))
    groups: dict[tuple[str, str], list[Pod]] = {}
    for pod in pods:
        groups.setdefault((pod.namespace, pod.job), []).append(pod)
    read_ = PodsFile(path, pods, header, [])
    if "scheduled" not in header:  # no wait recorded: each pod ran from its creation
        groups = {k: [replace(p, scheduled=p.created) for p in g] for k, g in groups.items()}
    jobs = estimate_runs([_csv_job(ns, name, g, read_.until) for (ns, name), g in
                          groups.items()])
    return PodsFile(path, pods, header, jobs)


def recorded(f: PodsFile, week: Week) -> Measured | None:
    """The week as the file recorded it (``measure.recorded``): its pods' waits, created
    to scheduled, and the GPU-hours they held, scheduled to deleted; a pod still waiting
    or running at the file's last time, until then (a lower bound). None when the file
    has no ``scheduled`` column: it records no wait (``unrecorded`` says so)."""
    if unrecorded(f) is not None:
        return None
    until = pd.Timestamp(f.until)
    frame = pd.DataFrame({
        "team": [p.team for p in f.pods], "namespace": [p.namespace for p in f.pods],
        "created": pd.to_datetime([p.created for p in f.pods], utc=True),
        "scheduled": pd.to_datetime([p.scheduled for p in f.pods], utc=True),
        "finished": pd.to_datetime([p.ended or until for p in f.pods], utc=True),
        "gpus": [p.gpus for p in f.pods],
        "utilization": [np.nan if p.utilization is None else p.utilization
                        for p in f.pods]})
    return measure.recorded(frame, week)


def unrecorded(f: PodsFile) -> str | None:
    """Why the file gives no week to compare a replay with; None when it gives one."""
    if "scheduled" not in f.columns:
        return (f"{f.path.name} has no scheduled column, so no recorded wait to check a "
                "replay against")
    return None


def _pod_row(row: Mapping[str, str], where: str, line: int) -> Pod:
    created = parse_time(row.get("created", ""), f"{where}: created")
    scheduled = parse_time(row["scheduled"], f"{where}: scheduled") \
        if row.get("scheduled") else None
    ended_text = row.get("deleted") or row.get("finished") or ""
    ended = parse_time(ended_text, f"{where}: deleted") if ended_text else None
    if scheduled is not None and scheduled < created:
        raise TraceError(f"{where}: scheduled is before created")
    if ended is not None and ended < (scheduled or created):
        raise TraceError(f"{where}: deleted is before {'scheduled' if scheduled else 'created'}")
    try:
        gpus = float(row.get("gpus", ""))
    except ValueError:
        raise TraceError(f"{where}: gpus {row.get('gpus')!r} is not a number") from None
    if not math.isfinite(gpus) or gpus <= 0 or (gpus > 1 and gpus != int(gpus)) or gpus > 16:
        raise TraceError(f"{where}: gpus {gpus:g} must be a whole number of GPUs (1-16) or "
                         "a fraction of one")
    model = row.get("gpu_model", "")
    unknown = [m for m in model.split(MODELS_SEPARATOR) if m.strip() not in GPU_MODELS]
    if unknown:
        raise TraceError(f"{where}: gpu_model {unknown[0].strip()!r} is not one of "
                         f"{', '.join(sorted(GPU_MODELS))}")
    team = row.get("team", "")
    if not team:
        raise TraceError(f"{where}: team is empty")
    util: float | None = None
    if row.get("utilization"):
        try:
            util = float(row["utilization"])
        except ValueError:
            raise TraceError(f"{where}: utilization {row['utilization']!r} is not a "
                             "number") from None
        util = util / 100 if util > 1 else util
        if not 0 <= util <= 1:
            raise TraceError(f"{where}: utilization must be 0-1 or 0-100")
    spot = BOOLEANS.get(row.get("spot", "").lower()) if row.get("spot") else False
    if spot is None:
        raise TraceError(f"{where}: spot must be true or false")
    pod = row.get("pod") or f"pod-{line}"
    try:
        priority = int(row["priority"]) if row.get("priority") else 0
    except ValueError:
        raise TraceError(f"{where}: priority {row['priority']!r} is not a whole "
                         "number") from None
    return Pod(created=created, scheduled=scheduled, ended=ended, gpus=gpus,
               gpu_model=models_text(model.split(MODELS_SEPARATOR)), team=team,
               namespace=row.get("namespace") or team, pod=pod, job=row.get("job") or pod,
               queue=row.get("queue") or None, spot=spot, utilization=util,
               priority=priority)


def _csv_job(namespace: str, name: str, pods: list[Pod], until: datetime) -> Job:
    """The job of a pods CSV's pods. ``until``: the file's latest time, where its record
    ends: a pod still running then ran at least that long (``lower_bound``: it runs past
    a replay's window); a job none of whose pods was ever scheduled, all deleted, was
    withdrawn (``deadline_seconds``: its last deletion, from its submission). A file
    without a ``scheduled`` column records no wait: each pod's run is taken from its
    creation (what it waited included), and none is withdrawn."""
    first = min(pods, key=lambda p: p.created)
    created = first.created
    wave = [p for p in pods if p.created == created]
    runs = [((p.ended or until) - p.scheduled).total_seconds()
            for p in pods if p.scheduled is not None]
    running = any(p.scheduled is not None and p.ended is None for p in pods)
    withdrawn = all(p.scheduled is None and p.ended is not None for p in pods)
    deadline = max((p.ended - created).total_seconds() for p in pods
                   if p.ended is not None) if withdrawn else None
    utils = [p.utilization for p in pods if p.utilization is not None]
    util = float(np.mean(utils)) if utils else None
    basis: RunBasis = "estimated" if not runs else "lower_bound" if running else "measured"
    return Job(
        job=name, namespace=namespace, team=first.team, kind="job",
        submitted=created, pods=len(wave), gpus_per_pod=max(1, int(first.gpus)),
        gpu_model=first.gpu_model, spot=first.spot, sharing=first.gpus < 1,
        mig_profile=None, queue=first.queue, priority_class=None, priority=first.priority,
        run_seconds=max(1.0, sum(runs) / len(wave)) if runs else math.nan,
        run_basis=basis, startup_seconds=0.0, profile=profile_of(None, util),
        utilization=util, reclaims=0, restarts=max(0, len(pods) - len(wave)),
        schedulable=True, node_pool=None, deadline_seconds=deadline)


def load(path: Path) -> list[Job]:
    """A trace file (``analytics.whatif.trace.read``), or a plain pods CSV (told apart by
    their columns)."""
    return of_pods_csv(path) if is_pods_csv(path) else read(path)


def is_pods_csv(path: Path) -> bool:
    """Whether ``path`` is a plain pods CSV (``POD_COLUMNS``) rather than a trace."""
    try:
        with path.open(newline="") as f:
            header = {c.strip().lower() for c in next(csv.reader(f), [])}
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(f"{path}: cannot read it: {exc}") from None
    return "run_seconds" not in header and "created" in header


