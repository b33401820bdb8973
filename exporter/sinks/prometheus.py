"""The ``/metrics`` catalogue, rendered once per cycle from an immutable view.

Every family is built afresh from the cycle's view, so series of deleted pods and nodes
vanish by themselves; unknown values are absent, never zero. Base units, ratios 0-1,
counters end in ``_total``. The text is Prometheus' exposition format 0.0.4, written
directly: at 8,000 GPUs a generic client library spends seconds per render. What a series'
text comes from is kept from one cycle to the next (its line, which starts with its
``name{labels} `` prefix, and its last value), so a render formats only the values that
changed.
"""

from __future__ import annotations

import functools
import math
import platform
import threading
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any

from exporter import __version__, compute
from exporter.sources.dcgm import REJECT_REASONS, parse_labels
from exporter.sources.kube import KUBE_ERROR_REASONS, NodeInfo, PodInfo, gpu_model

if TYPE_CHECKING:
    from exporter.bottleneck import Diagnosis
    from exporter.scheduled_report import ReportStats
    from exporter.service import SourceHealth, Totals
    from exporter.sinks.bigquery import BigQueryStats
    from exporter.sinks.cloud_monitoring import CloudMonitoringStats
    from exporter.sinks.remote_write import RemoteWriteStats
    from exporter.sources.kube import KubeSource

P = "gke_gpu_"
QUEUE_BUCKETS = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0,
                 28800.0, 43200.0, 86400.0, 172800.0, 345600.0, 604800.0)
"""``le`` of ``queue_wait_seconds``: 5 s to 7 days (a notebook waits seconds, a multi-node
training job may wait days); the metric table of docs/metrics.md lists them."""
DEVICE_LABELS = ["cluster", "node", "pool", "zone", "model", "provisioning", "gpu", "uuid",
                 "mig_profile", "mig_instance"]
GROUP_LABELS = ["cluster", "state", "namespace", "team", "pool", "model", "provisioning"]
COST_GROUP = ["cluster", "namespace", "team", "pool", "model", "provisioning"]
BUILD_INFO = {"version": __version__, "python_version": platform.python_version(),
              "duckdb_version": metadata.version("duckdb")}
"""What is running: the exporter, the Python and the DuckDB (the warehouse file's format)."""


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _number(value: float) -> str:
    if value.__class__ is float:  # the common case first, with the same text as below
        if value.is_integer() and -1e15 < value < 1e15:
            return str(int(value))
        return repr(value)
    if value.__class__ is int:
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


_UNSET: object = object()
"""No value yet: unequal to every value, so the first one always writes its line. Values
that compare equal have the same text (``_number``: 1 and 1.0 both give ``1``)."""


def _series(prefix: str) -> list[Any]:
    """A series as a family keeps it: ``[line, value, cut]``, the line's first ``cut``
    bytes its ``name{labels} `` prefix (built once; the line again only when the value
    changes, from the prefix it starts with: the prefix is not kept twice)."""
    line = prefix.encode()
    return [line, _UNSET, len(line)]


class _Kept:
    """What a family keeps from one cycle to the next: each series (``_series``) by its
    label values. Lines are bytes, joined once per render (86,000 lines of a fleet's size:
    2 ms, where joining them as str and encoding the text took 21 ms); a family's text is
    not kept as well, which would hold the exposition twice (17 MB at 8,000 GPUs)."""

    __slots__ = ("fixed", "head", "keys", "mapped", "order", "series", "snapshot")

    def __init__(self, head: bytes) -> None:
        self.head = head
        self.series: dict[object, list[Any]] = {}
        # add_sorted's: its fixed labels, the mapping's keys as they came and sorted, a copy
        # of the mapping and the lines it gave
        self.fixed: tuple[str, ...] | None = None
        self.keys: list[object] = []
        self.order: list[Any] = []
        self.snapshot: dict[object, float] = {}
        self.mapped: list[bytes] = []


_KEPT: dict[tuple[str, str, str, tuple[str, ...], str], _Kept] = {}
_LOCK = threading.Lock()


