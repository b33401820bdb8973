"""Wiring: build the exporter from its configuration, serve it, run it.

``open_exporter`` owns every client (HTTP session, Kubernetes API client, DuckDB file) and
closes them; ``run`` is the service: a cycle every interval, ``/metrics``, ``/healthz``,
``/readyz`` (503 with the reason until every kind the figures need is listed and a cycle
ran on them, while the API forbids one or Kueue's discovery fails, and while the
Kubernetes view is older than ``kubernetes.max_staleness``), and on SIGTERM
or SIGINT the cycle in flight is finished, the warehouse flushed, and the process exits 0
(past ``shutdown_timeout`` from the signal, whatever is left is dropped with a warning).
A start-up failure (credentials, listening socket, a warehouse file another process holds)
is a ``StartupError`` naming the setting; a warehouse file that cannot be opened (damaged, a
full disk) leaves the service running without history, trying it again
(``runtime.recording.WarehouseOpening``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
import duckdb
from aiohttp import web

from exporter.config import Config
from exporter.errors import ConfigError, StartupError
from exporter.google.monitoring import metric_client
from exporter.logs import ctx
from exporter.metrics.health import CloudMonitoringStats, RemoteWriteStats
from exporter.model.prices import load_price_book
from exporter.runtime.lifecycle import stop_signal
from exporter.runtime.memory import MemoryTuning, glibc
from exporter.runtime.preflight import listen_error
from exporter.runtime.recording import WAREHOUSE_RETRY_SECONDS, WarehouseOpening
from exporter.runtime.scheduled_report import Schedule, ScheduledReport
from exporter.runtime.service import DCGM_FIELDS_READ, Exporter
from exporter.sinks import Push
from exporter.sinks.cloud_monitoring import CloudMonitoringWriter
from exporter.sinks.prometheus import MetricsEndpoint
from exporter.sinks.warehouse import Warehouse
from exporter.sources import ReadingSource
from exporter.sources.cloud_monitoring import CloudMonitoringSource
from exporter.sources.dcgm import DcgmSource, Discovery
from exporter.sources.kube import KubeSource
from exporter.sources.kube_client import (
    KubeClient,
    load_incluster,
    load_kubeconfig,
)
from exporter.sources.prometheus_api import PrometheusApiSource

if TYPE_CHECKING:
    from google.cloud.monitoring_v3 import MetricServiceAsyncClient

log = logging.getLogger(__name__)
_TEXT = "text/plain; version=0.0.4; charset=utf-8"
BIGQUERY_SHUTDOWN_SECONDS = 5.0


@dataclass(slots=True)
class Shutdown:
    """The time the stop leaves (``shutdown_timeout``, from the stop signal): the cycle in
    flight, the final flush and BigQuery's last send must end within it, else the process
    exits anyway, with a warning."""

    seconds: float
    deadline: float | None = None
    """Event-loop time it ends; None until the stop begins."""

    def begin(self) -> None:
        if self.deadline is None:
            self.deadline = asyncio.get_running_loop().time() + self.seconds

    def left(self) -> float:
        self.begin()
        assert self.deadline is not None
        return max(0.0, self.deadline - asyncio.get_running_loop().time())

    def left_out(self, step: str) -> bool:
        """Log that ``step`` had no time left; False."""
        log.warning("shutdown timeout", extra=ctx(step=step,
                                                  shutdown_timeout_seconds=self.seconds))
        return False

    async def within(self, step: str, work: Awaitable[object]) -> bool:
        """Await ``work`` until the deadline; past it, log that ``step`` was left."""
        try:
            async with asyncio.timeout(self.left()):
                await work
            return True
        except TimeoutError:
            return self.left_out(step)


async def _in_daemon_thread(fn: Callable[..., object], *args: object) -> None:
    """``fn(*args)`` in a thread the process does not wait for at exit (one left past the
    shutdown deadline must not hold the exit; what it wrote holds as at a SIGKILL)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def finish(exc: BaseException | None) -> None:
        if not done.done():
            done.set_result(None) if exc is None else done.set_exception(exc)

    def work() -> None:
        try:
            fn(*args)
        except BaseException as exc:  # handed to the awaiting task
            error: BaseException | None = exc
        else:
            error = None
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
            loop.call_soon_threadsafe(finish, error)

    threading.Thread(target=work, name=f"{LEFT_AT_EXIT}{getattr(fn, '__name__', '')}",
                     daemon=True).start()
    await done


LEFT_AT_EXIT = "shutdown:"
"""Name prefix of the threads ``_in_daemon_thread`` starts."""


