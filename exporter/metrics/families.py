"""The ``/metrics`` catalogue: every family the exporter exposes, declared once.

``FAMILIES`` is a table, in exposition order: each family's name, type, unit, help, labels
and the function that yields its samples from one cycle's ``MetricsView``. Everything that
shows the exporter's series reads it: the text exposition (``sinks.prometheus``), remote
write and Cloud Monitoring (through ``series`` and ``samples``, never the rendered text),
the metric reference in ``docs/metrics.md``, the configuration's check of
``cloud_monitoring.families`` and the dashboard and alert tests. The per-device families
open it as one group (``DEVICE_FAMILIES``), its columns written in one pass over the
devices.

Every family is built afresh from the cycle's view, so series of deleted pods and nodes
vanish by themselves; unknown values are absent, never zero. Base units, ratios 0-1,
counters end in ``_total``.
"""

from __future__ import annotations

import math
import platform
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Literal, TypeIs

from exporter import __version__
from exporter.metrics.health import (
    QUARANTINE_REASONS,
    BigQueryStats,
    CatalogStats,
    CloudMonitoringStats,
    KubeHealth,
    QuarantineReason,
    RemoteWriteStats,
    ReportStats,
    SourceHealth,
)
from exporter.model import compute
from exporter.model.carbon import region_of_zone
from exporter.model.energy import ENERGY_BASES, Carbon
from exporter.model.forecast import Forecast
from exporter.model.pending import CAUSES, STRANDED, WaitFigures
from exporter.model.prices import CommitmentUse, ListPrice
from exporter.model.records import (
    KUBE_ERROR_REASONS,
    PAGE_READS,
    REJECT_REASONS,
    ClusterQueueInfo,
    FlavorQuota,
    NodeInfo,
    PodInfo,
    WorkloadInfo,
    gpu_model,
)
from exporter.model.totals import QUEUE_BUCKETS, GroupKey, Totals, WaitHistogram

if TYPE_CHECKING:
    from exporter.model.bottleneck import Diagnosis

PREFIX = "gke_gpu_"
Kind = Literal["gauge", "counter", "histogram"]
Unit = Literal["", "seconds", "bytes", "ratio", "celsius", "watts", "hertz", "gpus", "pods",
               "usd", "usd_per_hour", "joules", "grams", "grams_per_kwh"]
"""A family's samples' unit, which its name ends in ("" for a count of the things its name
says, a state, a flag or an info family's 1)."""
Labels = tuple[str, ...]
"""A sample's label values, in the order of its family's ``labels``."""


@dataclass(frozen=True, slots=True)
class Buckets:
    """A histogram sample: cumulative counts per upper bound (``+Inf`` last), and the sum
    of the observations."""

    counts: tuple[tuple[str, float], ...]
    sum: float

    @property
    def count(self) -> float:
        return self.counts[-1][1]

    def parts(self) -> Iterator[tuple[str, str | None, float]]:
        """The histogram's series as exposed: (name suffix, ``le`` or None, value)."""
        for le, n in self.counts:
            yield "_bucket", le, n
        yield "_sum", None, self.sum
        yield "_count", None, self.count


Sample = tuple[Labels, float]
HistogramSample = tuple[Labels, Buckets]


@dataclass(frozen=True, slots=True)
class MetricsView:
    """What one cycle shows: its device states, the Kubernetes objects and the running
    totals, frozen at the cycle's end."""

    cluster: str
    now: float
    states: Sequence[compute.DeviceState]
    nodes: Mapping[str, NodeInfo]
    pods: Sequence[PodInfo]
    totals: Totals
    health: SourceHealth
    kube: KubeHealth
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
    kube_max_staleness_seconds: float = math.inf
    """A Kubernetes kind whose last answer is older than this is down (a hung watch)."""
    commitments: Mapping[str, CommitmentUse] = field(default_factory=dict)
    """Per GPU model with a committed-use discount."""
    list_prices: Mapping[tuple[str, str], ListPrice] = field(default_factory=dict)
    """(model, provisioning) -> the list price in use."""
    catalog: CatalogStats | None = None
    allocation: str | None = None
    """The allocation dimension's pod label or annotation, when one is configured."""
    kueue: bool = False
    """Whether the cluster runs Kueue (its API is served)."""
    workloads: Sequence[QueuedWorkload] = ()
    """Kueue's Workloads, each with its team and ClusterQueue."""
    cluster_queues: Mapping[str, ClusterQueueInfo] = field(default_factory=dict)
    warehouse_up: bool | None = None
    """Whether the warehouse is open and its last cycle's work succeeded; None without
    one."""
    warehouse_quarantined: Mapping[QuarantineReason, int] = field(default_factory=dict)
    """Files the warehouse set aside, by reason (``health.QUARANTINE_REASONS``)."""
    waits: WaitFigures = field(default_factory=WaitFigures)
    """What waits and why, and the free GPUs no waiting pod could use."""
    forecast: Forecast = field(default_factory=Forecast)
    """The last queue forecast: each waiting unit's expected start."""
    forecast_series: int = 1000
    """The most waiting units given an expected start series."""
    carbon: Carbon | None = None
    """The carbon factors in force."""


def _always(_: MetricsView) -> bool:
    return True


def _has_kueue(v: MetricsView) -> bool:
    return v.kueue


@dataclass(frozen=True, slots=True)
class Family[V: (float, Buckets)]:
    """One metric family: what it is called and means, and where its samples come from;
    ``V`` is its samples' value, a float (a gauge's, a counter's) or ``Buckets`` (a
    histogram's)."""

    name: str
    """Without ``PREFIX``; a counter's without ``_total`` (``exposed`` has both)."""
    kind: Kind
    unit: Unit
    help: str
    labels: Labels
    samples: Callable[[MetricsView], Iterable[tuple[Labels, V]]]
    """The cycle's samples: (label values, value)."""
    present: Callable[[MetricsView], bool] = _always
    """Whether the family is exposed at all this cycle (a sink's own series while the
    sink is configured); a present family with no sample still says what it is."""
    cloud_monitoring: bool = False
    """Written to Cloud Monitoring unless ``cloud_monitoring.families`` says otherwise."""

    @property
    def exposed(self) -> str:
        """The name as exposed: prefixed, a counter's with ``_total``."""
        return PREFIX + self.name + ("_total" if self.kind == "counter" else "")


type AnyFamily = Family[float] | Family[Buckets]
"""A family of the catalogue, of either kind of sample."""


def is_histogram(family: AnyFamily) -> TypeIs[Family[Buckets]]:
    """Whether the family is a histogram: its samples are ``Buckets``."""
    return family.kind == "histogram"


# ---------------------------------------------------------------------------- label sets

DEVICE_LABELS = ("cluster", "node", "pool", "zone", "model", "provisioning", "gpu", "uuid",
                 "mig_profile", "mig_instance")
READING_LABELS = ("cluster", "node", "pool", "model", "gpu", "uuid")
"""A reading is of the physical GPU (once, however many MIG instances it has), with the
labels the drill-down chooses by: at 8,000 GPUs each label costs ~0.5 MB a scrape."""
NODE_LABELS = ("cluster", "node", "pool", "model", "provisioning")
QUEUE_LABELS = ("cluster", "namespace", "team", "model")
WAIT_LABELS = ("cluster", "namespace", "team", "pool", "model", "cause")
STRANDED_LABELS = ("cluster", "pool", "model", "provisioning", "use")
KUEUE_LABELS = ("cluster", "cluster_queue", "local_queue", "namespace", "team")
KUEUE_QUEUE_LABELS = ("cluster", "cluster_queue", "local_queue", "namespace")
KUEUE_FLAVOR_LABELS = ("cluster", "cluster_queue", "cohort", "flavor")
GROUP_LABELS = ("cluster", "state", "namespace", "team", "pool", "model", "provisioning")
COST_GROUP = ("cluster", "namespace", "team", "pool", "model", "provisioning")
SOURCE_LABELS = ("cluster", "source", "target")
STATE_LABELS = ("cluster", "state", "pool", "model", "provisioning")
BUILD_INFO = {"version": __version__, "python_version": platform.python_version(),
              "duckdb_version": metadata.version("duckdb")}
