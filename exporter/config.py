"""Exporter configuration: a YAML file, every field overridable from the environment.

Environment variables are ``GKE_GPU_EXPORTER_<FIELD>``, nested with ``__``: for example
``GKE_GPU_EXPORTER_INTERVAL=15s`` or ``GKE_GPU_EXPORTER_DCGM__TIMEOUT=5s``. The environment
wins over the file. Everything is validated once at start-up (``--check-config``), and every
mistake found is reported at once, one line each: a variable with the prefix that names no
setting (with the nearest that does), each setting's own errors, and the errors between
settings (those of the settings that are valid themselves).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import typing
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, Self
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from exporter.errors import ConfigError
from exporter.files import Unreadable, not_utf8_text, read_yaml
from exporter.logs import LogLevel
from exporter.metrics.families import BY_NAME, CLOUD_MONITORING_DEFAULT, CLOUD_MONITORING_KINDS
from exporter.model import energy
from exporter.model.catalog import GPU_MODELS, MACHINE_FAMILIES
from exporter.model.durations import Duration

ENV_PREFIX = "GKE_GPU_EXPORTER_"
OTHER_VARIABLES = frozenset({"GKE_GPU_EXPORTER_LOG_FORMAT"})
"""Variables with the prefix that are not settings: the log format is chosen before the
configuration is read."""


def _raise_all(problems: list[str]) -> None:
    """Every problem a validator found, one line each (``load_config`` splits them)."""
    if problems:
        raise ValueError("\n".join(problems))


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DcgmDiscovery(_Section):
    """Find dcgm-exporter pods through the Kubernetes API (GKE's managed one by default)."""

    namespace: str = "gke-managed-system"
    """The namespace of the dcgm-exporter pods."""
    label_selector: str = "app.kubernetes.io/name=gke-managed-dcgm-exporter"
    """The label selector of the dcgm-exporter pods."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """Port to scrape; default: the pod's container port named ``metrics``, else 9400."""
    path: str = "/metrics"
    """The path of their metrics."""


class DcgmPrometheus(_Section):
    """Read DCGM from a Prometheus HTTP API instead of scraping dcgm-exporter: a cluster
    Prometheus, or Google Managed Prometheus' endpoint (through its frontend)."""

    url: str | None = None
    """e.g. http://prometheus.monitoring:9090, or the GMP frontend's URL."""
    selector: str = ""
    """Extra label matchers for the query, e.g. ``cluster="prod"``."""


PROJECT_ID = r"^(?:[a-z][a-z0-9.-]*:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$"
"""A Google Cloud project ID (6-30 characters), optionally domain-scoped."""
_FILTER_VALUE = r'^[^"\\\r\n]*$'
"""A value quoted into a Cloud Monitoring filter: no quotes, backslashes or line breaks."""


class DcgmCloudMonitoring(_Section):
    """Read DCGM from Cloud Monitoring: GKE's managed DCGM metrics (kept there by Google
    Managed Prometheus), else GKE's per-container accelerator system metrics."""

    project: str | None = Field(default=None, pattern=PROJECT_ID)
    """The cluster's project; setting it selects this source."""
    cluster: str | None = Field(default=None, pattern=_FILTER_VALUE)
    """The GKE cluster's name there; default: ``cluster``."""
    location: str | None = Field(default=None, pattern=_FILTER_VALUE)
    """The cluster's region or zone, when clusters in several locations share the name."""
    lookback: Duration = 180.0
    """How old a point may be and still count as the current reading."""
    fallback_system_metrics: bool = True
    """Without DCGM series, read kubernetes.io/container/accelerator/* instead."""
    endpoint: str | None = None
    """API endpoint override (``host:port``); default: Google's."""
    anonymous: bool = False
    """No credentials, plaintext gRPC to ``endpoint`` (a local server). Otherwise
    Application Default Credentials (Workload Identity on GKE)."""


class Dcgm(_Section):
    targets: list[str] = Field(default_factory=list)
    """Static dcgm-exporter URLs; leave empty to use discovery."""
    discovery: DcgmDiscovery = DcgmDiscovery()
    prometheus: DcgmPrometheus = DcgmPrometheus()
    cloud_monitoring: DcgmCloudMonitoring = DcgmCloudMonitoring()
    timeout: Duration = 10.0
    """How long a scrape round may take, every target at once; shorter than ``interval``."""
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    """The most one answer may hold; a longer one is refused, counted and logged."""
    max_devices_per_target: int = Field(default=1024, ge=1)
    """The most devices one answer may report."""
    retire_after: Duration = Field(default=3600.0, gt=0)
    """A device DCGM has not reported for this long, beyond what Kubernetes counts on its
    node, is forgotten: its series go, its open incident ends."""
    stuck_after: Duration = Field(default=150.0, gt=0)
    """A dcgm-exporter whose page stays byte for byte the same this long (two answers at
    least) while GPUs of its nodes are allocated is flagged stuck
    (``gke_gpu_exporter_dcgm_target_stuck``, logged once per episode): a live one's
    clocks, power and energy counters move every time it collects (every 30 s by default,
    its ``--collect-interval``), however often it is scraped."""

    @model_validator(mode="after")
    def _urls(self) -> Self:
        problems = [
            f"target {url!r} is not an http(s) URL"
            for url in [*self.targets, *([self.prometheus.url] if self.prometheus.url else [])]
            if not url.startswith(("http://", "https://"))]
        if self.prometheus.url and self.cloud_monitoring.project:
            problems.append("choose one DCGM source: dcgm.prometheus.url or "
                            "dcgm.cloud_monitoring.project")
        _raise_all(problems)
        return self


class Kubernetes(_Section):
    kubeconfig: Path | None = None
    """A kubeconfig file; default: ``$KUBECONFIG``, else ``~/.kube/config``."""
    in_cluster: bool = False
    """Use the pod's service account (its token and ``KUBERNETES_SERVICE_HOST``) instead
    of a kubeconfig."""
    watch_timeout: Duration = 300.0
    """Server-side timeout asked for on each watch; the watch is then resumed."""
    watchdog: Duration = 120.0
    """A watch silent (no event, no bookmark) for this long is dropped and relisted."""
    request_timeout: Duration = 30.0
    """Timeout of one list or the start of one watch."""
    max_staleness: Duration = 300.0
    """``/readyz`` answers 503 while the Kubernetes view has not been confirmed by the API
    (a list, a watch event or bookmark) for this long."""

    @model_validator(mode="after")
    def _staleness(self) -> Self:
        if self.max_staleness <= self.watchdog + self.request_timeout:
            raise ValueError("kubernetes.max_staleness must be longer than kubernetes.watchdog "
                             "plus kubernetes.request_timeout (a quiet watch is relisted "
                             "after the watchdog)")
        return self


class Commitment(_Section):
    """A resource-based committed-use discount of the cluster's region."""

    gpu: str
    """The GPU model (GKE accelerator name, e.g. nvidia-h100-80gb)."""
    gpus: int = Field(gt=0)
    """How many GPUs of it are committed."""
    usd_per_gpu_hour: float = Field(gt=0.0)
    """The commitment's term price of one GPU-hour (the 1- or 3-year price of the SKU)."""
    term: Literal["1y", "3y"]
    """The commitment's term (for the record: the price is what counts)."""

    @model_validator(mode="after")
    def _known(self) -> Self:
        if self.gpu not in GPU_MODELS:
            raise ValueError(f"commitment for unknown GPU model {self.gpu!r}; known: "
                             f"{', '.join(GPU_MODELS)}")
        return self


class PriceCatalog(_Section):
    """List prices read from Google's Cloud Billing Catalog API, the book their fallback."""

    enabled: bool = False
    refresh: Duration = 86400.0
    """How often the catalogue is read again (it is read at start too)."""
    timeout: Duration = 60.0
    """Per page of SKUs."""
    endpoint: str | None = None
    """``host:port`` of another CloudCatalog server; default: Google's."""
    anonymous: bool = False
    """No credentials, over plaintext (a local server only)."""


class Prices(_Section):
    book: Path | None = None
    """A price book YAML; default: the one shipped with the exporter."""
    region: str = "us-central1"
    """The cluster's region, whose prices apply."""
    discounts: dict[str, float] = Field(default_factory=dict)
    """Per node pool: committed-use or negotiated discount, a fraction (0.3 = 30 % off)."""
    default_discount: float = Field(default=0.0, ge=0.0, lt=1.0)
    """The discount of a node pool ``discounts`` does not name (0.3 = 30 % off)."""
    negotiated: dict[str, float] = Field(default_factory=dict)
    """Per GPU model or machine family (``a3``, ``g2``, ...): a negotiated fraction off the
    on-demand list price (0.1 = 10 % off); a model's own entry first. Not on spot."""
    commitments: list[Commitment] = Field(default_factory=list)
    """Resource-based committed-use discounts: the committed GPUs at their term price, the
    on-demand GPUs beyond them at the (negotiated) list price."""
    catalog: PriceCatalog = PriceCatalog()
    """Refresh the list prices from the Cloud Billing Catalog API (model by model; the book
    prices what the catalogue does not)."""

    @model_validator(mode="after")
    def _fractions(self) -> Self:
        problems = [f"discount for pool {pool!r} must be in [0, 1), got {d}"
                    for pool, d in self.discounts.items() if not 0.0 <= d < 1.0]
        for key, d in self.negotiated.items():
            if key not in GPU_MODELS and key not in MACHINE_FAMILIES:
                problems.append(f"negotiated discount for {key!r}: not a GPU model or a "
                                f"machine family ({', '.join(MACHINE_FAMILIES)})")
            if not 0.0 <= d < 1.0:
                problems.append(f"negotiated discount for {key!r} must be in [0, 1), got {d}")
        _raise_all(problems)
        return self


class Sla(_Section):
    target: float = Field(default=0.995, gt=0.0, lt=1.0)
    """The availability objective: the share of GPU-seconds up."""
    window: Duration = 30 * 86400.0
    """The window the objective holds over."""


class QueueForecast(_Section):
    """When each waiting pod or Kueue Workload is expected to start: the queue played
    forward from the cycle's state (``exporter.model.forecast``)."""

    enabled: bool = True
    interval: Duration = Field(default=60.0, ge=0.0)
    """How often the forecast is made again (0: every cycle); between, the last one holds."""
    horizon: Duration = Field(default=7 * 86400.0, gt=0.0)
    """How far ahead it looks: a unit not started by then has no expected start."""
    scale_up_delay: Duration = Field(default=600.0, ge=0.0)
    """How long a scale-up takes to bring its nodes, until the exporter has seen one: then
    the median of those it saw."""
    arrivals: Duration = Field(default=0.0, ge=0.0)
    """Work still to come taken to arrive as it did this long before (86400: the last
    day's submissions again, a day later), competing with what waits; 0: none (on the
    demo's scenarios it made the forecast worse: ``benchmarks/queue_forecast.py``)."""
    max_nodes: dict[str, int] = Field(default_factory=dict)
    """Pool -> the most nodes its autoscaler may run; else what the cluster autoscaler's
    ``TriggeredScaleUp`` events say (``max: N``); a pool with neither grows no further."""
    max_series: int = Field(default=1000, ge=0)
    """The most waiting units exported with an expected start (the longest waiting first)."""


class Carbon(_Section):
    """How GPU energy becomes CO2e: location-based, energy x PUE x the grid carbon
    intensity of the zone's region, from the shipped data (``exporter/data/carbon.yaml``:
    Google's published figures per region and year) unless a site's own factor is set."""

    pue: float | None = Field(default=None, ge=1.0, le=3.0)
    """The facility's power usage effectiveness; default: the shipped data's (Google's
    fleet-wide figure, with its year)."""
    grid_g_per_kwh: float | None = Field(default=None, ge=0.0, le=2000.0)
    """A site's own carbon factor, gCO2e per kWh, for every zone instead of its region's
    published intensity (e.g. a supplier's contract figure)."""
    year: int | None = Field(default=None, ge=2000, le=2100)
    """The data's year to use; default: the newest the shipped data has."""
    data: Path | None = None
    """A carbon file of one's own, in the shipped file's format."""

    def in_force(self) -> energy.Carbon:
        """The factors these settings put in force (the carbon file read: a bad one is a
        ``ConfigError``)."""
        from exporter.model.carbon import load_carbon_book

        return energy.Carbon.of(load_carbon_book(self.data, self.year), self.pue,
                                self.grid_g_per_kwh)


DATASET_ID = r"^[A-Za-z0-9_]{1,1024}$"
_TABLE_NAME = r"^[A-Za-z0-9_]{1,1024}$"


def billing_table_problem(table: str) -> str | None:
    """What is wrong with the name of a Cloud Billing export table (``PROJECT.DATASET.
    TABLE``, the project maybe domain-scoped), or None: what ``report.billing_table`` and
    ``report reconcile --billing-table`` accept."""
    parts = table.rsplit(".", 2)
    if len(parts) != 3:
        return f"{table!r} is not PROJECT.DATASET.TABLE"
    project, dataset, name = parts
    for part, what, shape in ((project, "project", r"^[A-Za-z0-9_.:-]+$"),
                              (dataset, "dataset", DATASET_ID), (name, "table", _TABLE_NAME)):
        if not re.match(shape, part):
            return f"{table!r} is not PROJECT.DATASET.TABLE: {part!r} is not a {what}"
    return None


def _billing_table(table: str) -> str:
    problem = billing_table_problem(table)
    if problem is not None:
        raise ValueError(f"{problem} (the Cloud Billing detailed export, e.g. my-project."
                         "billing.gcp_billing_export_resource_v1_01A2B3_C4D5E6_F7A8B9)")
    return table


BillingTable = Annotated[str, AfterValidator(_billing_table)]


class BigQuery(_Section):
    """Copy the warehouse tables to BigQuery. Rows pass through an outbox in the local
    DuckDB file, written in the same transaction as the local tables: they survive
    restarts, SIGKILL and BigQuery outages, and are sent in order once BigQuery answers."""

    enabled: bool = False
    """Write the warehouse's tables to BigQuery too."""
    project: str | None = Field(default=None, pattern=PROJECT_ID)
    """The project of the dataset."""
    dataset: str = Field(default="gke_gpu", pattern=DATASET_ID)
    """The dataset of the tables (created if missing)."""
    location: str = Field(default="US", pattern=r"^[A-Za-z0-9-]{2,40}$")
    """Where the dataset is created."""
    endpoint: str | None = None
    """API endpoint override (the local emulator); default: Google's."""
    anonymous: bool = False
    """Send no credentials (the emulator). Otherwise Application Default Credentials:
    Workload Identity on GKE, ``gcloud auth application-default login`` on a laptop."""
    batch_size: int = Field(default=500, ge=1, le=10_000)
    """Rows per insertAll request."""
    flush_interval: Duration = 60.0
    """How often waiting rows are sent."""
    request_timeout: Duration = 30.0
    """Timeout of one HTTP request."""
    deadline: Duration = 120.0
    """How long one batch is retried (with backoff) before the next attempt's turn."""
    spool_max_bytes: int = Field(default=512 * 1024 * 1024, ge=1024)
    """Cap on unsent rows kept on disk; past it the oldest are dropped and counted."""

    @model_validator(mode="after")
    def _project(self) -> Self:
        problems = []
        if self.enabled and not self.project:
            problems.append("bigquery.project is required when bigquery is enabled")
        if self.endpoint and not self.endpoint.startswith(("http://", "https://")):
            problems.append(f"bigquery.endpoint {self.endpoint!r} is not an http(s) URL")
        _raise_all(problems)
        return self


class Retention(_Section):
    """How long the local warehouse keeps its rows. BigQuery keeps what it was sent: set a
    partition expiration on its dataset for the same effect there."""

    raw: Duration = 35 * 86400.0
    """``gpu_usage`` rows keep the warehouse interval this long, then become one row per
    GPU, pod and state per hour (totals and means unchanged); 0: never."""
    keep: Duration = 400 * 86400.0
    """Rows of every table older than this are deleted; 0: never."""

    @model_validator(mode="after")
    def _order(self) -> Self:
        if self.keep and self.raw > self.keep:
            raise ValueError("retention.raw cannot be longer than retention.keep")
        return self


class Warehouse(_Section):
    enabled: bool = True
    """Keep the local DuckDB warehouse."""
    path: Path = Path("gke-gpu-exporter.duckdb")
    """The warehouse file (on a persistent volume in the cluster)."""
    interval: Duration = 60.0
    """Length of one ``gpu_usage`` row's interval."""
    flush_interval: Duration = 60.0
    """How often complete intervals are written (one transaction each time)."""
    retention: Retention = Retention()
    bigquery: BigQuery = BigQuery()

    @model_validator(mode="after")
    def _local_first(self) -> Self:
        if self.bigquery.enabled and not self.enabled:
            raise ValueError("bigquery needs the local warehouse: its file holds the rows "
                             "on their way")
        return self


class RemoteWrite(_Section):
    """Also push every cycle's series to a Prometheus remote-write receiver."""

    url: str | None = None
    """e.g. http://prometheus:9090/api/v1/write"""
    queue_size: int = Field(default=60, ge=1)
    """Cycles kept while the receiver is unreachable; past it the oldest are dropped."""
    timeout: Duration = 30.0
    """Timeout of one request."""


class CloudMonitoring(_Section):
    """Also write the exporter's figures to Cloud Monitoring as custom metrics
    (``custom.googleapis.com/gke_gpu/<name>`` on the ``k8s_cluster`` resource)."""

    enabled: bool = False
    """Write the figures to Cloud Monitoring."""
    project: str | None = Field(default=None, pattern=PROJECT_ID)
    """The project the custom metrics go to."""
    location: str | None = Field(default=None, pattern=r"^[a-z0-9-]{2,40}$")
    """The cluster's region or zone (a label of the k8s_cluster resource)."""
    families: list[str] = Field(default_factory=lambda: list(CLOUD_MONITORING_DEFAULT))
    """Which ``gke_gpu_`` families to write (names without the prefix and ``_total``;
    gauges and counters). Default: per-owner cost and time, capacity, queue and
    availability; not the per-GPU series (8 per GPU: costly at fleet scale, and
    Prometheus already has them)."""
    interval: Duration = 60.0
    """How often a point is written per series (Cloud Monitoring refuses points of one
    series closer than its sampling period; 10 s is the least allowed here)."""
    batch_size: int = Field(default=200, ge=1, le=200)
    """Time series per CreateTimeSeries request (the API takes at most 200)."""
    requests_per_second: float = Field(default=5.0, gt=0.0)
    """Pace of CreateTimeSeries requests, under the project's write quota."""
    timeout: Duration = 30.0
    """Timeout of one request."""
    endpoint: str | None = None
    """API endpoint override (``host:port``); default: Google's."""
    anonymous: bool = False
    """No credentials, plaintext gRPC to ``endpoint`` (a local server)."""

    @model_validator(mode="after")
    def _where(self) -> Self:
        problems = []
        if self.enabled and not (self.project and self.location):
            problems.append("cloud_monitoring.project and .location are required when "
                            "cloud_monitoring is enabled")
        if self.interval < 10:
            problems.append("cloud_monitoring.interval must be at least 10 s")
        unknown = [f for f in self.families if f not in BY_NAME
                   or BY_NAME[f].kind not in CLOUD_MONITORING_KINDS]
        if unknown:
            problems.append(f"cloud_monitoring.families: no gauge or counter named "
                            f"{', '.join(map(repr, unknown))} (names without gke_gpu_ and "
                            "_total; docs/metrics.md lists them)")
        _raise_all(problems)
        return self


_NO_CRLF = r"^[^\r\n]*$"


class Smtp(_Section):
    host: str = "localhost"
    """The mail server."""
    port: int = Field(default=587, ge=1, le=65535)
    """Its port."""
    security: Literal["starttls", "ssl", "none"] = "starttls"
    """STARTTLS on the plain port, TLS from the start (``ssl``), or none."""
    username: str | None = Field(default=None, pattern=_NO_CRLF)
    """The login, if the server wants one (the password: ``password``)."""
    password: SecretStr | None = None
    """Better from a file (``password_file``) or the environment
    (GKE_GPU_EXPORTER_REPORT__SMTP__PASSWORD), which child processes inherit."""
    password_file: Path | None = None
    """A mounted secret holding the password (as ``deploy/`` mounts it)."""
    ca_file: Path | None = None
    """CA bundle for the server's certificate; default: the system's."""
    timeout: Duration = 30.0
    """Timeout of one SMTP exchange."""
    allow_plaintext_auth: bool = False
    """Log in over ``security: none`` all the same (the password then crosses the network
    in clear; a warning is logged at each send). Without it such a login is refused."""

    @model_validator(mode="after")
    def _no_login_in_clear(self) -> Self:
        login = self.username is not None or self.password is not None \
            or self.password_file is not None
        if self.security == "none" and login and not self.allow_plaintext_auth:
            raise ValueError("a login over security: none sends the password in clear; use "
                             "starttls or ssl (or set allow_plaintext_auth: true)")
        return self


SCHEDULE = r"(?i)^(mon|tue|wed|thu|fri|sat|sun)[a-z]*\s+([01]?\d|2[0-3]):[0-5]\d$"
"""A weekday (its first three letters or more) and a 24-hour time."""


class Report(_Section):
    """The weekly report and who gets it."""

    sender: str = Field(default="gke-gpu-exporter@localhost", pattern=_NO_CRLF)
    """The report's From address."""
    subject: str = Field(default="GPU cost and bottleneck report {week} — {scope}: {cost}",
                         pattern=_NO_CRLF)
    """Placeholders: ``{week}`` (2026-W47), ``{scope}`` (the cluster, or the team),
    ``{cost}`` (the week's cost, to the dollar)."""
    min_coverage: float = Field(default=0.5, ge=0.0, le=1.0)
    """The share of a week's hours that must have data for its report to be written or
    mailed (``report weekly --force`` writes it anyway): an empty or mostly empty week
    would read as a cheap one."""
    platform_recipients: list[str] = Field(default_factory=list)
    """Get the whole report."""
    team_recipients: dict[str, list[str]] = Field(default_factory=dict)
    """Team -> addresses; each gets only its team's slice."""
    smtp: Smtp = Smtp()
    schedule: str | None = Field(default=None, pattern=SCHEDULE)
    """When the running exporter writes (and mails, with recipients) the last week's report
    from its warehouse: a weekday and a time, e.g. ``mon 07:00``; default: never."""
    timezone: str = "UTC"
    """The schedule's time zone (IANA name, e.g. ``Europe/Paris``)."""
    directory: Path | None = None
    """Where scheduled reports are written, one folder per week; default: ``reports/``
    beside the warehouse file."""
    timeout: Duration = Field(default=1800.0, gt=0)
    """Longest a scheduled report's child process may take (e.g. ``30m``): then it is
    killed, counted as failed and retried an hour later."""
    whatif_budget: Duration | None = Field(default=None, ge=0)
    """How long the platform report may spend replaying the week on the layout each of its
    actions implies (``What the actions do, replayed``; e.g. ``10m``): the week on its own
    layout first, then the actions in order while the budget lasts. Unset (the default):
    every action is replayed (on the replay engine, seconds each); 0: no replays."""
    whatif_step: Duration = Field(default=300.0, ge=30)
    """The warehouse interval the replays' fidelity allows a wait to differ by (and, for a
    replay through the full loop, its step)."""
    wait_target: Duration = Field(default=14400.0, gt=0)
    """The queue-wait p90 a team's pods should stay under (default 4 hours): a replayed
    action that saves money but pushes a team's p90 past its target is a trade-off, not a
    saving."""
    wait_targets: dict[str, Duration] = Field(default_factory=dict)
    """Per team: its own queue-wait p90 target (``research: 8h``), else ``wait_target``."""
    billing_table: BillingTable | None = None
    """The Cloud Billing detailed export (``PROJECT.DATASET.gcp_billing_export_resource_v1_
    <BILLING_ACCOUNT_ID>``): the platform report then reconciles the week's GPU cost with
    its GPU lines (read with ``warehouse.bigquery``'s endpoint and credentials)."""

    @model_validator(mode="after")
    def _valid(self) -> Self:
        problems = []
        if self.whatif_budget is not None and self.whatif_budget >= self.timeout:
            problems.append(f"whatif_budget ({self.whatif_budget:g} s) must be shorter than "
                            f"timeout ({self.timeout:g} s), which the replays run within")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name too long
            problems.append(f"unknown time zone {self.timezone!r}")
        try:
            self.subject.format(week="", scope="", cost="")
        except (KeyError, IndexError, ValueError) as exc:
            problems.append(f"subject {self.subject!r}: placeholders are {{week}}, {{scope}} "
                            f"and {{cost}} ({type(exc).__name__}: {exc})")
        problems += [f"not an email address: {addr!r}" for addr in [
            self.sender, *self.platform_recipients,
            *(a for v in self.team_recipients.values() for a in v)]
            if "\r" in addr or "\n" in addr or "@" not in addr]
        _raise_all(problems)
        return self


_LABEL_KEY = r"^([a-z0-9]([a-z0-9.-]*[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$"
"""A Kubernetes label or annotation key: an optional DNS prefix and ``/``, then a name."""


class Allocation(_Section):
    """A cost dimension of finance's own, besides the team: a pod label or annotation such
    as ``cost-center``. It is carried to the warehouse (``allocation`` columns), the report
    ("Cost by" ``name``) and ``/metrics`` (``gke_gpu_allocation_cost_usd_total``)."""

    label: str | None = Field(default=None, pattern=_LABEL_KEY)
    """Pod label holding the value, then the same label on the pod's namespace."""
    annotation: str | None = Field(default=None, pattern=_LABEL_KEY)
    """Pod annotation holding the value, read when the pod has no such label."""
    name: str | None = Field(default=None, min_length=1, max_length=40)
    """What the report calls it (default: the label, else the annotation)."""

    @property
    def enabled(self) -> bool:
        return bool(self.label or self.annotation)

    @property
    def title(self) -> str:
        return self.name or self.label or self.annotation or "allocation"


class Config(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__",
                                      extra="forbid", frozen=True)

    listen_address: str = "0.0.0.0"
    """Where ``/metrics``, ``/healthz`` and ``/readyz`` are served."""
    port: int = Field(default=9808, ge=0, le=65535)
    """Their port (0: a free one)."""
    interval: Duration = 30.0
    """One cycle: scrape, compute, write, render."""
    cluster: str = "default"
    """The ``cluster`` label of every series and the warehouse's ``cluster`` column."""
    team_label: str = "team"
    """Pod label, then namespace label, naming the team; else the namespace."""
    allocation: Allocation = Allocation()
    system_reserved_gpus: int = Field(default=0, ge=0)
    """GPUs subtracted from ``gke_gpu_cluster_available_gpus``."""
    bottleneck_window: Duration = 600.0
    """The sliding window of each pod's bottleneck class."""
    budgets: dict[str, float] = Field(default_factory=dict)
    """Monthly GPU budget per team, USD (exported as gke_gpu_team_budget_usd, for alerts)."""
    shutdown_timeout: Duration = 20.0
    """After SIGTERM, the time the cycle in flight, the final flush and BigQuery's last send have;
    then the process exits anyway."""
    log_level: LogLevel = "info"
    """The least severe log level written; ``--log-level`` on the command line wins."""
    dcgm: Dcgm = Dcgm()
    kubernetes: Kubernetes = Kubernetes()
    prices: Prices = Prices()
    sla: Sla = Sla()
    queue_forecast: QueueForecast = QueueForecast()
    carbon: Carbon = Carbon()
    warehouse: Warehouse = Warehouse()
    report: Report = Report()
    remote_write: RemoteWrite = RemoteWrite()
    cloud_monitoring: CloudMonitoring = CloudMonitoring()

    @model_validator(mode="after")
    def _between_settings(self) -> Self:
        found = list(self.cross_field_errors())
        deferred = _DEFERRED.get()
        if deferred is not None:
            deferred += found
        else:
            _raise_all([message for _, message in found])
        return self

    def cross_field_errors(self) -> Iterator[tuple[frozenset[str], str]]:
        """Each error between settings: the top-level settings it involves, and what is
        wrong."""
        if self.interval < 1:
            yield frozenset({"interval"}), "interval must be at least 1 s"
        if self.warehouse.interval < self.interval:
            yield frozenset({"warehouse", "interval"}), "warehouse.interval must be >= interval"
        if self.dcgm.timeout >= self.interval:
            yield frozenset({"dcgm", "interval"}), "dcgm.timeout must be shorter than interval"
        if self.report.schedule and not self.warehouse.enabled:
            yield (frozenset({"report", "warehouse"}),
                   "report.schedule needs the warehouse: the report is read from it")
        cm = self.dcgm.cloud_monitoring
        if cm.project and not cm.cluster and re.search(r'["\\\r\n]', self.cluster):
            yield (frozenset({"dcgm", "cluster"}),
                   "cluster cannot be quoted into a Cloud Monitoring filter: set "
                   "dcgm.cloud_monitoring.cluster")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (env_settings, init_settings)  # the environment overrides the file


_DEFERRED: ContextVar[list[tuple[frozenset[str], str]] | None] = ContextVar(
    "_DEFERRED", default=None)
"""While set, ``Config`` hands its errors between settings here instead of raising them."""


def variables(model: type[BaseModel] = Config, prefix: str = ENV_PREFIX
              ) -> Iterator[tuple[str, bool]]:
    """Each setting's environment variable, and whether it takes keys below it (a
    mapping, such as ``GKE_GPU_EXPORTER_BUDGETS__ML``)."""
    for name, info in model.model_fields.items():
        variable = prefix + name.upper()
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield variable, False
            yield from variables(kind, variable + "__")
        else:
            yield variable, typing.get_origin(kind) is dict


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """A line for each ``GKE_GPU_EXPORTER_*`` variable that names no setting, with the
    nearest that does (variables are read whatever their case); and the setting it would
    be (``dcgm.timout``)."""
    known = dict(variables())
    out = []
    for variable in sorted(environ):
        name = variable.upper()
        if not name.startswith(ENV_PREFIX) or name in known or name in OTHER_VARIABLES or \
                any(name.startswith(v + "__") for v, keyed in known.items() if keyed):
            continue
        near = difflib.get_close_matches(  # by what follows the prefix, which all share
            name.removeprefix(ENV_PREFIX),
            [v.removeprefix(ENV_PREFIX) for v in [*known, *OTHER_VARIABLES]], n=1)
        out.append((f"environment: {variable}: no such setting" +
                    (f"; did you mean {ENV_PREFIX}{near[0]}?" if near else
                     f" (the settings are {ENV_PREFIX}<FIELD>, nested with __)"),
                    name.removeprefix(ENV_PREFIX).lower().replace("__", ".")))
    return out


def _json_valued(model: type[BaseModel] = Config, prefix: str = ENV_PREFIX
                 ) -> Iterator[tuple[str, str]]:
    """Each variable whose value is read as JSON (a section, a mapping or a list, as the
    settings source reads them), and an example of its shape."""
    for name, info in model.model_fields.items():
        variable, kind = prefix + name.upper(), info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield variable, '{"setting": value}'
            yield from _json_valued(kind, variable + "__")
        elif typing.get_origin(kind) is dict:
            yield variable, '{"key": value}'
        elif typing.get_origin(kind) is list:
            yield variable, '["value"]'


def environment_problems(environ: Mapping[str, str]) -> list[str]:
    """A line for each ``GKE_GPU_EXPORTER_*`` variable whose value cannot be read: not
    UTF-8, or not JSON where the setting takes JSON (a mapping, a list, a section)."""
    shapes = dict(_json_valued())
    out = []
    for variable in sorted(environ):
        name, value = variable.upper(), environ[variable]
        if not name.startswith(ENV_PREFIX):
            continue
        if (bad := not_utf8_text(value)) is not None:
            out.append(f"environment: {variable}: {bad}")
        elif name in shapes and value.strip():
            try:
                json.loads(value)
            except ValueError as exc:
                out.append(f"environment: {variable}: not JSON ({exc}); it takes JSON, e.g. "
                           f"{variable}='{shapes[name]}'")
    return out


def _variable_of(loc: tuple[int | str, ...], environ: Mapping[str, str]) -> str | None:
    """``environment: <VARIABLE>`` when the setting at ``loc`` (or a section or mapping
    holding it) was given by a variable, which wins over the file; else None."""
    given = {name.upper(): name for name in environ}
    for end in range(len(loc), 0, -1):
        variable = ENV_PREFIX + "__".join(str(p) for p in loc[:end]).upper()
        if variable in given:
            return f"environment: {given[variable]}"
    return None


def _read_file(path: str | Path) -> dict[str, Any]:
    """The settings of a config file, each failure one line naming the file."""
    try:
        loaded = read_yaml(Path(path))
    except Unreadable as exc:
        raise ConfigError(f"{path}: config: {exc}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: a config is a YAML mapping of settings, not a "
                          f"{type(loaded).__name__}")
    names = [f"{path}: {key!r}: a setting's name is a string"
             for key in loaded or {} if not isinstance(key, str)]
    if names:
        raise ConfigError("\n".join(names))
    return loaded or {}


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None,
                environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate a config file (None: defaults and environment only), reporting
    every mistake at once (``ConfigError``, a line each, each naming its source: the file
    or the variable). ``environ``: the environment whose ``GKE_GPU_EXPORTER_*`` variables
    are checked (default: the process's)."""
    data = _read_file(path) if path is not None else {}
    data |= overrides or {}
    where = path or "config"
    env = os.environ if environ is None else environ
    unknown = unknown_variables(env)
    lines = [line for line, _ in unknown]
    named = {loc for _, loc in unknown}
    undecodable = environment_problems(env)
    if undecodable:  # the settings source would stop at the first of them
        raise ConfigError("\n".join(lines + undecodable))
    try:
        config = Config(**data)
    except SettingsError as exc:  # a value the settings source could not decode
        cause = f" ({exc.__cause__})" if exc.__cause__ else ""
        raise ConfigError("\n".join([*lines, f"environment: {exc}{cause}"])) from None
    except ValidationError as exc:
        failed: set[str] = set()
        for err in exc.errors():
            loc = ".".join(p if isinstance(p, str) and p.isprintable() and p else
                           str(p) if isinstance(p, int) else repr(p)
                           for p in err["loc"]) or "(top level)"
            if err["loc"]:
                failed.add(str(err["loc"][0]))
            if err["type"] == "extra_forbidden" and loc.lower() in named:
                continue  # an unknown variable's, named above
            msg = _unknown(err["loc"]) if err["type"] == "extra_forbidden" else \
                err["msg"].removeprefix("Value error, ")
            source = _variable_of(err["loc"], env) or where
            lines += [f"{source}: {loc}: {line}" for line in msg.split("\n")]
        if failed:  # the errors between the settings that are valid themselves
            lines += [f"{where}: (top level): {message}"
                      for keys, message in _between_valid_settings(data, failed)]
        raise ConfigError("\n".join(lines)) from None
    if lines:
        raise ConfigError("\n".join(lines))
    return config


def _unknown(loc: tuple[int | str, ...]) -> str:
    """An unknown setting's message, with the known one its name is closest to."""
    model: Any = Config
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part) if isinstance(part, str) else None
        if field is None:
            return "unknown setting"
        model = next((a for a in (field.annotation, *typing.get_args(field.annotation))
                      if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if model is None:
            return "unknown setting"
    names = list(getattr(model, "model_fields", {}))
    near = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.7)
    return f"unknown setting; did you mean {near[0]}?" if near else "unknown setting"


class _Given(Config):
    """A configuration of the settings given to it alone (not the environment's)."""

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def _merged(low: dict[str, Any], high: dict[str, Any]) -> dict[str, Any]:
    """``low`` with ``high`` over it, mappings merged key by key."""
    out = dict(low)
    for key, value in high.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and \
            isinstance(out.get(key), dict) else value
    return out


def _between_valid_settings(data: dict[str, Any], failed: set[str]
                            ) -> list[tuple[frozenset[str], str]]:
    """The errors between settings that do not involve the ``failed`` ones: the
    configuration (the file's settings, the environment's over them) built again without
    them, their defaults in their place."""
    given = _merged(data, EnvSettingsSource(Config)())
    found: list[tuple[frozenset[str], str]] = []
    token = _DEFERRED.set(found)
    try:
        _Given(**{k: v for k, v in given.items() if k not in failed})
    except ValidationError:
        pass  # (a setting failed only with the other's defaults)
    finally:
        _DEFERRED.reset(token)
    return [(keys, message) for keys, message in found if not keys & failed]
