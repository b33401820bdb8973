"""The BigQuery sink against a real BigQuery API: every row once, through outages."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from google.cloud import bigquery

from exporter.google.bigquery_emulator import Emulator
from exporter.model.pending import FreeRow, PendingRow, PoolFree
from exporter.model.records import ClusterQueueInfo, FlavorQuota
from exporter.sinks.bigquery import BigQuerySink
from exporter.sinks.schema import GPU_USAGE, TABLES
from exporter.sinks.warehouse import Warehouse
from tests.bigquery.conftest import client_for, duck_rows, rows_of, sink_config
from tests.exporter.test_compute import pod
from tests.exporter.test_wait_rows import waiting
from tests.exporter.test_warehouse import rows, workload


def warehouse_with_rows(path: Path, minutes: int = 3) -> Warehouse:
    wh = Warehouse(path, "c", interval=60.0, outbox=True)
    for i in range(minutes * 2):
        wh.add_usage(rows(i * 30.0))
    wh.add_pods([pod()], 60.0, lambda p: "team-x")
    wh.add_event("n1", "pool", "GPU-1", "xid", 10.0, 70.0)
    wh.add_quotas([ClusterQueueInfo("research", "ml", {"h100": FlavorQuota(8, 4, 6, 0)}, 1, 2)],
                  60.0)
    wh.add_workloads([workload("a"), workload("b", admitted=150.0)], 60.0, lambda w: "team-x",
                     lambda w: "research", complete=True)
    free = PoolFree("a100", "nvidia-tesla-a100", "on-demand", "us-central1-b",
                    {"fragment": 3.0}, {"fragment": 9.0}, units=3, largest=2)
    wh.add_waits([PendingRow(30.0, 60.0, waiting())], [FreeRow(30.0, 60.0, free, "fragment")])
    wh.flush(minutes * 60.0)
    return wh


def usage_count(client: bigquery.Client, sink: BigQuerySink) -> int:
    return len(rows_of(client, sink.cfg, "gpu_usage", "time", "id"))


def test_tables_are_created_partitioned_and_clustered(emulator: Emulator,
                                                      bq: bigquery.Client,
                                                      tmp_path: Path) -> None:
    wh = Warehouse(tmp_path / "w.duckdb", "c", 60.0, outbox=True)
    sink = BigQuerySink(sink_config(emulator), wh.open_outbox())
    assert sink.drain()
    for table in TABLES:
        t = bq.get_table(sink.ref(table.name))
        assert [f.name for f in t.schema] == table.names
        assert t.time_partitioning.field == table.partition_by
        assert t.time_partitioning.type_ == "DAY"
        assert t.require_partition_filter is True
        assert t.clustering_fields == list(table.cluster_by)
    with pytest.raises(Exception, match="filter"):
        bq.query_and_wait(f"SELECT count(*) FROM `{sink.ref('gpu_usage')}`")


def test_tables_made_by_an_earlier_release_gain_the_new_columns(
        emulator: Emulator, bq: bigquery.Client, tmp_path: Path) -> None:
    """A dataset whose tables lack the columns a later release added (``allocation``)
    gets them, last and nullable, and takes the new rows; its rows are kept."""
    from exporter.sinks.bigquery import table_definition

    cfg = sink_config(emulator)
    bq.create_dataset(f"{cfg.project}.{cfg.dataset}")
    for table in TABLES:
        old = table_definition(table, f"{cfg.project}.{cfg.dataset}.{table.name}")
        if "allocation" in table.names:   # the release before it and the Kueue columns
            old.schema = old.schema[:table.names.index("allocation")]
        bq.create_table(old)
    wh = warehouse_with_rows(tmp_path / "w.duckdb")
    sink = BigQuerySink(cfg, wh.open_outbox())
    assert sink.drain()
    for table in TABLES:
        assert [f.name for f in bq.get_table(sink.ref(table.name)).schema] == table.names
        assert rows_of(bq, cfg, table.name, table.partition_by) == duck_rows(wh.con, table.name)


def test_bigquery_rows_equal_duckdb_rows(emulator: Emulator, bq: bigquery.Client,
                                         tmp_path: Path) -> None:
    wh = warehouse_with_rows(tmp_path / "w.duckdb")
    sink = BigQuerySink(sink_config(emulator), wh.open_outbox())
    assert sink.drain()
    assert sink.stats.spool_rows == 0
    for table in TABLES:
        local = duck_rows(wh.con, table.name)
        remote = rows_of(bq, sink.cfg, table.name, table.partition_by)
        assert remote == local and local, table.name
        assert sink.stats.rows_written[table.name] == len(local)


def test_a_batch_sent_again_adds_nothing(emulator: Emulator, bq: bigquery.Client,
                                         tmp_path: Path) -> None:
    wh = warehouse_with_rows(tmp_path / "w.duckdb")
    saved = wh.con.execute("SELECT * FROM outbox").fetchall()
    cfg = sink_config(emulator)
    first = BigQuerySink(cfg, wh.open_outbox())
    assert first.drain()
    n = usage_count(bq, first)
    # the answer was lost: the same rows are in the outbox again, and sent again
    wh.con.executemany("INSERT INTO outbox VALUES (?, ?, ?, ?, ?)", saved)
    again = BigQuerySink(cfg, wh.open_outbox())      # a restart: outcome unknown
    assert again.drain()
    assert usage_count(bq, again) == n
    assert again.stats.rows_already_present["gpu_usage"] == n
    wh.con.executemany("INSERT INTO outbox VALUES (?, ?, ?, ?, ?)", saved)
    first._uncertain = False                         # a plain retry: insertIds dedupe it
    assert first.drain()
    assert usage_count(bq, first) == n


def test_emulator_down_then_back_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    em = Emulator(tmp_path / "bq")
    em.start()
    try:
        path = tmp_path / "w.duckdb"
        wh = Warehouse(path, "c", interval=60.0, outbox=True)
        sink = BigQuerySink(sink_config(em, deadline=1), wh.open_outbox())
        t = 0.0
        for _ in range(4):
            wh.add_usage(rows(t))
            t += 30.0
        wh.flush(t)
        assert sink.drain()
        em.stop(kill=True)                            # BigQuery goes away mid-run
        for _ in range(6):
            wh.add_usage(rows(t))
            t += 30.0
            wh.flush(t)
            sink.drain()
        assert not sink.drain()
        assert sink.stats.spool_rows == 3 and not sink.stats.up and sink.stats.errors >= 1
        em.start()                                    # and comes back, data intact
        assert sink.drain()
        assert sink.stats.up and sink.stats.spool_rows == 0
        client = client_for(em)
        local = duck_rows(wh.con, "gpu_usage")
        assert rows_of(client, sink.cfg, "gpu_usage", "time") == local
        assert len(local) == 5
    finally:
        em.stop()


def test_a_bad_row_is_counted_and_the_rest_written(emulator: Emulator, bq: bigquery.Client,
                                                   tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    wh = warehouse_with_rows(tmp_path / "w.duckdb")
    wh.con.execute("""INSERT INTO outbox (tbl, id, part, row) VALUES ('gpu_usage', 'bad-row',
        TIMESTAMPTZ '1970-01-01 00:00:00+00',
        '{"id": "bad-row", "time": "1970-01-01 00:00:00+00", "interval_seconds": 60,
          "cluster": "c", "device_id": "d", "state": "allocated", "gpu_seconds": "lots"}')""")
    sink = BigQuerySink(sink_config(emulator), wh.open_outbox())
    with caplog.at_level(logging.WARNING):
        assert sink.drain()
    assert sink.stats.rows_rejected == {"gpu_usage": 1}
    assert sink.stats.rows_written["gpu_usage"] == 3
    assert usage_count(bq, sink) == 3
    assert "bad-row" in str([getattr(r, "ctx", "") for r in caplog.records])


