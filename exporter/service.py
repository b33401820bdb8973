"""One exporter cycle: sources → snapshot → compute → sinks.

``Exporter.cycle(now)`` asks the reading source (``sources.ReadingSource``) for every
target's answer, places the answers on their nodes and freezes them with the Kubernetes
state the watches keep current (``snapshot.Snapshot``), computes each device's state,
integrates the previous snapshot's states over the time since it (GPU-seconds, utilised
seconds, cost, up/down time), and hands the result on: rows to the warehouse, and a frozen
view (``families.MetricsView``) to every sink (``sinks.Sink``: ``/metrics``, the push
sinks). Time is an argument, so the same code runs on the wall clock or on
the simulator's virtual clock.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter import compute, logs, memory
from exporter.bottleneck import CLOCK_REASONS, SIGNAL_FIELDS, Diagnosis, Window, decide
from exporter.catalog import DCGM_RENAMED
from exporter.config import Config
from exporter.errors import SourceError
from exporter.families import DEVICE_READINGS, MetricsView, QueuedWorkload
from exporter.health import (
    CatalogStats,
    CloudMonitoringStats,
    PageRuns,
    RemoteWriteStats,
    ReportStats,
    SourceHealth,
    SourceTarget,
)
from exporter.placement import Placement
from exporter.prices import (
    Commitment,
    CommitmentUse,
    ListPrice,
    PriceBook,
    effective_prices,
    unused_commitment,
)
from exporter.records import (
    DeviceReading,
    NodeInfo,
    ParseResult,
    PodInfo,
    TargetScrape,
    WorkloadInfo,
    gpu_model,
)
from exporter.sinks import Sink
from exporter.sinks.schema import FIELDS
from exporter.sinks.warehouse import Warehouse
from exporter.snapshot import Placed, Snapshot, place_answers
from exporter.sources import ClusterSource, ReadingSource
from exporter.sources.kube import KUEUE_KINDS, deleted_pod
from exporter.sources.kueue import GROUP as KUEUE_GROUP
from exporter.totals import Totals

if TYPE_CHECKING:
    from exporter.sinks.bigquery import BigQuerySink
    from exporter.sinks.prometheus import MetricsEndpoint

log = logging.getLogger(__name__)

_USED = frozenset({*compute.FIELDS_READ, *SIGNAL_FIELDS, *FIELDS.values(),
                   *(r.dcgm_field for r in DEVICE_READINGS)})
DCGM_FIELDS_READ = _USED | {old for old, new in DCGM_RENAMED.items() if new in _USED}
"""Every DCGM field the exporter uses, under each name DCGM has given it; the source skips
the other families unparsed."""

VIEW_KINDS = ("nodes", "pods", "namespaces")
"""The Kubernetes kinds the figures stand on (a pod's team may be its namespace's label):
not ready before all are listed. Kueue's kinds too where the cluster serves Kueue."""
REMEMBERED_OWNERS = 20_000
"""GPU pods whose owner is remembered after they leave the view (by namespace and name,
the most recently seen kept): a GPU DCGM still shows with such a pod is theirs."""
REMEMBERED_SECONDS = 3600.0
"""And for how long after they were last in the view (memory stays flat under churn)."""

GC_THRESHOLDS = (100_000, 50, 50)
"""The garbage collector's thresholds while the exporter runs (Python's are 2,000, 10,
10). A cycle at 8,000 GPUs allocates about a million objects, nearly all freed by their
reference counts: at Python's thresholds the collector ran about 50 times a cycle and cost
0.05-0.2 s CPU of each; at these, under 0.01 s on average."""

def _mean_fields(samples: Sequence[Mapping[str, float]]) -> Mapping[str, float]:
    """One sample of a pod's GPUs: the mean of each signal field over them (of the
    clock-event reasons, every GPU's bits)."""
    if len(samples) == 1:  # most pods have one GPU: its values are the means
        return samples[0]
    out = {}
    for name in SIGNAL_FIELDS:
        values = [s[name] for s in samples if name in s]
        if values:
            if name == CLOCK_REASONS:  # a bitmask: any GPU's reasons count
                bits = 0
                for v in values:
                    bits |= int(v)
                out[name] = float(bits)
            else:
                out[name] = sum(values) / len(values)
    return out


WAREHOUSE_RETRY_SECONDS = 300.0
"""How often a warehouse that could not be opened is tried again (a damaged file moved away,
a full disk freed: it heals without a restart)."""


@dataclass(slots=True)
class WarehouseOpening:
    """A warehouse that could not be opened at start: the service runs without it (the
    figures need none; the history waits) and tries ``open`` again every
    ``retry_seconds`` of the cycles' time, calling ``opened`` with it once it opens."""

    open: Callable[[], Warehouse]
    path: str
    error: str
    """Why the last try failed."""
    opened: Callable[[Warehouse], None] = lambda _: None
    retry_seconds: float = WAREHOUSE_RETRY_SECONDS
    next_try: float | None = None
    """The cycle time of the next try; None until the first cycle."""


