"""``gke-gpu-exporter demo``: the whole product on a simulated cluster, no cloud needed.

The simulator serves a GKE GPU cluster on loopback; the exporter watches its Kubernetes
API and scrapes its dcgm-exporters over real HTTP, one cycle per simulated step, in
virtual time, writing the local DuckDB warehouse. At the end it prints a per-team summary
and where everything is; ``--serve`` keeps ``/metrics`` (and the cluster) up: the simulated
days then end now, and the cluster and the exporter go on in real time (``live``), so that a
Prometheus scraping the demo sees fresh series at its own cadence.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from tqdm import tqdm

from analytics.store import DuckDBStore
from analytics.week import week_containing
from analytics.weekly import ReplaysOf, run_weekly
from exporter.config import Config, load_config
from exporter.google.bigquery_emulator import PROJECT, Emulator
from exporter.runtime.app import open_exporter, serve
from exporter.runtime.lifecycle import wait_for_shutdown
from exporter.runtime.service import Exporter
from exporter.summary import summary_table
from simulator.scenario import Scenario
from simulator.server import SimulatorServer

if TYPE_CHECKING:
    from exporter.sinks.bigquery import BigQuerySink
    from simulator.billing_export import SampleBill
from exporter.sinks.schema import TABLES

KINDS = {"nodes": "Node", "pods": "Pod", "namespaces": "Namespace"}
KUEUE_KINDS = {"workloads": "Workload", "clusterqueues": "ClusterQueue",
               "localqueues": "LocalQueue"}


DEMO_ALLOCATION = {"label": "cost-center", "annotation": "billing.example.com/cost-center",
                   "name": "cost centre"}
"""How the simulated clusters' finance team allocates: a ``cost-center`` label on the pod
or its namespace, else a billing annotation on the pod."""


def demo_config(scenario: Scenario, kubeconfig: Path, out: Path,
                bigquery_endpoint: str | None = None,
                prices: dict[str, object] | None = None) -> Config:
    step = scenario.step
    bigquery = {"enabled": True, "project": PROJECT, "dataset": "gke_gpu", "anonymous": True,
                "endpoint": bigquery_endpoint, "flush_interval": 1.0} \
        if bigquery_endpoint else {}
    return load_config(None, overrides={
        "cluster": scenario.cluster, "listen_address": "127.0.0.1", "port": 0,
        "interval": step, "bottleneck_window": max(600.0, 20 * step),
        "dcgm": {"timeout": min(1.0, step / 2), "stuck_after": max(150.0, 2 * step)},
        "kubernetes": {"kubeconfig": str(kubeconfig), "watchdog": 3600.0,
                       "max_staleness": 7200.0},
        "prices": (prices or {}) | {"region": scenario.region},
        "allocation": DEMO_ALLOCATION,
        "warehouse": {"path": str(out / "warehouse.duckdb"), "interval": max(60.0, step),
                      "flush_interval": REPLAY_FLUSH_INTERVAL, "bigquery": bigquery},
    })


REPLAY_FLUSH_INTERVAL = 86400.0
"""How often the simulated days' complete intervals are written to the warehouse: a
simulated day (the rows wait in the staged files till then; the report's flush writes
the last ones). Every flush costs about the same whatever it writes, so the replay's cost
follows how many it makes, not the rows."""
LIVE_FLUSH_INTERVAL = 300.0
"""How often ``--serve``'s real-time cycles are written to the warehouse."""


PROGRESS_LINES = 10
"""Off a terminal (no progress bar), a line of progress every tenth of the run."""
BAR = "{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} h [{elapsed}<{remaining}]"


def progress_line(done: int, steps: int, step: float, elapsed: float) -> str:
    """One line of progress: the simulated day (or hour, in a run under a day) reached, of
    how many, and the seconds taken."""
    unit, name = (86400, "day") if steps * step >= 86400 else (3600, "hour")
    return (f"simulated {name} {done * step / unit:.1f} of {steps * step / unit:.3g} "
            f"({done / steps:.0%}), {elapsed:.0f} s")