def left_running() -> bool:
    """Whether shutdown work left past its deadline still runs. It may be inside DuckDB, so
    the process must then end without the interpreter's teardown (``os._exit``), which would
    abort under it."""
    return any(t.name.startswith(LEFT_AT_EXIT) and t.is_alive() for t in threading.enumerate())


async def _cycle(exporter: Exporter, now: float, stop: asyncio.Future[Any],
                 shutdown: Shutdown) -> None:
    """One cycle; a stop during it leaves it until the shutdown deadline to end."""
    cycle = asyncio.create_task(exporter.cycle(now))
    await asyncio.wait([cycle, stop], return_when=asyncio.FIRST_COMPLETED)
    if not cycle.done() and not await shutdown.within("cycle", asyncio.shield(cycle)):
        cycle.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await cycle
        return
    cycle.result()


async def _kube_client(cfg: Config) -> KubeClient:
    k = cfg.kubernetes
    try:
        if k.in_cluster:
            return load_incluster()
        return await load_kubeconfig(k.kubeconfig)
    except Exception as exc:  # KubeConfigError, or anything a malformed entry raises
        setting = "kubernetes.in_cluster" if k.in_cluster else "kubernetes.kubeconfig"
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise StartupError(setting, f"cannot load the Kubernetes credentials ({why}): fix "
                           "the kubeconfig's user (its exec plugin's login) or the "
                           "service account") from exc


def _open_warehouse(cfg: Config) -> tuple[Warehouse | None, WarehouseOpening | None]:
    """The warehouse the config asks for, or, when the file cannot be opened (damaged, a
    full disk), what tries again while the service runs without it. A file another
    process holds is a start-up error."""
    if not cfg.warehouse.enabled:
        return None, None
    try:
        return _warehouse(cfg), None
    except StartupError as exc:  # not WarehouseLocked: another process has it
        error = " ".join(str(exc).split())
        log.error("warehouse unavailable", extra=ctx(
            target=str(cfg.warehouse.path), error=error,
            retry_seconds=WAREHOUSE_RETRY_SECONDS))
        return None, WarehouseOpening(functools.partial(_warehouse, cfg),
                                      str(cfg.warehouse.path), error)


async def _final_flush(warehouse: Warehouse, now: float, shutdown: Shutdown) -> bool:
    """Flush the warehouse at the stop, within ``shutdown``; whether it ended (a flush that
    fails ends too: what it did not write stays staged for the next run, and the stop goes
    on)."""
    if shutdown.left() <= 0:
        return shutdown.left_out("final flush")
    try:
        return await shutdown.within("final flush", _in_daemon_thread(warehouse.flush, now))
    except Exception as exc:
        log.warning("final flush failed", extra=ctx(
            target=str(warehouse.path), error=" ".join(f"{type(exc).__name__}: {exc}".split())))
        return True


def _warehouse(cfg: Config) -> Warehouse:
    w = cfg.warehouse
    try:
        return Warehouse(w.path, cfg.cluster, w.interval, w.flush_interval,
                         outbox=w.bigquery.enabled, raw_retention=w.retention.raw,
                         retention=w.retention.keep)
    except (duckdb.Error, OSError) as exc:
        why = " ".join(str(exc).split())
        error = StartupError("warehouse.path", f"cannot open {w.path} ({why}): point it at "
                             "a DuckDB file in a writable directory")
    gc.collect()  # the connection a half-opened file left: closed once collected
    raise error


@dataclass(slots=True)
class _Pushes:
    """The push sinks the config asks for, their own figures, and the Cloud Monitoring
    client (for the caller to close)."""

    sinks: list[Push]
    remote_write: RemoteWriteStats | None = None
    cloud_monitoring: CloudMonitoringStats | None = None
    client: MetricServiceAsyncClient | None = None


def _pushes(cfg: Config, session: aiohttp.ClientSession) -> _Pushes:
    out = _Pushes([])
    if cfg.remote_write.url:
        from exporter.sinks.remote_write import RemoteWriter  # protobuf: only when used

        writer = RemoteWriter(session, cfg.remote_write.url, cfg.remote_write.queue_size,
                              cfg.remote_write.timeout)
        out.remote_write = writer.stats
        out.sinks.append(writer)
    gcm = cfg.cloud_monitoring
    if gcm.enabled:
        out.client = metric_client(gcm.endpoint, gcm.anonymous)
        gcm_writer = CloudMonitoringWriter(
            out.client, gcm.project or "", gcm.location or "", cfg.cluster, gcm.families,
            started=time.time(), interval=gcm.interval, batch_size=gcm.batch_size,
            requests_per_second=gcm.requests_per_second, timeout=gcm.timeout)
        out.cloud_monitoring = gcm_writer.stats
        out.sinks.append(gcm_writer)
    return out


