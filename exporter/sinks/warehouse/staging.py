"""Staged usage rows: each cycle's rows as Parquet files, one per interval, in the directory
beside the database (``<file>.staging``), until a flush writes them; the order a flush
writes them in (``write_groups``); and the quarantine, where a file the warehouse cannot use
is set aside."""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import compress, repeat
from operator import attrgetter
from pathlib import Path
from typing import Any

import duckdb

from exporter import duck
from exporter.logs import ctx
from exporter.metrics.health import QUARANTINE_REASONS, QuarantineReason
from exporter.model.bottleneck import CLOCK_REASONS, IDLE_GR
from exporter.model.compute import XID, UsageRow
from exporter.sinks.batch_files import Encoded, write_parquet
from exporter.sinks.schema import FIELDS, GPU_USAGE
from exporter.sinks.warehouse.tables import DAY

log = logging.getLogger("exporter.sinks.warehouse")

STAGE_TYPES = {
    "win": "DOUBLE", **dict.fromkeys((
        "device_id", "pod_uid", "state", "node", "node_pool", "zone", "gpu_model",
        "provisioning", "gpu_uuid", "gpu_index", "mig_profile", "namespace", "pod", "team",
        "workload", "reason", "allocation"), "VARCHAR"),
    **dict.fromkeys(("gpu_seconds", "utilized", "cost", "price", *FIELDS,
                     "memory_used_bytes", "memory_total_bytes"), "DOUBLE"),
    "last_xid": "BIGINT", "clock_event_reasons": "BIGINT",
    "energy": "DOUBLE", "energy_basis": "VARCHAR", "co2e": "DOUBLE", "idle_energy": "DOUBLE",
}
STAGED = "usage-{win!r}-{serial}.parquet"
"""A staged file: its rows' interval (start, Unix seconds) and a serial unique to it."""
QUARANTINE = "quarantine"
"""The folder in the staging directory that files the warehouse cannot use are moved to,
kept for a look and never read again (``QUARANTINE_REASONS``)."""
_STAGED_KEYS = frozenset({"win", "device_id", "pod_uid", "state", "gpu_seconds"})
"""Columns every staged file has had, whichever release staged it."""
NOT_THE_FILE = (duckdb.OutOfMemoryException, duckdb.FatalException,
                duckdb.InternalException, duckdb.InterruptException)
"""What DuckDB raises for a fault of its own, whatever it reads: never a reason to set a file
aside. What a damaged file raises varies with the damage (``InvalidInputException`` for a
file that is not Parquet, a bare ``duckdb.Error`` for a page that does not decode, ...)."""
_STAGE_OF_DEVICE = {
    "device_id": "device_id", "state": "state", "node": "node", "node_pool": "pool",
    "zone": "zone", "gpu_model": "accelerator", "provisioning": "provisioning",
    "gpu_uuid": "gpu_uuid", "gpu_index": "gpu_index", "mig_profile": "mig_profile",
    "reason": "reason", "price": "price_usd_per_hour",
    "memory_used_bytes": "memory_used_bytes", "memory_total_bytes": "memory_total_bytes"}
"""Staged columns taken from the row's device, and its attribute."""
_STAGE_OF_OWNER = {"namespace": "namespace", "pod": "name", "team": "team",
                   "workload": "workload", "allocation": "allocation"}
"""... from the row's owner (NULL for none)."""
_STAGE_OF_ROW = {"gpu_seconds": "seconds", "utilized": "utilized_seconds",
                 "cost": "cost_usd", "energy": "joules", "energy_basis": "energy_basis",
                 "co2e": "co2e_grams"}
WRITE_BYTES = 2 << 20
"""Most staged Parquet one transaction of a flush reads (whole intervals, at least one).
A transaction holds what it writes, and the outbox's copy, in memory until it commits:
with the outbox on, 8.4 MB of files (a day of the default scenario in one transaction, at
a ``flush_interval`` of a day) and 6 MB ran out of the connection's 64 MB, 4 MB did not;
half that leaves room at any ``flush_interval``."""
PENDING_ROWS_MAX = 1_000_000
"""Most usage rows kept in memory while staging fails (an hour of 8,000 GPUs at the default
30 s interval); past it they are dropped, counted as removed for reason ``unstaged``."""


