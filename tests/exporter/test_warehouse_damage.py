"""Damaged state is set aside, not repeated: a staged file the warehouse cannot use is moved
to the quarantine folder, counted and logged once, and the writes go on; a write-ahead log
DuckDB drops is kept aside and logged with what was lost."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from exporter import duck
from exporter.metrics.health import QUARANTINE_REASONS, QuarantineReason
from exporter.sinks.warehouse import QUARANTINE, Warehouse
from tests.exporter.test_warehouse import count, rows

Damage = Callable[[Path], Path]
"""The staging directory -> the damaged or stray file made in it."""


def _garbage(staging: Path) -> Path:
    path = staging / "usage-0.0-1.parquet"
    path.write_bytes(b"\x00not parquet at all\n" * 64)
    return path


def _copy_of_a_staged_file(staging: Path, name: str, cut: Callable[[bytes], bytes]) -> Path:
    """A real staged file of interval 0 (from a warehouse of its own), cut by ``cut``."""
    other = Warehouse(staging.parent / "other.duckdb", "c", interval=60.0)
    other.add_usage(rows(0.0) + rows(30.0))
    (made,) = other.staging.directory.glob("usage-*.parquet")
    data = made.read_bytes()
    other.close()
    path = staging / name
    path.write_bytes(cut(data))
    return path


def _truncated(staging: Path) -> Path:
    return _copy_of_a_staged_file(staging, "usage-0.0-2.parquet", lambda d: d[:len(d) // 2])


def _damaged_page(staging: Path) -> Path:
    """Whole metadata, a page overwritten: only reading its values finds it."""
    def scribble(data: bytes) -> bytes:
        return data[:4] + b"\xab" * 300 + data[304:]
    return _copy_of_a_staged_file(staging, "usage-0.0-3.parquet", scribble)


def _foreign(staging: Path) -> Path:
    path = staging / "usage-0.0-4.parquet"
    con = duck.connect()
    con.execute(f"COPY (SELECT 1 AS other) TO {duck.quote(str(path))} (FORMAT parquet)")
    con.close()
    return path


def _no_interval(staging: Path) -> Path:
    path = staging / "usage-garbage.parquet"
    path.write_bytes(b"stray")
    return path


def _stray(staging: Path) -> Path:
    path = staging / "notes.txt"
    path.write_text("left here by hand\n")
    return path


DAMAGE: dict[str, tuple[Damage, QuarantineReason]] = {
    "garbage bytes": (_garbage, "unreadable"),
    "truncated Parquet": (_truncated, "unreadable"),
    "a damaged page": (_damaged_page, "unreadable"),
    "Parquet of other columns": (_foreign, "foreign"),
    "a staged name without an interval": (_no_interval, "name"),
    "a stray file of another name": (_stray, "stray"),
}


def quarantined(path: Path) -> list[str]:
    folder = path.with_name(path.name + ".staging") / QUARANTINE
    return sorted(f.name for f in folder.iterdir()) if folder.exists() else []


@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_staged_file_is_set_aside_and_the_writes_go_on(
        case: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    damage, reason = DAMAGE[case]
    path = tmp_path / "w.duckdb"
    wh = Warehouse(path, "c", interval=60.0)
    bad = damage(wh.staging.directory)
    wh.add_usage(rows(0.0))
    wh.add_usage(rows(30.0))
    with caplog.at_level(logging.WARNING, logger="exporter.sinks.warehouse"):
        wh.maybe_flush(90.0)               # [0, 60) is complete, the damaged file's too
    # during: the good file of the same interval is written, the bad one is set aside
    assert count(wh) == (1, 60.0)
    assert not bad.exists() and quarantined(path) == [bad.name]
    assert wh.quarantined == {r: int(r == reason) for r in QUARANTINE_REASONS}
    (line,) = [r for r in caplog.records if r.getMessage() == "warehouse file quarantined"]
    assert line.ctx["file"] == str(bad) and line.ctx["reason"] == reason  # type: ignore[attr-defined]
    caplog.clear()
    # after: the next flushes write, and the file is neither read nor logged again
    for t in (60.0, 90.0, 120.0):
        wh.add_usage(rows(t))
    wh.maybe_flush(150.0)
    assert count(wh) == (2, 120.0)
    assert wh.quarantined[reason] == 1 and not caplog.records
    wh.close()


def test_a_damaged_file_left_at_a_restart_is_set_aside_by_the_next_run(tmp_path: Path) -> None:
    """The damage outlives the process: the next run's first flush sets it aside."""
    path = tmp_path / "w.duckdb"
    first = Warehouse(path, "c", interval=60.0)
    first.add_usage(rows(0.0))
    first.flush(30.0)                      # stays staged: its interval is not complete
    first.close()
    _garbage(path.with_name(path.name + ".staging"))
    second = Warehouse(path, "c", interval=60.0)
    second.add_usage(rows(30.0))
    second.flush(60.0)
    assert count(second) == (1, 60.0)
    assert second.quarantined["unreadable"] == 1 and len(quarantined(path)) == 1
    second.close()