"""What is running: the exporter, the Python and the DuckDB (the warehouse file's format)."""

def _per_view[T](build: Callable[[MetricsView], T]) -> Callable[[MetricsView], T]:
    """``build`` once per view: the families it feeds share one pass over the view."""
    last: list[tuple[MetricsView, T]] = []
    lock = threading.Lock()

    def get(v: MetricsView) -> T:
        with lock:
            if not last or last[0][0] is not v:
                last[:] = [(v, build(v))]
            return last[0][1]
    return get


# ---------------------------------------------------------------------------- devices


@dataclass(frozen=True, slots=True)
class ReadingFamily:
    """A DCGM reading shown per GPU as it is, for the drill-down: absent where
    dcgm-exporter does not collect the field."""

    family: Family[float]
    dcgm_field: str
    scale: float
    """What the field's value is multiplied by to be in the family's unit."""


def _reading(name: str, unit: Unit, dcgm_field: str, scale: float, doc: str) -> ReadingFamily:
    return ReadingFamily(Family(name, "gauge", unit, doc, READING_LABELS,
                                lambda v: _devices(v).readings[dcgm_field]), dcgm_field, scale)


DEVICE_READINGS = (
    _reading("temperature_celsius", "celsius", "DCGM_FI_DEV_GPU_TEMP", 1.0,
             "GPU temperature (DCGM)."),
    _reading("power_watts", "watts", "DCGM_FI_DEV_POWER_USAGE", 1.0, "GPU power draw (DCGM)."),
    _reading("sm_clock_hertz", "hertz", "DCGM_FI_DEV_SM_CLOCK", 1e6,
             "GPU SM clock (DCGM, MHz x 1e6)."),
)
"""The DCGM readings shown per GPU, in exposition order."""


@dataclass(frozen=True, slots=True)
class DeviceFamilies:
    """The families of one sample (or one per pod) per device, by column: ~13 samples per
    GPU, nine tenths of a fleet's exposition. ``/metrics`` writes them in one pass over
    the devices, each device's lines kept together (``sinks.prometheus``)."""

    utilization: Family[float]
    memory_used: Family[float]
    memory_total: Family[float]
    available: Family[float]
    state: Family[float]
    price: Family[float]
    allocation: Family[float]
    """One sample per pod holding the device."""
    readings: tuple[ReadingFamily, ...]
    """Of the physical GPU: once, however many MIG instances it has."""

    def __iter__(self) -> Iterator[Family[float]]:
        """The families in exposition order."""
        yield from (self.utilization, self.memory_used, self.memory_total, self.available,
                    self.state, self.price, self.allocation)
        for r in self.readings:
            yield r.family


@dataclass(slots=True)
class _DeviceSamples:
    utilization: list[Sample] = field(default_factory=list)
    memory_used: list[Sample] = field(default_factory=list)
    memory_total: list[Sample] = field(default_factory=list)
    available: list[Sample] = field(default_factory=list)
    state: list[Sample] = field(default_factory=list)
    price: list[Sample] = field(default_factory=list)
    allocation: list[Sample] = field(default_factory=list)
    readings: dict[str, list[Sample]] = field(
        default_factory=lambda: {r.dcgm_field: [] for r in DEVICE_READINGS})
    """By DCGM field."""
    gpus: dict[Labels, float] = field(default_factory=lambda: defaultdict(float))
    """Physical GPUs by ``STATE_LABELS``: each device's fraction (a MIG slice its share of
    the GPU, a time-shared GPU once), as ``gpu_seconds`` integrates them."""
    utilized: dict[Labels, float] = field(default_factory=lambda: defaultdict(float))
    """Utilisation x fraction by ``STATE_LABELS``, where the device has a reading."""


@_per_view
def _devices(v: MetricsView) -> _DeviceSamples:
    """The per-device families, in one pass over the devices: ~13 samples per GPU."""
    c = v.cluster
    out = _DeviceSamples()
    read = [(r.dcgm_field, r.scale, out.readings[r.dcgm_field].append)
            for r in DEVICE_READINGS]
    read_gpus: set[str] = set()
    for d in v.states:
        instance = d.device_id.rsplit("/", 1)[1] if "/" in d.device_id else ""
        labels = (c, d.node, d.pool, d.zone, d.accelerator, d.provisioning, d.gpu_index,
                  d.gpu_uuid, d.mig_profile or "", instance)
        if d.utilization is not None:
            out.utilization.append(((*labels, d.utilization_source or ""), d.utilization))
        if d.memory_used_bytes is not None:
            out.memory_used.append((labels, d.memory_used_bytes))
        if d.memory_total_bytes is not None:
            out.memory_total.append((labels, d.memory_total_bytes))
        out.available.append((labels, 0.0 if d.state == "unavailable" else 1.0))
        out.state.append(((*labels, d.state, d.reason or ""), 1.0))
        group = (c, d.state, d.pool, d.accelerator, d.provisioning)
        out.gpus[group] += d.fraction
        if d.utilization is not None:
            out.utilized[group] += d.utilization * d.fraction
        if d.price_usd_per_hour is not None:
            out.price.append((labels, d.price_usd_per_hour))
        for o in d.owners:
            out.allocation.append(((*labels, o.namespace, o.name, o.team, o.workload), 1.0))
        if d.gpu_uuid in read_gpus:  # another MIG instance of a GPU already read
            continue
        fields = d.fields
        reading = (c, d.node, d.pool, d.accelerator, d.gpu_index, d.gpu_uuid)
        read_any = False
        for name, scale, add in read:
            x = fields.get(name)
            if x is not None:
                add((reading, x * scale))
                read_any = True
        if read_any:
            read_gpus.add(d.gpu_uuid)
    return out


def _by_state(table: Callable[[_DeviceSamples], Mapping[Labels, float]]
              ) -> Callable[[MetricsView], list[Sample]]:
    def samples(v: MetricsView) -> list[Sample]:
        values = table(_devices(v))
        return [(key, values[key]) for key in sorted(values)]
    return samples


# ---------------------------------------------------------------------------- nodes


@_per_view
def _gpu_nodes(v: MetricsView) -> list[tuple[Labels, NodeInfo]]:
    return [((v.cluster, n.name, n.pool, n.accelerator, n.provisioning), n)
            for n in v.nodes.values() if n.accelerator]


def _allocated(v: MetricsView) -> Iterator[Sample]:
    requested: dict[str, int] = defaultdict(int)
    for p in v.pods:
        if p.node and p.phase in ("Running", "Pending") and p.scheduled_unix is not None:
            requested[p.node] += p.gpus
    return ((labels, requested.get(n.name, 0)) for labels, n in _gpu_nodes(v))


def _available_gpus(v: MetricsView) -> list[Sample]:
    return [] if v.available_gpus is None else [((v.cluster,), v.available_gpus)]


# ---------------------------------------------------------------------------- queue


@dataclass(frozen=True, slots=True)
class QueuedWorkload:
    """A Kueue Workload as the queue figures group it."""

    workload: WorkloadInfo
    team: str
    cluster_queue: str


