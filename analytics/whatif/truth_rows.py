"""A replay's account (``simulator.truth``) as the warehouse's tables, so that the report's
queries read a replay as they read a measured week.

- ``gpu_usage``: each truth segment (a device in one state, held by the same pods) cut at
  the hours, a row per pod holding it (or one, unallocated or unavailable). GPU-seconds
  and cost are ``exporter.model.compute.usage_rows``' (the seconds times the device's
  fraction of its GPU, the price of a GPU of its pool after discount times that fraction,
  both split evenly among the pods time-sharing it): the engine against the full loop
  (``tests/test_whatif_end_to_end.py``) holds the two to the same figures. Utilisation is
  each job's, as the trace measured it (a time-shared GPU's, its pods' added up to at most
  1; unknown when one is unknown); an idle GPU's is 0. Energy is not replayed: its columns are null.
- ``gpu_pods``: each pod's last state: created, scheduled, finished, phase and reason, its
  wait from its submission (its Kueue Workload's creation when Kueue queued it).
- ``kueue_workloads``: each Workload's last state.
- ``gpu_pending`` and ``gpu_free``: the truth's runs of waiting (by cause) and of free GPUs
  (by use), cut at the hours.
- ``availability_events``: the GPUs' incidents.

Rows are kept to the window ``[start, end)``: what the queries read of a week. Each table
is built by columns (NumPy and Arrow arrays, cut at the hours by index), with no pandas
frame between the truth and Arrow.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from exporter.sinks.schema import BY_NAME
from simulator.scenario import Scenario
from simulator.truth import TruthLog

HOUR = 3600.0
Columns = dict[str, Any]
"""A table's columns by name: each a sequence of Python values (None for null), a NumPy
array or a pandas ``DatetimeIndex``, all of one length."""


@dataclass(frozen=True, slots=True)
class Window:
    start: float
    end: float


def _columns(names: Sequence[str], rows: list[tuple[Any, ...]]) -> Columns:
    """``rows`` (tuples in the order of ``names``) as columns."""
    values = list(zip(*rows, strict=True)) if rows else [()] * len(names)
    return dict(zip(names, values, strict=True))


def _floats(values: Sequence[Any]) -> np.ndarray:
    """Numbers (None: NaN) as a float array."""
    return np.array(values, dtype=float) if len(values) else np.zeros(0)


def _take(values: Any, rows: np.ndarray) -> Any:
    if isinstance(values, np.ndarray):
        return values[rows]
    return pa.array(values, from_pandas=True).take(rows)


def hours(cols: Columns, window: Window) -> Columns:
    """``cols``' runs (``start``, ``end`` in unix seconds) clipped to ``window`` and cut at
    the hours: a row per piece, with ``time`` and ``interval_seconds``."""
    lo = np.maximum(_floats(cols["start"]), window.start)
    hi = np.minimum(_floats(cols["end"]), window.end)
    keep = np.flatnonzero(hi > lo)
    lo, hi = lo[keep], hi[keep]
    first = np.floor(lo / HOUR)
    count = (np.ceil(hi / HOUR) - first).astype(int)
    idx = np.repeat(np.arange(len(lo)), count)
    offset = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    hour = (first[idx] + offset) * HOUR
    a = np.maximum(lo[idx], hour)
    b = np.minimum(hi[idx], hour + HOUR)
    rows = keep[idx]
    out = {k: _take(v, rows) for k, v in cols.items() if k not in ("start", "end")}
    out["time"] = _timestamps(a)
    out["interval_seconds"] = b - a
    return out


MICROSECONDS = pa.timestamp("us", tz="UTC")
"""The warehouse's timestamps."""


def _timestamps(values: Sequence[float | None] | np.ndarray) -> pa.Array:
    """Unix seconds (None: null) as the warehouse's timestamps, to the microsecond."""
    seconds = values if isinstance(values, np.ndarray) else _floats(values)
    known = ~np.isnan(seconds)
    micros = np.round(np.where(known, seconds, 0.0) * 1e6).astype(np.int64)
    return pa.array(micros, MICROSECONDS, mask=~known)


def _per(values: Any, table: Mapping[str, Any]) -> list[Any]:
    """Each of ``values`` looked up in ``table`` (None where it is not there)."""
    return [table.get(v) for v in (values.to_pylist() if isinstance(values, pa.Array)
                                   else values)]