class Metric:
    """One metric family: HELP, TYPE and its samples, as text."""

    kind = "untyped"
    suffix = ""

    def __init__(self, name: str, documentation: str, labels: Sequence[str] | None = None,
                 value: float | None = None, const: str = "") -> None:
        """``const``: label text every sample carries first (``label_text``'s form)."""
        self.name = name + self.suffix
        self.documentation = documentation
        self.labels = tuple(labels or ())
        self.const = const
        self.lines: list[bytes] = []
        ident = (self.name, self.kind, documentation, self.labels, const)
        kept = _KEPT.get(ident)
        if kept is None:
            help_text = documentation.replace("\\", "\\\\").replace("\n", "\\n")
            kept = _KEPT[ident] = _Kept(f"# HELP {self.name} {help_text}\n"
                                        f"# TYPE {self.name} {self.kind}\n".encode())
        self._kept = kept
        if value is not None:
            self.add_metric((), value)

    def _labels(self, values: Sequence[str], extra: str = "") -> str:
        pairs = ",".join(p for p in (self.const, label_text(self.labels, values), extra) if p)
        return "{" + pairs + "}" if pairs else ""

    def add_metric(self, values: Sequence[str], value: float) -> None:
        self.add_items((((*values,), value),))

    def add_items(self, items: Iterable[tuple[tuple[str, ...], float]]) -> None:
        """Samples as (label values, value), in order."""
        series = self._kept.series
        append = self.lines.append
        for key, value in items:
            s = series.get(key)
            if s is None:
                s = series[key] = _series(f"{self.name}{self._labels(key)} ")
            if s[1] != value:
                s[1] = value
                s[0] = s[0][:s[2]] + _number(value).encode() + b"\n"
            append(s[0])

    def add_sorted(self, mapping: Mapping[Any, float], fixed: tuple[str, ...],
                   nonzero: bool = False) -> None:
        """A sample per item of ``mapping`` (but zeros when ``nonzero``), sorted by key,
        labelled ``fixed`` then the key (a tuple key: its parts). Unless the mapping's keys
        change the order is kept, and so are the lines while the mapping is equal."""
        kept = self._kept
        keys = list(mapping)
        if fixed != kept.fixed:
            kept.series.clear()
            kept.fixed, kept.keys, kept.snapshot = fixed, [], {}
        if keys != kept.keys:
            kept.keys, kept.order = keys, sorted(keys)
        elif mapping == kept.snapshot:
            self.lines.extend(kept.mapped)
            return
        series = kept.series
        mapped: list[bytes] = []
        append = mapped.append
        for key in kept.order:
            value = mapping[key]
            if nonzero and not value:
                continue
            s = series.get(key)
            if s is None:
                values = (*fixed, *key) if key.__class__ is tuple else (*fixed, key)
                s = series[key] = _series(f"{self.name}{self._labels(values)} ")
            if s[1] != value:
                s[1] = value
                s[0] = s[0][:s[2]] + _number(value).encode() + b"\n"
            append(s[0])
        kept.snapshot, kept.mapped = dict(mapping), mapped
        self.lines.extend(mapped)

    def parts(self) -> list[bytes]:
        """The family's text: HELP and TYPE, then its lines. The series gone for good are
        forgotten."""
        kept = self._kept
        if len(kept.series) > 2 * len(self.lines) + 1024:
            kept.series.clear()
        return [kept.head, *self.lines]


class GaugeMetricFamily(Metric):
    kind = "gauge"


class CounterMetricFamily(Metric):
    kind = "counter"
    suffix = "_total"


class HistogramMetricFamily(Metric):
    kind = "histogram"

    def add_metric(self, values: Sequence[str], buckets: Sequence[tuple[str, float]],  # type: ignore[override]
                   sum_value: float) -> None:
        series = self._kept.series
        append = self.lines.append
        values = tuple(values)
        samples = [*((("_bucket", bound), count) for bound, count in buckets),
                   (("_sum", None), sum_value), (("_count", None), buckets[-1][1])]
        for (part, bound), value in samples:
            key = (part, bound, values)
            s = series.get(key)
            if s is None:
                extra = f'le="{bound}"' if bound is not None else ""
                s = series[key] = _series(f"{self.name}{part}{self._labels(values, extra)} ")
            if s[1] != value:
                s[1] = value
                s[0] = s[0][:s[2]] + _number(value).encode() + b"\n"
            append(s[0])


@dataclass(frozen=True, slots=True)
class MetricsView:
    cluster: str
    now: float
    states: Sequence[compute.DeviceState]
    nodes: Mapping[str, NodeInfo]
    pods: Sequence[PodInfo]
    totals: Totals
    health: SourceHealth
    kube: KubeSource
    diagnoses: Mapping[str, tuple[compute.Owner, Diagnosis]]
    available_gpus: float | None
    """None before the first list of nodes: unknown, not zero."""
    cycle_seconds: float
    owner: Callable[[PodInfo], compute.Owner]
    rows_written: Mapping[str, int]
    bigquery: BigQueryStats | None = None
    bigquery_dataset: str = ""
    budgets: Mapping[str, float] = field(default_factory=dict)
    sla_target: float = 0.995
    remote_write: RemoteWriteStats | None = None
    cloud_monitoring: CloudMonitoringStats | None = None
    rows_removed: Mapping[tuple[str, str], int] = field(default_factory=dict)
    report: ReportStats | None = None
    kube_max_staleness: float = math.inf
    """A Kubernetes kind whose last answer is older than this is down (a hung watch)."""