@dataclass(slots=True)
class _Pending:
    """What waits, by label set: pods (or Workloads), the GPUs they ask for, the longest
    wait so far."""

    count: dict[Labels, int] = field(default_factory=lambda: defaultdict(int))
    gpus: dict[Labels, int] = field(default_factory=lambda: defaultdict(int))
    oldest: dict[Labels, float] = field(default_factory=dict)


@_per_view
def _pending(v: MetricsView) -> _Pending:
    out = _Pending()
    for p in v.pods:
        if p.gpus <= 0 or p.phase != "Pending" or p.scheduled_unix is not None:
            continue
        key = (v.cluster, p.namespace, v.owner(p).team, gpu_model(p, v.nodes))
        out.count[key] += 1
        out.gpus[key] += p.gpus
        out.oldest[key] = max(out.oldest.get(key, 0.0), compute.queue_wait_seconds(p, v.now))
    for q in v.workloads:  # GPU demand Kueue has not admitted yet: no pod exists for it
        w = q.workload
        if not w.pending or w.gpus <= 0:
            continue
        key = (v.cluster, w.namespace, q.team, w.accelerator or "")
        out.gpus[key] += w.gpus
        out.oldest[key] = max(out.oldest.get(key, 0.0), max(0.0, v.now - w.created_unix))
    return out


@_per_view
def _kueue_pending(v: MetricsView) -> _Pending:
    out = _Pending()
    for q in v.workloads:
        w = q.workload
        if not w.pending:
            continue
        key = (v.cluster, q.cluster_queue, w.local_queue, w.namespace)
        out.count[key] += 1
        out.gpus[key] += w.gpus
        cq = (v.cluster, q.cluster_queue)
        out.oldest[cq] = max(out.oldest.get(cq, 0.0), compute.admission_wait_seconds(
            w.queued_unix, None, v.now))
    return out


def _waiting_gpus(v: MetricsView) -> list[Sample]:
    out: dict[Labels, float] = defaultdict(float)
    for w in v.waits.waiting:
        out[(v.cluster, *w.key)] += w.gpus
    return sorted(out.items())


def _longest_waiting(v: MetricsView) -> list[Sample]:
    out: dict[Labels, float] = {}
    for w in v.waits.waiting:
        key = (v.cluster, *w.key)
        out[key] = max(out.get(key, 0.0), w.wait_seconds)
    return sorted(out.items())


def _expected_starts(v: MetricsView) -> list[Sample]:
    """The waiting units the forecast started, the longest waiting first, as many as
    ``forecast_series``."""
    starts = v.forecast.starts
    found = sorted((w for w in v.waits.waiting
                    if (e := starts.get(w.uid)) is not None and e.start is not None),
                   key=lambda w: (-w.wait_seconds, w.uid))[:v.forecast_series]
    out = []
    for w in found:
        e = starts[w.uid]
        assert e.start is not None
        out.append(((v.cluster, w.namespace, w.team, w.kind, w.name, w.workload,
                     w.verdict.pool, e.basis), e.start))
    return sorted(out)


def _forecast_counts(v: MetricsView) -> list[Sample]:
    if v.forecast.made_unix is None:
        return []
    return [((v.cluster, basis), float(n)) for basis, n in v.forecast.counts().items()]


def _waited(v: MetricsView) -> list[Sample]:
    return [((v.cluster, *k), x) for k, x in sorted(v.waits.gpu_seconds.items())]


def _stranded(v: MetricsView) -> list[Sample]:
    return [((v.cluster, pf.pool, pf.model, pf.provisioning, use), pf.gpus[use])
            for _, pf in sorted(v.waits.pools.items()) for use in STRANDED if use in pf.gpus]


def _stranded_cost(v: MetricsView) -> list[Sample]:
    return [((v.cluster, pf.pool, pf.model, pf.provisioning),
             sum(pf.cost_usd_per_hour.get(use, 0.0) for use in STRANDED))
            for _, pf in sorted(v.waits.pools.items())]


def _histograms[K: Labels](hists: Mapping[K, WaitHistogram], cluster: str
                           ) -> Iterator[HistogramSample]:
    for key in sorted(hists):
        h = hists[key]
        counts = [(str(b), h.buckets[i]) for i, b in enumerate(QUEUE_BUCKETS)]
        counts.append(("+Inf", h.count))
        yield (cluster, *key), Buckets(tuple(counts), h.total_seconds)


def _quotas(value: Callable[[FlavorQuota], float | None]
            ) -> Callable[[MetricsView], list[Sample]]:
    """A sample per ClusterQueue and GPU flavor of ``value`` (of its ``FlavorQuota``)."""
    def samples(v: MetricsView) -> list[Sample]:
        return [((v.cluster, name, q.cohort, flavor), x)
                for name, q in sorted(v.cluster_queues.items())
                for flavor, f in sorted(q.flavors.items()) if (x := value(f)) is not None]
    return samples


def _pending_of(table: Callable[[_Pending], Mapping[Labels, float]],
                waiting: Callable[[MetricsView], _Pending] = _pending
                ) -> Callable[[MetricsView], list[Sample]]:
    def samples(v: MetricsView) -> list[Sample]:
        values = table(waiting(v))
        return [(key, values[key]) for key in sorted(values)]
    return samples


def _queue_waits(v: MetricsView) -> Iterator[HistogramSample]:
    return _histograms(v.totals.queue_hist, v.cluster)


# ---------------------------------------------------------------------------- cost


def _by_group(table: Callable[[Totals], Mapping[GroupKey, float]]
              ) -> Callable[[MetricsView], Iterator[Sample]]:
    """A sample per owner group of ``table`` (the cost, GPU time or utilised time), in
    the order of the groups' GPU time."""
    def samples(v: MetricsView) -> Iterator[Sample]:
        values = table(v.totals)
        return (((v.cluster, *key), values[key]) for key in sorted(v.totals.gpu_seconds)
                if key in values)
    return samples


def _effective_cost(v: MetricsView) -> Iterator[Sample]:
    """Per owner group, allocated time only: ``compute.effective_cost_per_utilized_hour``
    of the cost and utilised seconds summed since start."""
    cost: dict[Labels, float] = defaultdict(float)
    used: dict[Labels, float] = defaultdict(float)
    t = v.totals
    g: Labels
    for key in sorted(t.gpu_seconds):
        if key.state == "allocated":
            g = (v.cluster, key.namespace, key.team, key.pool, key.accelerator,
                 key.provisioning)
            cost[g] += t.cost_usd.get(key, 0.0)
            used[g] += t.utilized_seconds.get(key, 0.0)
    for g in sorted(cost):
        value = compute.effective_cost_per_utilized_hour(cost[g], used[g])
        if value is not None:
            yield g, value


# ---------------------------------------------------------------------------- totals


type TableKey = str | Labels
"""A key of a table of the totals: one label value, or several."""


class _KeyOrder[K: TableKey]:
    """A table's keys sorted, sorted again only when its keys change (8,000 GPUs' keys,
    nearly always the same from one cycle to the next)."""

    __slots__ = ("keys", "order")

    def __init__(self) -> None:
        self.keys: list[K] = []
        self.order: list[K] = []

    def __call__(self, table: Mapping[K, float]) -> list[K]:
        keys = list(table)
        if keys != self.keys:
            self.keys, self.order = keys, sorted(keys)
        return self.order


