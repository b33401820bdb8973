"""One exporter cycle: sources → snapshot → compute → sinks.

``Exporter.cycle(now)`` asks the reading source (``sources.ReadingSource``) for every
target's answer, places the answers on their nodes and freezes them with the Kubernetes
state the watches keep current (``snapshot.Snapshot``), computes each device's state,
integrates the previous snapshot's states over the time since it (GPU-seconds, utilised
seconds, cost, up/down time), and hands the result on: rows to the warehouse, and a frozen
view (``families.MetricsView``) to every sink (``sinks.Sink``: ``/metrics``, the push
sinks). The state kept from one cycle to the next is in parts, each owning one thing
(``exporter.runtime``); the view a cycle publishes holds copies of what it shows, so a
scrape that lands while the next cycle runs sees one cycle. Time is an argument, so the
same code runs on the wall clock or on the simulator's virtual clock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from exporter import logs
from exporter.config import Config
from exporter.logs import ctx
from exporter.metrics.families import DEVICE_READINGS, MetricsView, QueuedWorkload
from exporter.metrics.health import (
    CatalogStats,
    CloudMonitoringStats,
    RemoteWriteStats,
    ReportStats,
    SourceHealth,
)
from exporter.model import compute
from exporter.model.bottleneck import SIGNAL_FIELDS, Diagnosis
from exporter.model.catalog import DCGM_RENAMED
from exporter.model.energy import Carbon
from exporter.model.placement import Placement
from exporter.model.prices import PriceBook
from exporter.model.records import PodInfo
from exporter.model.snapshot import Snapshot, place_answers
from exporter.model.totals import Totals
from exporter.runtime.bottlenecks import Bottlenecks
from exporter.runtime.cycles import CycleRecord
from exporter.runtime.energy_counters import EnergyCounters
from exporter.runtime.forecasts import Forecasts
from exporter.runtime.incidents import Incidents
from exporter.runtime.inventory import Inventory
from exporter.runtime.memory import MemoryTuning, glibc
from exporter.runtime.owners import Owners
from exporter.runtime.price_state import PriceState
from exporter.runtime.publishing import Publisher, copy_of, frozen_figures
from exporter.runtime.queues import Queues
from exporter.runtime.readiness import VIEW_KINDS, Readiness
from exporter.runtime.recording import Recording, WarehouseOpening
from exporter.runtime.scrapes import Scrapes
from exporter.runtime.waits import Waits
from exporter.sinks import Sink
from exporter.sinks.schema import FIELDS
from exporter.sinks.warehouse import Warehouse
from exporter.sources import ClusterSource, ReadingSource

if TYPE_CHECKING:
    from exporter.sinks.bigquery import BigQuerySink
    from exporter.sinks.prometheus import MetricsEndpoint

log = logging.getLogger(__name__)

_USED = frozenset({*compute.FIELDS_READ, *SIGNAL_FIELDS, *FIELDS.values(),
                   *(r.dcgm_field for r in DEVICE_READINGS)})
DCGM_FIELDS_READ = _USED | {old for old, new in DCGM_RENAMED.items() if new in _USED}
"""Every DCGM field the exporter uses, under each name DCGM has given it; the source skips
the other families unparsed."""

class Exporter:
    """The loop of one cycle over the parts that hold the exporter's state between cycles
    (``exporter.runtime``); ``cycle`` is the only thing that changes them."""

    def __init__(self, config: Config, prices: PriceBook, kube: ClusterSource,
                 dcgm: ReadingSource, metrics: MetricsEndpoint, sinks: Sequence[Sink] = (),
                 warehouse: Warehouse | None = None, bigquery: BigQuerySink | None = None, *,
                 remote_write: RemoteWriteStats | None = None,
                 cloud_monitoring: CloudMonitoringStats | None = None,
                 warehouse_opening: WarehouseOpening | None = None,
                 memory: MemoryTuning | None = None, carbon: Carbon | None = None) -> None:
        self.config = config
        self.carbon = carbon
        """The carbon factors in force; None: energy without CO2e."""
        self._factors: dict[str, float | None] = {}
        self.energy = EnergyCounters()
        """The GPUs' energy counters from one cycle to the next."""
        self.memory = memory if memory is not None else MemoryTuning(glibc())
        """The process's memory: what each cycle frees goes back to the system."""
        self.kube = kube
        self.totals = Totals()
        episodes = logs.Episodes(log)
        self.scrapes = Scrapes(dcgm, config.dcgm.stuck_after, episodes)
        devices, open_incidents = warehouse.resume.load() if warehouse is not None else ({}, {})
        # go on from where the last run stopped
        self.inventory = Inventory(config.dcgm.max_devices_per_target, config.dcgm.retire_after,
                                   self.scrapes.health, episodes, devices)
        self.incidents = Incidents(self.totals, open_incidents)
        self.owners = Owners(config, kube, episodes)
        self.queues = Queues(config, kube)
        self.bottlenecks = Bottlenecks(config.bottleneck_window)
        self.waits = Waits()
        self.forecasts = Forecasts(config.queue_forecast)
        self.pricing = PriceState(config, prices, log)
        self.recording = Recording(kube, self.owners, self.queues, self.scrapes.health,
                                   episodes, log, warehouse, bigquery, warehouse_opening)
        self.record = CycleRecord()
        self.readiness = Readiness(config, kube, self.recording,
                                   lambda: self.record.viewed_cycles)
        self.publisher = Publisher(metrics, sinks, remote_write=remote_write,
                                   cloud_monitoring=cloud_monitoring)

    # ------------------------------------------------------------------ what callers read

    @property
    def metrics(self) -> MetricsEndpoint:
        """``/metrics``: what the last cycle shows, rendered once for every scrape."""
        return self.publisher.metrics

    @property
    def sinks(self) -> list[Sink]:
        """Each is handed every cycle's view."""
        return self.publisher.sinks

    @property
    def view(self) -> MetricsView | None:
        """What the last cycle shows; None before the first."""
        return self.publisher.view

    @property
    def report(self) -> ReportStats | None:
        """Set when the service also makes the weekly report on a schedule."""
        return self.publisher.report

    @report.setter
    def report(self, stats: ReportStats | None) -> None:
        self.publisher.report = stats

    @property
    def catalog(self) -> CatalogStats | None:
        """The price catalogue's reads, when it is read."""
        return self.pricing.catalog

    @property
    def prices(self) -> PriceBook:
        return self.pricing.book

    @property
    def health(self) -> SourceHealth:
        return self.scrapes.health

    @property
    def warehouse(self) -> Warehouse | None:
        return self.recording.warehouse

    @property
    def warehouse_opening(self) -> WarehouseOpening | None:
        """The warehouse to open, while it could not be."""
        return self.recording.opening

    @property
    def warehouse_ok(self) -> bool:
        """False while the warehouse fails (the last cycle's warehouse work raised); True
        without a warehouse."""
        return self.recording.ok

    @property
    def bigquery(self) -> BigQuerySink | None:
        return self.recording.bigquery

    @bigquery.setter
    def bigquery(self, sink: BigQuerySink | None) -> None:
        self.recording.bigquery = sink

    @property
    def states(self) -> list[compute.DeviceState]:
        """The device states of the last cycle."""
        return self.record.states

    @property
    def cycles(self) -> int:
        return self.record.cycles

    @property
    def stage_cpu(self) -> dict[str, float]:
        return self.record.stage_cpu

    @property
    def last_cycle_time(self) -> float:
        return self.record.last_time

    @property
    def diagnoses(self) -> Mapping[str, tuple[compute.Owner, Diagnosis]]:
        return self.bottlenecks.diagnoses

    @property
    def ready(self) -> bool:
        return not self.unready()

    def unready(self) -> list[str]:
        """Why ``/readyz`` answers 503, one line each; empty when ready."""
        return self.readiness.unready()

    def targets(self) -> dict[str, str | None]:
        """Target URL -> the node it belongs to (None while unknown)."""
        return self.scrapes.targets(self.kube.pods.values())

    def close(self) -> None:
        """Let the warehouse's thread end once its work (if any) is done."""
        self.recording.close()

    # ------------------------------------------------------------------ the cycle

    async def cycle(self, now: float) -> None:
        began, cpu = time.perf_counter(), time.process_time()
        kube, totals, record = self.kube, self.totals, self.record
        viewed = all(kube.synced[k].is_set() for k in VIEW_KINDS)
        targets = self.targets()
        results = await self.scrapes.source.fetch(list(targets))
        stages = {"scrape": time.process_time() - cpu}
        placed = place_answers(targets, results, Placement(kube.nodes, kube.pods.values()),
                               self.scrapes.source.whole_cluster, self.scrapes.covered)
        for url, res in zip(targets, results, strict=True):
            self.scrapes.answered(url, res, placed, now)
        self.scrapes.forget_gone(targets)
        nodes = dict(kube.nodes)
        self.inventory.admit(placed.readings, nodes, now)
        snap = Snapshot(now, nodes, dict(kube.pods), tuple(kube.take_deleted_pods()),
                        placed.readings, frozenset(placed.unknown_nodes), placed.complete,
                        kube.synced["nodes"].is_set(), bool(kube.kueue), dict(kube.workloads),
                        dict(kube.cluster_queues), dict(kube.pod_events))
        states = self._compute(snap)
        self.scrapes.stuck(dict(zip(targets, results, strict=True)), states, now)
        self.pricing.unpriced(states)
        usage: list[compute.UsageRow] = []
        if record.state_time is not None and now > record.state_time:
            seconds = now - record.state_time
            energy = self.energy.interval(record.states, states, record.state_time, seconds,
                                          totals.energy_bases)
            usage = compute.usage_rows(record.states, record.state_time, seconds, energy,
                                       self._carbon_factors(record.states))
            totals.add(usage)
        self.recording.seed_months(totals)
        record.states, record.state_time = states, now
        self.incidents.xids(states)
        self.recording.ended(self.incidents.update(states, nodes, snap.unknown_nodes, now))
        for pod in snap.pods.values():
            self.incidents.preempted(pod)
        self.queues.observe(totals, self.owners.team, now)
        with_pods = {wl.uid for p in snap.pods.values() if (wl := self.queues.workload_of(p))}
        waited, free = self.waits.observe(snap, self.owners.team, self.queues.workload_team,
                                          self.queues.cluster_queue_of,
                                          lambda wl: wl.uid in with_pods, states)
        forecast = self.forecasts.observe(snap, self.waits.figures, self.waits.shapes,
                                          self.queues.workload_of,
                                          self.queues.cluster_queue_of)
        self.waits.expect({uid: e.start for uid, e in forecast.starts.items()})
        self.bottlenecks.update(now, states)
        self.inventory.forget_gone(totals, states, nodes)
        self.incidents.forget_pools(nodes, snap.pods.values())
        stages["compute"] = time.process_time() - cpu - stages["scrape"]
        recording = self.recording
        if recording.warehouse is None and recording.opening is not None:
            self.inventory.devices = await recording.open_late(now, self.inventory.devices)
        if recording.warehouse is not None:
            await recording.write(usage, nodes, self.inventory.copy(),
                                  dict(self.incidents.open), now, waited, free)
        stages["warehouse"] = time.process_time() - cpu - sum(stages.values())
        record.stage_cpu = stages
        record.cycles += 1
        record.viewed_cycles += viewed
        if viewed and record.viewed_cycles == 1:
            self.memory.freeze()  # what start-up built lives on, set aside from collections
        record.last_time = now
        record.seconds = time.perf_counter() - began
        self.publisher.publish(self._view(snap), now)
        self.memory.give_back()  # what the cycle freed, the last exposition included

    def _compute(self, snap: Snapshot) -> list[compute.DeviceState]:
        """The devices' states of a snapshot; the inventory goes on from it."""
        owners = self.owners.of_gpu_pods()
        self.owners.remember(owners, snap.now)
        self.incidents.learn_pools(snap.nodes.values())
        for pod in snap.ended_pods:
            owners.setdefault((pod.namespace, pod.name), self.owners.owner(pod))
            self._pod_gone(pod, snap.now)
        price = self.pricing.device_prices(snap.nodes)
        prices = self.config.prices
        states = compute.device_states(
            snap.nodes, snap.readings, snap.unknown_nodes, self.inventory.devices, owners,
            price, prices.discounts, prices.default_discount, snap.complete,
            self.inventory.last_seen, self.owners.unviewed_owner)
        self.inventory.remember(snap.readings, snap.nodes, snap.now)
        self.owners.unowned(states, snap.now)
        return states

    def _carbon_factors(self, states: Sequence[compute.DeviceState]) -> dict[str, float]:
        """Grams of CO2e per joule of the states' zones (the few a cluster has, memoised)."""
        if self.carbon is None:
            return {}
        factors = self._factors
        for zone in {d.zone for d in states} - factors.keys():
            factors[zone] = self.carbon.factors([zone]).get(zone)
            if factors[zone] is None:
                log.warning("no grid carbon intensity for the zone: its GPUs' CO2e is "
                            "unknown (set carbon.grid_g_per_kwh)", extra=ctx(zone=zone))
        return {z: f for z, f in factors.items() if f is not None}

    def _pod_gone(self, pod: PodInfo, now: float) -> None:
        """A pod deleted from the cluster: its last row written, its sums kept a while."""
        self.incidents.pod_gone(pod)
        self.recording.pod_gone(pod, now)
        self.bottlenecks.pod_gone(pod.uid)
        self.waits.pod_gone(pod.uid)
        self.totals.waited.discard(pod.uid)
        self.totals.pod_ended(pod.uid)

    def _view(self, snap: Snapshot) -> MetricsView:
        """The cycle's view: copies of what it shows, the cluster as the snapshot took it
        (the watches go on while the cycle awaits the warehouse), so that nothing after it
        changes any of it."""
        nodes, now = snap.nodes, snap.now
        config, kube, recording, publisher = self.config, self.kube, self.recording, \
            self.publisher
        warehouse, bigquery = recording.warehouse, recording.bigquery
        totals, health, kube_figures = frozen_figures(self.totals, self.scrapes.health, kube)
        return MetricsView(
            cluster=config.cluster, now=now, states=self.record.states, nodes=nodes,
            pods=list(snap.pods.values()), totals=totals, health=health,
            kube=kube_figures, diagnoses=self.bottlenecks.diagnoses,
            available_gpus=compute.available_gpus(nodes.values(), config.system_reserved_gpus)
            if snap.nodes_listed else None,
            cycle_seconds=self.record.seconds, owner=self.owners.frozen(),
            rows_written=dict(warehouse.rows_written) if warehouse else {},
            bigquery=copy_of(bigquery.stats) if bigquery else None,
            bigquery_dataset=bigquery.dataset_ref if bigquery else "",
            budgets=config.budgets, sla_target=config.sla.target,
            remote_write=_copy(publisher.remote_write),
            cloud_monitoring=_copy(publisher.cloud_monitoring),
            rows_removed=dict(warehouse.rows_removed) if warehouse else {},
            warehouse_up=recording.up,
            warehouse_quarantined=dict(warehouse.quarantined) if warehouse else {},
            report=_copy(publisher.report),
            kube_max_staleness_seconds=config.kubernetes.max_staleness,
            commitments=self.pricing.commitment_use,
            list_prices=self.pricing.shown(),
            catalog=_copy(self.pricing.catalog),
            allocation=(config.allocation.label or config.allocation.annotation)
            if config.allocation.enabled else None,
            kueue=snap.kueue,
            workloads=[QueuedWorkload(w, self.queues.workload_team(w),
                                      self.queues.cluster_queue_of(w))
                       for w in snap.workloads.values()],
            cluster_queues=dict(snap.cluster_queues),
            waits=self.waits.figures,
            forecast=self.forecasts.last,
            forecast_series=config.queue_forecast.max_series,
            carbon=self.carbon,
        )


def _copy[T](stats: T | None) -> T | None:
    return None if stats is None else copy_of(stats)