def label_text(names: Sequence[str], values: Sequence[str]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in zip(names, values, strict=True))


@functools.lru_cache(maxsize=65536)
def _device_labels_cached(cluster: str, node: str, pool: str, zone: str, model: str,
                          provisioning: str, gpu: str, uuid: str, mig_profile: str,
                          instance: str) -> str:
    return label_text(DEVICE_LABELS, [cluster, node, pool, zone, model, provisioning, gpu,
                                      uuid, mig_profile, instance])


def _device_labels(cluster: str, d: compute.DeviceState) -> str:
    """The device's label text; the same GPU gets the same text every cycle (cached)."""
    instance = d.device_id.rsplit("/", 1)[1] if "/" in d.device_id else ""
    return _device_labels_cached(cluster, d.node, d.pool, d.zone, d.accelerator,
                                 d.provisioning, d.gpu_index, d.gpu_uuid,
                                 d.mig_profile or "", instance)


DEVICE_READINGS = (
    ("temperature_celsius", "DCGM_FI_DEV_GPU_TEMP", 1.0, "GPU temperature (DCGM)."),
    ("power_watts", "DCGM_FI_DEV_POWER_USAGE", 1.0, "GPU power draw (DCGM)."),
    ("sm_clock_hertz", "DCGM_FI_DEV_SM_CLOCK", 1e6, "GPU SM clock (DCGM, MHz x 1e6)."),
)
"""DCGM readings shown per GPU as they are, for the drill-down: (family, field, scale,
help). Absent where dcgm-exporter does not collect the field."""
READING_LABELS = ["cluster", "node", "pool", "model", "gpu", "uuid"]
"""A reading is of the physical GPU (once, however many MIG instances it has), with the
labels the drill-down chooses by: at 8,000 GPUs each label costs ~0.5 MB a scrape."""


class _Device:
    """One device's lines, kept from one cycle to the next (keyed by everything its labels
    come from): utilisation, memory in use and the readings are rewritten when they change,
    the rest when the device's state, reason, price, owners or memory size change."""

    __slots__ = ("alloc", "available", "labels", "price", "reading_lines", "reading_values",
                 "readings", "settled", "source", "state", "total", "used", "used_line", "util",
                 "util_line")

    def __init__(self, labels: str) -> None:
        self.labels = labels
        self.readings = b""
        """``{labels} `` of the GPU's readings; empty until it has one."""
        self.reading_values: list[float | None] = [None] * len(DEVICE_READINGS)
        self.reading_lines = [b""] * len(DEVICE_READINGS)
        self.util: object = _UNSET
        self.source: str | None = None
        self.util_line = b""
        self.used: object = _UNSET
        self.used_line = b""
        self.settled: object = _UNSET
        self.total = self.available = self.state = self.price = b""
        self.alloc: list[bytes] = []


_DEVICES: dict[tuple[str, ...], _Device] = {}