class SortedTable[K: TableKey]:
    """The samples of a table of the totals, sorted by key (a tuple key: its parts as
    labels after the cluster), zeros left out when ``nonzero``. Iterated, it gives the
    samples; ``table`` lets the text writer see that a table is what it was last cycle
    (most GPUs' XID counts are) and write the lines it wrote then."""

    __slots__ = ("cluster", "nonzero", "order", "table")

    def __init__(self, cluster: str, table: Mapping[K, float], order: list[K],
                 nonzero: bool) -> None:
        self.cluster, self.table, self.order, self.nonzero = cluster, table, order, nonzero

    def __iter__(self) -> Iterator[Sample]:
        items, c, nonzero = self.table, self.cluster, self.nonzero
        for key in self.order:
            value = items[key]
            if nonzero and not value:
                continue
            yield ((c, *key) if isinstance(key, tuple) else (c, key)), value


def _sorted_by_key[K: TableKey](table: Callable[[Totals], Mapping[K, float]],
                                nonzero: bool = False
                                ) -> Callable[[MetricsView], SortedTable[K]]:
    """The family's samples: those of a table of the totals (``SortedTable``)."""
    order = _KeyOrder[K]()

    def samples(v: MetricsView) -> SortedTable[K]:
        items = table(v.totals)
        return SortedTable(v.cluster, items, order(items), nonzero)
    return samples


@_per_view
def _pod_labels(v: MetricsView) -> list[tuple[str, Labels]]:
    """The pods in the cluster now that have held a GPU, in label order: uid and labels
    (one pass for the per-pod families)."""
    held = v.totals.pod_seconds
    out: list[tuple[str, Labels]] = []
    for pod in sorted((p for p in v.pods if p.uid in held),
                      key=lambda p: (p.namespace, p.name)):
        o = v.owner(pod)
        out.append((pod.uid, (v.cluster, pod.namespace, pod.name, o.team, o.workload)))
    return out


def _pods_of(table: Callable[[Totals], Mapping[str, float]]
             ) -> Callable[[MetricsView], Iterator[Sample]]:
    """A sample per pod in the cluster now with a value in ``table`` (a per-pod sum)."""
    def samples(v: MetricsView) -> Iterator[Sample]:
        values = table(v.totals)
        return ((labels, values[uid]) for uid, labels in _pod_labels(v) if uid in values)
    return samples


def _intensities(v: MetricsView) -> Iterator[Sample]:
    """The grid carbon intensity in force in each region the cluster's GPU nodes are in."""
    if v.carbon is None:
        return
    zones = sorted({n.zone for n in v.nodes.values() if n.accelerator})
    for region in sorted({region_of_zone(z) for z in zones}):
        g = v.carbon.grid_g_per_kwh(region)
        if g is not None:
            yield (v.cluster, region, v.carbon.source), g


def _month_cost(v: MetricsView) -> Iterator[Sample]:
    return (((v.cluster, team), usd) for team, usd in sorted(v.totals.month_cost.items()))


def _budgets(v: MetricsView) -> Iterator[Sample]:
    return (((v.cluster, team), usd) for team, usd in sorted(v.budgets.items()))


def _bottlenecks(v: MetricsView) -> Iterator[Sample]:
    return (((v.cluster, o.namespace, o.name, o.team, o.workload, diag.bottleneck), 1.0)
            for o, diag in v.diagnoses.values())


# ---------------------------------------------------------------------------- health


def _source_up(v: MetricsView) -> Iterator[Sample]:
    c, h = v.cluster, v.health
    for (source, target), ok in sorted(h.up.items()):
        yield (c, source, target), 1.0 if ok else 0.0
    for kind, ok in sorted(v.kube.up.items()):
        age = v.kube.age(kind)
        fresh = age is None or age <= v.kube_max_staleness_seconds
        yield (c, "kubernetes", kind), 1.0 if ok and fresh else 0.0
    if v.bigquery is not None:
        yield (c, "bigquery", v.bigquery_dataset), 1.0 if v.bigquery.up else 0.0
    if v.cloud_monitoring is not None:
        yield (c, "cloud_monitoring", v.cloud_monitoring.project), \
            1.0 if v.cloud_monitoring.up else 0.0


def _last_success(v: MetricsView) -> Iterator[Sample]:
    c = v.cluster
    for (source, target), t in sorted(v.health.last_success.items()):
        yield (c, source, target), t
    for kind, t in sorted(v.kube.last_success.items()):
        yield (c, "kubernetes", kind), t
    if v.bigquery is not None and v.bigquery.last_success is not None:
        yield (c, "bigquery", v.bigquery_dataset), v.bigquery.last_success
    cm = v.cloud_monitoring
    if cm is not None and cm.last_success is not None:
        yield (c, "cloud_monitoring", cm.project), cm.last_success


def _scrape_duration(v: MetricsView) -> Iterator[Sample]:
    h = v.health
    return (((v.cluster, *key), h.duration[key]) for key, _ in sorted(h.up.items())
            if key in h.duration)


def _errors(v: MetricsView) -> Iterator[Sample]:
    c, h = v.cluster, v.health
    for key, n in sorted(h.errors.items()):
        known = h.error_reasons.get(key, {})
        for reason, count in sorted(known.items()):
            yield (c, key.source, key.target, reason), count
        if n > sum(known.values()) or not known:
            yield (c, key.source, key.target, "error"), n - sum(known.values())
    for kind, st in sorted(v.kube.stats.items()):
        for reason in sorted(KUBE_ERROR_REASONS | st.reasons.keys()):
            yield (c, "kubernetes", kind, reason), st.reasons.get(reason, 0)
    if v.bigquery is not None:
        yield (c, "bigquery", v.bigquery_dataset, "error"), v.bigquery.errors


def _relists(v: MetricsView) -> Iterator[Sample]:
    for kind, st in sorted(v.kube.stats.items()):
        yield (v.cluster, kind, "expired"), st.expired
        yield (v.cluster, kind, "watchdog"), st.watchdog_relists


def _unowned(v: MetricsView) -> Iterator[Sample]:
    yield (v.cluster,), sum(d.fraction for d in v.states if d.state == "allocated" and any(
        o.team == compute.UNKNOWN_TEAM for o in d.owners))


def _rejected(v: MetricsView) -> Iterator[Sample]:
    h = v.health
    return (((v.cluster, reason), h.rejected.get(reason, 0))
            for reason in sorted(REJECT_REASONS | h.rejected.keys()))


def _pages(v: MetricsView) -> Iterator[Sample]:
    pages = v.health.pages
    return (((v.cluster, how), pages.get(how, 0)) for how in PAGE_READS)


def _rows_written(v: MetricsView) -> Iterator[Sample]:
    for table, n in sorted(v.rows_written.items()):
        yield (v.cluster, "duckdb", table), n
    if v.bigquery is not None:
        for table, n in sorted(dict(v.bigquery.rows_written).items()):
            yield (v.cluster, "bigquery", table), n


def _bigquery_on(v: MetricsView) -> bool:
    return v.bigquery is not None


def _bigquery_table(table: Callable[[BigQueryStats], Mapping[str, int]]
                    ) -> Callable[[MetricsView], Iterator[Sample]]:
    def samples(v: MetricsView) -> Iterator[Sample]:
        assert v.bigquery is not None
        return (((v.cluster, "bigquery", t), n)
                for t, n in sorted(dict(table(v.bigquery)).items()))
    return samples


def _bigquery_value(value: Callable[[BigQueryStats], float]
                    ) -> Callable[[MetricsView], list[Sample]]:
    def samples(v: MetricsView) -> list[Sample]:
        assert v.bigquery is not None
        return [((v.cluster, "bigquery"), value(v.bigquery))]
    return samples


def _rows_removed(v: MetricsView) -> Iterator[Sample]:
    return (((v.cluster, *key), n) for key, n in sorted(v.rows_removed.items()))