@contextlib.asynccontextmanager
async def open_exporter(cfg: Config, shutdown: Shutdown | None = None
                        ) -> AsyncIterator[Exporter]:
    """The service with every source and sink the config asks for, wired here and nowhere
    else: the Kubernetes watches, one reading source, the warehouse and BigQuery,
    ``/metrics`` and the push sinks; started on entry, stopped and flushed (within
    ``shutdown``) on exit."""
    memory = MemoryTuning(glibc())
    memory.tune_allocator()
    prices = load_price_book(cfg.prices.book, cfg.prices.region)
    api = await _kube_client(cfg)
    # connections outlive the interval, so each cycle reuses them instead of reconnecting
    connector = aiohttp.TCPConnector(limit=4096, limit_per_host=4, ttl_dns_cache=300,
                                     keepalive_timeout=cfg.interval * 2 + 5)
    # compressing text on loopback costs both ends; each source bounds its own requests
    # in time, so the session keeps no timer per request
    session = aiohttp.ClientSession(
        connector=connector, read_bufsize=1 << 20, cookie_jar=aiohttp.DummyCookieJar(),
        headers={"Accept-Encoding": "identity"}, timeout=aiohttp.ClientTimeout())
    bq_cfg = cfg.warehouse.bigquery
    try:
        warehouse, opening = _open_warehouse(cfg)
    except ConfigError:
        await session.close()
        await api.close()
        raise
    bigquery = None
    if warehouse is not None and bq_cfg.enabled:
        from exporter.sinks.bigquery import BigQuerySink  # a heavy import: only when used

        bigquery = BigQuerySink(bq_cfg, warehouse.open_outbox())
    kube = KubeSource(api, watch_timeout=cfg.kubernetes.watch_timeout,
                      watchdog=cfg.kubernetes.watchdog,
                      request_timeout=cfg.kubernetes.request_timeout,
                      annotations=[a for a in (cfg.allocation.annotation,) if a])
    dcgm: ReadingSource = DcgmSource(
        cfg.dcgm.timeout, cfg.dcgm.max_body_bytes, cfg.dcgm.max_devices_per_target,
        read=DCGM_FIELDS_READ, keepalive_seconds=cfg.interval * 2 + 5,
        static_targets=cfg.dcgm.targets, discovery=Discovery(**cfg.dcgm.discovery.model_dump()))
    if cfg.dcgm.prometheus.url:
        dcgm = PrometheusApiSource(session, cfg.dcgm.prometheus.url, DCGM_FIELDS_READ,
                                   cfg.dcgm.prometheus.selector, cfg.dcgm.timeout,
                                   cfg.dcgm.discovery.namespace)
    cm = cfg.dcgm.cloud_monitoring
    monitoring = None
    if cm.project:
        monitoring = metric_client(cm.endpoint, cm.anonymous)
        dcgm = CloudMonitoringSource(
            monitoring, cm.project, cm.cluster or cfg.cluster, DCGM_FIELDS_READ,
            cfg.dcgm.timeout, cm.lookback, cm.location, cm.fallback_system_metrics,
            cfg.dcgm.discovery.namespace)
    pushes = _pushes(cfg, session)
    exporter = Exporter(cfg, prices, kube, dcgm, MetricsEndpoint(), pushes.sinks, warehouse,
                        bigquery, remote_write=pushes.remote_write,
                        cloud_monitoring=pushes.cloud_monitoring, warehouse_opening=opening,
                        memory=memory, carbon=cfg.carbon.in_force())
    if opening is not None and bq_cfg.enabled:
        def send(opened: Warehouse) -> None:  # the outbox's rows go once it opens
            from exporter.sinks.bigquery import BigQuerySink

            exporter.bigquery = BigQuerySink(bq_cfg, opened.open_outbox())
            exporter.bigquery.start()

        opening.opened = send
    sending = [asyncio.create_task(push.run()) for push in pushes.sinks]
    catalog = None
    if cfg.prices.catalog.enabled:
        from exporter.sources.billing_catalog import CatalogRefresh, catalog_client

        pc = cfg.prices.catalog
        catalog = catalog_client(pc.endpoint, pc.anonymous)
        refresh = CatalogRefresh(catalog, cfg.prices.region, pc.refresh, pc.timeout)
        exporter.pricing.feed = refresh  # each cycle takes its latest prices
        sending.append(asyncio.create_task(refresh.run()))
    memory.tune_collector()
    kube.start()
    if bigquery is not None:
        bigquery.start()
    try:
        yield exporter
    finally:
        for task in sending:
            task.cancel()
        shutdown = shutdown or Shutdown(cfg.shutdown_timeout)
        shutdown.begin()
        await kube.stop()
        flushed = True
        warehouse, bigquery = exporter.warehouse, exporter.bigquery  # opened late, maybe
        if warehouse is not None:  # unfinished intervals stay staged
            flushed = await _final_flush(warehouse, exporter.last_cycle_time, shutdown)
        if bigquery is not None:  # a last send; what misses it stays spooled
            if flushed:
                await shutdown.within("bigquery", _in_daemon_thread(
                    bigquery.stop, min(BIGQUERY_SHUTDOWN_SECONDS, shutdown.left())))
            else:
                bigquery.stop(0)
        exporter.close()
        dcgm.close()
        memory.close()
        if warehouse is not None and flushed:
            warehouse.close()
        await session.close()
        await api.close()
        for client in (monitoring, pushes.client, catalog):
            if client is not None:
                await client.transport.close()  # type: ignore[no-untyped-call]