def _device_samples(v: MetricsView, util: Metric, mem_used: Metric, mem_total: Metric,
                    available: Metric, state: Metric, price: Metric, alloc: Metric,
                    readings: Sequence[Metric]) -> None:
    """The per-device families, in one pass over the devices: ~13 samples per GPU."""
    c = v.cluster
    devices = _DEVICES
    read = [(field, family.name.encode(), scale, family.lines.append)
            for (_, field, scale, _), family in zip(DEVICE_READINGS, readings, strict=True)]
    read_gpus: set[str] = set()
    add_util, add_used, add_total = (util.lines.append, mem_used.lines.append,
                                     mem_total.lines.append)
    add_available, add_state, add_price = (available.lines.append, state.lines.append,
                                           price.lines.append)
    add_alloc = alloc.lines.extend
    for d in v.states:
        key = (c, d.node, d.pool, d.zone, d.accelerator, d.provisioning, d.gpu_index,
               d.gpu_uuid, d.mig_profile or "", d.device_id)
        e = devices.get(key)
        if e is None:
            e = devices[key] = _Device(_device_labels(c, d))
        u = d.utilization
        if u is not None:
            if u != e.util or d.utilization_source != e.source:
                e.util, e.source = u, d.utilization_source
                e.util_line = (f'{util.name}{{{e.labels},source="{d.utilization_source}"}} '
                               f"{_number(u)}\n").encode()
            add_util(e.util_line)
        used, total = d.memory_used_bytes, d.memory_total_bytes
        if used is not None:
            if used != e.used:
                e.used = used
                e.used_line = f"{mem_used.name}{{{e.labels}}} {_number(used)}\n".encode()
            add_used(e.used_line)
        settled = (d.state, d.reason, d.price_usd_per_hour, d.owners, total)
        if settled != e.settled:
            e.settled = settled
            labels = e.labels
            e.total = b"" if total is None else \
                f"{mem_total.name}{{{labels}}} {_number(total)}\n".encode()
            e.available = (f"{available.name}{{{labels}}} "
                           f"{'0' if d.state == 'unavailable' else '1'}\n").encode()
            e.state = (f'{state.name}{{{labels},state="{d.state}",reason="{d.reason or ""}"}} '
                       "1\n").encode()
            e.price = (b"" if d.price_usd_per_hour is None else
                       f"{price.name}{{{labels}}} {_number(d.price_usd_per_hour)}\n".encode())
            e.alloc = [f"{alloc.name}{{{labels},{label_text(
                ('namespace', 'pod', 'team', 'workload'),
                (o.namespace, o.name, o.team, o.workload))}}} 1\n".encode() for o in d.owners]
        if e.total:
            add_total(e.total)
        add_available(e.available)
        add_state(e.state)
        if e.price:
            add_price(e.price)
        if e.alloc:
            add_alloc(e.alloc)
        if d.gpu_uuid in read_gpus:  # another MIG instance of a GPU already read
            continue
        if not e.readings:
            e.readings = ("{" + label_text(READING_LABELS, (
                c, d.node, d.pool, d.accelerator, d.gpu_index, d.gpu_uuid)) + "} ").encode()
        fields = d.fields
        last, lines = e.reading_values, e.reading_lines
        read_any = False
        for i, (name, family, scale, add) in enumerate(read):
            x = fields.get(name)
            if x is not None:
                if x != last[i]:  # most readings hold from one cycle to the next
                    last[i] = x
                    lines[i] = b"%s%s%s\n" % (family, e.readings, _number(x * scale).encode())
                add(lines[i])
                read_any = True
        if read_any:
            read_gpus.add(d.gpu_uuid)
    if len(devices) > 2 * len(v.states) + 1024:  # devices gone for good
        devices.clear()


