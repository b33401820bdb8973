"""A sample Cloud Billing detailed usage cost export of a simulated cluster.

The bill is made from the simulator's ground truth (``TruthLog``), never from what the
exporter measured: each hour, each node and each namespace that held its GPUs has one
line per GPU SKU, its usage the true GPU-seconds (a MIG instance as its fraction of the
GPU, a time-shared GPU split among its pods), its cost those hours at the price book's
list price. The lines are labelled as GKE cost allocation labels them
(``goog-k8s-cluster-name``, ``goog-k8s-node-pool-name``, ``k8s-namespace``, with
``kube:unallocated`` for GPU time no pod held, a GPU that is down included), in the
columns and nesting of the detailed export (``gcp_billing_export_resource_v1_<ACCOUNT>``).

The bill then differs from the truth in four known ways, each kept as a ``Difference``
per UTC day and namespace, so a reconciliation can be checked against them:

- ``spot_price``: spot GPUs are charged ``SPOT_PRICE_CHANGE`` above the book's spot price
  (spot prices move; the book is a snapshot);
- ``committed_use``: the on-demand GPUs of the costliest on-demand model carry a
  committed-use credit of ``COMMITTED_USE_DISCOUNT`` of their cost;
- ``not_exported``: the export is a day behind: the run's last UTC day is not in it yet
  (when the run covers more than one day);
- ``unmonitored_pool``: a node pool the exporter never saw (``UNSEEN_POOL``, in namespace
  ``UNSEEN_NAMESPACE``) is billed for every hour the export covers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from simulator.scenario import Pool, Scenario
from simulator.truth import TruthLog

HOUR = 3600.0
DAY = 86400.0
ACCOUNT = "01A2B3-C4D5E6-F7A8B9"
TABLE = f"gcp_billing_export_resource_v1_{ACCOUNT.replace('-', '_')}"
"""The detailed export's table name for the sample's billing account."""
FILE = "billing_export.parquet"
COMPUTE_ENGINE = {"id": "6F81-5844-456A", "description": "Compute Engine"}
UNALLOCATED = "kube:unallocated"

SPOT_PRICE_CHANGE = 0.10
"""The bill's spot GPU price above the book's."""
COMMITTED_USE_DISCOUNT = 0.37
"""The committed-use credit on the committed model's on-demand GPUs, as a share of cost."""
UNSEEN_POOL = "l4-eval"
UNSEEN_NAMESPACE = "batch-eval"
UNSEEN_ACCELERATOR = "nvidia-l4"
UNSEEN_GPUS = 2
"""The node pool on the bill that the exporter never saw: two L4 GPUs, held all along."""

Kind = Literal["spot_price", "committed_use", "not_exported", "unmonitored_pool"]

SKU_NAMES = {
    "nvidia-h200-141gb": "H200 141GB GPU",
    "nvidia-h100-80gb": "Nvidia H100 80GB GPU",
    "nvidia-a100-80gb": "Nvidia A100 80GB GPU",
    "nvidia-tesla-a100": "Nvidia Tesla A100 GPU",
    "nvidia-l4": "Nvidia L4 GPU",
    "nvidia-tesla-t4": "Nvidia Tesla T4 GPU",
    "nvidia-tesla-v100": "Nvidia Tesla V100 GPU",
    "nvidia-tesla-p100": "Nvidia Tesla P100 GPU",
    "nvidia-tesla-p4": "Nvidia Tesla P4 GPU",
}
"""How Compute Engine's GPU SKUs name each model."""
GEOGRAPHIES = {"europe-west1": "Belgium", "europe-west4": "Netherlands",
               "europe-west2": "London", "europe-west3": "Frankfurt"}
"""Regions whose SKUs name a country or city; the others name their continent."""