def _report_runs(v: MetricsView) -> Iterator[Sample]:
    assert v.report is not None
    return (((v.cluster, outcome), n) for outcome, n in sorted(v.report.runs.items()))


def _report_coverage(v: MetricsView) -> list[Sample]:
    assert v.report is not None and v.report.coverage is not None
    week, share = v.report.coverage
    return [((v.cluster, week), share)]


def _report_last_success(v: MetricsView) -> list[Sample]:
    assert v.report is not None and v.report.last_success is not None
    return [((v.cluster,), v.report.last_success)]


def _remote_write_requests(v: MetricsView) -> list[Sample]:
    rw = v.remote_write
    assert rw is not None
    return [((v.cluster, outcome), n) for outcome, n in (
        ("sent", rw.requests_sent), ("dropped", rw.requests_dropped), ("retried", rw.retries))]


def _remote_write_queue(v: MetricsView) -> list[Sample]:
    assert v.remote_write is not None
    return [((v.cluster,), v.remote_write.queued)]


def _cloud_monitoring_points(v: MetricsView) -> list[Sample]:
    cm = v.cloud_monitoring
    assert cm is not None
    return [((v.cluster, outcome), n) for outcome, n in (
        ("written", cm.points_written), ("refused", cm.points_refused),
        ("dropped", cm.points_dropped))]


def _unpriced(v: MetricsView) -> Iterator[Sample]:
    missing: dict[tuple[str, str], float] = defaultdict(float)
    for d in v.states:
        if d.price_usd_per_hour is None:
            missing[(d.accelerator, d.provisioning)] += d.fraction
    return (((v.cluster, *key), missing[key]) for key in sorted(missing))


def _one(value: Callable[[MetricsView], float]) -> Callable[[MetricsView], list[Sample]]:
    return lambda v: [((v.cluster,), value(v))]


# ---------------------------------------------------------------------------- the table