def _families(v: MetricsView) -> Iterator[Metric]:
    c = v.cluster
    util = GaugeMetricFamily(P + "utilization_ratio", "GPU utilisation: DCGM GR engine "
                             "active, else GPU_UTIL/100 (source label says which).",
                             labels=[*DEVICE_LABELS, "source"])
    mem_used = GaugeMetricFamily(P + "memory_used_bytes", "GPU framebuffer memory in use.",
                                 labels=DEVICE_LABELS)
    mem_total = GaugeMetricFamily(P + "memory_total_bytes", "GPU framebuffer memory size.",
                                  labels=DEVICE_LABELS)
    available = GaugeMetricFamily(P + "available", "1 if the GPU is usable, 0 if it is "
                                  "unavailable (node not Ready, GPU missing, fatal XID).",
                                  labels=DEVICE_LABELS)
    state = GaugeMetricFamily(P + "state", "1 for the GPU's allocation state: allocated, "
                              "unallocated or unavailable (with reason).",
                              labels=[*DEVICE_LABELS, "state", "reason"])
    price = GaugeMetricFamily(P + "price_usd_per_hour", "Hourly price of the GPU (or MIG "
                              "slice) after discount.", labels=DEVICE_LABELS)
    alloc = GaugeMetricFamily(P + "allocation_info", "Which pod holds which GPU; one series "
                              "per pod on a time-shared GPU.",
                              labels=[*DEVICE_LABELS, "namespace", "pod", "team", "workload"])
    readings = [GaugeMetricFamily(P + name, doc, labels=READING_LABELS)
                for name, _, _, doc in DEVICE_READINGS]
    _device_samples(v, util, mem_used, mem_total, available, state, price, alloc, readings)
    yield from (util, mem_used, mem_total, available, state, price, alloc, *readings)

    node_labels = ["cluster", "node", "pool", "model", "provisioning"]
    cap = GaugeMetricFamily(P + "node_capacity_gpus", "nvidia.com/gpu capacity of the node.",
                            labels=node_labels)
    allocatable = GaugeMetricFamily(P + "node_allocatable_gpus",
                                    "nvidia.com/gpu the node offers to pods.",
                                    labels=node_labels)
    allocated = GaugeMetricFamily(P + "node_allocated_gpus",
                                  "nvidia.com/gpu requested by pods running on the node.",
                                  labels=node_labels)
    ready = GaugeMetricFamily(P + "node_ready", "1 if the node is Ready.", labels=node_labels)
    requested: dict[str, int] = defaultdict(int)
    for p in v.pods:
        if p.node and p.phase in ("Running", "Pending") and p.scheduled is not None:
            requested[p.node] += p.gpus
    gpu_nodes = [((c, n.name, n.pool, n.accelerator, n.provisioning), n)
                 for n in v.nodes.values() if n.accelerator]
    cap.add_items((nl, n.capacity_gpus) for nl, n in gpu_nodes)
    allocatable.add_items((nl, n.allocatable_gpus) for nl, n in gpu_nodes)
    allocated.add_items((nl, requested.get(n.name, 0)) for nl, n in gpu_nodes)
    ready.add_items((nl, 1.0 if n.ready else 0.0) for nl, n in gpu_nodes)
    yield from (cap, allocatable, allocated, ready)
    yield GaugeMetricFamily(P + "cluster_available_gpus", "Allocatable GPUs of Ready nodes "
                            "minus system-reserved, in physical GPUs.",
                            value=v.available_gpus, const=label_text(["cluster"], [c]))

    yield from _queue_families(v)
    yield from _cost_families(v)

    up = CounterMetricFamily(P + "up_seconds", "Seconds the GPU was available.",
                             labels=["cluster", "uuid"])
    up.add_sorted(v.totals.up_seconds, (c,))
    down = CounterMetricFamily(P + "down_seconds", "Seconds the GPU was unavailable, by "
                               "reason: node_not_ready, gpu_missing, xid.",
                               labels=["cluster", "uuid", "reason"])
    down.add_sorted(v.totals.down_seconds, (c,))
    spot = CounterMetricFamily(P + "spot_interruptions", "Pods terminated by spot "
                               "preemption, by node pool.", labels=["cluster", "pool"])
    for pool, count in sorted(v.totals.interruptions.items()):
        spot.add_metric([c, pool], count)
    xid = CounterMetricFamily(P + "xid_events", "XID errors seen: each time a GPU's last XID "
                              "(DCGM_FI_DEV_XID_ERRORS) changes to a new code.",
                              labels=["cluster", "node", "uuid"])
    xid.add_sorted(v.totals.xid_events, (c,))
    last = GaugeMetricFamily(P + "last_xid", "The GPU's last XID error code (absent: none).",
                             labels=["cluster", "node", "uuid"])
    last.add_sorted(v.totals.last_xid, (c,), nonzero=True)
    sla = GaugeMetricFamily(P + "sla_target_ratio", "Availability objective (config: "
                            "sla.target), for the SLO alerts.", labels=["cluster"])
    sla.add_metric([c], v.sla_target)
    yield from (up, down, spot, xid, last, sla)
    if v.budgets:
        budget = GaugeMetricFamily(P + "team_budget_usd", "Monthly GPU budget of the team "
                                   "(config: budgets).", labels=["cluster", "team"])
        for team, usd in sorted(v.budgets.items()):
            budget.add_metric([c, team], usd)
        yield budget
    month = GaugeMetricFamily(P + "team_month_cost_usd", "Cost of the team's allocated GPUs "
                              "this UTC calendar month so far, the warehouse's rows of the "
                              "month from before a restart included.", labels=["cluster", "team"])
    month.add_items(((c, team), usd) for team, usd in sorted(v.totals.month_cost.items()))
    yield month

    bottleneck = GaugeMetricFamily(P + "pod_bottleneck", "1 for the pod's bottleneck class "
                                   "over the sliding window.",
                                   labels=["cluster", "namespace", "pod", "team", "workload",
                                           "class"])
    bottleneck.add_items(((c, owner.namespace, owner.name, owner.team, owner.workload,
                           diag.bottleneck), 1.0) for owner, diag in v.diagnoses.values())
    yield bottleneck
    yield from _health_families(v)