def test_a_full_spool_drops_the_oldest_rows_and_counts_them(emulator: Emulator,
                                                            tmp_path: Path) -> None:
    wh = warehouse_with_rows(tmp_path / "w.duckdb", minutes=10)
    size = [len(r) for (r,) in wh.con.execute(
        "SELECT row FROM outbox ORDER BY seq DESC").fetchall()]
    keep = 4
    sink = BigQuerySink(sink_config(emulator, endpoint="http://127.0.0.1:9",
                                    deadline=0.5), wh.open_outbox())
    sink.cfg = sink.cfg.model_copy(update={"spool_max_bytes": sum(size[:keep])})
    assert not sink.drain()
    assert sink.stats.spool_rows == keep
    assert sum(sink.stats.spool_dropped.values()) == len(size) - keep
    # the oldest went: the newest usage intervals and the pod and event rows are kept
    left = wh.con.execute("SELECT tbl FROM outbox ORDER BY seq").fetchall()
    assert len(left) == keep


def test_usage_schema_is_what_bigquery_returns(emulator: Emulator, bq: bigquery.Client,
                                               tmp_path: Path) -> None:
    wh = warehouse_with_rows(tmp_path / "w.duckdb")
    sink = BigQuerySink(sink_config(emulator), wh.open_outbox())
    assert sink.drain()
    df = bq.query_and_wait(f"SELECT * FROM `{sink.ref('gpu_usage')}` WHERE time IS NOT NULL"
                           ).to_arrow(create_bqstorage_client=False).to_pandas()
    assert list(df.columns) == GPU_USAGE.names and len(df) == 3
