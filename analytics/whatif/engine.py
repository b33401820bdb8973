"""The replay engine: a scenario played by the simulator's cluster alone, in event time,
and measured by the report's own queries.

The full replay (``exporter.whatif.replay``) serves the simulated cluster over HTTP and
has the exporter watch and scrape it, a cycle a step. The engine keeps the cluster (the
same scheduler, placement, Kueue, autoscaler, faults, Spot reclaims, MIG and
time-sharing) and drops the rest:

- the cluster runs headless (no API objects, no Events) and steps only to the times
  something can change (``Cluster.advance_to``), at ``RESOLUTION`` seconds: waits of less
  than a step of the measured week are measured;
- its account of what happened (``simulator.truth``) is written as the warehouse's tables
  (``analytics.whatif.truth_rows``), Arrow tables an in-memory DuckDB queries in place
  (``analytics.store.ArrowStore``);
- ``analytics.whatif.measure`` reads them as it reads the measured week's warehouse.

So a replay's cost, waits, causes, stranded GPUs and availability keep the measured
week's definitions. ``tests/test_whatif_end_to_end.py`` holds the engine to the full
replay, ``tests/simulator/test_clock.py`` the event-time steps to every step.
"""

from __future__ import annotations

import contextlib
import gc
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from analytics.store import ArrowStore
from analytics.week import Week
from analytics.whatif import parts, truth_rows
from analytics.whatif.measure import Measured, measure
from analytics.whatif.scenario import pod_workloads
from analytics.whatif.trace import Job
from exporter.config import Prices
from exporter.model.prices import Commitment, PriceBook, effective_prices, load_price_book
from simulator.cluster import Cluster
from simulator.scenario import Scenario

RESOLUTION = 1.0
"""Seconds of the engine's clock: a replay's times are whole seconds."""

MEMORY_LIMIT = "2GB"
"""What DuckDB may use for the queries over a replay's tables (held by Arrow, outside it)."""
THREADS = 1
"""DuckDB's threads for those queries: one reads a replay's tables for less CPU than
several, which mostly wait on each other."""


@dataclass(frozen=True, slots=True)
class Played:
    """A scenario played and measured."""

    measured: Measured
    seconds: float
    """CPU seconds it took, measuring included."""
    steps: int
    """Steps the cluster took (of the ``RESOLUTION``-second steps of the window)."""
    store: ArrowStore
    """Its warehouse (in memory): what ``measured`` was read from."""


@dataclass(frozen=True, slots=True)
class Pricing:
    """What a replay's GPUs cost: the price book of the region and what finance agreed."""

    book: PriceBook
    prices: Prices

    @classmethod
    def load(cls, prices: Prices, region: str) -> Pricing:
        return cls(load_price_book(prices.book, region), prices)

    def pools(self, scenario: Scenario) -> dict[str, float | None]:
        """Each pool's price of one of its GPUs an hour, after negotiated prices,
        commitments (for the on-demand GPUs the layout starts with) and the pool's
        discount; None where the book has no price."""
        on_demand: dict[str, float] = {}
        for p in scenario.pools:
            if not p.spot:
                on_demand[p.accelerator] = on_demand.get(p.accelerator, 0.0) + \
                    p.nodes * p.gpus_per_node
        agreed = self.prices
        listed = effective_prices(self.book.prices, on_demand,
                                  [Commitment(c.gpu, c.gpus, c.usd_per_gpu_hour)
                                   for c in agreed.commitments], agreed.negotiated)
        out: dict[str, float | None] = {}
        for p in scenario.pools:
            price = listed.get((p.accelerator, "spot" if p.spot else "on-demand"))
            out[p.name] = None if price is None else \
                price * (1.0 - agreed.discounts.get(p.name, agreed.default_discount))
        return out


def utilizations(jobs: Sequence[Job]) -> dict[str, float]:
    """Each job's measured utilisation by the name its pods carry (``workload``)."""
    return {name: j.utilization for j in jobs if j.utilization is not None
            for name in pod_workloads(j)}


def play(scenario: Scenario, week: Week, pricing: Pricing,
         utilization: Mapping[str, float], whole: bool = False) -> Played:
    """``scenario`` (at ``RESOLUTION`` s steps) over ``week``, measured: its parts
    (``analytics.whatif.parts``) played alone, or, ``whole``, the cluster at once. The
    ``Played.store`` is the caller's to close."""
    return Engine(pricing, utilization, whole).play(scenario, week)