F = Family
DEVICE_FAMILIES = DeviceFamilies(
    utilization=F("utilization_ratio", "gauge", "ratio", "GPU utilisation: DCGM GR engine "
                  "active, else GPU_UTIL/100 (source label says which).",
                  (*DEVICE_LABELS, "source"), lambda v: _devices(v).utilization),
    memory_used=F("memory_used_bytes", "gauge", "bytes", "GPU framebuffer memory in use.",
                  DEVICE_LABELS, lambda v: _devices(v).memory_used),
    memory_total=F("memory_total_bytes", "gauge", "bytes", "GPU framebuffer memory size.",
                   DEVICE_LABELS, lambda v: _devices(v).memory_total),
    available=F("available", "gauge", "", "1 if the GPU is usable, 0 if it is unavailable "
                "(node not Ready, GPU missing, fatal XID).", DEVICE_LABELS,
                lambda v: _devices(v).available),
    state=F("state", "gauge", "", "1 for the GPU's allocation state: allocated, unallocated "
            "or unavailable (with reason).", (*DEVICE_LABELS, "state", "reason"),
            lambda v: _devices(v).state),
    price=F("price_usd_per_hour", "gauge", "usd_per_hour", "Hourly price of the GPU (or MIG "
            "slice) after discount.", DEVICE_LABELS, lambda v: _devices(v).price),
    allocation=F("allocation_info", "gauge", "", "Which pod holds which GPU; one series per "
                 "pod on a time-shared GPU.",
                 (*DEVICE_LABELS, "namespace", "pod", "team", "workload"),
                 lambda v: _devices(v).allocation),
    readings=DEVICE_READINGS,
)
FAMILIES: tuple[AnyFamily, ...] = (
    *DEVICE_FAMILIES,
    F("node_capacity_gpus", "gauge", "gpus", "nvidia.com/gpu capacity of the node.",
      NODE_LABELS, lambda v: ((labels, n.capacity_gpus) for labels, n in _gpu_nodes(v))),
    F("node_allocatable_gpus", "gauge", "gpus", "nvidia.com/gpu the node offers to pods.",
      NODE_LABELS, lambda v: ((labels, n.allocatable_gpus) for labels, n in _gpu_nodes(v)),
      cloud_monitoring=True),
    F("node_allocated_gpus", "gauge", "gpus", "nvidia.com/gpu requested by pods running on "
      "the node.", NODE_LABELS, _allocated, cloud_monitoring=True),
    F("node_ready", "gauge", "", "1 if the node is Ready.", NODE_LABELS,
      lambda v: ((labels, 1.0 if n.ready else 0.0) for labels, n in _gpu_nodes(v))),
    F("cluster_available_gpus", "gauge", "gpus", "Allocatable GPUs of Ready nodes minus "
      "system-reserved, in physical GPUs.", ("cluster",), _available_gpus,
      cloud_monitoring=True),
    F("state_gpus", "gauge", "gpus", "Physical GPUs in each allocation state now: "
      "allocated, unallocated, unavailable (MIG slices as their fraction, a time-shared GPU "
      "once; gpu_seconds_total integrates it).", STATE_LABELS,
      _by_state(lambda d: d.gpus), cloud_monitoring=True),
    F("utilized_gpus", "gauge", "gpus", "GPUs' worth of work running now: utilisation x "
      "fraction of the devices with a reading (utilized_gpu_seconds_total integrates it).",
      STATE_LABELS, _by_state(lambda d: d.utilized), cloud_monitoring=True),
    F("pending_pods", "gauge", "pods", "GPU pods waiting to be scheduled.", QUEUE_LABELS,
      _pending_of(lambda p: p.count), cloud_monitoring=True),
    F("pending_gpus", "gauge", "gpus", "GPUs requested by pending pods, and by Kueue "
      "Workloads not admitted yet (their pods do not exist).", QUEUE_LABELS,
      _pending_of(lambda p: p.gpus), cloud_monitoring=True),
    F("oldest_pending_seconds", "gauge", "seconds", "Wait so far of the oldest pending GPU "
      "pod or Kueue Workload not admitted yet (from the Workload's creation).",
      QUEUE_LABELS, _pending_of(lambda p: p.oldest), cloud_monitoring=True),
    F("pending_cause_gpus", "gauge", "gpus", "GPUs waiting now, by why (cause: "
      f"{', '.join(CAUSES)}): pending GPU pods, starting ones included, and Kueue Workloads "
      "not admitted yet; pool: the node pool they fit.", WAIT_LABELS, _waiting_gpus,
      cloud_monitoring=True),
    F("pending_cause_oldest_seconds", "gauge", "seconds", "Wait so far of the oldest of "
      "them, by why.", WAIT_LABELS, _longest_waiting),
    F("pending_gpu_seconds", "counter", "seconds", "GPU-seconds waited since start, by "
      "why (GPUs asked x seconds waited).", WAIT_LABELS, _waited),
    F("stranded_gpus", "gauge", "gpus", "Free physical GPUs of Ready nodes no waiting pod "
      "could use, by why (use: fragment, quota, mismatch, no_demand).", STRANDED_LABELS,
      _stranded, cloud_monitoring=True),
    F("stranded_cost_usd_per_hour", "gauge", "usd_per_hour", "What the stranded GPUs cost "
      "an hour (price x (1 - discount)).", ("cluster", "pool", "model", "provisioning"),
      _stranded_cost),
    F("pool_fragmentation_ratio", "gauge", "ratio", "Of the pool's free GPUs, the share "
      "on nodes where a waiting pod that fits the pool asks more than the node has free; "
      "no series while no such pod waits.", ("cluster", "pool", "model"),
      lambda v: [((v.cluster, pf.pool, pf.model), ratio)
                 for _, pf in sorted(v.waits.pools.items())
                 if (ratio := pf.fragmentation) is not None]),
    F("scale_up_failures", "counter", "", "Scale-ups the cluster autoscaler said failed "
      "for waiting pods (GKE's FailedScaleUp events, by their count), by the pool the pods "
      "fit and why (out_of_resources, quota_exceeded, other).",
      ("cluster", "pool", "reason"),
      lambda v: [((v.cluster, pool, reason), float(n))
                 for (pool, reason), n in sorted(v.waits.scale_up_failures.items())]),
    F("expected_start_timestamp_seconds", "gauge", "seconds", "When each waiting GPU pod "
      "or Kueue Workload is expected to start (Unix seconds): the live queue played forward "
      "from the last forecast (running pods' remaining time from the run times of pods like "
      "them, pools' maxima and scale-up delays, Kueue quotas, priorities); basis: starting "
      "(bound to a node) or forecast. Absent when none was found within the horizon.",
      ("cluster", "namespace", "team", "kind", "name", "workload", "pool", "basis"),
      _expected_starts),
    F("queue_forecast_units", "gauge", "", "Waiting units of the last queue forecast, by "
      "outcome (basis: starting, forecast, beyond_horizon, no_room).",
      ("cluster", "basis"), _forecast_counts),
    F("queue_forecast_timestamp_seconds", "gauge", "seconds", "When the last queue "
      "forecast was made.", ("cluster",),
      lambda v: [] if v.forecast.made_unix is None else [((v.cluster,),
                                                          v.forecast.made_unix)]),
    F("queue_wait_seconds", "histogram", "seconds", "Time from pod creation to "
      "PodScheduled=True, GPU pods scheduled since start; for a pod of a Job Kueue queued, "
      "from its Workload's creation (admission included).", QUEUE_LABELS, _queue_waits),
    F("kueue_admission_wait_seconds", "histogram", "seconds", "Kueue: time from a "
      "Workload's creation, or its last requeue, to its admission, each admission since "
      "start (as kueue_admission_wait_time_seconds measures it).", KUEUE_LABELS,
      lambda v: _histograms(v.totals.admission_hist, v.cluster), present=_has_kueue),
    F("kueue_pending_workloads", "gauge", "", "Kueue Workloads not admitted yet.",
      KUEUE_QUEUE_LABELS, _pending_of(lambda p: p.count, _kueue_pending), present=_has_kueue),
    F("kueue_pending_gpus", "gauge", "gpus", "GPUs those Workloads ask for.",
      KUEUE_QUEUE_LABELS, _pending_of(lambda p: p.gpus, _kueue_pending), present=_has_kueue),
    F("kueue_oldest_pending_seconds", "gauge", "seconds", "Wait so far of the ClusterQueue's "
      "oldest Workload not admitted yet (since its creation or last requeue).",
      ("cluster", "cluster_queue"), _pending_of(lambda p: p.oldest, _kueue_pending),
      present=_has_kueue),
    F("kueue_quota_gpus", "gauge", "gpus", "A ClusterQueue's nominal quota of nvidia.com/gpu "
      "in a flavor.", KUEUE_FLAVOR_LABELS, _quotas(lambda f: f.nominal_gpus),
      present=_has_kueue),
    F("kueue_borrowing_limit_gpus", "gauge", "gpus", "The most GPUs of a flavor the "
      "ClusterQueue may borrow from its cohort (absent: no limit).", KUEUE_FLAVOR_LABELS,
      _quotas(lambda f: f.borrowing_limit_gpus), present=_has_kueue),
    F("kueue_used_gpus", "gauge", "gpus", "GPUs of a flavor the ClusterQueue's admitted "
      "Workloads hold (its flavorsUsage).", KUEUE_FLAVOR_LABELS,
      _quotas(lambda f: f.used_gpus), present=_has_kueue),
    F("kueue_borrowed_gpus", "gauge", "gpus", "Of those, the GPUs beyond its nominal quota: "
      "borrowed from its cohort.", KUEUE_FLAVOR_LABELS, _quotas(lambda f: f.borrowed_gpus),
      present=_has_kueue),
    F("cost_usd", "counter", "usd", "GPU cost by allocation state and owner; unallocated "
      "and unavailable time goes to the pool.", GROUP_LABELS, _by_group(lambda t: t.cost_usd),
      cloud_monitoring=True),
    F("gpu_seconds", "counter", "seconds", "GPU time by allocation state and owner (MIG "
      "slices as their fraction, shared GPUs split).", GROUP_LABELS,
      _by_group(lambda t: t.gpu_seconds), cloud_monitoring=True),
    F("utilized_gpu_seconds", "counter", "seconds", "GPU time weighted by utilisation.",
      GROUP_LABELS, _by_group(lambda t: t.utilized_seconds), cloud_monitoring=True),
    F("effective_cost_usd_per_utilized_hour", "gauge", "usd_per_hour", "Cost of one utilised "
      "GPU-hour since start: price x (1 - discount) / utilisation.", COST_GROUP,
      _effective_cost, cloud_monitoring=True),
    F("energy_joules", "counter", "joules", "GPU energy by allocation state and owner, from "
      "DCGM's energy counter (the power integral where it restarted or is not collected), "
      "split as cost is; unallocated and unavailable GPUs' to the pool.", GROUP_LABELS,
      _by_group(lambda t: t.energy_joules), cloud_monitoring=True),
    F("co2e_grams", "counter", "grams", "Location-based CO2e of that energy: energy x PUE x "
      "the region's grid carbon intensity (grid_carbon_intensity_grams_per_kwh).",
      GROUP_LABELS, _by_group(lambda t: t.co2e_grams), cloud_monitoring=True),
    F("board_energy_joules", "counter", "joules", "Energy of the GPU board (its MIG instances "
      "added up) while the exporter knew its state.", ("cluster", "node", "uuid"),
      _sorted_by_key(lambda t: t.gpu_joules)),
    F("pod_energy_joules", "counter", "joules", "Energy of the GPUs a pod in the cluster now "
      "has held, its share where shared.", ("cluster", "namespace", "pod", "team",
                                           "workload"), _pods_of(lambda t: t.pod_joules)),
    F("pod_co2e_grams", "counter", "grams", "CO2e of that energy.",
      ("cluster", "namespace", "pod", "team", "workload"), _pods_of(lambda t: t.pod_co2e)),
    F("grid_carbon_intensity_grams_per_kwh", "gauge", "grams_per_kwh", "Grid carbon "
      "intensity in force for a region of the cluster's GPU nodes (gCO2e per kWh, before "
      "PUE) and its basis: the shipped data's year and source, or the site's own factor "
      "(config: carbon).", ("cluster", "region", "basis"), _intensities,
      present=lambda v: v.carbon is not None),
    F("power_usage_effectiveness", "gauge", "", "PUE the CO2e figures use: the facility's "
      "energy over its IT equipment's (config: carbon.pue).", ("cluster",),
      _one(lambda v: v.carbon.pue if v.carbon else math.nan),
      present=lambda v: v.carbon is not None),
    F("up_seconds", "counter", "seconds", "Seconds the GPU was available.",
      ("cluster", "uuid"), _sorted_by_key(lambda t: t.up_seconds), cloud_monitoring=True),
    F("down_seconds", "counter", "seconds", "Seconds the GPU was unavailable, by reason: "
      "node_not_ready, gpu_missing, xid.", ("cluster", "uuid", "reason"),
      _sorted_by_key(lambda t: t.down_seconds), cloud_monitoring=True),
    F("spot_interruptions", "counter", "", "Pods terminated by spot preemption, by node "
      "pool.", ("cluster", "pool"), _sorted_by_key(lambda t: t.interruptions),
      cloud_monitoring=True),
    F("xid_events", "counter", "", "XID errors seen: each time a GPU's last XID "
      "(DCGM_FI_DEV_XID_ERRORS) changes to a new code.", ("cluster", "node", "uuid"),
      _sorted_by_key(lambda t: t.xid_events)),
    F("last_xid", "gauge", "", "The GPU's last XID error code (absent: none).",
      ("cluster", "node", "uuid"), _sorted_by_key(lambda t: t.last_xid, nonzero=True)),
    F("sla_target_ratio", "gauge", "ratio", "Availability objective (config: sla.target), "
      "for the SLO alerts.", ("cluster",), _one(lambda v: v.sla_target)),
    F("commitment_gpus", "gauge", "gpus", "GPUs of the model under a committed-use "
      "discount (config: prices.commitments).", ("cluster", "model"),
      lambda v: [((v.cluster, m), c.gpus) for m, c in sorted(v.commitments.items())],
      present=lambda v: bool(v.commitments)),
    F("commitment_unused_gpus", "gauge", "gpus", "Committed GPUs no on-demand GPU of the "
      "model uses now: paid for, held by no pod or node.", ("cluster", "model"),
      lambda v: [((v.cluster, m), c.unused_gpus) for m, c in sorted(v.commitments.items())],
      present=lambda v: bool(v.commitments)),
    F("commitment_unused_usd_per_hour", "gauge", "usd_per_hour", "What the unused committed "
      "GPUs cost an hour at the term price: no device carries it.", ("cluster", "model"),
      lambda v: [((v.cluster, m), c.unused_usd_per_hour)
                 for m, c in sorted(v.commitments.items())],
      present=lambda v: bool(v.commitments)),
    F("list_price_usd_per_hour", "gauge", "usd_per_hour", "List price of a GPU-hour in use, "
      "before discounts, and where it comes from: the price book, or Google's Cloud Billing "
      "catalogue (prices.catalog).", ("cluster", "model", "provisioning", "source"),
      lambda v: [((v.cluster, m, p, price.source), price.usd_per_hour)
                 for (m, p), price in v.list_prices.items()]),
    F("list_price_age_seconds", "gauge", "seconds", "How old the list price in use is: "
      "since the book's as_of date, or since the catalogue was read.",
      ("cluster", "model", "provisioning", "source"),
      lambda v: [((v.cluster, m, p, price.source), max(0.0, v.now - price.read_unix))
                 for (m, p), price in v.list_prices.items() if price.read_unix is not None]),
    F("allocation_cost_usd", "counter", "usd", "Cost of the GPU time pods held, by the pods' "
      "value of the allocation dimension (config: allocation; \"\" for pods without one): "
      "a cost-center label or annotation, side by side with the team's.",
      ("cluster", "dimension", "allocation"),
      lambda v: [((v.cluster, v.allocation or "", a), usd)
                 for a, usd in sorted(v.totals.allocation_cost.items())],
      present=lambda v: v.allocation is not None),
    F("team_budget_usd", "gauge", "usd", "Monthly GPU budget of the team (config: budgets).",
      ("cluster", "team"), _budgets, present=lambda v: bool(v.budgets)),
    F("team_month_cost_usd", "gauge", "usd", "Cost of the team's allocated GPUs this UTC "
      "calendar month so far, the warehouse's rows of the month from before a restart "
      "included.", ("cluster", "team"), _month_cost),
    F("pod_bottleneck", "gauge", "", "1 for the pod's bottleneck class over the sliding "
      "window.", ("cluster", "namespace", "pod", "team", "workload", "class"), _bottlenecks),
    # the exporter's own series
    F("exporter_source_up", "gauge", "", "1 if the source answered in the last cycle (a "
      "Kubernetes kind: its last list, event or bookmark is within "
      "kubernetes.max_staleness).", SOURCE_LABELS, _source_up),
    F("exporter_source_last_success_timestamp_seconds", "gauge", "seconds", "When the source "
      "last answered (Unix time): a dcgm target's last scrape, a Kubernetes list, watch "
      "event or bookmark, a BigQuery or Cloud Monitoring write. Absent before the first.",
      SOURCE_LABELS, _last_success),
    F("exporter_scrape_duration_seconds", "gauge", "seconds", "Duration of the last "
      "successful scrape of a target.", SOURCE_LABELS, _scrape_duration),
    F("exporter_errors", "counter", "", "Failed scrapes, watches and writes, by reason: "
      "http_<status>, refused, unavailable, timeout, bad_answer, error.",
      (*SOURCE_LABELS, "reason"), _errors),
    F("exporter_kubernetes_relists", "counter", "", "Relists by cause: expired (410), "
      "watchdog (silent watch).", ("cluster", "resource", "cause"), _relists),
    F("exporter_kubernetes_rejected_objects", "counter", "", "Kubernetes objects skipped "
      "because they could not be read (a Kueue Workload with a malformed quantity, say), "
      "or events about more pods than are kept, by resource; each logged once per "
      "episode.", ("cluster", "resource"),
      lambda v: [((v.cluster, kind), n) for kind, n in sorted(v.kube.rejected_objects.items())]),
    F("exporter_kubernetes_discovery_up", "gauge", "", "1 if the API group's discovery "
      "was answered the last time it was asked (served or not), 0 while it fails (a 403: "
      "the exporter cannot tell whether the cluster runs Kueue, and is not ready). Absent "
      "before it is asked.", ("cluster", "group"),
      lambda v: [((v.cluster, g), 1.0 if ok else 0.0)
                 for g, ok in sorted(v.kube.discovery_up.items())]),
    F("exporter_kubernetes_discovery_errors", "counter", "", "Failed discoveries of an API "
      "group, by reason (http_<status>, refused, timeout...); each episode logged once.",
      ("cluster", "group", "reason"),
      lambda v: [((v.cluster, g, r), n)
                 for (g, r), n in sorted(v.kube.discovery_errors.items())]),
    F("exporter_unowned_gpus", "gauge", "gpus", "Allocated GPUs (a MIG instance as its "
      "fraction) with a pod of team \"unknown\" this cycle: the pod neither in the "
      "exporter's view nor seen before, and its namespace not listed (or the pod without "
      "the team label while namespaces cannot be listed). Their cost goes to team "
      "\"unknown\", never to a team guessed.", ("cluster",), _unowned),
    F("exporter_rejected_samples", "counter", "", "DCGM samples dropped, by reason.",
      ("cluster", "reason"), _rejected),
    F("exporter_energy_intervals", "counter", "", "GPU-intervals whose energy is known, by "
      "where it comes from: counter (DCGM's energy counter, spread over the intervals each "
      "rise covers), reset (the counter went backwards or jumped: the power integral, "
      "logged), power (no counter collected, or one that stopped counting: the power "
      "integral).", ("cluster", "basis"),
      lambda v: [((v.cluster, b), float(v.totals.energy_bases.get(b, 0)))
                 for b in ENERGY_BASES]),
    F("exporter_dcgm_pages", "counter", "", "dcgm-exporter pages read, by how: plan (by "
      "the plan learnt from an earlier page of the same shape), new_plan (the shape new or "
      "changed: a plan learnt from this page), full (by the full parser: a value no plan "
      "vouches for, or a shape with no plan), plan_failed (by the full parser after the "
      "plan failed on the page; logged).", ("cluster", "read"), _pages,
      present=lambda v: bool(v.health.pages)),
    F("exporter_dcgm_target_stuck", "gauge", "", "1 if the dcgm-exporter's page has been "
      "byte for byte the same for dcgm.stuck_after (two answers at least) while GPUs of its "
      "nodes are allocated (a stuck exporter: its figures are stale; logged once per "
      "episode), else 0. Absent for a target that has not answered.", ("cluster", "target"),
      lambda v: [((v.cluster, t), 1.0 if s else 0.0) for t, s in sorted(v.health.stuck.items())],
      present=lambda v: bool(v.health.stuck)),
    F("exporter_rows_written", "counter", "", "Rows written to the warehouse, by sink "
      "(duckdb, bigquery) and table.", ("cluster", "sink", "table"), _rows_written),
    F("exporter_rows_rejected", "counter", "", "Rows the sink refused (bad values), by "
      "table; the rest of their batch was written.", ("cluster", "sink", "table"),
      _bigquery_table(lambda bq: bq.rows_rejected), present=_bigquery_on),
    F("exporter_spool_dropped_rows", "counter", "", "Unsent rows dropped, oldest first, "
      "because the spool was full.", ("cluster", "sink", "table"),
      _bigquery_table(lambda bq: bq.spool_dropped), present=_bigquery_on),
    F("exporter_spool_rows", "gauge", "", "Rows waiting to be sent.", ("cluster", "sink"),
      _bigquery_value(lambda bq: bq.spool_rows), present=_bigquery_on),
    F("exporter_spool_bytes", "gauge", "bytes", "Size of the rows waiting to be sent.",
      ("cluster", "sink"), _bigquery_value(lambda bq: bq.spool_bytes), present=_bigquery_on),
    F("exporter_warehouse_rows_removed", "counter", "", "Warehouse rows taken out by the "
      "retention: rolled_up (into hourly rows), expired; or given up unstaged while the "
      "warehouse failed.", ("cluster", "table", "reason"), _rows_removed,
      present=lambda v: bool(v.rows_removed)),
    F("exporter_warehouse_up", "gauge", "", "1 while the warehouse is open and its last "
      "cycle's work succeeded; 0 while it fails, or cannot be opened (the exporter then "
      "serves its figures without history, and tries again every 5 minutes).",
      ("cluster",), lambda v: [((v.cluster,), 1.0 if v.warehouse_up else 0.0)],
      present=lambda v: v.warehouse_up is not None),
    F("exporter_warehouse_quarantined_files", "counter", "", "Files the warehouse set aside "
      "in the quarantine folder of its staging directory and never reads again, by "
      "reason: unreadable, foreign (other columns) or name (no interval) for a staged "
      "file, stray for another file there, wal for a write-ahead log DuckDB did not "
      "replay. Their rows are lost.",
      ("cluster", "reason"),
      lambda v: [((v.cluster, r), v.warehouse_quarantined.get(r, 0))
                 for r in QUARANTINE_REASONS],
      present=lambda v: bool(v.warehouse_quarantined)),
    F("exporter_reports", "counter", "", "Scheduled weekly reports by outcome: ok, failed "
      "(retried an hour later), thin (a week covered less than report.min_coverage: not "
      "made, not retried).", ("cluster", "outcome"), _report_runs,
      present=lambda v: v.report is not None),
    F("exporter_report_coverage_ratio", "gauge", "ratio", "The share of its hours the warehouse "
      "covers, of the last week the schedule reported (made, or found thin).",
      ("cluster", "week"), _report_coverage,
      present=lambda v: v.report is not None and v.report.coverage is not None),
    F("exporter_report_last_success_timestamp_seconds", "gauge", "seconds", "When the last "
      "scheduled weekly report was made.", ("cluster",), _report_last_success,
      present=lambda v: v.report is not None and v.report.last_success is not None),
    F("exporter_remote_write_requests", "counter", "", "Remote-write requests by outcome: "
      "sent, dropped (refused, or the queue was full), retried.", ("cluster", "outcome"),
      _remote_write_requests, present=lambda v: v.remote_write is not None),
    F("exporter_remote_write_queue", "gauge", "", "Requests waiting to be sent.",
      ("cluster",), _remote_write_queue, present=lambda v: v.remote_write is not None),
    F("exporter_cloud_monitoring_points", "counter", "", "Points written to Cloud "
      "Monitoring by outcome: written, refused, dropped (superseded by a newer snapshot "
      "while the API failed).", ("cluster", "outcome"), _cloud_monitoring_points,
      present=lambda v: v.cloud_monitoring is not None),
    F("exporter_price_catalog_reads", "counter", "", "Reads of the Cloud Billing "
      "catalogue by outcome: ok, failed (the prices in use kept).", ("cluster", "outcome"),
      lambda v: [] if v.catalog is None else [
          ((v.cluster, "ok"), v.catalog.reads - v.catalog.failures),
          ((v.cluster, "failed"), v.catalog.failures)],
      present=lambda v: v.catalog is not None),
    F("exporter_unpriced_gpus", "gauge", "gpus", "GPUs whose model the price book does not "
      "price: their cost is unknown, not zero.", ("cluster", "model", "provisioning"),
      _unpriced),
    F("exporter_cycle_duration_seconds", "gauge", "seconds", "Wall time of the last cycle.",
      ("cluster",), _one(lambda v: v.cycle_seconds)),
    F("exporter_last_cycle_timestamp_seconds", "gauge", "seconds", "When the last cycle ran "
      "(Unix time of its snapshot).", ("cluster",), _one(lambda v: v.now)),
    F("exporter_build_info", "gauge", "", "Always 1; the labels say which exporter, Python "
      "and DuckDB versions are running.", ("cluster", *BUILD_INFO),
      lambda v: [((v.cluster, *BUILD_INFO.values()), 1.0)]),
)

