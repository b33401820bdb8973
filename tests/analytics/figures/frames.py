"""Small hand-built frames for the figures' tests: usage rows, pods, pod states, and a
report's workspace that holds pods as the report loads them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import pyarrow as pa

from analytics.figures.bottlenecks import classify_arrow
from analytics.figures.rightsizing import prepare
from analytics.week import parse_week
from analytics.workspace import Table, Workspace

WEEK = parse_week("2026-W47")
T = pd.Timestamp


def usage(*rows: tuple[Any, ...]) -> pd.DataFrame:
    cols = ["team", "namespace", "node_pool", "gpu_model", "provisioning", "state",
            "this_week", "gpu_seconds", "utilized_seconds", "measured_seconds", "cost_usd",
            "idle_seconds", "idle_cost_usd"]
    return pd.DataFrame(list(rows), columns=cols)


U = usage(
    # team, ns, pool, model, prov, state, this week, secs, utilized, measured, cost, idle s, idle $
    ("a", "ns-a", "h100", "nvidia-h100-80gb", "on-demand", "allocated", True,
     7200, 5400, 7200, 20.0, 1800, 5.0),
    ("b", "ns-b", "l4", "nvidia-l4", "spot", "allocated", True, 3600, 0, 0, 1.0, 0, 0.0),
    (None, None, "h100", "nvidia-h100-80gb", "on-demand", "unallocated", True,
     3600, 0, 0, 10.0, 0, 0.0),
    ("a", "ns-a", "h100", "nvidia-h100-80gb", "on-demand", "allocated", False,
     3600, 3600, 3600, 10.0, 0, 0.0),
)


def pods(**over: Any) -> pd.DataFrame:
    base: dict[str, Any] = dict(
        cluster="c", namespace="ns", pod_uid="u1", pod="p1", workload="w", team="t",
        gpu_model="nvidia-h100-80gb", provisioning="on-demand", mig=False,
        gpu_seconds=3600.0, cost_usd=10.0, utilized_seconds=900.0, idle_seconds=2700.0,
        idle_cost_usd=7.5, utilization=0.25, gr_engine_active=0.25, sm_active=0.2,
        sm_occupancy=0.1, tensor_active=0.1, dram_active=0.1, gpu_util_percent=90.0,
        temperature_celsius=60.0, nvlink_tx_bytes_per_second=0.0,
        nvlink_rx_bytes_per_second=0.0, pcie_tx_bytes_per_second=1e9,
        pcie_rx_bytes_per_second=2e9,
        stalled_share=0.0, max_gr=0.3, throttled_share=0.0, peak_memory_bytes=8 * 2**30,
        memory_total_bytes=80 * 2**30)
    rows = over.pop("rows", [{}])
    return pd.DataFrame([base | over | r for r in rows])


def workspace(prices: Mapping[tuple[str, str], float] | None = None, *,
              pods: pd.DataFrame | None = None,
              pod_states: pd.DataFrame | None = None) -> Workspace:
    """A report's workspace with ``pods`` loaded as the report loads the week's (each
    classified on its way in, numbered in ``seq``), and ``pod_states``."""
    ws = Workspace()
    prepare(ws, prices or {})
    if pods is not None:
        rows = pa.Table.from_pandas(pods, preserve_index=False)
        ws.load("pods", rows.to_batches() or [pa.RecordBatch.from_pylist([], rows.schema)],
                lambda t: classify_arrow(t).append_column(
                    "seq", pa.array(range(t.num_rows), type=pa.int64())))
    if pod_states is not None:
        ws.put("pod_states", pod_states)
    return ws


def table(ws: Workspace, name: str, frame: pd.DataFrame) -> Table:
    """``frame`` as a report table kept in ``ws``."""
    ws.put(name, frame)
    return Table(ws, name)


def states(*rows: tuple[Any, ...]) -> pd.DataFrame:
    cols = ["cluster", "pod_uid", "namespace", "pod", "team", "workload", "owner_kind",
            "gpu_model", "gpus", "created", "scheduled", "finished", "queue_wait_seconds",
            "phase", "reason", "priority_class"]
    return pd.DataFrame(list(rows), columns=cols)


def pod_state(uid: str, created: str, scheduled: str | None, gpus: int = 1,
              team: str = "t", **kw: Any) -> tuple[Any, ...]:
    c = T(created, tz="UTC")
    s = T(scheduled, tz="UTC") if scheduled else None
    wait = (s - c).total_seconds() if s is not None else None
    return ("c", uid, "ns", uid, team, "w", kw.get("kind", "Job"), "nvidia-l4", gpus, c, s,
            kw.get("finished"), wait, kw.get("phase", "Running"), kw.get("reason"), "")
