"""BigQuery: the warehouse tables, copied from the outbox with each row's effect once.

A sender thread (BigQuery's client blocks; the event loop never waits on it) takes the
oldest rows of the outbox, a table at a time and in order, and streams them with
``insertAll``, each row's deterministic id as its ``insertId``. Rows leave the outbox only
once BigQuery has answered for them, so an outage, a restart or a SIGKILL loses nothing.
Retried requests are deduplicated by BigQuery on the insertIds; and whenever the outcome
of an earlier attempt is unknown (after a failure, and after every start) the sender first
asks BigQuery which of the batch's ids it already has, so nothing is written twice however
long the outage was. Rows BigQuery refuses are counted and logged with their ids; the rest
of their batch is written.

Tables are created when missing: day-partitioned on their event time with a required
partition filter, clustered as ``exporter.sinks.schema`` says.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from google.api_core import retry as api_retry
from google.auth.credentials import AnonymousCredentials
from google.cloud import bigquery

from exporter.backoff import Backoff
from exporter.config import BigQuery as BigQueryConfig
from exporter.logs import ctx
from exporter.metrics.health import BigQueryStats
from exporter.sinks.outbox import Batch, Outbox
from exporter.sinks.schema import BY_NAME, TABLES, Table

log = logging.getLogger(__name__)

MAX_LOGGED_ROWS = 5
"""Refused rows named in the log line of one batch (all of them are counted)."""


def make_client(cfg: BigQueryConfig) -> bigquery.Client:
    """A client with Application Default Credentials (Workload Identity on GKE), or none
    for the emulator."""
    return bigquery.Client(
        project=cfg.project, location=cfg.location,
        credentials=AnonymousCredentials() if cfg.anonymous else None,  # type: ignore[no-untyped-call]
        client_options={"api_endpoint": cfg.endpoint} if cfg.endpoint else None)


def table_definition(table: Table, ref: str) -> bigquery.Table:
    """The BigQuery table for one schema table."""
    t = bigquery.Table(ref, schema=[
        bigquery.SchemaField(c.name, c.type, mode="REQUIRED" if c.required else "NULLABLE",
                             description=c.description) for c in table.columns])
    t.description = table.description
    t.time_partitioning = bigquery.TimePartitioning(
        type_=bigquery.TimePartitioningType.DAY, field=table.partition_by)
    t.require_partition_filter = True
    t.clustering_fields = list(table.cluster_by)
    return t


class _Stopping(Exception):
    """The exporter is shutting down: stop retrying."""


class BigQuerySink:
    def __init__(self, cfg: BigQueryConfig, outbox: Outbox,
                 client: bigquery.Client | None = None) -> None:
        self.cfg = cfg
        self.stats = BigQueryStats()
        self._outbox = outbox
        self._client = client
        self._tables_ready = False
        self._uncertain = True
        """Whether rows of the outbox may already be in BigQuery (an attempt whose answer
        was lost; a previous run killed between sending and forgetting them)."""
        self._draining = threading.Lock()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._retry = api_retry.Retry(
            predicate=api_retry.if_transient_error, initial=0.5,
            maximum=min(30.0, cfg.deadline), multiplier=2.0, timeout=cfg.deadline,
            on_error=self._abort_when_stopping)
        """Within one attempt: transient errors retried with backoff until the deadline."""

    @property
    def dataset_ref(self) -> str:
        return f"{self.cfg.project}.{self.cfg.dataset}"

    def ref(self, table: str) -> str:
        return f"{self.dataset_ref}.{table}"

    # ------------------------------------------------------------------ the thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="bigquery-sender", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """New rows are in the outbox: send them now rather than at the next interval."""
        self._wake.set()

    def stop(self, timeout: float) -> None:
        """One last drain, then stop; what is not sent within ``timeout`` stays spooled."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("bigquery sender still busy at shutdown; unsent rows stay "
                            "in the spool", extra=ctx(dataset=self.cfg.dataset))

    def _loop(self) -> None:
        backoff = Backoff(base=1.0, cap=max(1.0, self.cfg.flush_interval))
        while True:
            ok = self.drain()
            if self._stopping.is_set():
                return
            if ok:
                backoff.reset()
            self._wake.wait(self.cfg.flush_interval if ok else backoff.next())
            self._wake.clear()

    def _abort_when_stopping(self, _: Exception) -> None:
        if self._stopping.is_set():
            raise _Stopping

    # ------------------------------------------------------------------ sending

    def drain(self) -> bool:
        """Send every waiting row, oldest first. True when the outbox is empty; False when
        BigQuery failed (the rows stay for the next attempt). Blocks: not for the loop."""
        with self._draining:
            return self._drain()

    def _drain(self) -> bool:
        try:
            self._trim()
            if self._client is None:
                self._client = make_client(self.cfg)
            if not self._tables_ready:
                self.ensure_tables()
            while (batch := self._outbox.oldest(self.cfg.batch_size)) is not None:
                self._send(batch)
        except Exception as exc:  # unreachable, refused, credentials: try again later
            self._uncertain = True
            self.stats.errors += 1
            self.stats.last_error = f"{type(exc).__name__}: {exc}"[:500]
            if self.stats.up or self.stats.errors == 1:
                log.warning("bigquery write failed; rows stay in the spool",
                            extra=ctx(dataset=self.cfg.dataset, error=self.stats.last_error))
            self.stats.up = False
            return False
        finally:
            self.stats.spool_rows, self.stats.spool_bytes = self._outbox.size()
        if not self.stats.up and self.stats.errors:
            log.info("bigquery writes resumed", extra=ctx(dataset=self.cfg.dataset))
        self.stats.up = True
        self.stats.last_success = time.time()
        return True

    def ensure_tables(self) -> None:
        """Create the dataset and tables that are missing, and add to existing tables the
        columns a later release added (as NULLABLE columns: BigQuery's one schema change
        that needs no rewrite)."""
        assert self._client is not None
        dataset = bigquery.Dataset(self.dataset_ref)
        dataset.location = self.cfg.location
        self._client.create_dataset(dataset, exists_ok=True, retry=self._retry,
                                    timeout=self.cfg.request_timeout)
        for table in TABLES:
            made = self._client.create_table(table_definition(table, self.ref(table.name)),
                                             exists_ok=True, retry=self._retry,
                                             timeout=self.cfg.request_timeout)
            have = {f.name for f in made.schema}
            missing = [f for f in table_definition(table, self.ref(table.name)).schema
                       if f.name not in have]
            if missing:
                made.schema = [*made.schema, *missing]
                self._client.update_table(made, ["schema"], retry=self._retry,
                                          timeout=self.cfg.request_timeout)
                log.info("bigquery table columns added", extra=ctx(
                    table=table.name, columns=",".join(f.name for f in missing)))
        self._tables_ready = True

    def _trim(self) -> None:
        for table, n in self._outbox.trim(self.cfg.spool_max_bytes).items():
            self.stats.spool_dropped[table] += n
            log.error("bigquery spool full: oldest rows dropped",
                      extra=ctx(table=table, rows=n, max_bytes=self.cfg.spool_max_bytes))

    def _send(self, batch: Batch) -> None:
        assert self._client is not None
        table = BY_NAME[batch.table]
        ids, rows = batch.ids, batch.rows
        if self._uncertain:
            present = self._present(table, batch)
            if present:
                self.stats.rows_already_present[table.name] += len(present)
                keep = [i for i, row_id in enumerate(ids) if row_id not in present]
                ids, rows = [ids[i] for i in keep], [rows[i] for i in keep]
        errors: Sequence[dict[str, Any]] = []
        if rows:
            errors = self._client.insert_rows_json(
                self.ref(table.name), rows, row_ids=ids, skip_invalid_rows=True,
                retry=self._retry, timeout=self.cfg.request_timeout)
        refused = {int(e["index"]): e.get("errors", []) for e in errors}
        if refused:
            self.stats.rows_rejected[table.name] += len(refused)
            log.warning("bigquery refused rows", extra=ctx(
                table=table.name, rows=len(refused),
                examples=[{"id": ids[i], "errors": [f"{x.get('location', '')}: "
                                                    f"{x.get('message', '')}" for x in errs]}
                          for i, errs in list(refused.items())[:MAX_LOGGED_ROWS]]))
        self.stats.rows_written[table.name] += len(rows) - len(refused)
        self._outbox.remove(batch.seqs)
        self._uncertain = False

    def _present(self, table: Table, batch: Batch) -> set[str]:
        """Which of the batch's ids BigQuery already holds."""
        assert self._client is not None
        sql = (f"SELECT id FROM `{self.ref(table.name)}` "
               f"WHERE {table.partition_by} BETWEEN @first AND @last AND id IN UNNEST(@ids)")
        config = bigquery.QueryJobConfig(query_parameters=[
            bigquery.ScalarQueryParameter("first", "TIMESTAMP", batch.first),
            bigquery.ScalarQueryParameter("last", "TIMESTAMP", batch.last),
            bigquery.ArrayQueryParameter("ids", "STRING", batch.ids)])
        rows = self._client.query_and_wait(sql, job_config=config, retry=self._retry,
                                           job_retry=None,  # type: ignore[arg-type]
                                           api_timeout=self.cfg.request_timeout,
                                           wait_timeout=self.cfg.deadline)
        return {row["id"] for row in rows}
