"""The warehouse's side of each cycle: the rows, pods, quotas, Workloads and incidents
handed to it, its DuckDB work in one thread of its own (a slow flush never holds up
``/metrics`` or the watches), its month's spend read back at start, a warehouse that
could not be opened tried again, and the BigQuery sink sending its outbox."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from exporter import logs
from exporter.metrics.health import SourceHealth, SourceTarget
from exporter.model import compute
from exporter.model.pending import FreeRow, PendingRow
from exporter.model.records import NodeInfo, PodInfo, gpu_model
from exporter.model.totals import Totals
from exporter.sinks.warehouse import Warehouse
from exporter.sources import ClusterSource
from exporter.sources.kube import deleted_pod

if TYPE_CHECKING:
    from exporter.runtime.incidents import Ended
    from exporter.runtime.owners import Owners
    from exporter.runtime.queues import Queues
    from exporter.sinks.bigquery import BigQuerySink

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


class Recording:
    """The warehouse (None without one, or while it cannot be opened) and what it is
    handed."""

    def __init__(self, kube: ClusterSource, owners: Owners, queues: Queues,
                 health: SourceHealth, episodes: logs.Episodes, log: logging.Logger,
                 warehouse: Warehouse | None = None, bigquery: BigQuerySink | None = None,
                 opening: WarehouseOpening | None = None) -> None:
        self.kube, self.owners, self.queues = kube, owners, queues
        self.warehouse = warehouse
        self.bigquery = bigquery
        self.opening = opening
        """The warehouse to open, while it could not be."""
        self.error: str | None = None if opening is None else opening.error
        """Why the last cycle's warehouse work failed; None when it did not."""
        self._health, self._episodes, self._log = health, episodes, log
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="warehouse")
        """One thread for DuckDB's work: its memory stays in one allocator arena."""
        self._month_seed: Future[dict[tuple[str, str], float]] | None = None
        """The warehouse's spend of this month before this run: its first task, so that
        none of this run's rows are in it (seconds at fleet scale: no cycle waits)."""
        if warehouse is not None:
            self._month_seed = self._thread.submit(warehouse.resume.team_month_costs)
        self._vanished_unchecked = True
        """Pods that ended while no exporter watched are yet to be finished."""
        self._vanished_workloads_unchecked = True
        """And Kueue Workloads."""

    @property
    def ok(self) -> bool:
        """False while the warehouse fails (the last cycle's warehouse work raised); True
        without a warehouse."""
        return self.error is None

    @property
    def up(self) -> bool | None:
        """Whether the warehouse is open and its last cycle's work succeeded; None without
        one."""
        if self.warehouse is None and self.opening is None:
            return None
        return self.warehouse is not None and self.ok

    def close(self) -> None:
        """Let the warehouse's thread end once its work (if any) is done."""
        self._thread.shutdown(wait=False)

    def seed_months(self, totals: Totals) -> None:
        """Add the warehouse's spend of the month before this run, once it is read."""
        seed = self._month_seed
        if seed is None or not seed.done():
            return
        self._month_seed = None
        try:
            totals.seed_months(seed.result())
        except Exception as exc:  # the month's spend then counts from this run's start
            if self.warehouse is not None:
                self._health.errors[SourceTarget("warehouse", str(self.warehouse.path))] += 1
            self._log.warning("month-to-date spend not read from the warehouse",
                              extra=logs.ctx(error=f"{type(exc).__name__}: {exc}"))

    def pod_gone(self, pod: PodInfo, now: float) -> None:
        """A pod deleted from the cluster: its last row says it ended (``deleted_pod``)."""
        warehouse = self.warehouse
        if warehouse is None:
            return
        warehouse.add_pods([deleted_pod(pod, now)], now, self.owners.team,
                           lambda p: gpu_model(p, self.kube.nodes), self.owners.allocation,
                           self.queues.admission_of)
        warehouse.forget_pod(pod.uid)

    def ended(self, incidents: Iterable[Ended]) -> None:
        if self.warehouse is not None:
            for e in incidents:
                self.warehouse.add_event(e.node, e.pool, e.gpu_uuid, e.reason, e.start, e.end)

    async def open_late(self, now: float,
                        devices: dict[str, dict[str, compute.DeviceIdentity]]
                        ) -> dict[str, dict[str, compute.DeviceIdentity]]:
        """Try again to open the warehouse, when its time has come (in the warehouse's
        thread: opening a large file takes a while). Once open, it goes on from the state
        it saved, this run's devices first (the inventory returned), and its month's spend
        is added as at a start."""
        opening = self.opening
        if self.warehouse is not None or opening is None:
            return devices
        if opening.next_try is None:
            opening.next_try = now + opening.retry_seconds
        if now < opening.next_try:
            return devices
        opening.next_try = now + opening.retry_seconds
        try:
            warehouse = await asyncio.get_running_loop().run_in_executor(
                self._thread, opening.open)
        except Exception as exc:
            opening.error = self.error = " ".join(str(exc).split())
            self._health.errors[SourceTarget("warehouse", opening.path)] += 1
            return devices
        inventory, _ = warehouse.resume.load()
        self._month_seed = self._thread.submit(warehouse.resume.team_month_costs)
        self.warehouse, self.opening, self.error = warehouse, None, None
        self._log.info("warehouse opened", extra=logs.ctx(target=opening.path))
        opening.opened(warehouse)
        return inventory | devices

    async def write(self, usage: list[compute.UsageRow], nodes: dict[str, NodeInfo],
                    inventory: dict[str, dict[str, compute.DeviceIdentity]],
                    incidents: dict[tuple[str, str], tuple[float, str, str]],
                    now: float, waited: list[PendingRow] | None = None,
                    free: list[FreeRow] | None = None) -> None:
        """Hand the cycle to the warehouse. DuckDB's work runs in a worker thread, so a slow
        flush or checkpoint never holds up ``/metrics`` or the watches; it is given copies
        of what it reads (``inventory``, ``incidents``). A failure (a full disk, DuckDB out
        of memory) costs this cycle's warehouse work only: it is counted as an error of
        source ``warehouse``, logged when it begins and when it ends, and shown by ``ok``;
        rows not staged are kept for the next cycle."""
        warehouse = self.warehouse
        if warehouse is None:
            return
        path = str(warehouse.path)
        kube = self.kube
        present = None
        if self._vanished_unchecked and kube.synced["pods"].is_set():
            present = frozenset(kube.pods)
        listed = kube.synced.get("workloads")
        workloads_listed = listed is not None and listed.is_set()
        present_workloads = None
        if self._vanished_workloads_unchecked and workloads_listed:
            present_workloads = frozenset(kube.workloads)

        def write() -> None:
            warehouse.add_usage(usage)
            warehouse.add_waits(waited or [], free or [])
            warehouse.resume.save(inventory, incidents)
            if present is not None:
                warehouse.finish_vanished(present, now)
            if present_workloads is not None:
                warehouse.finish_vanished_workloads(present_workloads, now)
            warehouse.maybe_flush(now)

        try:
            warehouse.add_pods(list(kube.pods.values()), now, self.owners.team,
                               lambda p: gpu_model(p, nodes), self.owners.allocation,
                               self.queues.admission_of)
            warehouse.add_quotas(kube.cluster_queues.values(), now)
            warehouse.add_workloads(kube.workloads.values(), now, self.queues.workload_team,
                                    self.queues.cluster_queue_of, workloads_listed)
            await asyncio.get_running_loop().run_in_executor(self._thread, write)
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            self._health.errors[SourceTarget("warehouse", path)] += 1
            self._episodes.failed((path, "warehouse"), now, "warehouse write failed",
                                  target=path, error=self.error)
            return
        if present is not None:
            self._vanished_unchecked = False  # once, on the first full pod list
        if present_workloads is not None:
            self._vanished_workloads_unchecked = False  # and on the first Workload list
        self.error = None
        self._episodes.recovered((path, "warehouse"), now, "warehouse write recovered",
                                 target=path)
