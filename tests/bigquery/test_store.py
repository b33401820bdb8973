"""The analytics read path: one SQL text, parameterised, on DuckDB and on BigQuery."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
from google.cloud import bigquery

from analytics import rollups
from analytics.store import BigQueryStore, DuckDBStore
from exporter.google.bigquery_emulator import Emulator
from exporter.model import compute
from exporter.sinks.bigquery import BigQuerySink
from exporter.sinks.warehouse import Warehouse
from tests.bigquery.conftest import sink_config
from tests.exporter.test_compute import PRICE, node, reading

HOSTILE = "x'); DROP TABLE gpu_usage; --"
T0 = 1_794_787_200.0  # 2026-11-16T00:00:00Z


def usage_rows(start: float) -> list[compute.UsageRow]:
    owners = {("ns", "a"): compute.Owner("uid-a", "ns", "a", "alpha", "w"),
              ("ns", "b"): compute.Owner("uid-b", "ns", "b", HOSTILE, "w")}
    readings = {"n1": [reading(pods=("a",), DCGM_FI_PROF_GR_ENGINE_ACTIVE=0.5),
                       reading("GPU-other", pods=("b",), DCGM_FI_PROF_GR_ENGINE_ACTIVE=0.25)]}
    states = compute.device_states({"n1": node()}, readings, frozenset(), {}, owners, PRICE,
                                   {})
    return compute.usage_rows(states, start, 1800.0)


@pytest.fixture(scope="module")
def stores(emulator: Emulator, bq: bigquery.Client,
           tmp_path_factory: pytest.TempPathFactory) -> tuple[DuckDBStore, BigQueryStore]:
    path = tmp_path_factory.mktemp("store") / "w.duckdb"
    wh = Warehouse(path, "c", interval=1800.0, outbox=True)
    for i in range(8):  # four hours of half-hour intervals, two GPUs
        wh.add_usage(usage_rows(T0 + i * 1800.0))
    wh.flush(T0 + 8 * 1800.0)
    cfg = sink_config(emulator)
    assert BigQuerySink(cfg, wh.open_outbox()).drain()
    wh.close()
    return DuckDBStore(path), BigQueryStore(bq, f"{cfg.project}.{cfg.dataset}")


START, END = datetime(2026, 11, 16, tzinfo=UTC), datetime(2026, 11, 17, tzinfo=UTC)


def normal(df: pd.DataFrame) -> list[tuple[object, ...]]:
    out = []
    for row in df.itertuples(index=False):
        out.append(tuple(round(v, 9) if isinstance(v, float) else
                         pd.Timestamp(v).tz_convert("UTC") if isinstance(v, pd.Timestamp)
                         else v for v in row))
    return out


@pytest.mark.parametrize(("grain", "by"), [("hour", ("team",)), ("day", ("team", "gpu_model")),
                                           ("day", ())])
def test_rollups_agree_on_duckdb_and_bigquery(stores: tuple[DuckDBStore, BigQueryStore],
                                              grain: str, by: tuple[str, ...]) -> None:
    duck, big = (rollups.usage(s, START, END, grain, by) for s in stores)
    assert list(duck.columns) == list(big.columns)
    assert normal(duck) == normal(big) and len(duck) > 0


def test_rollup_figures(stores: tuple[DuckDBStore, BigQueryStore]) -> None:
    for store in stores:
        df = rollups.usage(store, START, END, "day", ("team",)).set_index("team")
        alpha = df.loc["alpha"]
        assert alpha.gpu_hours == pytest.approx(4.0)          # one GPU for four hours
        assert alpha.utilization == pytest.approx(0.5)
        assert alpha.cost_usd == pytest.approx(4 * 0.7)
        assert alpha.effective_cost_usd_per_utilized_hour == pytest.approx(1.4)
        assert df.loc[HOSTILE].utilization == pytest.approx(0.25)


def test_a_hostile_value_is_a_value(stores: tuple[DuckDBStore, BigQueryStore]) -> None:
    for store in stores:
        hit = rollups.usage(store, START, END, "day", ("team",), team=HOSTILE)
        assert list(hit.team) == [HOSTILE]                     # matched exactly, as data
        miss = rollups.usage(store, START, END, "day", ("team",), team="alpha' OR '1'='1")
        assert miss.empty
        # the table is still there
        assert not rollups.usage(store, START, END, "day", ("team",)).empty


@pytest.mark.parametrize("bad", [{"by": ("team; DROP TABLE gpu_usage",)},
                                 {"grain": "week'"}, {"by": ("id",)}])
def test_identifiers_come_from_a_list(stores: tuple[DuckDBStore, BigQueryStore],
                                      bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"must be one of|cannot group"):
        rollups.usage(stores[0], START, END, **bad)  # type: ignore[arg-type]


def test_unknown_table_is_refused(stores: tuple[DuckDBStore, BigQueryStore]) -> None:
    with pytest.raises(ValueError, match="unknown warehouse table"):
        stores[0].query("SELECT * FROM {secrets}")


def test_hostile_dataset_name_fails_config_validation(tmp_path: Path) -> None:
    from exporter.config import load_config
    from exporter.errors import ConfigError

    with pytest.raises(ConfigError, match="dataset"):
        load_config(None, {"warehouse": {"bigquery": {
            "enabled": True, "project": "my-project", "dataset": "gpu`; DROP SCHEMA x; --"}}})
    with pytest.raises(ConfigError, match="project"):
        load_config(None, {"warehouse": {"bigquery": {"enabled": True, "project": "a`b"}}})