BY_NAME: Mapping[str, AnyFamily] = {f.name: f for f in FAMILIES}
CLOUD_MONITORING_DEFAULT = tuple(f.name for f in FAMILIES if f.cloud_monitoring)
"""Written to Cloud Monitoring by default: per-owner cost and time, capacity, queue and
availability; not the per-GPU series (8 per GPU: costly at fleet scale, and Prometheus
already has them)."""
CLOUD_MONITORING_KINDS = ("gauge", "counter")
"""Cloud Monitoring takes these as GAUGE and CUMULATIVE points; histograms are not written."""


def exposed_names(family: AnyFamily) -> tuple[str, ...]:
    """The names of the family's series as exposed (a histogram's three)."""
    if is_histogram(family):
        base = PREFIX + family.name
        return (f"{base}_bucket", f"{base}_sum", f"{base}_count")
    return (family.exposed,)


@dataclass(frozen=True, slots=True)
class Series:
    """One exposed series of one cycle: its name and labels (empty ones left out, as
    Prometheus stores them), and its value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def series(view: MetricsView, families: Iterable[AnyFamily] = FAMILIES) -> Iterator[Series]:
    """Every series of the cycle, as ``/metrics`` exposes them (a histogram's buckets, sum
    and count each a series), in exposition order."""
    for family in families:
        if not family.present(view):
            continue
        names = family.labels
        if is_histogram(family):
            base = PREFIX + family.name
            for values, b in family.samples(view):
                labels = _pairs(names, values)
                for suffix, le, n in b.parts():
                    yield Series(base + suffix, labels if le is None else (*labels, ("le", le)),
                                 n)
            continue
        name = family.exposed
        for values, value in family.samples(view):
            yield Series(name, _pairs(names, values), float(value))


def samples(view: MetricsView, family: AnyFamily) -> Iterator[Sample]:
    """A gauge's or counter's samples this cycle (none when it is not present)."""
    if is_histogram(family):
        raise ValueError(f"{family.name} is a histogram")
    if family.present(view):
        yield from family.samples(view)


def _pairs(names: Labels, values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in zip(names, values, strict=True) if v)