class Exporter:
    """The exporter's state between cycles; ``cycle`` is the only thing that changes it."""

    def __init__(self, config: Config, prices: PriceBook, kube: ClusterSource,
                 dcgm: ReadingSource, metrics: MetricsEndpoint, sinks: Sequence[Sink] = (),
                 warehouse: Warehouse | None = None, bigquery: BigQuerySink | None = None, *,
                 remote_write: RemoteWriteStats | None = None,
                 cloud_monitoring: CloudMonitoringStats | None = None,
                 warehouse_opening: WarehouseOpening | None = None) -> None:
        self.config = config
        self.prices = prices
        self.kube = kube
        self.dcgm = dcgm
        self.metrics = metrics
        """``/metrics``: what the last cycle shows, rendered once for every scrape."""
        self.sinks: list[Sink] = [metrics, *sinks]
        """Each is handed every cycle's view."""
        self.warehouse = warehouse
        self.bigquery = bigquery
        self.remote_write = remote_write
        """The remote-write sink's own figures, when the service pushes by remote write."""
        self.cloud_monitoring = cloud_monitoring
        """The Cloud Monitoring sink's own figures, when the service writes there."""
        self.report: ReportStats | None = None
        """Set when the service also makes the weekly report on a schedule."""
        self.totals = Totals()
        self.health = SourceHealth()
        self.inventory: dict[str, dict[str, compute.DeviceIdentity]] = {}
        self.last_seen: dict[str, float] = {}
        """Device id -> when DCGM last reported it (since start), for retiring it."""
        self.states: list[compute.DeviceState] = []
        self.state_time: float | None = None
        self.diagnoses: dict[str, tuple[compute.Owner, Diagnosis]] = {}
        self._workload_index: dict[tuple[str, str, str], WorkloadInfo] = {}
        """Kueue's Workloads by (namespace, kind, name) of the object they were made for."""
        self.open_incidents: dict[tuple[str, str], tuple[float, str, str]] = {}
        """(GPU UUID, reason) -> (start, node, pool) of each GPU now unavailable."""
        if warehouse is not None:  # go on from where the last run stopped
            self.inventory, self.open_incidents = warehouse.load_state()
        self.cycles = 0
        self.viewed_cycles = 0
        """Cycles that ran on a listed Kubernetes view (``VIEW_KINDS``)."""
        self.cycle_seconds = 0.0
        self.stage_cpu: dict[str, float] = {}
        """CPU seconds of the last cycle by stage: scrape (HTTP and parsing), compute,
        warehouse (every thread of the process, so approximate while other work runs)."""
        self.last_cycle_time = 0.0
        self._view_now: MetricsView | None = None
        self._vanished_unchecked = True
        """Pods that ended while no exporter watched are yet to be finished."""
        self._vanished_workloads_unchecked = True
        """And Kueue Workloads."""
        self._target_nodes: dict[str, set[str]] = {}
        """The nodes each target's last answer covered: unknown while it fails."""
        self._windows: dict[str, Window] = {}
        """Each allocated pod's samples over ``bottleneck_window``."""
        self._logged: set[tuple[str, str]] = set()
        self._episodes = logs.Episodes(log)
        """Failing targets, (url, "scrape" or "rejected:<reason>"): logged per episode."""
        self._page_runs = PageRuns()
        self._interrupted_pods: set[str] = set()
        self._known_owners: dict[tuple[str, str], tuple[compute.Owner, float]] = {}
        """(namespace, pod) -> the owner last seen and when it was last in the view."""
        self._pool_of: dict[str, str] = {}
        """Node -> pool, kept after the node is gone (a preempted node's pods outlive it)."""
        self._price = {k: v for k, v in prices.prices.items()}
        self.price_sources: dict[tuple[str, str], tuple[str, float | None]] = dict.fromkeys(
            prices.prices, ("book", prices.as_of_unix))
        """Where each list price in use comes from (``book`` or ``catalog``), and when it
        was read (the book's ``as_of``; None when it has none)."""
        self.catalog: CatalogStats | None = None
        """The price catalogue's reads, when it is read."""
        self._commitments = [
            Commitment(c.gpu, c.gpus, c.usd_per_gpu_hour) for c in config.prices.commitments]
        self._commitment_use: dict[str, CommitmentUse] = {}
        self.warehouse_opening = warehouse_opening
        """The warehouse to open, while it could not be."""
        self.warehouse_error: str | None = \
            None if warehouse_opening is None else warehouse_opening.error
        """Why the last cycle's warehouse work failed; None when it did not."""
        self._warehouse_thread = ThreadPoolExecutor(1, thread_name_prefix="warehouse")
        """One thread for DuckDB's work: its memory stays in one allocator arena."""
        self._month_seed: Future[dict[tuple[str, str], float]] | None = None
        """The warehouse's spend of this month before this run: its first task, so that
        none of this run's rows are in it (seconds at fleet scale: no cycle waits)."""
        if warehouse is not None:
            self._month_seed = self._warehouse_thread.submit(warehouse.team_month_costs)

    @property
    def ready(self) -> bool:
        return not self.unready()

    def unready(self) -> list[str]:
        """Why ``/readyz`` answers 503, one line each; empty when ready. Every readiness
        check is in ``readiness_checks``."""
        return [reason for check in self.readiness_checks if (reason := check())]

    @property
    def readiness_checks(self) -> tuple[Callable[[], str | None], ...]:
        """Each returns why the exporter is not ready, or None."""
        return (self._kubernetes_listed, self._kubernetes_allowed, self._kueue_discovered,
                self._kubernetes_fresh, self._warehouse_writing)

    def needed_kinds(self) -> tuple[str, ...]:
        """The Kubernetes kinds the figures need: ``VIEW_KINDS``, and Kueue's where the
        cluster serves it (queue wait's admission comes from its Workloads)."""
        return VIEW_KINDS + (KUEUE_KINDS if self.kube.kueue else ())

    def _kueue_discovered(self) -> str | None:
        if error := self.kube.discovery_error.get(KUEUE_GROUP):
            return (f"whether the cluster runs Kueue is unknown: its API group "
                    f"{KUEUE_GROUP} cannot be discovered ({error})")
        return None

    def _kubernetes_listed(self) -> str | None:
        missing = [k for k in self.needed_kinds() if not self.kube.synced[k].is_set()]
        if missing:
            errors = [e for k in missing if (e := self.kube.stats[k].last_error)]
            kinds = ", ".join(missing[:-1]) + " and " + missing[-1] if len(missing) > 1 \
                else missing[0]
            return (f"no list of {kinds} from the Kubernetes API yet"
                    + (f" (last error: {' '.join(errors[0].splitlines()[:2])})"
                       if errors else ""))
        if not self.viewed_cycles:
            return "waiting for the first full cycle"
        return None

    def _kubernetes_allowed(self) -> str | None:
        denied = [k for k in self.needed_kinds() if k in self.kube.denied]
        if denied:
            return (f"the Kubernetes API forbids {', '.join(denied)} to the exporter (HTTP "
                    f"403): {self.kube.denied[denied[0]]}")
        return None

    def _kubernetes_fresh(self) -> str | None:
        ages = [a for k in self.needed_kinds() if (a := self.kube.age(k)) is not None]
        bound = self.config.kubernetes.max_staleness
        if ages and max(ages) > bound:
            return (f"the Kubernetes view is {max(ages):.0f} s old (kubernetes.max_staleness "
                    f"{bound:g} s): the API does not answer")
        return None

    def _warehouse_writing(self) -> str | None:
        if self.warehouse_ok:
            return None
        why = ' '.join(str(self.warehouse_error).split())[:300]
        if (opening := self.warehouse_opening) is not None:
            return (f"the warehouse cannot be opened, /metrics is served without history "
                    f"(tried again every {opening.retry_seconds:g} s): {why}")
        return f"the warehouse fails: {why}"

    # ------------------------------------------------------------------ targets

    def targets(self) -> dict[str, str | None]:
        """Target URL -> the node it belongs to (None while unknown)."""
        return self.dcgm.targets(self.kube.pods.values())

    # ------------------------------------------------------------------ the cycle

    async def cycle(self, now: float) -> None:
        began, cpu = time.perf_counter(), time.process_time()
        viewed = all(self.kube.synced[k].is_set() for k in VIEW_KINDS)
        targets = self.targets()
        results = await self.dcgm.fetch(list(targets))
        stages = {"scrape": time.process_time() - cpu}
        placed = place_answers(targets, results,
                               Placement(self.kube.nodes, self.kube.pods.values()),
                               self.dcgm.whole_cluster, self._target_nodes)
        for url, res in zip(targets, results, strict=True):
            self._answered(url, res, placed, now)
        for gone in [k for k in self.health.up if k[0] == "dcgm" and k[1] not in targets]:
            for table in (self.health.up, self.health.duration, self.health.errors,
                          self.health.last_success):
                table.pop(gone, None)  # the target went with its node: its series go too
            self.health.error_reasons.pop(gone, None)
            self._target_nodes.pop(gone[1], None)
            self._episodes.forget(gone[1])
            self._page_runs.forget(gone[1])
            self.health.stuck.pop(gone[1], None)
        nodes = dict(self.kube.nodes)
        self._admit(placed.readings, nodes, now)
        snap = Snapshot(now, nodes, dict(self.kube.pods), tuple(self.kube.take_deleted_pods()),
                        placed.readings, frozenset(placed.unknown_nodes), placed.complete)
        states = self._compute(snap)
        self._stuck(dict(zip(targets, results, strict=True)), states, now)
        for d in states:
            if d.price_usd_per_hour is None:
                self._log_once(d.node, f"unpriced:{d.accelerator}", "gpu model not priced",
                               model=d.accelerator, provisioning=d.provisioning,
                               region=self.prices.region)
        usage: list[compute.UsageRow] = []
        if self.state_time is not None and now > self.state_time:
            usage = compute.usage_rows(self.states, self.state_time, now - self.state_time)
            self.totals.add(usage)
        self._seed_months()
        self.states, self.state_time = states, now
        self._xids(states)
        self._incidents(states, nodes, snap.unknown_nodes, now)
        self._queue(now)
        self._bottlenecks(now, states)
        self._forget_gone(states, nodes)
        stages["compute"] = time.process_time() - cpu - stages["scrape"]
        if self.warehouse is None and self.warehouse_opening is not None:
            await self._open_warehouse(self.warehouse_opening, now)
        if self.warehouse is not None:
            await self._write_warehouse(self.warehouse, usage, nodes, now)
        stages["warehouse"] = time.process_time() - cpu - sum(stages.values())
        self.stage_cpu = stages
        self.cycles += 1
        self.viewed_cycles += viewed
        if viewed and self.viewed_cycles == 1:
            gc.freeze()  # what start-up built lives on: no collection need scan it again
        self.last_cycle_time = now
        self.cycle_seconds = time.perf_counter() - began
        self._view_now = view = self._view(nodes, now)
        for sink in self.sinks:
            sink.add_cycle(view, now)
        memory.give_back()  # what the cycle freed, the last exposition included

    def close(self) -> None:
        """Let the warehouse's thread end once its work (if any) is done."""
        self._warehouse_thread.shutdown(wait=False)

    @property
    def view(self) -> MetricsView | None:
        """What the last cycle shows; None before the first."""
        return self._view_now

    # ------------------------------------------------------------------ pieces

    def _answered(self, url: str, res: TargetScrape | Exception, placed: Placed,
                  now: float) -> None:
        """The health of one target after its answer: up or its error, the samples it
        lost, logged once per episode."""
        key = SourceTarget("dcgm", url)
        if isinstance(res, TargetScrape):
            self.health.up[key] = True
            self.health.last_success[key] = now
            self.health.duration[key] = res.duration_seconds
            self._episodes.recovered((url, "scrape"), now, "dcgm scrape recovered", target=url)
            self._page_read(url, res.result, now)
            rejects = dict(res.result.rejected)
            lost, stray = placed.unplaced.get(url, (0, None))
            if lost:
                rejects["unknown_node"] = rejects.get("unknown_node", 0) + lost
            for reason, n in rejects.items():
                self.health.rejected[reason] += n
            if not self.dcgm.whole_cluster:
                self._target_nodes[url] = placed.covered[url]
            self._log_rejects(url, rejects, stray, now)
            return
        assert isinstance(res, SourceError)
        self.health.up[key] = False
        self.health.errors[key] += 1
        self.health.error_reasons[key][res.label] += 1
        for reason, n in res.rejected.items():  # an answer with no sample we keep
            self.health.rejected[reason] += n
        self._episodes.failed((url, "scrape"), now, "dcgm scrape failed", target=url,
                              reason=res.label, error=res.reason,
                              **({"rejected": res.rejected} if res.rejected else {}))

    def _stuck(self, answers: Mapping[str, TargetScrape | Exception],
               states: Sequence[compute.DeviceState], now: float) -> None:
        """Each answering target's page compared with its last: the same
        ``dcgm.stuck_after`` times in a row while GPUs of its nodes are allocated, it is
        flagged stuck, logged once per episode."""
        allocated = {d.node for d in states if d.state == "allocated"}
        after = self.config.dcgm.stuck_after
        for url, res in answers.items():
            if not isinstance(res, TargetScrape) or res.page_crc is None:
                continue
            run = self._page_runs.see(url, (res.page_crc, res.bytes_read))
            busy = sorted(self._target_nodes.get(url, set()) & allocated)
            stuck = self.health.stuck[url] = PageRuns.stuck(run, after, len(busy))
            if stuck:
                self._episodes.failed((url, "stuck"), now, "dcgm page unchanged while its "
                                      "gpus are allocated", target=url, scrapes=run,
                                      nodes=busy)
            else:
                self._episodes.recovered((url, "stuck"), now, "dcgm page changing again",
                                         target=url)

    def _page_read(self, url: str, result: ParseResult, now: float) -> None:
        """How a page was read, counted; a plan that failed logged once, until a page of
        the target is read by a plan again."""
        how = result.read_by
        if how is None:
            return
        self.health.pages[how] += 1
        if how == "plan_failed":
            self._episodes.failed((url, "page_plan"), now, "dcgm page read in full: its plan "
                                  "failed", target=url, error=result.plan_error)
        elif how != "full":
            self._episodes.recovered((url, "page_plan"), now, "dcgm page read by plan again",
                                     target=url)

    def set_list_prices(self, prices: Mapping[tuple[str, str], float], read_at: float) -> None:
        """List prices read from the price catalogue at ``read_at``, model by model: what it
        does not price keeps the book's."""
        self._price.update(prices)
        self.price_sources.update(dict.fromkeys(prices, ("catalog", read_at)))

    def _compute(self, snap: Snapshot) -> list[compute.DeviceState]:
        """The devices' states of a snapshot; the inventory goes on from it."""
        owners = self._owners()
        self._remember(owners, snap.now)
        self._pool_of.update((n.name, n.pool) for n in snap.nodes.values())
        for pod in snap.ended_pods:
            owners.setdefault((pod.namespace, pod.name), self._owner(pod))
            self._pod_gone(pod, snap.now)
        gpus = compute.on_demand_gpus(snap.nodes.values())
        price = effective_prices(self._price, gpus, self._commitments,
                                 self.config.prices.negotiated)
        self._commitment_use = unused_commitment(self._commitments, gpus)
        states = compute.device_states(
            snap.nodes, snap.readings, snap.unknown_nodes, self.inventory, owners,
            price, self.config.prices.discounts, self.config.prices.default_discount,
            snap.complete, self.last_seen, self.unviewed_owner)
        self.inventory = compute.remember(self.inventory, snap.readings, snap.nodes)
        self._retire(snap.readings, snap.nodes, snap.now)
        self._unowned(states, snap.now)
        return states

    def _remember(self, owners: Mapping[tuple[str, str], compute.Owner], now: float) -> None:
        """Keep the owners whose team is known, the most recently seen last: at most
        ``REMEMBERED_OWNERS``, none last seen over ``REMEMBERED_SECONDS`` ago."""
        known = self._known_owners
        for key, owner in owners.items():
            if owner.team != compute.UNKNOWN_TEAM:
                known.pop(key, None)
                known[key] = (owner, now)
        while known:
            oldest = next(iter(known))
            if len(known) <= REMEMBERED_OWNERS and known[oldest][1] >= now - REMEMBERED_SECONDS:
                break
            del known[oldest]

    def unviewed_owner(self, namespace: str, pod: str) -> compute.Owner:
        """The owner of a GPU's pod not in the view: as last seen, else by its namespace
        (``compute.unviewed_owner``), else ``compute.UNKNOWN_TEAM``'s."""
        if (known := self._known_owners.get((namespace, pod))) is not None:
            return known[0]
        return compute.unviewed_owner(namespace, pod, self.kube.namespace_labels,
                                      self.config.team_label)

    def _unowned(self, states: Sequence[compute.DeviceState], now: float) -> None:
        """Log once per episode that allocated GPUs have pods of an unknown team."""
        pods = sorted({f"{o.namespace}/{o.name}" for d in states for o in d.owners
                       if o.team == compute.UNKNOWN_TEAM})
        if pods:
            missing = [k for k in ("pods", "namespaces") if not self.kube.up.get(k)]
            self._episodes.failed(("owners", "unknown"), now, "gpu owners unknown",
                                  team=compute.UNKNOWN_TEAM, pods=len(pods), first=pods[:5],
                                  kubernetes_down=missing)
        else:
            self._episodes.recovered(("owners", "unknown"), now, "gpu owners known again")


    def _owner(self, pod: PodInfo) -> compute.Owner:
        team = compute.team_of(pod.labels, pod.namespace, self.kube.namespace_labels,
                               self.config.team_label, self.kube.synced["namespaces"].is_set())
        a = self.config.allocation
        allocation = compute.allocation_of(pod.labels, pod.annotations, pod.namespace,
                                           self.kube.namespace_labels, a.label, a.annotation
                                           ) if a.enabled else ""
        return compute.Owner(pod.uid, pod.namespace, pod.name, team, pod.workload, allocation)

    def _team(self, pod: PodInfo) -> str:
        return self._owner(pod).team

    def _allocation(self, pod: PodInfo) -> str:
        return self._owner(pod).allocation

    def _owners(self) -> dict[tuple[str, str], compute.Owner]:
        return {(p.namespace, p.name): self._owner(p) for p in self.kube.pods.values()
                if p.gpus > 0}

    def _interrupted(self, pod: PodInfo) -> None:
        """Count a spot preemption once per pod: when it is seen terminated, or gone."""
        if pod.reason == "Terminated" and pod.phase == "Failed" and \
                pod.uid not in self._interrupted_pods:
            self._interrupted_pods.add(pod.uid)
            self.totals.interruptions[self._pool_of.get(pod.node or "", "")] += 1

    def _pod_gone(self, pod: PodInfo, now: float) -> None:
        """A pod deleted from the cluster: its last row says it ended (``deleted_pod``)."""
        self._interrupted(pod)
        self._interrupted_pods.discard(pod.uid)
        if self.warehouse is not None:
            self.warehouse.add_pods([deleted_pod(pod, now)], now, self._team,
                                    lambda p: gpu_model(p, self.kube.nodes), self._allocation,
                                    self.admission_of)
            self.warehouse.forget_pod(pod.uid)
        self._windows.pop(pod.uid, None)
        self.diagnoses.pop(pod.uid, None)
        self.totals.waited.discard(pod.uid)
        self.totals.pod_ended(pod.uid)

    def _admit(self, readings: dict[str, list[DeviceReading]],
               nodes: Mapping[str, NodeInfo], now: float) -> None:
        """Drop the readings of GPUs beyond what their node holds (``compute.admit``):
        counted as ``too_many_devices``, never devices; logged when a node begins to report
        too many and when it no longer does."""
        for name, devs in readings.items():
            known = {i.gpu_uuid for i in self.inventory.get(name, {}).values()}
            kept, excess = compute.admit(devs, known, nodes.get(name),
                                         self.config.dcgm.max_devices_per_target)
            episode = (name, "rejected:too_many_devices")
            if excess:
                readings[name] = kept
                self.health.rejected["too_many_devices"] += sum(len(d.fields) for d in excess)
                self._episodes.failed(episode, now, "more gpus than the node holds", node=name,
                                      reported=len({d.uuid for d in devs}),
                                      kept=len({d.uuid for d in kept}))
            else:
                self._episodes.recovered(episode, now, "no more gpus than the node holds",
                                         node=name)

    def _retire(self, readings: Mapping[str, Sequence[DeviceReading]],
                nodes: Mapping[str, NodeInfo], now: float) -> None:
        """Forget the devices ``compute.retire`` says to: their series go with the next
        snapshot, their open incidents end (``_incidents``)."""
        for devs in readings.values():
            for d in devs:
                self.last_seen[d.device_id] = now
        for known in self.inventory.values():
            for device_id in known:
                self.last_seen.setdefault(device_id, now)  # loaded at start: from now
        self.inventory = compute.retire(self.inventory, nodes, self.last_seen, now,
                                        self.config.dcgm.retire_after)
        kept = {device_id for known in self.inventory.values() for device_id in known}
        if len(kept) != len(self.last_seen):
            self.last_seen = {d: t for d, t in self.last_seen.items() if d in kept}

    def _forget_gone(self, states: Sequence[compute.DeviceState],
                     nodes: Mapping[str, NodeInfo]) -> None:
        """The counters of GPUs no longer known (retired, or their node deleted) leave
        /metrics; so does the pool of a node neither live nor named by a pod. The names of
        GPUs known only from Kubernetes (``<node>/k8s-<index>``, a few per node) stay while
        their node does."""
        live = {d.gpu_uuid for d in states}
        for devs in self.inventory.values():
            live.update(i.gpu_uuid for i in devs.values())

        def gone(uuid: str) -> bool:
            node, k8s, _ = uuid.rpartition("/k8s-")
            return uuid not in live and not (k8s and node in nodes)

        t = self.totals  # nearly every GPU is live: only the others are looked at
        for uuid in [u for u in t.up_seconds.keys() - live if gone(u)]:
            del t.up_seconds[uuid]
        for key in [k for k in t.down_seconds if k[0] not in live and gone(k[0])]:
            del t.down_seconds[key]
        for table in (t.xid_events, t.last_xid):
            for xkey in [k for k in table if k[1] not in live and gone(k[1])]:
                del table[xkey]
        named = {p.node for p in self.kube.pods.values()}
        self._pool_of = {n: p for n, p in self._pool_of.items() if n in nodes or n in named}

    def _xids(self, states: Sequence[compute.DeviceState]) -> None:
        """DCGM reports a GPU's last XID: a change to a new code is one more event."""
        events, last = self.totals.xid_events, self.totals.last_xid
        for d in states:
            key = (d.node, d.gpu_uuid)
            events.setdefault(key, 0)
            xid = d.fields.get(compute.XID)
            if xid is None:
                continue
            code = int(xid)
            if code and last.get(key, 0) != code:
                events[key] += 1
            last[key] = code

    def _incidents(self, states: Sequence[compute.DeviceState], nodes: dict[str, NodeInfo],
                   unknown: frozenset[str], now: float) -> None:
        """Open an incident when a GPU becomes unavailable; close it when it is back."""
        down = {(d.gpu_uuid, d.reason or ""): d for d in states if d.state == "unavailable"}
        for key, d in down.items():
            self.open_incidents.setdefault(key, (now, d.node, d.pool))
        reported = {d.node for d in states}
        for ended in [k for k in self.open_incidents if k not in down]:
            start, node, pool = self.open_incidents[ended]
            if node in unknown or (node in nodes and node not in reported):
                continue  # cannot tell yet: no answer covered its node this cycle
            del self.open_incidents[ended]
            if self.warehouse is not None:
                gpu_uuid, reason = ended
                self.warehouse.add_event(node, pool, gpu_uuid, reason, start, now)

    def _queue(self, now: float) -> None:
        self._index_workloads()
        waited = self.totals.waited
        for pod in self.kube.pods.values():
            self._interrupted(pod)
            if pod.gpus > 0 and pod.scheduled_unix is not None and pod.uid not in waited:
                group = (pod.namespace, self._team(pod), gpu_model(pod, self.kube.nodes))
                wl = self.workload_of(pod)
                self.totals.observe_wait(pod.uid, group, compute.queue_wait_seconds(
                    pod, now, wl.created_unix if wl else None))
        admitted = self.totals.admitted
        for uid in [u for u in admitted if u not in self.kube.workloads]:
            del admitted[uid]
        for wl in self.kube.workloads.values():
            if wl.admitted_unix is not None:
                key = (self.cluster_queue_of(wl), wl.local_queue, wl.namespace,
                       self.workload_team(wl))
                wait = compute.admission_wait_seconds(wl.queued_unix, wl.admitted_unix, now)
                self.totals.observe_admission(wl.uid, wl.admitted_unix, key, wait)

    # ------------------------------------------------------------------ Kueue

    def _index_workloads(self) -> None:
        self._workload_index = {(w.namespace, w.owner_kind, w.owner_name): w
                                for w in self.kube.workloads.values()}

    def workload_of(self, pod: PodInfo) -> WorkloadInfo | None:
        """The Kueue Workload of the pod's Job (or JobSet), if Kueue queued it."""
        if not self._workload_index:
            return None
        jobset = pod.labels.get("jobset.sigs.k8s.io/jobset-name")
        if jobset:
            return self._workload_index.get((pod.namespace, "JobSet", jobset))
        return self._workload_index.get((pod.namespace, pod.owner_kind, pod.workload))

    def admission_of(self, pod: PodInfo) -> compute.Admission | None:
        wl = self.workload_of(pod)
        if wl is None:
            return None
        wait = None if wl.admitted_unix is None else compute.admission_wait_seconds(
            wl.queued_unix, wl.admitted_unix, wl.admitted_unix)
        return compute.Admission(wl.created_unix, wait, self.cluster_queue_of(wl))

    def workload_team(self, wl: WorkloadInfo) -> str:
        return compute.team_of(wl.labels, wl.namespace, self.kube.namespace_labels,
                               self.config.team_label, self.kube.synced["namespaces"].is_set())

    def cluster_queue_of(self, wl: WorkloadInfo) -> str:
        """The ClusterQueue that admitted it, else its LocalQueue's ("" if unknown)."""
        if wl.cluster_queue:
            return wl.cluster_queue
        lq = self.kube.local_queues.get((wl.namespace, wl.local_queue))
        return lq.cluster_queue if lq else ""

    def _bottlenecks(self, now: float, states: Sequence[compute.DeviceState]) -> None:
        window = self.config.bottleneck_window
        live: dict[str, tuple[compute.Owner, str, bool]] = {}
        per_pod: dict[str, list[Mapping[str, float]]] = defaultdict(list)
        for d in states:
            if d.state != "allocated":
                continue
            for o in d.owners:
                if o.uid:
                    per_pod[o.uid].append(d.fields)
                    live[o.uid] = (o, d.accelerator, d.mig_profile is not None)
        for uid, fields in per_pod.items():
            # one sample per pod and cycle: the mean over its GPUs of the fields that count
            w = self._windows.get(uid)
            if w is None:
                w = self._windows[uid] = Window()
            w.add(now, _mean_fields(fields))
        self.diagnoses = {}
        for uid, (owner, accel, mig) in live.items():
            w = self._windows[uid]
            w.expire(now - window)
            self.diagnoses[uid] = (owner, decide(w.signals(), accel, mig=mig))
        for uid in [u for u in self._windows if u not in live]:
            del self._windows[uid]

    def _seed_months(self) -> None:
        """Add the warehouse's spend of the month before this run, once it is read."""
        seed = self._month_seed
        if seed is None or not seed.done():
            return
        self._month_seed = None
        try:
            self.totals.seed_months(seed.result())
        except Exception as exc:  # the month's spend then counts from this run's start
            if self.warehouse is not None:
                self.health.errors[SourceTarget("warehouse", str(self.warehouse.path))] += 1
            log.warning("month-to-date spend not read from the warehouse",
                        extra=logs.ctx(error=f"{type(exc).__name__}: {exc}"))

    async def _open_warehouse(self, opening: WarehouseOpening, now: float) -> None:
        """Try again to open the warehouse, when its time has come (in the warehouse's
        thread: opening a large file takes a while). Once open, it goes on from the state
        it saved, this run's devices first, and its month's spend is added as at a start."""
        if opening.next_try is None:
            opening.next_try = now + opening.retry_seconds
        if now < opening.next_try:
            return
        opening.next_try = now + opening.retry_seconds
        try:
            warehouse = await asyncio.get_running_loop().run_in_executor(
                self._warehouse_thread, opening.open)
        except Exception as exc:
            opening.error = self.warehouse_error = " ".join(str(exc).split())
            self.health.errors[SourceTarget("warehouse", opening.path)] += 1
            return
        inventory, _ = warehouse.load_state()
        self.inventory = inventory | self.inventory
        self._month_seed = self._warehouse_thread.submit(warehouse.team_month_costs)
        self.warehouse, self.warehouse_opening, self.warehouse_error = warehouse, None, None
        log.info("warehouse opened", extra=logs.ctx(target=opening.path))
        opening.opened(warehouse)

    async def _write_warehouse(self, warehouse: Warehouse, usage: list[compute.UsageRow],
                               nodes: dict[str, NodeInfo], now: float) -> None:
        """Hand the cycle to the warehouse. DuckDB's work runs in a worker thread, so a slow
        flush or checkpoint never holds up ``/metrics`` or the watches; it is given copies
        of what it reads. A failure (a full disk, DuckDB out of memory) costs this cycle's
        warehouse work only: it is counted as an error of source ``warehouse``, logged when
        it begins and when it ends, and shown by ``warehouse_ok``; rows not staged are kept
        for the next cycle."""
        path = str(warehouse.path)
        inventory = {node: dict(devices) for node, devices in self.inventory.items()}
        incidents = dict(self.open_incidents)
        present = None
        if self._vanished_unchecked and self.kube.synced["pods"].is_set():
            present = frozenset(self.kube.pods)
        listed = self.kube.synced.get("workloads")
        workloads_listed = listed is not None and listed.is_set()
        present_workloads = None
        if self._vanished_workloads_unchecked and workloads_listed:
            present_workloads = frozenset(self.kube.workloads)

        def write() -> None:
            warehouse.add_usage(usage)
            warehouse.save_state(inventory, incidents)
            if present is not None:
                warehouse.finish_vanished(present, now)
            if present_workloads is not None:
                warehouse.finish_vanished_workloads(present_workloads, now)
            warehouse.maybe_flush(now)

        try:
            warehouse.add_pods(list(self.kube.pods.values()), now, self._team,
                               lambda p: gpu_model(p, nodes), self._allocation,
                               self.admission_of)
            warehouse.add_quotas(self.kube.cluster_queues.values(), now)
            warehouse.add_workloads(self.kube.workloads.values(), now, self.workload_team,
                                    self.cluster_queue_of, workloads_listed)
            await asyncio.get_running_loop().run_in_executor(self._warehouse_thread, write)
        except Exception as exc:
            self.warehouse_error = f"{type(exc).__name__}: {exc}"
            self.health.errors[SourceTarget("warehouse", path)] += 1
            self._episodes.failed((path, "warehouse"), now, "warehouse write failed",
                                  target=path, error=self.warehouse_error)
            return
        if present is not None:
            self._vanished_unchecked = False  # once, on the first full pod list
        if present_workloads is not None:
            self._vanished_workloads_unchecked = False  # and on the first Workload list
        self.warehouse_error = None
        self._episodes.recovered((path, "warehouse"), now, "warehouse write recovered",
                                 target=path)

    @property
    def warehouse_ok(self) -> bool:
        """False while the warehouse fails (the last cycle's warehouse work raised); True
        without a warehouse."""
        return self.warehouse_error is None

    def _log_rejects(self, url: str, rejects: Mapping[str, int], stray: DeviceReading | None,
                     now: float) -> None:
        """One line when a target's answers begin to have samples dropped for a reason (a
        GPU on no known node: with its labels), one when an answer has none again."""
        for reason, n in rejects.items():
            if reason == "unknown_node" and stray is not None:
                self._episodes.failed(
                    (url, "rejected:unknown_node"), now, "gpu on no known node", target=url,
                    count=n, gpu=stray.uuid, hostname=stray.hostname,
                    pods=[f"{p.namespace}/{p.pod}" for p in stray.pods])
            else:
                self._episodes.failed((url, f"rejected:{reason}"), now,
                                      "dcgm samples rejected", target=url, reason=reason,
                                      count=n)
        for kind in self._episodes.failing(url):
            reason = kind.removeprefix("rejected:")
            if kind != reason and reason not in rejects:
                self._episodes.recovered((url, kind), now, "dcgm samples accepted again",
                                         target=url, reason=reason)

    def _log_once(self, target: str, kind: str, event: str, **fields: object) -> None:
        """Log a failure the first time it happens to a target (it is always counted)."""
        if (target, kind) in self._logged:
            return
        self._logged.add((target, kind))
        log.warning(event, extra=logs.ctx(target=target, **fields))

    def _view(self, nodes: dict[str, NodeInfo], now: float) -> MetricsView:
        return MetricsView(
            cluster=self.config.cluster, now=now, states=self.states, nodes=nodes,
            pods=list(self.kube.pods.values()), totals=self.totals, health=self.health,
            kube=self.kube, diagnoses=self.diagnoses,
            available_gpus=compute.available_gpus(nodes.values(),
                                                  self.config.system_reserved_gpus)
            if self.kube.synced["nodes"].is_set() else None,
            cycle_seconds=self.cycle_seconds, owner=self._owner,
            rows_written=dict(self.warehouse.rows_written) if self.warehouse else {},
            bigquery=self.bigquery.stats if self.bigquery else None,
            bigquery_dataset=self.bigquery.dataset_ref if self.bigquery else "",
            budgets=self.config.budgets, sla_target=self.config.sla.target,
            remote_write=self.remote_write, cloud_monitoring=self.cloud_monitoring,
            rows_removed=dict(self.warehouse.rows_removed) if self.warehouse else {},
            warehouse_up=None if self.warehouse is None and self.warehouse_opening is None
            else self.warehouse is not None and self.warehouse_ok,
            warehouse_quarantined=dict(self.warehouse.quarantined) if self.warehouse else {},
            report=self.report, kube_max_staleness_seconds=self.config.kubernetes.max_staleness,
            commitments=self._commitment_use,
            list_prices={k: ListPrice(v, *self.price_sources.get(k, ("book", None)))
                         for k, v in sorted(self._price.items())},
            catalog=self.catalog,
            allocation=(self.config.allocation.label or self.config.allocation.annotation)
            if self.config.allocation.enabled else None,
            kueue=bool(self.kube.kueue),
            workloads=[QueuedWorkload(w, self.workload_team(w), self.cluster_queue_of(w))
                       for w in self.kube.workloads.values()],
            cluster_queues=dict(self.kube.cluster_queues),
        )