def _queue_families(v: MetricsView) -> Iterator[Metric]:
    c = v.cluster
    labels = ["cluster", "namespace", "team", "model"]
    pending_pods: dict[tuple[str, str, str, str], int] = defaultdict(int)
    pending_gpus: dict[tuple[str, str, str, str], int] = defaultdict(int)
    oldest: dict[tuple[str, str, str, str], float] = {}
    for p in v.pods:
        if p.gpus <= 0 or p.phase != "Pending" or p.scheduled is not None:
            continue
        o = v.owner(p)
        key = (c, p.namespace, o.team, gpu_model(p, v.nodes))
        pending_pods[key] += 1
        pending_gpus[key] += p.gpus
        oldest[key] = max(oldest.get(key, 0.0), compute.queue_wait_seconds(p, v.now))
    fams = [GaugeMetricFamily(P + "pending_pods", "GPU pods waiting to be scheduled.",
                              labels=labels),
            GaugeMetricFamily(P + "pending_gpus", "GPUs requested by pending pods.",
                              labels=labels),
            GaugeMetricFamily(P + "oldest_pending_seconds", "Age of the oldest pending GPU "
                              "pod.", labels=labels)]
    for key in sorted(pending_pods):
        fams[0].add_metric(list(key), pending_pods[key])
        fams[1].add_metric(list(key), pending_gpus[key])
        fams[2].add_metric(list(key), oldest[key])
    yield from fams
    hist = HistogramMetricFamily(P + "queue_wait_seconds", "Time from pod creation to "
                                 "PodScheduled=True, GPU pods scheduled since start.",
                                 labels=labels)
    for hkey in sorted(v.totals.queue_hist):
        h = v.totals.queue_hist[hkey]
        cum = [(str(b), h.buckets[i]) for i, b in enumerate(QUEUE_BUCKETS)]
        cum.append(("+Inf", h.count))
        hist.add_metric([c, *hkey], cum, h.total)
    yield hist


def _cost_families(v: MetricsView) -> Iterator[Metric]:
    c = v.cluster
    cost = CounterMetricFamily(P + "cost_usd", "GPU cost by allocation state and owner; "
                               "unallocated and unavailable time goes to the pool.",
                               labels=GROUP_LABELS)
    secs = CounterMetricFamily(P + "gpu_seconds", "GPU time by allocation state and owner "
                               "(MIG slices as their fraction, shared GPUs split).",
                               labels=GROUP_LABELS)
    used = CounterMetricFamily(P + "utilized_gpu_seconds", "GPU time weighted by "
                               "utilisation.", labels=GROUP_LABELS)
    effective = GaugeMetricFamily(P + "effective_cost_usd_per_utilized_hour",
                                  "Cost of one utilised GPU-hour since start: price x "
                                  "(1 - discount) / utilisation.", labels=COST_GROUP)
    eff_cost: dict[tuple[str, str, str, str, str, str], float] = defaultdict(float)
    eff_used: dict[tuple[str, str, str, str, str, str], float] = defaultdict(float)
    t = v.totals
    for key in sorted(t.gpu_seconds):
        labels = [c, *key]
        secs.add_metric(labels, t.gpu_seconds[key])
        if key in t.cost_usd:
            cost.add_metric(labels, t.cost_usd[key])
        if key in t.utilized_seconds:
            used.add_metric(labels, t.utilized_seconds[key])
        if key[0] == "allocated":
            g = (c, *key[1:])
            eff_cost[g] += t.cost_usd.get(key, 0.0)
            eff_used[g] += t.utilized_seconds.get(key, 0.0)
    for g in sorted(eff_cost):
        value = compute.effective_cost(eff_cost[g], eff_used[g])
        if value is not None:
            effective.add_metric(list(g), value)
    yield from (cost, secs, used, effective)