def usage(truth: TruthLog, scenario: Scenario, window: Window,
          prices: Mapping[str, float | None], utilization: Mapping[str, float]) -> Columns:
    """``gpu_usage`` rows. ``prices``: each pool's USD per GPU-hour after discount (None:
    unpriced); ``utilization``: each job's (its pods' ``workload``) measured mean."""
    teams = {n.name: n.team or n.name for n in scenario.namespaces}
    rows: list[tuple[object, ...]] = []
    for seg in truth.segments:
        if seg.end <= window.start or seg.start >= window.end:
            continue
        d = seg.device
        base = (seg.start, seg.end, d.node, d.pool, d.zone, d.accelerator, d.provisioning,
                d.gpu_uuid, str(d.gpu_index), d.mig_profile, d.device_id, d.fraction,
                prices.get(d.pool))
        if seg.down is not None:
            rows.append((*base, "unavailable", seg.down, 1, None, None, None, None, None,
                         None))
            continue
        if not seg.occupants:
            rows.append((*base, "unallocated", None, 1, None, None, None, None, None, 0.0))
            continue
        known = [utilization.get(p.workload) for p in seg.occupants]
        util = None if any(u is None for u in known) else \
            min(1.0, sum(u for u in known if u is not None))
        n = len(seg.occupants)
        for p in seg.occupants:
            rows.append((*base, "allocated", None, n, p.namespace, p.name, p.uid,
                         p.team or teams.get(p.namespace, p.namespace), p.workload, util))
    cols = _columns(["start", "end", "node", "node_pool", "zone", "gpu_model", "provisioning",
                     "gpu_uuid", "gpu_index", "mig_profile", "device_id", "fraction", "price",
                     "state", "reason", "shares", "namespace", "pod", "pod_uid", "team",
                     "workload", "utilization"], rows)
    for c in ("fraction", "price", "shares"):
        cols[c] = _floats(cols[c])
    f = hours(cols, window)
    fraction, shares, seconds = f.pop("fraction"), f.pop("shares"), f["interval_seconds"]
    unit = f.pop("price") * fraction
    return f | {"gpu_seconds": seconds * fraction / shares, "price_usd_per_hour": unit,
                "cost_usd": unit * seconds / HOUR / shares}


def pods(truth: TruthLog, window: Window) -> Columns:
    """``gpu_pods``: each pod created before the window's end, as it last was in it."""
    last = window.end - 1e-3
    rows = []
    for rec in truth.pods.values():
        if rec.created_at >= window.end:
            continue
        wl = truth.workloads.get(rec.workload_uid or "")
        queued = wl.created_at if wl is not None else rec.created_at
        done = rec.finished_at if rec.finished_at is not None and \
            rec.finished_at < window.end else None
        started = rec.scheduled_at if rec.scheduled_at is not None and \
            rec.scheduled_at < window.end else None
        phase = rec.phase if done is not None else "Running" if started is not None \
            else "Pending"
        rows.append((rec.uid, rec.namespace, rec.name, rec.team or rec.namespace,
                     rec.workload, "Job", rec.gpus, rec.accelerator, rec.node if started
                     else None, phase, rec.created_at, started, done,
                     None if started is None else started - queued,
                     rec.reason if done is not None else None, queued,
                     wl.cluster_queue if wl is not None else None,
                     min(done if done is not None else last, last)))
    f = _columns([
        "pod_uid", "namespace", "pod", "team", "workload", "owner_kind", "gpus", "gpu_model",
        "node", "phase", "created", "scheduled", "finished", "queue_wait_seconds", "reason",
        "queued", "cluster_queue", "updated"], rows)
    for c in ("created", "scheduled", "finished", "queued", "updated"):
        f[c] = _timestamps(f[c])
    f["queue_wait_seconds"] = _floats(f["queue_wait_seconds"])
    return f


def workloads(truth: TruthLog, finished: Mapping[str, float], window: Window) -> Columns:
    """``kueue_workloads``: each Workload created before the window's end, as it last was.
    ``finished``: when each that finished did (Kueue's own record)."""
    last = window.end - 1e-3
    rows = []
    for wl in truth.workloads.values():
        if wl.created_at >= window.end:
            continue
        admitted = None
        queued = wl.created_at
        if wl.admissions:
            at_queue, at = wl.admissions[-1]
            if at < window.end and not any(at <= e < window.end for e in wl.evictions):
                admitted = at
            queued = at_queue
        done = finished.get(wl.uid)
        done = done if done is not None and done < window.end else None
        state = "Finished" if done is not None else "Admitted" if admitted is not None \
            else "Pending"
        rows.append((wl.uid, wl.namespace, wl.name, wl.name, wl.team or wl.namespace,
                     wl.local_queue, wl.cluster_queue, wl.gpus, state, wl.created_at, queued,
                     admitted, done, min(done if done is not None else last, last), "Job"))
    f = _columns([
        "workload_uid", "namespace", "workload", "owner_name", "team", "local_queue",
        "cluster_queue", "gpus", "state", "created", "queued", "admitted", "finished",
        "updated", "owner_kind"], rows)
    for c in ("created", "queued", "admitted", "finished", "updated"):
        f[c] = _timestamps(f[c])
    return f


