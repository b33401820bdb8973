"""A real BigQuery API: the local-bigquery emulator in a child process, on loopback."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import duckdb
import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import bigquery

from exporter.config import BigQuery
from exporter.google.bigquery_emulator import PROJECT, Emulator


@pytest.fixture(scope="session")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    with Emulator(tmp_path_factory.mktemp("bigquery")) as bq:
        yield bq


def client_for(em: Emulator) -> bigquery.Client:
    return bigquery.Client(project=PROJECT, credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
                           client_options={"api_endpoint": em.url})


@pytest.fixture(scope="session")
def bq(emulator: Emulator) -> Iterator[bigquery.Client]:
    client = client_for(emulator)
    yield client
    client.close()


def sink_config(em: Emulator, **overrides: object) -> BigQuery:
    """A fresh dataset per use, so tests do not see each other's rows."""
    return BigQuery.model_validate({
        "enabled": True, "project": PROJECT, "dataset": f"t_{uuid.uuid4().hex[:12]}",
        "endpoint": em.url, "anonymous": True, "deadline": 5, "request_timeout": 5,
        "flush_interval": 0.5} | overrides)


def rows_of(client: bigquery.Client, cfg: BigQuery, table: str, partition: str,
            columns: str = "*") -> list[dict[str, object]]:
    sql = (f"SELECT {columns} FROM `{cfg.project}.{cfg.dataset}.{table}` "
           f"WHERE {partition} IS NOT NULL ORDER BY id")
    return [dict(r.items()) for r in client.query_and_wait(sql)]


def duck_rows(con: duckdb.DuckDBPyConnection, table: str,
              columns: str = "*") -> list[dict[str, object]]:
    cur = con.execute(f"SELECT {columns} FROM {table} ORDER BY id")
    names = [d[0] for d in cur.description or []]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
