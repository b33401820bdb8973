"""How every source and sink is doing, as the exporter's own series show it: what each
answered, failed, wrote, refused or dropped since start. The sources and sinks keep these
records up to date; the catalogue (``exporter.families``) reads them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, get_args


@dataclass(slots=True)
class SourceHealth:
    """Each DCGM target's and sink's last answer, errors and rejected samples, by
    (source, target)."""

    up: dict[tuple[str, str], bool] = field(default_factory=dict)
    duration: dict[tuple[str, str], float] = field(default_factory=dict)
    errors: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    error_reasons: dict[tuple[str, str, str], int] = field(
        default_factory=lambda: defaultdict(int))
    """(source, target, ``SourceError.label``) -> errors; the rest of ``errors`` has none."""
    rejected: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    last_success: dict[tuple[str, str], float] = field(default_factory=dict)
    """(source, target) -> the cycle time of its last answer."""
    pages: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """dcgm-exporter pages by how they were read (``records.PAGE_READS``)."""


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