_KV = pa.struct([("key", pa.string()), ("value", pa.string())])
SCHEMA = pa.schema([
    ("billing_account_id", pa.string()),
    ("service", pa.struct([("id", pa.string()), ("description", pa.string())])),
    ("sku", pa.struct([("id", pa.string()), ("description", pa.string())])),
    ("usage_start_time", pa.timestamp("us", tz="UTC")),
    ("usage_end_time", pa.timestamp("us", tz="UTC")),
    ("project", pa.struct([("id", pa.string()), ("number", pa.string()),
                           ("name", pa.string()), ("labels", pa.list_(_KV)),
                           ("ancestry_numbers", pa.string())])),
    ("labels", pa.list_(_KV)),
    ("system_labels", pa.list_(_KV)),
    ("location", pa.struct([("location", pa.string()), ("country", pa.string()),
                            ("region", pa.string()), ("zone", pa.string())])),
    ("resource", pa.struct([("name", pa.string()), ("global_name", pa.string())])),
    ("export_time", pa.timestamp("us", tz="UTC")),
    ("cost", pa.float64()),
    ("currency", pa.string()),
    ("currency_conversion_rate", pa.float64()),
    ("usage", pa.struct([("amount", pa.float64()), ("unit", pa.string()),
                         ("amount_in_pricing_units", pa.float64()),
                         ("pricing_unit", pa.string())])),
    ("credits", pa.list_(pa.struct([("name", pa.string()), ("amount", pa.float64()),
                                    ("full_name", pa.string()), ("id", pa.string()),
                                    ("type", pa.string())]))),
    ("invoice", pa.struct([("month", pa.string())])),
    ("cost_type", pa.string()),
    ("price", pa.struct([("effective_price", pa.float64()), ("tier_start_amount", pa.float64()),
                         ("unit", pa.string()), ("pricing_unit_quantity", pa.float64())])),
])
"""The detailed usage cost export's columns this sample fills, with their nesting."""


@dataclass(frozen=True, slots=True)
class Difference:
    """How the bill differs from the truth on one UTC day, in one namespace, for one
    reason: its net cost less the true cost at list price, its GPU-hours less the true."""

    kind: Kind
    day: str
    namespace: str
    cost_usd: float
    gpu_hours: float


@dataclass(frozen=True, slots=True)
class SampleBill:
    table: pa.Table
    differences: tuple[Difference, ...]
    exported_until: float
    """The end of the hours the export holds (unix seconds)."""


@dataclass(frozen=True, slots=True)
class _Usage:
    """True GPU-seconds of one hour, node and namespace, on one SKU."""

    hour: float
    node: str
    pool: str
    zone: str
    machine_type: str
    accelerator: str
    provisioning: str
    namespace: str
    seconds: float


def sku_description(accelerator: str, provisioning: str, region: str) -> str:
    """The GPU SKU's description, as Compute Engine writes it."""
    name = SKU_NAMES.get(accelerator, f"Nvidia {accelerator.removeprefix('nvidia-')} GPU")
    where = GEOGRAPHIES.get(region) or _continent(region)
    spot = " attached to Spot Preemptible VMs" if provisioning == "spot" else ""
    return f"{name}{spot} running in {where}"


def _continent(region: str) -> str:
    if region.startswith(("us-", "northamerica-", "southamerica-")):
        return "Americas"
    if region.startswith(("europe-", "me-", "africa-")):
        return "EMEA"
    return "APAC"


