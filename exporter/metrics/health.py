"""How every source and sink is doing, as the exporter's own series show it: what each
answered, failed, wrote, refused or dropped since start. The sources and sinks keep these
records up to date; the catalogue (``exporter.metrics.families``) reads them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol, get_args


class SourceTarget(NamedTuple):
    """What the exporter's own series of a source are kept by: the source (``dcgm``,
    ``warehouse``...) and its target (a dcgm-exporter's URL, a warehouse's path)."""

    source: str
    target: str


@dataclass(slots=True)
class SourceHealth:
    """Each DCGM target's and sink's last answer, errors and rejected samples, by
    ``SourceTarget``."""

    up: dict[SourceTarget, bool] = field(default_factory=dict)
    duration: dict[SourceTarget, float] = field(default_factory=dict)
    errors: dict[SourceTarget, int] = field(default_factory=lambda: defaultdict(int))
    error_reasons: dict[SourceTarget, dict[str, int]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    """Errors by ``SourceError.label``; the rest of ``errors`` has none."""
    rejected: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    last_success: dict[SourceTarget, float] = field(default_factory=dict)
    """The cycle time of its last answer."""
    pages: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """dcgm-exporter pages by how they were read (``records.PAGE_READS``)."""
    stuck: dict[str, bool] = field(default_factory=dict)
    """dcgm target -> whether it is stuck (``PageRuns.stuck``), from its last answer."""


@dataclass(slots=True)
class PageRuns:
    """Each dcgm target's last page (its CRC-32 and length), how many answers in a row
    brought it and when the first of them came: a live dcgm-exporter's clocks, power and
    energy counters change its page every time it collects, so one that stays the same
    for longer while its GPUs are busy is stuck. A failed scrape between two answers
    neither ends nor lengthens a run."""

    last: dict[str, tuple[int, int]] = field(default_factory=dict)
    runs: dict[str, int] = field(default_factory=dict)
    since: dict[str, float] = field(default_factory=dict)
    """When the run's first answer came (the clock of the cycles, seconds)."""

    def see(self, target: str, page: tuple[int, int], now: float) -> int:
        """The answers in a row, this one (at ``now``) included, that brought ``page``."""
        if self.last.get(target) == page:
            run = self.runs[target] + 1
        else:
            run, self.since[target] = 1, now
        self.last[target], self.runs[target] = page, run
        return run

    def unchanged_seconds(self, target: str, now: float) -> float:
        """How long ``target``'s page has been the same, from the run's first answer."""
        return now - self.since.get(target, now)

    def forget(self, target: str) -> None:
        self.last.pop(target, None)
        self.runs.pop(target, None)
        self.since.pop(target, None)

    @staticmethod
    def stuck(run: int, unchanged_seconds: float, after_seconds: float,
              allocated_nodes: int) -> bool:
        """Whether a target is stuck: the same page in two answers or more, over
        ``after_seconds`` or longer, while GPUs of ``allocated_nodes`` of its nodes are
        allocated (an idle node's page may rightly stand still)."""
        return run >= 2 and unchanged_seconds >= after_seconds and allocated_nodes > 0


@dataclass(slots=True)
class WatchStats:
    """One Kubernetes kind's list and watch since start."""

    lists: int = 0
    watch_restarts: int = 0
    expired: int = 0
    watchdog_relists: int = 0
    errors: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    """Errors by label (``SourceError.label``)."""
    last_error: str | None = None


class KubeHealth(Protocol):
    """What the exporter's own series read of the Kubernetes watches."""

    @property
    def up(self) -> Mapping[str, bool]: ...
    @property
    def stats(self) -> Mapping[str, WatchStats]: ...
    @property
    def last_success(self) -> Mapping[str, float]: ...
    @property
    def rejected_objects(self) -> Mapping[str, int]: ...
    @property
    def discovery_up(self) -> Mapping[str, bool]:
        """API group -> whether its last discovery was answered; absent before asked."""
    @property
    def discovery_errors(self) -> Mapping[tuple[str, str], int]:
        """(API group, reason) -> failed discoveries."""
    @property
    def discovery_error(self) -> Mapping[str, str]:
        """API group -> the error of its discovery, while it fails."""
    def age(self, kind: str) -> float | None: ...


@dataclass(slots=True)
class BigQueryStats:
    """What the sender did since start, for /metrics (written by the sender thread)."""

    rows_written: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    rows_rejected: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    rows_already_present: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    spool_dropped: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    errors: int = 0
    up: bool = False
    last_success: float | None = None
    """When the last send emptied the spool or got every batch in (Unix time)."""
    spool_rows: int = 0
    spool_bytes: int = 0
    last_error: str | None = None


@dataclass(slots=True)
class CloudMonitoringStats:
    points_written: int = 0
    points_refused: int = 0
    points_dropped: int = 0
    """Superseded by a newer snapshot before they could be written."""
    retries: int = 0
    up: bool = True
    """The last request was answered (written or refused), not failed."""
    last_success: float | None = None
    """When a request was last answered (Unix time)."""
    project: str = ""


@dataclass(slots=True)
class RemoteWriteStats:
    requests_sent: int = 0
    requests_dropped: int = 0
    """Refused (4xx) or pushed out of a full queue."""
    retries: int = 0
    queued: int = 0


@dataclass(slots=True)
class ReportStats:
    """For the exporter's own metrics."""

    runs: dict[str, int] = field(default_factory=lambda: {"ok": 0, "failed": 0, "thin": 0})
    last_success: float | None = None
    """When the last report was made (Unix time)."""
    coverage: tuple[str, float] | None = None
    """The last week reported (made or found thin) and the share of its hours covered."""


@dataclass(slots=True)
class CatalogStats:
    """The catalogue's reads, for the exporter's own metrics."""

    reads: int = 0
    failures: int = 0
    last_success: float | None = None
    """Unix time of the last read that priced something."""
    last_error: str = ""


QuarantineReason = Literal["name", "unreadable", "foreign", "stray", "wal"]
QUARANTINE_REASONS: tuple[QuarantineReason, ...] = get_args(QuarantineReason)
"""Why the warehouse set a file aside in its quarantine folder: a staged file whose ``name``
gives no interval, one that is ``unreadable`` (not Parquet, cut short, damaged) or
``foreign`` (Parquet without the staged rows' columns), a ``stray`` file of another name in
the staging folder, a write-ahead log (``wal``) DuckDB found damaged and did not replay."""