def _health_families(v: MetricsView) -> Iterator[Metric]:
    """The exporter's own series, each with the cluster it watches."""
    h = v.health
    const = label_text(["cluster"], [v.cluster])
    gauge = functools.partial(GaugeMetricFamily, const=const)
    counter = functools.partial(CounterMetricFamily, const=const)
    up = gauge(P + "exporter_source_up", "1 if the source answered in the last "
                           "cycle (a Kubernetes kind: its last list, event or bookmark is "
                           "within kubernetes.max_staleness).", labels=["source", "target"])
    dur = gauge(P + "exporter_scrape_duration_seconds", "Duration of the last "
                            "successful scrape of a target.", labels=["source", "target"])
    answered = sorted(h.up.items())
    up.add_items((key, 1.0 if ok else 0.0) for key, ok in answered)
    dur.add_items((key, h.duration[key]) for key, _ in answered if key in h.duration)
    for kind, ok in sorted(v.kube.up.items()):
        age = v.kube.age(kind)
        fresh = age is None or age <= v.kube_max_staleness
        up.add_metric(["kubernetes", kind], 1.0 if ok and fresh else 0.0)
    last = gauge(P + "exporter_source_last_success_timestamp_seconds", "When the "
                             "source last answered (Unix time): a dcgm target's last scrape, "
                             "a Kubernetes list, watch event or bookmark, a BigQuery or Cloud "
                             "Monitoring write. Absent before the first.",
                             labels=["source", "target"])
    last.add_items(sorted(h.last_success.items()))
    for kind, t in sorted(v.kube.last_success.items()):
        last.add_metric(["kubernetes", kind], t)
    errors = counter(P + "exporter_errors", "Failed scrapes, watches and writes, "
                                 "by reason: http_<status>, refused, unavailable, timeout, "
                                 "bad_answer, error.", labels=["source", "target", "reason"])
    by_reason: dict[tuple[str, str], dict[str, int]] = defaultdict(dict)
    for (source, target, reason), n in h.error_reasons.items():
        by_reason[(source, target)][reason] = n
    for (source, target), n in sorted(h.errors.items()):
        known = by_reason.get((source, target), {})
        for reason, count in sorted(known.items()):
            errors.add_metric([source, target, reason], count)
        if n > sum(known.values()) or not known:
            errors.add_metric([source, target, "error"], n - sum(known.values()))
    for kind, st in sorted(v.kube.stats.items()):
        for reason in sorted(KUBE_ERROR_REASONS | st.reasons.keys()):
            errors.add_metric(["kubernetes", kind, reason], st.reasons.get(reason, 0))
    relists = counter(P + "exporter_kubernetes_relists", "Relists by cause: "
                                  "expired (410), watchdog (silent watch).",
                                  labels=["resource", "cause"])
    for kind, st in sorted(v.kube.stats.items()):
        relists.add_metric([kind, "expired"], st.expired)
        relists.add_metric([kind, "watchdog"], st.watchdog_relists)
    rejected = counter(P + "exporter_rejected_samples", "DCGM samples dropped, by "
                                   "reason.", labels=["reason"])
    for reason in sorted(REJECT_REASONS | h.rejected.keys()):
        rejected.add_metric([reason], h.rejected.get(reason, 0))
    rows = counter(P + "exporter_rows_written", "Rows written to the warehouse, "
                               "by sink (duckdb, bigquery) and table.", labels=["sink", "table"])
    for table, n in sorted(v.rows_written.items()):
        rows.add_metric(["duckdb", table], n)
    if v.bigquery is not None:
        bq = v.bigquery
        up.add_metric(["bigquery", v.bigquery_dataset], 1.0 if bq.up else 0.0)
        if bq.last_success is not None:
            last.add_metric(["bigquery", v.bigquery_dataset], bq.last_success)
        errors.add_metric(["bigquery", v.bigquery_dataset, "error"], bq.errors)
        for table, n in sorted(dict(bq.rows_written).items()):
            rows.add_metric(["bigquery", table], n)
    if v.cloud_monitoring is not None:
        up.add_metric(["cloud_monitoring", v.cloud_monitoring.project],
                      1.0 if v.cloud_monitoring.up else 0.0)
        if v.cloud_monitoring.last_success is not None:
            last.add_metric(["cloud_monitoring", v.cloud_monitoring.project],
                            v.cloud_monitoring.last_success)
    yield from (up, last, dur, errors, relists, rejected, rows)
    if v.bigquery is not None:
        yield from _spool_families(v.bigquery, const)
    if v.rows_removed:  # the local warehouse is on
        removed = counter(P + "exporter_warehouse_rows_removed", "Warehouse rows "
                                      "taken out by the retention: rolled_up (into hourly "
                                      "rows), expired; or given up unstaged while the "
                                      "warehouse failed.", labels=["table", "reason"])
        for (table, reason), n in sorted(v.rows_removed.items()):
            removed.add_metric([table, reason], n)
        yield removed
    if v.report is not None:
        runs = counter(P + "exporter_reports", "Scheduled weekly reports by "
                                   "outcome: ok, failed.", labels=["outcome"])
        for outcome, n in sorted(v.report.runs.items()):
            runs.add_metric([outcome], n)
        yield runs
        if v.report.last_success is not None:
            yield gauge(P + "exporter_report_last_success_timestamp_seconds",
                                    "When the last scheduled weekly report was made.",
                                    value=v.report.last_success)
    if v.remote_write is not None:
        rw = v.remote_write
        requests = counter(P + "exporter_remote_write_requests", "Remote-write "
                                       "requests by outcome: sent, dropped (refused, or the "
                                       "queue was full), retried.", labels=["outcome"])
        for outcome, n in (("sent", rw.requests_sent), ("dropped", rw.requests_dropped),
                           ("retried", rw.retries)):
            requests.add_metric([outcome], n)
        yield requests
        yield gauge(P + "exporter_remote_write_queue", "Requests waiting to be "
                                "sent.", value=rw.queued)
    if v.cloud_monitoring is not None:
        cm = v.cloud_monitoring
        written = counter(P + "exporter_cloud_monitoring_points", "Points "
                                      "written to Cloud Monitoring by outcome: written, "
                                      "refused, dropped (superseded by a newer snapshot "
                                      "while the API failed).", labels=["outcome"])
        for outcome, n in (("written", cm.points_written), ("refused", cm.points_refused),
                           ("dropped", cm.points_dropped)):
            written.add_metric([outcome], n)
        yield written
    unpriced = gauge(P + "exporter_unpriced_gpus", "GPUs whose model the price "
                                 "book does not price: their cost is unknown, not zero.",
                                 labels=["model", "provisioning"])
    missing: dict[tuple[str, str], float] = defaultdict(float)
    for d in v.states:
        if d.price_usd_per_hour is None:
            missing[(d.accelerator, d.provisioning)] += d.fraction
    for key in sorted(missing):
        unpriced.add_metric(list(key), missing[key])
    yield unpriced
    yield gauge(P + "exporter_cycle_duration_seconds", "Wall time of the last "
                            "cycle.", value=v.cycle_seconds)
    yield gauge(P + "exporter_last_cycle_timestamp_seconds", "When the last "
                            "cycle ran (Unix time of its snapshot).", value=v.now)
    build = gauge(P + "exporter_build_info", "Always 1; the labels say which "
                              "exporter, Python and DuckDB versions are running.",
                              labels=list(BUILD_INFO))
    build.add_metric(list(BUILD_INFO.values()), 1.0)
    yield build