class Engine:
    """Plays scenarios of one week's jobs part by part, and keeps each part's tables: a
    part of a later scenario that is the same (the same pools, workloads, jobs, faults
    and settings) is not played again. The tables of the parts are put together and
    measured in one in-memory warehouse, reused from play to play."""

    def __init__(self, pricing: Pricing, utilization: Mapping[str, float],
                 whole: bool = False) -> None:
        self._pricing, self._utilization, self._whole = pricing, utilization, whole
        self._parts: dict[str, tuple[dict[str, pa.Table], int]] = {}
        self._store: ArrowStore | None = None

    def play(self, scenario: Scenario, week: Week) -> Played:
        """``scenario`` over ``week``, measured. Its ``Played.store`` holds the tables
        until the next play."""
        began = time.process_time()
        window = truth_rows.Window(week.start.timestamp(), week.end.timestamp())
        split = [scenario] if self._whole else parts.split(scenario)
        prices = self._pricing.pools(scenario)  # the cluster's: commitments span its pools
        played = [self._part(p, window, prices) for p in split]
        tables = merged([t for t, _ in played])
        if self._store is None:
            self._store = ArrowStore(tables, MEMORY_LIMIT, THREADS)
        else:
            self._store.hold(tables)
        measured = measure(self._store, week, scenario.cluster)
        return Played(measured, time.process_time() - began, sum(n for _, n in played),
                      self._store)

    def _part(self, scenario: Scenario, window: truth_rows.Window,
              prices: Mapping[str, float | None]) -> tuple[dict[str, pa.Table], int]:
        """A part's tables and the steps it took to play (0: played before). ``prices``:
        each pool's, of the whole cluster (a commitment's GPUs are shared by the pools of
        its model, whatever part they are in)."""
        mine = {p.name: prices.get(p.name) for p in scenario.pools}
        key = json.dumps([window.start, window.end, sorted(mine.items())]) + \
            scenario.model_dump_json()
        held = self._parts.get(key)
        if held is not None:
            return held[0], 0
        with _collector_paused():
            cluster = Cluster(scenario, headless=True)
            steps = cluster.advance_to(window.end)
            cluster.close()
            tables = warehouse(cluster, window, mine, self._utilization)
        self._parts[key] = tables, steps
        return tables, steps

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def warehouse(cluster: Cluster, window: truth_rows.Window,
              prices: Mapping[str, float | None], utilization: Mapping[str, float]
              ) -> dict[str, pa.Table]:
    """The cluster's truth over ``window`` as the warehouse's tables."""
    truth, scenario = cluster.truth, cluster.scenario
    finished = {uid: w.finished_at for uid, w in cluster.kueue.workloads.items()
                if w.finished_at is not None} if cluster.kueue is not None else {}
    columns = {
        "gpu_usage": truth_rows.usage(truth, scenario, window, prices, utilization),
        "gpu_pods": truth_rows.pods(truth, window),
        "kueue_workloads": truth_rows.workloads(truth, finished, window),
        "gpu_pending": truth_rows.pending(truth, scenario, window),
        "gpu_free": truth_rows.free(truth, scenario, window, prices),
        "availability_events": truth_rows.incidents(truth, window),
    }
    return {name: truth_rows.arrow(name, cols, scenario.cluster)
            for name, cols in columns.items()}


POD_UIDS = {"gpu_usage": "pod_uid", "gpu_pods": "pod_uid", "gpu_pending": "uid"}
"""The columns that hold a pod's uid: each part numbers its pods from 0, so a uid is the
part's own."""


def merged(played: Sequence[Mapping[str, pa.Table]]) -> dict[str, pa.Table]:
    """The parts' tables as one warehouse's: each table's rows of every part, the pods'
    uids of each part after the first marked with its number, the row ids renumbered."""
    if len(played) == 1:
        return dict(played[0])
    out = {}
    for name in played[0]:
        table = pa.concat_tables([_marked(p[name], name, i) for i, p in enumerate(played)])
        at = table.schema.get_field_index("id")
        out[name] = table.set_column(at, table.schema.field(at),
                                     truth_rows.row_ids(name, len(table)))
    return out


def _marked(table: pa.Table, name: str, part: int) -> pa.Table:
    column = POD_UIDS.get(name)
    if column is None or part == 0:
        return table
    at = table.schema.get_field_index(column)
    return table.set_column(at, table.schema.field(at), pc.binary_join_element_wise(
        table[column], pa.scalar(f"-part{part}"), ""))