def test_only_the_damaged_file_of_several_intervals_and_days_is_set_aside(
        tmp_path: Path) -> None:
    path = tmp_path / "w.duckdb"
    wh = Warehouse(path, "c", interval=60.0)
    day = 86400.0
    for t in (0.0, 30.0, 60.0, 90.0, day, day + 30.0):
        wh.add_usage(rows(t))
    _garbage(wh.staging.directory).rename(wh.staging.directory / "usage-60.0-1.parquet")
    wh.flush(day + 60.0)
    assert count(wh) == (3, 180.0)
    assert quarantined(path) == ["usage-60.0-1.parquet"]
    wh.close()


def _kill_after_a_write(path: Path) -> None:
    """At ``path``, a file as a kill leaves it: one interval checkpointed, a second only in
    the write-ahead log (copied while another warehouse has them open)."""
    wh = Warehouse(path.with_name("running.duckdb"), "c", interval=60.0)
    for t in (0.0, 30.0):
        wh.add_usage(rows(t))
    wh.maybe_flush(60.0)                   # the first write checkpoints the file
    for t in (60.0, 90.0):
        wh.add_usage(rows(t))
    wh.flush(120.0)                        # in the log only
    shutil.copyfile(wh.path, path)
    shutil.copyfile(f"{wh.path}.wal", f"{path}.wal")
    wh.close()
    assert Path(f"{path}.wal").stat().st_size > 0


def test_a_write_ahead_log_replayed_is_not_reported(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "w.duckdb"
    _kill_after_a_write(path)
    with caplog.at_level(logging.WARNING, logger="exporter.sinks.warehouse"):
        wh = Warehouse(path, "c", interval=60.0)
    assert count(wh) == (2, 120.0)         # both intervals: the log was replayed
    assert wh.quarantined["wal"] == 0 and not caplog.records and not quarantined(path)
    wh.close()


@pytest.mark.parametrize("damage", [lambda d: b"\x00garbage" * 100, lambda d: d[:-20]],
                         ids=["garbage", "cut short"])
def test_a_write_ahead_log_dropped_is_kept_aside_and_logged(
        damage: Callable[[bytes], bytes], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "w.duckdb"
    _kill_after_a_write(path)
    log = Path(f"{path}.wal")
    log.write_bytes(damage(log.read_bytes()))
    size = log.stat().st_size
    with caplog.at_level(logging.WARNING, logger="exporter.sinks.warehouse"):
        wh = Warehouse(path, "c", interval=60.0)
    assert count(wh) == (1, 60.0)          # what the log held is lost ...
    assert wh.quarantined["wal"] == 1      # ... but said, and a copy kept
    (line,) = [r for r in caplog.records if r.getMessage() == "warehouse file quarantined"]
    fields = line.ctx  # type: ignore[attr-defined]
    assert fields["reason"] == "wal" and f"({size} bytes)" in fields["error"]
    assert quarantined(path) == ["w.duckdb.wal"]
    assert (path.with_name("w.duckdb.staging") / QUARANTINE / "w.duckdb.wal").stat().st_size \
        == size
    json.dumps(fields)                     # a structured log line
    for t in (120.0, 150.0):               # and the warehouse goes on
        wh.add_usage(rows(t))
    wh.flush(180.0)
    assert count(wh) == (2, 120.0)
    wh.close()