class Progress:
    """Simulated time's progress: a bar on a terminal, else a line every tenth of it."""

    def __init__(self, steps: int, step: float, desc: str = "simulating") -> None:
        self.steps, self.step, self.done = steps, step, 0
        self.began = time.monotonic()
        self.terminal = sys.stderr.isatty()
        self.bar = tqdm(total=steps * step / 3600, unit="h", desc=desc, leave=False,
                        disable=not self.terminal, bar_format=BAR)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_: object) -> None:
        self.bar.close()

    @property
    def per_update(self) -> int:
        """Steps between updates: an hour's, at most a tenth of the run's."""
        return max(1, min(round(3600 / self.step), self.steps // PROGRESS_LINES))

    def advance(self, n: int) -> None:
        self.bar.update(n * self.step / 3600)
        before, self.done = self.done, self.done + n
        if not self.terminal and self.done * PROGRESS_LINES // self.steps \
                > before * PROGRESS_LINES // self.steps:
            print(progress_line(self.done, self.steps, self.step,
                                time.monotonic() - self.began), file=sys.stderr, flush=True)


async def run_steps(sim: SimulatorServer, exporter: Exporter, steps: int,
                    progress: Progress) -> None:
    """``steps`` steps of the simulator, each followed by an exporter cycle."""
    done = 0
    while done < steps:
        n = min(progress.per_update, steps - done)
        await step_both(sim, exporter, n)
        progress.advance(n)
        done += n


async def caught_up(sim: SimulatorServer, exporter: Exporter) -> None:
    """Wait until the exporter's watches have applied every change the simulator made."""
    store, kube = sim.store, exporter.kube
    kinds = KINDS | (KUEUE_KINDS if kube.kueue else {})
    while any(kube.resource_versions[k] < store.last_version(kind)  # noqa: ASYNC110
              for k, kind in kinds.items()):
        await asyncio.sleep(0.001)


async def step_both(sim: SimulatorServer, exporter: Exporter, steps: int) -> None:
    """Advance the simulator step by step, running one exporter cycle after each."""
    for _ in range(steps):
        await sim.advance(sim.cluster.step)
        await caught_up(sim, exporter)
        await exporter.cycle(sim.cluster.now)


async def run_demo(scenario: Scenario, *, duration: float, out: Path, serve_after: bool,
                   bigquery_emulator: bool = False, replays: ReplaysOf | None = None,
                   port: int = 0) -> int:
    """The demo; ``replays``: how its report replays its actions (none without it);
    ``port``: where ``serve_after`` serves /metrics (0: a free port)."""
    if serve_after:  # the simulated days end now, for the cluster to go on in real time
        scenario = ending_now(scenario, duration, time.time())
    await asyncio.to_thread(_fresh_outputs, out)
    emulator = Emulator(out / "bigquery") if bigquery_emulator else None
    if emulator is not None:
        await asyncio.to_thread(emulator.start)
    try:
        return await _run(scenario, duration, out, serve_after, emulator, replays, port)
    finally:
        if emulator is not None:
            await asyncio.to_thread(emulator.stop)


async def _run(scenario: Scenario, duration: float, out: Path, serve_after: bool,
               emulator: Emulator | None, replays: ReplaysOf | None, port: int) -> int:
    async with SimulatorServer(scenario) as sim:
        outputs = sim.write_outputs(out)
        cfg = demo_config(scenario, outputs.kubeconfig, out,
                          emulator.url if emulator is not None else None)
        async with open_exporter(cfg) as exporter:
            began = time.monotonic()
            async with asyncio.timeout(30):
                await exporter.kube.wait_synced()
            await exporter.cycle(sim.cluster.now)
            step = sim.cluster.step
            steps = round(duration / step)
            with Progress(steps, step) as progress:
                await run_steps(sim, exporter, steps, progress)
            elapsed = time.monotonic() - began
            (out / "metrics.prom").write_bytes(exporter.metrics.text)
            print(f"Simulated {duration / 86400:g} days of cluster '{scenario.cluster}' in "
                  f"{elapsed:.0f} s: {exporter.cycles} exporter cycles over HTTP, "
                  f"{len(exporter.states)} GPUs and MIG slices, "
                  f"{len(exporter.totals.pod_seconds)} GPU pods.")
            print()
            print(summary_table(exporter, week_containing(scenario.start)))
            print()
            report = await asyncio.to_thread(write_report, exporter, scenario, out, replays)
            _, bill = await asyncio.to_thread(write_sample_bill, sim, exporter, out)
            print(f"Outputs in {out}/: warehouse.duckdb ({', '.join(written(exporter))}), "
                  "metrics.prom, kubeconfig, targets.txt")
            print(report)
            print(bill)
            if emulator is not None and exporter.bigquery is not None:
                print()
                print(await asyncio.to_thread(bigquery_summary, exporter, exporter.bigquery,
                                              emulator))
            if serve_after:
                await catch_up(sim, exporter, time.time())
                if exporter.warehouse is not None:
                    exporter.warehouse.flush_interval = LIVE_FLUSH_INTERVAL
                    await asyncio.to_thread(exporter.warehouse.flush, exporter.last_cycle_time)
                runner, port = await serve(exporter, "127.0.0.1", port)
                sim.speed = 1.0
                config = write_prometheus_config(out, port)
                print(f"Serving http://127.0.0.1:{port}/metrics (a cycle every "
                      f"{SERVE_INTERVAL:g} s, in real time) and the cluster at {sim.api_url} "
                      f"(kubectl --kubeconfig {outputs.kubeconfig} get pods -A); "
                      "Ctrl-C to stop.", flush=True)
                print(f"A Prometheus scraping it, with the shipped rules: prometheus "
                      f"--config.file={config} --storage.tsdb.path={out / 'prometheus'} "
                      "--web.listen-address=127.0.0.1:9090 (Grafana: "
                      "dashboards/datasource.yaml and dashboards/provisioning.yaml)",
                      flush=True)
                try:
                    await live(sim, exporter, wait_for_shutdown())
                finally:
                    await runner.cleanup()
    return 0


RULES = Path(__file__).resolve().parent.parent / "alerts" / "rules.yaml"
"""The shipped recording and alerting rules, where the product runs from its source."""


def write_prometheus_config(out: Path, port: int, scrape_seconds: int = 15) -> Path:
    """``out/prometheus.yml``: a Prometheus scraping the demo's /metrics at ``port`` every
    ``scrape_seconds``, with the shipped rules where they are at hand (a source checkout;
    an installed wheel has none)."""
    config: dict[str, object] = {
        "global": {"scrape_interval": f"{scrape_seconds}s",
                   "evaluation_interval": f"{scrape_seconds}s"},
        "scrape_configs": [{"job_name": "gke-gpu-exporter",
                            "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]}
    if RULES.is_file():
        config = {"rule_files": [str(RULES)], **config}
    path = out / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _fresh_outputs(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "warehouse.duckdb").unlink(missing_ok=True)
    (out / "billing_export.parquet").unlink(missing_ok=True)
    shutil.rmtree(out / "bigquery", ignore_errors=True)
    shutil.rmtree(out / "report", ignore_errors=True)
    shutil.rmtree(out / "email", ignore_errors=True)


def written(exporter: Exporter) -> list[str]:
    """The warehouse tables the run wrote rows to."""
    wh = exporter.warehouse
    assert wh is not None
    return [t.name for t in TABLES
            if wh.con.execute(f"SELECT count(*) FROM {t.name}").fetchone() != (0,)]


def write_report(exporter: Exporter, scenario: Scenario, out: Path,
                 replays: ReplaysOf | None = None) -> str:
    """The weekly report of the simulated week (the week the simulation starts in), its
    actions replayed with ``replays``, and its email as it would be sent (``email/``)."""
    wh = exporter.warehouse
    assert wh is not None
    wh.flush(exporter.last_cycle_time, partial=True)
    wh.checkpoint()  # the replay's one checkpoint: it wrote a week in less than its interval
    week = week_containing(scenario.start)
    store = DuckDBStore(con=wh.con)
    report, _ = run_weekly(store, week, exporter.config, exporter.prices, out / "report",
                           email=False, force=True,  # however short the run
                           replays=replays(store, week, exporter.config) if replays else None,
                           preview=out / "email")
    h = report.headline
    covered, least = h.get("coverage") or 0.0, exporter.config.report.min_coverage
    partial = f" of {covered:.0%} of the week (below report.min_coverage, {least:.0%}: " \
        "written for the demo; report weekly would refuse it)" if covered < least else ""
    return (f"Weekly report {week.label}{partial}: ${h['cost_usd'] or 0:,.2f}, "
            f"{len(report.tables['bottlenecks'])} workloads diagnosed -> "
            f"{out}/report/report.html (and report.md, report.json, a CSV per table, "
            f"teams/ for each team's slice); its email: {out}/email/email.html "
            "(and email.eml, as it would be sent)")


def write_sample_bill(sim: SimulatorServer, exporter: Exporter,
                      out: Path) -> tuple[SampleBill, str]:
    """A sample Cloud Billing detailed export of the run, from the simulator's truth and
    the price book, written to ``out``; and how to reconcile with it."""
    from exporter.model.prices import load_price_book
    from simulator import billing_export

    c, cfg = sim.cluster, exporter.config
    c.close()
    book = load_price_book(cfg.prices.book, cfg.prices.region)
    bill = billing_export.sample_bill(c.truth, sim.scenario, book.prices, c.start, c.now)
    path = billing_export.write(bill, out / billing_export.FILE)
    week = week_containing(sim.scenario.start)
    return bill, (f"Sample bill: {path} ({bill.table.num_rows:,} GPU lines of a detailed billing "
            f"export) -> gke-gpu-exporter report reconcile --billing-file {path} "
            f"--store duckdb:{out}/warehouse.duckdb --week {week.label}")


def bigquery_summary(exporter: Exporter, sink: BigQuerySink, emulator: Emulator) -> str:
    """Send what is left, then compare each BigQuery table with its DuckDB twin."""
    from exporter.sinks.bigquery import make_client

    wh = exporter.warehouse
    assert wh is not None
    wh.flush(exporter.last_cycle_time, partial=True)
    while not sink.drain():
        time.sleep(0.5)
    client = make_client(sink.cfg)
    lines = [f"BigQuery (the local emulator at {emulator.url}, dataset {sink.dataset_ref}):"]
    for table in TABLES:
        local = wh.con.execute(f"SELECT count(*) FROM {table.name}").fetchone()
        remote = next(iter(client.query_and_wait(
            f"SELECT count(*) AS n FROM `{sink.ref(table.name)}` "
            f"WHERE {table.partition_by} IS NOT NULL")))
        n_local = local[0] if local else 0
        same = "same as DuckDB" if remote["n"] == n_local else f"DuckDB has {n_local}"
        lines.append(f"  {table.name:<20} {remote['n']:>9,} rows  {same}")
    client.close()  # type: ignore[no-untyped-call]
    return "\n".join(lines)


SERVE_INTERVAL = 5.0
"""The exporter's cycle while ``--serve`` runs: shorter than any scrape interval Prometheus
is set to (15 s, 30 s, its default 1 m) and a divisor of each, so that every scrape sees a
new cycle and the counters move by as many cycles between any two scrapes."""


def ending_now(scenario: Scenario, duration: float, now: float) -> Scenario:
    """``scenario`` moved in time so that its first ``duration`` ends at ``now`` (the step
    before it): then virtual time can go on as wall time."""
    step = scenario.step
    end = now - now % step
    start = end - round(duration / step) * step
    return scenario.model_copy(update={"start": datetime.fromtimestamp(start, UTC)})


async def catch_up(sim: SimulatorServer, exporter: Exporter, now: float) -> None:
    """Advance the simulator to the last step before ``now`` and run a cycle at ``now``."""
    behind = now - sim.cluster.now
    if behind >= sim.cluster.step:
        await sim.advance(behind - behind % sim.cluster.step)
    await caught_up(sim, exporter)
    await exporter.cycle(now)


async def live(sim: SimulatorServer, exporter: Exporter, until: Awaitable[None], *,
               interval: float = SERVE_INTERVAL, clock: Callable[[], float] = time.time
               ) -> None:
    """The cluster and the exporter in real time until ``until`` is done: a cycle at each
    multiple of ``interval`` on ``clock``, stamped with its time, after the simulator has
    taken every step the clock has passed. Stamped so, the sources' last answers are as old
    as they really are (``GkeGpuExporterSourceStale`` measures ``time()`` against them)."""
    done = asyncio.ensure_future(until)
    try:
        while not done.done():
            await asyncio.wait([done], timeout=interval - clock() % interval)
            if not done.done():
                await catch_up(sim, exporter, clock())
    finally:
        done.cancel()