def _spool_families(bq: BigQueryStats, const: str) -> Iterator[Metric]:
    gauge = functools.partial(GaugeMetricFamily, const=const)
    counter = functools.partial(CounterMetricFamily, const=const)
    refused = counter(P + "exporter_rows_rejected", "Rows the sink refused (bad "
                                  "values), by table; the rest of their batch was written.",
                                  labels=["sink", "table"])
    for table, n in sorted(dict(bq.rows_rejected).items()):
        refused.add_metric(["bigquery", table], n)
    dropped = counter(P + "exporter_spool_dropped_rows", "Unsent rows dropped, "
                                  "oldest first, because the spool was full.",
                                  labels=["sink", "table"])
    for table, n in sorted(dict(bq.spool_dropped).items()):
        dropped.add_metric(["bigquery", table], n)
    spooled = gauge(P + "exporter_spool_rows", "Rows waiting to be sent.",
                                labels=["sink"])
    spooled.add_metric(["bigquery"], bq.spool_rows)
    size = gauge(P + "exporter_spool_bytes", "Size of the rows waiting to be "
                             "sent.", labels=["sink"])
    size.add_metric(["bigquery"], bq.spool_bytes)
    yield from (refused, dropped, spooled, size)


def series_labels(key: str) -> tuple[str, dict[str, str]]:
    """A rendered sample's name and labels, from its line without the value; an empty
    label is no label (as Prometheus stores it)."""
    name, _, rest = key.partition("{")
    labels = (parse_labels(rest[:-1]) or {}) if rest else {}
    return name, {k: v for k, v in labels.items() if v}


@dataclass(frozen=True, slots=True)
class Exposition:
    """One cycle's exposition as ``render_parts`` gives it, and its size in bytes."""

    parts: list[bytes]
    size: int

    def chunks(self, lines: int = 4096) -> Iterator[bytes]:
        """The text in order, ``lines`` pieces at a time (about 1 MB at fleet scale)."""
        parts = self.parts
        for i in range(0, len(parts), lines):
            yield b"".join(parts[i:i + lines])

    def gzip(self, level: int) -> bytes:
        """The text gzip-compressed (a header without time or name, as
        ``gzip.compress(text, level, mtime=0)`` writes one)."""
        z = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        out = [z.compress(chunk) for chunk in self.chunks()]
        out.append(z.flush())
        return b"".join(out)


def render(view: MetricsView) -> bytes:
    """The full exposition for one cycle."""
    return b"".join(render_parts(view))


def render_parts(view: MetricsView) -> list[bytes]:
    """The full exposition for one cycle, as the pieces it is made of (the lines the
    families keep from cycle to cycle), in order: ``render`` without joining them."""
    parts: list[bytes] = []
    with _LOCK:  # what the families keep is shared
        for family in _families(view):
            parts += family.parts()
    return parts