def http_app(exporter: Exporter) -> web.Application:
    endpoint = exporter.metrics

    async def metrics(request: web.Request) -> web.StreamResponse:
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            return web.Response(body=endpoint.gzip, headers={
                "Content-Type": _TEXT, "Content-Encoding": "gzip", "Vary": "Accept-Encoding"})
        exposition = endpoint.parts  # the cycle's, even if another begins meanwhile
        response = web.StreamResponse(headers={"Content-Type": _TEXT,
                                               "Vary": "Accept-Encoding"})
        response.content_length = exposition.size
        await response.prepare(request)
        if request.method != "HEAD":
            for chunk in exposition.chunks():
                await response.write(chunk)
        await response.write_eof()
        return response

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        reasons = exporter.unready()
        if not reasons:
            return web.Response(text="ready\n")
        return web.Response(status=503, text=reasons[0] + "\n")

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics), web.get("/healthz", healthz),
                    web.get("/readyz", readyz)])
    return app


async def serve(exporter: Exporter, host: str, port: int) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(http_app(exporter), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:  # gaierror included
        await runner.cleanup()
        raise listen_error(host, port, exc) from exc
    return runner, runner.addresses[0][1]


def scheduled_report(cfg: Config, warehouse: Warehouse | None,
                     config_file: str | None) -> ScheduledReport | None:
    """The weekly report the service makes itself, when ``report.schedule`` is set."""
    r = cfg.report
    if r.schedule is None or warehouse is None:
        return None
    return ScheduledReport(
        warehouse, Schedule.parse(r.schedule, r.timezone),
        r.directory or cfg.warehouse.path.parent / "reports", config_file,
        email=bool(r.platform_recipients or any(r.team_recipients.values())),
        timeout=r.timeout)


async def run(cfg: Config, config_file: str | None = None) -> int:
    """The service, until SIGTERM or SIGINT. A stop before the first cycle (the warehouse
    opening, the first Kubernetes sync) ends the start-up at once, with one log line."""
    with stop_signal() as stop:
        started = asyncio.Event()
        service = asyncio.create_task(_service(cfg, config_file, stop, started))
        ready = asyncio.create_task(started.wait())
        try:
            first: list[asyncio.Future[Any]] = [service, ready, stop]
            await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if stop.done() and not started.is_set() and not service.done():
            service.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await service
            log.info("stopped", extra=ctx(signal=stop.result(), during="start-up"))
            return 0
        return await service


async def _service(cfg: Config, config_file: str | None, stop: asyncio.Future[str],
                   started: asyncio.Event) -> int:
    shutdown = Shutdown(cfg.shutdown_timeout)
    async with open_exporter(cfg, shutdown) as exporter:
        report = scheduled_report(cfg, exporter.warehouse, config_file)
        exporter.report = report.stats if report is not None else None
        runner, port = await serve(exporter, cfg.listen_address, cfg.port)
        log.info("serving", extra=ctx(address=cfg.listen_address, port=port,
                                      interval_seconds=cfg.interval))
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(cfg.kubernetes.request_timeout):
                    await exporter.kube.wait_synced()
            started.set()
            while not stop.done():
                began = time.monotonic()
                try:
                    await _cycle(exporter, time.time(), stop, shutdown)
                    if report is None and exporter.warehouse is not None:  # opened late
                        report = scheduled_report(cfg, exporter.warehouse, config_file)
                        exporter.report = report.stats if report is not None else None
                    if report is not None:
                        report.maybe_run(time.time())
                except Exception:  # a bug in one cycle must not end the service
                    log.exception("cycle failed")
                wait = max(0.0, cfg.interval - (time.monotonic() - began))
                await asyncio.wait([stop], timeout=wait)
        finally:
            shutdown.begin()
            if report is not None:
                await report.stop()
            await runner.cleanup()
    log.info("stopped", extra=ctx(signal=stop.result() if stop.done() else None))
    return 0
