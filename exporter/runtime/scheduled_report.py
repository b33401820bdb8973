"""The weekly report on a schedule, made by the running exporter from the warehouse it owns.

DuckDB lets one process open the warehouse file, and the exporter holds it. So when a week's
report is due (``report.schedule``, e.g. ``mon 07:00`` in ``report.timezone``: the first
such moment after the ISO week ends, Monday 00:00 UTC) the exporter copies what that report
reads (``analytics.week.reads``) to Parquet on a cursor of its own, in a thread, and runs
``gke-gpu-exporter report weekly --store parquet:DIR`` as a short-lived child process: the
report stack (pandas, matplotlib, Jinja) never loads into the long-running service.

Each week is reported once: the week goes into the warehouse's ``report_runs`` table when its
child exits 0, so a restart neither repeats nor skips it. A week the warehouse covers less
than ``report.min_coverage`` of is *thin*: the child says so (``--outcome``), and the week is
recorded as reported, counted ``thin`` with its coverage, and not tried again, since its past
hours will not fill in. Any other failed attempt (its output is in ``report.log`` beside the
report) is retried after ``RETRY_SECONDS``; a child that runs longer than
``report.timeout`` is killed and counted failed. Only the week just ended is reported; an
exporter that was down for longer does not catch up on older weeks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from analytics.week import Week, last_complete_week, reads
from exporter.logs import ctx
from exporter.metrics.health import ReportStats
from exporter.sinks.warehouse import Warehouse

log = logging.getLogger(__name__)

RETRY_SECONDS = 3600.0
TIMEOUT_SECONDS = 1800.0
"""Longest a report's child process may take, unless ``report.timeout`` says otherwise."""
_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@dataclass(frozen=True, slots=True)
class Schedule:
    """A weekday and a time of day in a time zone."""

    weekday: int
    """0 = Monday."""
    hour: int
    minute: int
    zone: ZoneInfo

    @classmethod
    def parse(cls, text: str, zone: str = "UTC") -> Schedule:
        """``mon 07:00``, ``Monday 7:30``: the form ``report.schedule`` validates."""
        day, _, hhmm = text.strip().partition(" ")
        hour, _, minute = hhmm.strip().partition(":")
        return cls(_DAYS.index(day[:3].lower()), int(hour), int(minute), ZoneInfo(zone))

    def first_at_or_after(self, t: datetime) -> datetime:
        """The first scheduled moment at or after ``t`` (in UTC)."""
        local = t.astimezone(self.zone)
        day = local.date() + timedelta(days=(self.weekday - local.weekday()) % 7)
        moment = datetime(day.year, day.month, day.day, self.hour, self.minute,
                          tzinfo=self.zone)
        if moment < local:  # earlier today: a week later
            moment += timedelta(days=7)
        return moment.astimezone(UTC)

    def due(self, now: datetime) -> Week | None:
        """The week whose report is due at ``now``: the last complete week, once its
        scheduled moment has come."""
        week = last_complete_week(now)
        return week if now >= self.first_at_or_after(week.end) else None


class ScheduledReport:
    """Call ``maybe_run(now)`` every cycle; a due week's report starts in the background."""

    def __init__(self, warehouse: Warehouse, schedule: Schedule, directory: Path,
                 config_file: str | None, email: bool,
                 command: tuple[str, ...] = (sys.executable, "-m", "exporter"),
                 timeout: float = TIMEOUT_SECONDS) -> None:
        self.warehouse = warehouse
        self.schedule = schedule
        self.directory = directory
        self.config_file = config_file
        """The child reads the same config file (and inherits the environment)."""
        self.email = email
        self.command = command
        self.timeout = timeout
        self.stats = ReportStats()
        self._task: asyncio.Task[None] | None = None
        self._retry_at = 0.0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def maybe_run(self, now: float) -> asyncio.Task[None] | None:
        """Start the due week's report unless it is made, running, or waiting to retry."""
        if self.running or now < self._retry_at:
            return None
        week = self.schedule.due(datetime.fromtimestamp(now, UTC))
        if week is None or self.warehouse.report_done(week.label):
            return None
        self._task = asyncio.create_task(self._run(week, now))
        return self._task

    async def _run(self, week: Week, now: float) -> None:
        out = self.directory / week.label
        snapshot = out / "snapshot"
        log.info("weekly report started", extra=ctx(week=week.label, directory=str(out)))
        outcome = out / "outcome.json"
        try:
            await asyncio.to_thread(self.warehouse.snapshot, reads(week), snapshot)
            outcome.unlink(missing_ok=True)
            code = await self._child(week, snapshot, out, outcome)
        except Exception as exc:  # the service goes on; the next attempt may succeed
            log.error("weekly report failed", extra=ctx(week=week.label, error=str(exc)))
            code = -1
        said = read_outcome(outcome, week.label) if code >= 0 else None
        if code != 0 and (said is None or said[0] != "thin"):
            self.stats.runs["failed"] += 1
            self._retry_at = now + RETRY_SECONDS
            return
        self.warehouse.record_report(week.label, time.time(), out)
        if said is not None:
            self.stats.coverage = (week.label, said[1])
        if code != 0:  # thin: reported as such, once; the snapshot kept for --force
            self.stats.runs["thin"] += 1
            log.warning("weekly report not made: thin week", extra=ctx(
                week=week.label, coverage=round(said[1], 4) if said else None,
                log=str(out / "report.log"), snapshot=str(snapshot)))
            return
        shutil.rmtree(snapshot, ignore_errors=True)
        self.stats.runs["ok"] += 1
        self.stats.last_success = time.time()
        log.info("weekly report made", extra=ctx(week=week.label, directory=str(out),
                                                 mailed=self.email))

    async def _child(self, week: Week, snapshot: Path, out: Path, outcome: Path) -> int:
        args = [*self.command, "report", "weekly", "--store", f"parquet:{snapshot}",
                "--week", week.label, "--out", str(out / "report"), "--outcome", str(outcome)]
        if self.config_file:
            args += ["--config", self.config_file]
        if self.email:
            args.append("--email")
        logfile = out / "report.log"
        with logfile.open("ab") as output:
            proc = await asyncio.create_subprocess_exec(
                *args, stdin=asyncio.subprocess.DEVNULL, stdout=output,
                stderr=asyncio.subprocess.STDOUT)
            try:
                async with asyncio.timeout(self.timeout):
                    code = await proc.wait()
            except TimeoutError:
                code = -1
                log.error("weekly report timed out", extra=ctx(
                    week=week.label, timeout_seconds=self.timeout, log=str(logfile)))
            finally:
                if proc.returncode is None:  # timed out, or the exporter is stopping
                    proc.kill()
                    with contextlib.suppress(ProcessLookupError):
                        await proc.wait()
        if code > 0:
            log.error("weekly report failed", extra=ctx(week=week.label, exit_code=code,
                                                         log=str(logfile)))
        return code

    async def stop(self) -> None:
        """Stop a report in progress (it is made again after a restart)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def read_outcome(path: Path, week: str) -> tuple[str, float] | None:
    """What ``report weekly --outcome`` wrote of ``week``: ``ok`` or ``thin``, and the
    share of its hours covered; None when it wrote nothing readable (the child failed
    before, or is not this release's)."""
    try:
        said = json.loads(path.read_text())
        if said["week"] == week and said["outcome"] in ("ok", "thin"):
            return str(said["outcome"]), float(said["coverage"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None
