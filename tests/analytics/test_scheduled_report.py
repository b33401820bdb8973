"""The weekly report made by the running exporter: on its schedule, from a Parquet snapshot
of the warehouse it holds, in a child process, once per week across restarts."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pandas as pd
import pytest
import yaml

from analytics.report import build
from analytics.store import DuckDBStore, ParquetStore
from analytics.week import parse_week, reads
from analytics.workspace import Table
from exporter.config import load_config
from exporter.errors import ConfigError
from exporter.model.prices import load_price_book
from exporter.runtime.app import scheduled_report
from exporter.runtime.scheduled_report import (
    RETRY_SECONDS,
    TIMEOUT_SECONDS,
    Schedule,
    ScheduledReport,
    read_outcome,
)
from exporter.sinks.warehouse import Warehouse
from tests.analytics.conftest import HOSTILE, PASSWORD, W46, Inbox
from tests.timing import limit

W47 = parse_week("2026-W47")


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC) if "+" not in text else \
        datetime.fromisoformat(text)


@pytest.mark.parametrize(("schedule", "zone", "after", "expected"), [
    ("mon 07:00", "UTC", "2026-11-23T00:00", "2026-11-23T07:00"),
    ("mon 07:00", "UTC", "2026-11-23T07:00", "2026-11-23T07:00"),     # at the moment itself
    ("mon 07:00", "UTC", "2026-11-23T07:01", "2026-11-30T07:00"),
    ("Monday 7:30", "UTC", "2026-11-21T12:00", "2026-11-23T07:30"),
    ("fri 18:00", "UTC", "2026-11-23T00:00", "2026-11-27T18:00"),
    ("sun 23:59", "UTC", "2026-11-23T00:00", "2026-11-29T23:59"),
    ("mon 07:00", "Europe/Paris", "2026-11-23T00:00", "2026-11-23T06:00"),   # CET, UTC+1
    ("mon 07:00", "Europe/Paris", "2026-06-01T00:00", "2026-06-01T05:00"),   # CEST, UTC+2
    ("mon 07:00", "America/New_York", "2026-11-23T00:00", "2026-11-23T12:00"),
    ("mon 07:00", "Asia/Tokyo", "2026-11-23T00:00", "2026-11-29T22:00"),     # Monday there
])
def test_schedule_next_moment(schedule: str, zone: str, after: str, expected: str) -> None:
    assert Schedule.parse(schedule, zone).first_at_or_after(utc(after)) == utc(expected)


@pytest.mark.parametrize(("now", "due"), [
    ("2026-11-23T06:59", None),                # W47 ended, its moment not yet come
    ("2026-11-23T07:00", "2026-W47"),
    ("2026-11-26T12:00", "2026-W47"),          # later that week: still W47 (once)
    ("2026-11-30T06:00", None),         # W48 not yet due; the turn of W47 is over
    ("2026-11-30T07:00", "2026-W48"),
])
def test_the_due_week(now: str, due: str | None) -> None:
    week = Schedule.parse("mon 07:00").due(utc(now))
    assert (week.label if week else None) == due


def _frame(table: pd.DataFrame | Table) -> pd.DataFrame:
    return table.frame() if isinstance(table, Table) else table


def test_a_snapshot_reports_what_the_warehouse_does(small_warehouse: Path,
                                                    tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    shutil.copy(small_warehouse, path)
    wh = Warehouse(path, "c", interval=3600.0)
    wh.snapshot(reads(W47), tmp_path / "snap")
    wh.close()
    prices = load_price_book(None, "us-central1").prices
    full, snap = DuckDBStore(path), ParquetStore(tmp_path / "snap")
    for team in (None, HOSTILE):
        a = build(full, W47, prices, 0.995, "c", team=team)
        b = build(snap, W47, prices, 0.995, "c", team=team)
        known = {k for k, v in a.headline.items() if v is not None}
        assert {k for k, v in b.headline.items() if v is not None} == known
        assert {k: b.headline[k] for k in known} == pytest.approx(
            {k: a.headline[k] for k in known}, rel=1e-12)  # sums in another order
        assert (a.headline["cost_usd"] or 0) > 0
        assert a.tables.keys() == b.tables.keys()
        for name in a.tables:
            pd.testing.assert_frame_equal(_frame(a.tables[name]), _frame(b.tables[name]),
                                          rtol=1e-12, obj=name)
    full.close()
    snap.close()


def _job(path: Path, config_file: Path, tmp_path: Path, **kw: object) -> ScheduledReport:
    wh = Warehouse(path, "c", interval=3600.0)
    return ScheduledReport(wh, Schedule.parse("mon 07:00"), tmp_path / "reports",
                           str(config_file), email=True, **kw)  # type: ignore[arg-type]


def _config(tmp_path: Path, port: int, ca_file: Path) -> Path:
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump({"cluster": "c", "report": {
        "sender": "gpu-reports@example.com", "platform_recipients": ["platform@example.com"],
        "team_recipients": {"alpha": ["alpha-lead@example.com"]},
        "smtp": {"host": "127.0.0.1", "port": port, "username": "reports",
                 "ca_file": str(ca_file)}}}))
    return file


async def test_the_week_is_reported_and_mailed_once_across_restarts(
        small_warehouse: Path, tmp_path: Path, smtp_server: tuple[Inbox, int, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    inbox, port, ca_file = smtp_server
    monkeypatch.setenv("GKE_GPU_EXPORTER_REPORT__SMTP__PASSWORD", PASSWORD)
    path = tmp_path / "w.duckdb"
    shutil.copy(small_warehouse, path)
    config_file = _config(tmp_path, port, ca_file)
    job = _job(path, config_file, tmp_path)
    before = W47.end.timestamp() + 6 * 3600       # Monday 06:00: not yet
    assert job.maybe_run(before) is None
    task = job.maybe_run(before + 3600)           # 07:00
    assert task is not None and job.running
    assert job.maybe_run(before + 3660) is None   # one at a time
    await asyncio.wait_for(task, limit(120))
    out = tmp_path / "reports" / "2026-W47"
    assert job.stats.runs == {"ok": 1, "failed": 0, "thin": 0}, \
        (out / "report.log").read_text()
    assert job.stats.coverage is not None and job.stats.coverage[0] == "2026-W47"
    assert 0.5 <= job.stats.coverage[1] <= 1.0
    assert (out / "report" / "report.html").exists()
    assert not (out / "snapshot").exists()       # the snapshot goes once the report is made
    rcpts = sorted(r for to, _ in inbox.messages for r in to)
    assert rcpts == ["alpha-lead@example.com", "platform@example.com"]
    assert "2026-W47" in str(inbox.messages[0][1]["Subject"])
    assert job.maybe_run(before + 7200) is None   # made: not again
    job.warehouse.close()
    restarted = _job(path, config_file, tmp_path)
    assert restarted.maybe_run(before + 86400) is None
    restarted.warehouse.close()
    assert len(inbox.messages) == 2


async def test_a_failed_report_is_shown_and_retried(small_warehouse: Path,
                                                    tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    shutil.copy(small_warehouse, path)
    config_file = tmp_path / "config.yaml"
    config_file.write_text("cluster: c\n")
    failing = (sys.executable, "-c", "import sys; print('no SMTP server'); sys.exit(3)")
    job = _job(path, config_file, tmp_path, command=failing)
    now = W47.end.timestamp() + 8 * 3600
    task = job.maybe_run(now)
    assert task is not None
    await asyncio.wait_for(task, limit(60))
    # during the fault: counted, not recorded, its output kept, no retry before the delay
    assert job.stats.runs == {"ok": 0, "failed": 1, "thin": 0}
    assert job.stats.last_success is None and job.stats.coverage is None
    assert not job.warehouse.report_done("2026-W47")
    assert "no SMTP server" in (tmp_path / "reports" / "2026-W47" / "report.log").read_text()
    assert job.maybe_run(now + 60) is None
    # the fault mended: the next attempt makes it
    job.command = (sys.executable, "-m", "exporter")
    job.email = False
    task = job.maybe_run(now + RETRY_SECONDS)
    assert task is not None
    await asyncio.wait_for(task, limit(120))
    assert job.stats.runs == {"ok": 1, "failed": 1, "thin": 0}
    assert job.stats.last_success is not None
    assert job.warehouse.report_done("2026-W47")
    job.warehouse.close()


@pytest.mark.parametrize(("week", "kept_days", "covered"), [
    ("2026-W48", 7, (0.0, 0.0)),          # no data at all
    ("2026-W47", 2, (2 / 7 - 0.01, 2 / 7 + 0.01)),   # two days of seven, below 50 %
], ids=["empty", "below min_coverage"])
async def test_a_thin_week_is_reported_thin_once_not_retried(
        small_warehouse: Path, tmp_path: Path, week: str, kept_days: int,
        covered: tuple[float, float]) -> None:
    path = tmp_path / "w.duckdb"
    shutil.copy(small_warehouse, path)
    with duckdb.connect(str(path)) as con:   # the exporter was down the rest of the week
        for (table,) in con.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_type = "
                "'BASE TABLE' AND table_name LIKE 'gpu_usage_%'").fetchall():
            con.execute(f"DELETE FROM {table} WHERE time >= ?",
                        [W47.start + timedelta(days=kept_days)])
    config_file = tmp_path / "config.yaml"
    config_file.write_text("cluster: c\nreport: {min_coverage: 0.5}\n")
    job = _job(path, config_file, tmp_path)
    job.email = False
    now = parse_week(week).end.timestamp() + 8 * 3600
    task = job.maybe_run(now)
    assert task is not None
    await asyncio.wait_for(task, limit(120))
    log = (tmp_path / "reports" / week / "report.log").read_text()
    assert job.stats.runs == {"ok": 0, "failed": 0, "thin": 1}, log
    assert "min_coverage" in log or "no data" in log
    assert job.stats.coverage is not None and job.stats.coverage[0] == week
    assert covered[0] <= job.stats.coverage[1] <= covered[1]
    assert job.stats.last_success is None            # nothing was made
    assert not (tmp_path / "reports" / week / "report").exists()
    assert (tmp_path / "reports" / week / "snapshot").is_dir()   # kept for --force
    assert job.warehouse.report_done(week)           # recorded once: not again
    assert job.maybe_run(now + RETRY_SECONDS) is None
    assert job.maybe_run(now + 3 * RETRY_SECONDS) is None
    job.warehouse.close()


async def test_a_hung_child_is_killed_after_the_timeout(small_warehouse: Path,
                                                        tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    shutil.copy(small_warehouse, path)
    config_file = tmp_path / "config.yaml"
    config_file.write_text("cluster: c\n")
    hung = (sys.executable, "-c", "import time; print('stuck', flush=True); time.sleep(600)")
    job = _job(path, config_file, tmp_path, command=hung, timeout=1.0)
    now = W47.end.timestamp() + 8 * 3600
    began = time.monotonic()
    task = job.maybe_run(now)
    assert task is not None
    await asyncio.wait_for(task, limit(60))
    assert time.monotonic() - began < 30
    assert job.stats.runs == {"ok": 0, "failed": 1, "thin": 0}
    assert not job.warehouse.report_done("2026-W47")
    assert "stuck" in (tmp_path / "reports" / "2026-W47" / "report.log").read_text()
    assert job.maybe_run(now + 60) is None and job.maybe_run(now + RETRY_SECONDS) is not None
    await job.stop()
    job.warehouse.close()


@pytest.mark.parametrize(("value", "seconds"), [
    (None, TIMEOUT_SECONDS), ("45m", 2700.0), (90, 90.0), ("1h30m", 5400.0),
    (0, None), ("-5m", None), ("soon", None), (True, None)])
def test_the_report_timeout_is_a_duration(tmp_path: Path, value: object,
                                          seconds: float | None) -> None:
    file = tmp_path / "config.yaml"
    report: dict[str, object] = {"schedule": "mon 07:00"}
    if value is not None:
        report["timeout"] = value
    file.write_text(yaml.safe_dump({"cluster": "c", "report": report,
                                    "warehouse": {"path": str(tmp_path / "w.duckdb")}}))
    if seconds is None:
        with pytest.raises(ConfigError, match=r"report\.timeout"):
            load_config(str(file))
        return
    cfg = load_config(str(file))
    assert cfg.report.timeout == seconds
    wh = Warehouse(tmp_path / "w.duckdb", "c", interval=3600.0)
    job = scheduled_report(cfg, wh, str(file))
    assert job is not None and job.timeout == seconds
    wh.close()


@pytest.mark.parametrize(("text", "expected"), [
    ('{"week": "2026-W47", "outcome": "thin", "coverage": 0.1}', ("thin", 0.1)),
    ('{"week": "2026-W47", "outcome": "ok", "coverage": 1}', ("ok", 1.0)),
    ('{"week": "2026-W46", "outcome": "thin", "coverage": 0.1}', None),   # another week's
    ('{"week": "2026-W47", "outcome": "mailed", "coverage": 0.1}', None),
    ('{"week": "2026-W47", "outcome": "thin"}', None),
    ('{"week": "2026-W47", "outcome": "thin", "coverage": "x"}', None),
    ("[1, 2]", None), ("not json", None), (None, None)])
def test_the_childs_outcome_is_read_strictly(tmp_path: Path, text: str | None,
                                             expected: tuple[str, float] | None) -> None:
    file = tmp_path / "outcome.json"
    if text is not None:
        file.write_text(text)
    assert read_outcome(file, "2026-W47") == expected


def test_a_locked_warehouse_is_one_line_of_advice(small_warehouse: Path,
                                                  tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    shutil.copy(small_warehouse, path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, duckdb; c = duckdb.connect(sys.argv[1]); "
         "print('open', flush=True); sys.stdin.read()", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        done = subprocess.run(
            [sys.executable, "-m", "exporter", "report", "weekly", "--week", "2026-W47",
             "--store", f"duckdb:{path}", "--out", str(tmp_path / "out")],
            capture_output=True, text=True, timeout=limit(60))
    finally:
        holder.communicate("")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith(f"error: the warehouse {path} is open in another process "
                               f"(PID {holder.pid}")
    assert "report.schedule" in lines[0]


def test_the_week_reads_cover_the_report(small_warehouse: Path) -> None:
    """Everything before W46 is outside the snapshot, and the report of W47 needs W46."""
    start, end = reads(W47)["gpu_usage"]
    assert start.timestamp() == W46 and end == W47.end