def _day(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d")


def _hourly_usage(truth: TruthLog, start: float, end: float,
                  pools: Mapping[str, Pool]) -> list[_Usage]:
    out = []
    for hour in _hours(start, end):
        seconds: dict[tuple[str, str, str, str, str], float] = defaultdict(float)
        for row in truth.report(hour, min(hour + HOUR, end), utilization=False).gpu_seconds:
            ns = row.namespace if row.state == "allocated" and row.namespace else UNALLOCATED
            seconds[(row.node, row.pool, row.accelerator, row.provisioning, ns)] += row.seconds
        out += [_Usage(hour, node, pool, pools[pool].zone, pools[pool].machine_type, accel,
                       prov, ns, secs)
                for (node, pool, accel, prov, ns), secs in sorted(seconds.items()) if secs > 0]
    return out


def _hours(start: float, end: float) -> Iterable[float]:
    hour = start - start % HOUR
    while hour < end:
        yield max(hour, start)
        hour += HOUR


def sample_bill(truth: TruthLog, scenario: Scenario, prices: Mapping[tuple[str, str], float],
                start: float, end: float) -> SampleBill:
    """The detailed export's GPU lines of ``[start, end)`` (closed truth segments), at
    ``prices`` (USD a GPU-hour by model and provisioning), with the known differences."""
    pools = {p.name: p for p in scenario.pools}
    usage = [u for u in _hourly_usage(truth, start, end, pools)
             if (u.accelerator, u.provisioning) in prices]
    first_day, last_day = start - start % DAY, (end - 1) - (end - 1) % DAY
    exported_until = last_day if last_day > first_day else end
    on_demand = {a for (a, p) in prices if p == "on-demand"
                 and any(u.accelerator == a and u.provisioning == p for u in usage)}
    committed = max(on_demand, key=lambda a: prices[(a, "on-demand")], default=None)
    diffs: dict[tuple[Kind, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    lines = []
    for u in usage:
        hours = u.seconds / HOUR
        list_cost = hours * prices[(u.accelerator, u.provisioning)]
        day = _day(u.hour)
        if u.hour >= exported_until:
            diffs[("not_exported", day, u.namespace)][0] -= list_cost
            diffs[("not_exported", day, u.namespace)][1] -= hours
            continue
        cost, credit = list_cost, 0.0
        if u.provisioning == "spot":
            cost = list_cost * (1 + SPOT_PRICE_CHANGE)
            diffs[("spot_price", day, u.namespace)][0] += cost - list_cost
        if u.accelerator == committed and u.provisioning == "on-demand":
            credit = -COMMITTED_USE_DISCOUNT * cost
            diffs[("committed_use", day, u.namespace)][0] += credit
        lines.append(_line(scenario, u, hours, cost, credit))
    if UNSEEN_ACCELERATOR in SKU_NAMES and (UNSEEN_ACCELERATOR, "on-demand") in prices:
        price = prices[(UNSEEN_ACCELERATOR, "on-demand")]
        for hour in _hours(start, exported_until):
            span = min(hour - hour % HOUR + HOUR, exported_until) - hour
            for g in range(UNSEEN_GPUS):
                u = _Usage(hour, f"gke-{scenario.cluster}-{UNSEEN_POOL}-{g}", UNSEEN_POOL,
                           f"{scenario.region}-a", "g2-standard-8", UNSEEN_ACCELERATOR,
                           "on-demand",
                           UNSEEN_NAMESPACE, span)
                lines.append(_line(scenario, u, span / HOUR, span / HOUR * price, 0.0))
                d = diffs[("unmonitored_pool", _day(hour), UNSEEN_NAMESPACE)]
                d[0] += span / HOUR * price
                d[1] += span / HOUR
    differences = tuple(Difference(kind, day, ns, cost, hours)
                        for (kind, day, ns), (cost, hours) in sorted(diffs.items()))
    return SampleBill(pa.Table.from_pylist(lines, schema=SCHEMA), differences, exported_until)


def _line(scenario: Scenario, u: _Usage, hours: float, cost: float,
          credit: float) -> dict[str, Any]:
    at = datetime.fromtimestamp(u.hour, UTC)
    until = datetime.fromtimestamp(u.hour - u.hour % HOUR + HOUR, UTC)
    sku = sku_description(u.accelerator, u.provisioning, scenario.region)
    labels = [{"key": "goog-k8s-cluster-name", "value": scenario.cluster},
              {"key": "goog-k8s-node-pool-name", "value": u.pool},
              {"key": "k8s-namespace", "value": u.namespace}]
    return {
        "billing_account_id": ACCOUNT,
        "service": COMPUTE_ENGINE,
        "sku": {"id": _sku_id(sku), "description": sku},
        "usage_start_time": at, "usage_end_time": until,
        "project": {"id": scenario.project, "number": "123456789012",
                    "name": scenario.project, "labels": [],
                    "ancestry_numbers": "/123456789012/"},
        "labels": labels,
        "system_labels": [{"key": "compute.googleapis.com/machine_spec",
                           "value": u.machine_type}],
        "location": {"location": u.zone, "country": None, "region": scenario.region,
                     "zone": u.zone},
        "resource": {"name": u.node, "global_name": (
            f"//compute.googleapis.com/projects/{scenario.project}/zones/{u.zone}/"
            f"instances/{u.node}")},
        "export_time": until,
        "cost": round(cost, 6), "currency": "USD", "currency_conversion_rate": 1.0,
        "usage": {"amount": round(u.seconds, 3), "unit": "seconds",
                  "amount_in_pricing_units": hours, "pricing_unit": "hour"},
        "credits": [{"name": "Committed use discount: GPU", "amount": round(credit, 6),
                     "full_name": None, "id": "COMMITTED_USAGE_DISCOUNT-GPU",
                     "type": "COMMITTED_USAGE_DISCOUNT"}] if credit else [],
        "invoice": {"month": at.strftime("%Y%m")},
        "cost_type": "regular",
        "price": {"effective_price": round(cost / hours, 6) if hours else 0.0,
                  "tier_start_amount": 0.0, "unit": "hour", "pricing_unit_quantity": 1.0},
    }


def _sku_id(description: str) -> str:
    """A stable SKU id of the sample (real ids are opaque, like ``1D2E-3F4A-5B6C``)."""
    import hashlib

    h = hashlib.sha256(description.encode()).hexdigest().upper()
    return f"{h[0:4]}-{h[4:8]}-{h[8:12]}"


def write(bill: SampleBill, path: Path) -> Path:
    """The bill as one Parquet file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(bill.table, path)
    return path