def staging_directory(path: Path) -> Path:
    """The directory of the staged files of the database at ``path``: beside it, or a new
    temporary one for ``:memory:``."""
    if str(path) == ":memory:":
        return Path(tempfile.mkdtemp(prefix="gpu-usage-staging-"))
    return path.with_name(path.name + ".staging")


def write_groups(staged: Mapping[float, Sequence[Path]], limit: int = WRITE_BYTES
                 ) -> Iterator[tuple[float, list[float]]]:
    """The intervals of ``staged`` (their files by interval) in the order a flush writes
    them, a transaction each: their UTC day, and its intervals in order, as many as fit in
    ``limit`` bytes of files (one at least). A file gone since it was listed counts 0."""
    day, size = math.nan, 0
    wins: list[float] = []
    for win in sorted(staged):
        here = sum(_size(f) for f in staged[win])
        if wins and (win - win % DAY != day or size + here > limit):
            yield day, wins
            wins, size = [], 0
        day = win - win % DAY
        wins.append(win)
        size += here
    if wins:
        yield day, wins


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class Quarantine:
    """The folder files the warehouse cannot use are set aside in, and how many were."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.counts: dict[QuarantineReason, int] = dict.fromkeys(QUARANTINE_REASONS, 0)
        """Files set aside in the quarantine folder, by why (``QUARANTINE_REASONS``)."""

    def put(self, path: Path, reason: QuarantineReason, error: str,
            copy: bool = False) -> None:
        """Move (or ``copy``) ``path`` to the quarantine folder, never to be read again;
        counted and logged."""
        self.directory.mkdir(parents=True, exist_ok=True)
        dest = self.directory / path.name
        if dest.exists():
            dest = self.directory / f"{path.name}.{time.time_ns()}"
        if copy:
            shutil.copyfile(path, dest)
        else:
            path.replace(dest)
        self.counts[reason] += 1
        log.warning("warehouse file quarantined", extra=ctx(
            file=str(path), moved_to=str(dest), reason=reason, error=error))


class Staging:
    """The usage rows of the cycles, staged in ``directory`` until a flush writes them."""

    def __init__(self, directory: Path, interval: float, quarantine: Quarantine,
                 rows_removed: dict[tuple[str, str], int],
                 connection: Callable[[], duckdb.DuckDBPyConnection]) -> None:
        directory.mkdir(exist_ok=True)
        for part in directory.glob("*.part"):  # a file a kill cut short: never staged
            part.unlink()
        self.directory = directory
        """The staged files, each the rows of one interval (``STAGED``)."""
        self.interval = interval
        self.quarantine = quarantine
        self.rows_removed = rows_removed
        self._connection = connection
        self._encoded: Encoded = {}
        """The last staged file's string columns (most come back the same, cycle after
        cycle)."""
        self.unstaged: dict[str, list[Any]] = {name: [] for name in STAGE_TYPES}
        """Rows not staged yet, by column: the current cycle's, and those of cycles whose
        staging failed (at most ``PENDING_ROWS_MAX``)."""

    def add(self, rows: Sequence[UsageRow]) -> None:
        """Take one cycle's rows, to stage; rows kept since staging failed are dropped (and
        counted) past ``PENDING_ROWS_MAX``."""
        cols = self.unstaged
        if len(cols["win"]) > PENDING_ROWS_MAX:
            self.rows_removed[GPU_USAGE.name, "unstaged"] += len(cols["win"])
            cols = self.unstaged = {name: [] for name in STAGE_TYPES}
        if rows:  # column by column, each in one pass at C speed where it can be
            devices = list(map(attrgetter("device"), rows))
            owners = list(map(attrgetter("owner"), rows))
            fields = list(map(attrgetter("fields"), devices))
            cols["win"] += [t - t % self.interval for t in map(attrgetter("start"), rows)]
            cols["pod_uid"] += map(getattr, owners, repeat("uid"), repeat(""))
            for col, attr in _STAGE_OF_DEVICE.items():
                cols[col] += map(attrgetter(attr), devices)
            for col, attr in _STAGE_OF_OWNER.items():
                cols[col] += map(getattr, owners, repeat(attr), repeat(None))
            for col, attr in _STAGE_OF_ROW.items():
                cols[col] += map(attrgetter(attr), rows)
            for col, field in FIELDS.items():
                cols[col] += map(dict.get, fields, repeat(field))
            cols["idle_energy"] += [
                None if r.joules is None else r.joules if d.state == "allocated"
                and d.utilization is not None and d.utilization < IDLE_GR else 0.0
                for r, d in zip(rows, devices, strict=True)]
            cols["last_xid"] += map(int, map(dict.get, fields, repeat(XID), repeat(0)))
            cols["clock_event_reasons"] += [
                None if r is None else int(r)
                for r in map(dict.get, fields, repeat(CLOCK_REASONS))]

    def stage(self) -> None:
        """Write the rows not staged yet to a file per interval (on disk before it is
        named, so a staged file is always whole)."""
        cols = self.unstaged
        rest: dict[str, list[Any]]
        while wins := cols["win"]:
            win = wins[0]
            if wins.count(win) == len(wins):  # one interval, unless staging failed before
                batch, rest = cols, {name: [] for name in STAGE_TYPES}
            else:
                mine = [w == win for w in wins]
                others = [not m for m in mine]
                batch = {name: list(compress(values, mine)) for name, values in cols.items()}
                rest = {name: list(compress(values, others)) for name, values in cols.items()}
            self._stage_file(win, batch)
            self.unstaged = cols = rest  # staged once: never again

    def _stage_file(self, win: float, batch: Mapping[str, Sequence[Any]]) -> None:
        """One interval's rows as a staged file, named once it is whole on disk."""
        name = self.directory / STAGED.format(win=float(win), serial=time.time_ns())
        part = name.with_suffix(".part")
        try:
            write_parquet(str(part), batch, STAGE_TYPES, self._encoded)
            fd = os.open(part, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            part.replace(name)
        except BaseException:
            part.unlink(missing_ok=True)
            raise

    def staged(self) -> dict[float, list[Path]]:
        """The staged files by the interval of their rows; any other file in the staging
        directory (a name that gives no interval, a stray) is set aside."""
        out: dict[float, list[Path]] = defaultdict(list)
        for f in self.directory.iterdir():
            if f.name == QUARANTINE or f.suffix == ".part":
                continue
            if not (f.name.startswith("usage-") and f.name.endswith(".parquet")):
                self.quarantine.put(f, "stray", "not a staged file")
                continue
            try:
                win = float(f.name.split("-")[1])
            except ValueError:
                self.quarantine.put(f, "name", "its name gives no interval")
                continue
            if not math.isfinite(win):
                self.quarantine.put(f, "name", "its name gives no interval")
                continue
            out[win].append(f)
        return out

    def unusable(self, files: Sequence[str]) -> list[tuple[str, QuarantineReason, str]]:
        """The staged files among ``files`` DuckDB cannot read as staged rows, each with
        why: their Parquet metadata first (a file that is not Parquet or is cut short, one
        without the staged columns), then, when each of those reads, every value of each
        (a damaged page). Only called once a write of them failed."""
        con = self._connection()
        bad: list[tuple[str, QuarantineReason, str]] = []
        for f in files:
            try:
                names = {name for (name,) in con.execute(
                    f"SELECT name FROM parquet_schema({duck.quote(f)})").fetchall()}
            except NOT_THE_FILE:
                raise
            except duckdb.Error as exc:
                bad.append((f, "unreadable", " ".join(str(exc).split())))
                continue
            if missing := _STAGED_KEYS - names:
                bad.append((f, "foreign", f"no column {', '.join(sorted(missing))}"))
        if bad:
            return bad
        for f in files:
            try:
                con.execute(f"SELECT max(COLUMNS(*)) FROM read_parquet({duck.quote(f)})"
                            ).fetchall()
            except NOT_THE_FILE:
                raise
            except duckdb.Error as exc:
                bad.append((f, "unreadable", " ".join(str(exc).split())))
        return bad