def pending(truth: TruthLog, scenario: Scenario, window: Window) -> Columns:
    """``gpu_pending``: each run of waiting for one cause, cut at the hours."""
    teams = {n.name: n.team or n.name for n in scenario.namespaces}
    queued = {uid: (truth.workloads[r.workload_uid].created_at
                    if r.workload_uid in truth.workloads else r.created_at)
              for uid, r in truth.pods.items()}
    queued.update({uid: w.created_at for uid, w in truth.workloads.items()})
    models = {uid: r.accelerator for uid, r in truth.pods.items()}
    rows = [(s.uid, s.kind, s.namespace, teams.get(s.namespace, s.namespace), s.cause,
             s.gpus, models.get(s.uid), queued.get(s.uid, s.start), s.start, s.end)
            for s in truth.pending_segments(window.start, window.end)]
    cols = _columns(["uid", "kind", "namespace", "team", "cause", "gpus", "gpu_model",
                     "queued", "start", "end"], rows)
    cols["gpus"] = np.array(cols["gpus"], dtype=np.int64)
    cols["queued"] = _floats(cols["queued"])
    f = hours(cols, window)
    seconds = f["interval_seconds"]
    ended = f["time"].cast(pa.int64()).to_numpy() / 1e6 + seconds
    return f | {"seconds": seconds, "gpu_seconds": f["gpus"] * seconds,
                "wait_seconds": ended - f.pop("queued"),
                "evidence_source": ["replay"] * len(seconds)}


def free(truth: TruthLog, scenario: Scenario, window: Window,
         prices: Mapping[str, float | None]) -> Columns:
    """``gpu_free``: each run of a pool's free GPUs of one use, cut at the hours."""
    pools = {p.name: p for p in scenario.pools}
    rows = [(s.pool, s.use, s.gpus, prices.get(s.pool), pools[s.pool].accelerator,
             "spot" if pools[s.pool].spot else "on-demand", pools[s.pool].zone, s.start, s.end)
            for s in truth.free_segments(window.start, window.end) if s.gpus > 0]
    cols = _columns(["node_pool", "use", "gpus", "price", "gpu_model", "provisioning", "zone",
                     "start", "end"], rows)
    cols["gpus"], cols["price"] = _floats(cols["gpus"]), _floats(cols["price"])
    f = hours(cols, window)
    gpus, price, seconds = f.pop("gpus"), f.pop("price"), f["interval_seconds"]
    return f | {"gpu_seconds": gpus * seconds, "cost_usd": price * gpus * seconds / HOUR}


def incidents(truth: TruthLog, window: Window) -> Columns:
    """``availability_events``: each GPU incident, clipped to the window."""
    pools = {s.device.node: s.device.pool for s in truth.segments}
    rows = []
    for i in truth.incidents:
        end = window.end if i.end is None else min(i.end, window.end)
        start = max(i.start, window.start)
        if end > start:
            rows.append((i.node, pools.get(i.node), i.gpu_uuid, i.reason, start, end,
                         end - start))
    f = _columns(["node", "node_pool", "gpu_uuid", "reason", "start_time", "end_time",
                  "seconds"], rows)
    for c in ("start_time", "end_time"):
        f[c] = _timestamps(f[c])
    f["seconds"] = _floats(f["seconds"])
    return f


def arrow(name: str, cols: Columns, cluster: str) -> pa.Table:
    """``cols`` as the warehouse table ``name``: its columns in the table's types, the
    table's other columns null, the ``cluster`` and row ids (unique within the replay's
    warehouse: it is written once, never merged) added."""
    schema = BY_NAME[name].arrow_schema
    n = len(next(iter(cols.values()))) if cols else 0
    if n == 0:
        return schema.empty_table()
    given = {"cluster": pa.repeat(pa.scalar(cluster, pa.string()), n),
             "id": row_ids(name, n)}
    columns = [given[f.name] if f.name in given else
               pa.array(cols[f.name], from_pandas=True).cast(f.type, safe=False)
               if f.name in cols else pa.nulls(n, f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def row_ids(name: str, rows: int) -> pa.Array:
    """Ids for ``rows`` rows of table ``name``: ``name-0001``, ... (unique in a replay's
    warehouse: it is written once, never merged)."""
    width = max(1, math.ceil(math.log10(rows + 1)))
    numbers = pc.utf8_lpad(pa.array(np.arange(rows)).cast(pa.string()), width, padding="0")
    return pc.binary_join_element_wise(f"{name}-", numbers, "")
