"""The resume state: what the running exporter saves as it goes and reads back as it starts,
to go on counting after a restart — every device DCGM has shown, the incidents still open
(a restart in an outage neither ends it nor loses it) and each team's month-to-date
cost."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import duckdb

from exporter.model.compute import DeviceIdentity
from exporter.sinks.batch_files import literal
from exporter.sinks.warehouse.writes import csv_batch

STATE_DDL = (
    """CREATE TABLE IF NOT EXISTS device_inventory (
        cluster VARCHAR NOT NULL, node VARCHAR NOT NULL, device_id VARCHAR NOT NULL,
        gpu_uuid VARCHAR NOT NULL, gpu_index VARCHAR, mig_profile VARCHAR)""",
    """CREATE TABLE IF NOT EXISTS open_incidents (
        cluster VARCHAR NOT NULL, gpu_uuid VARCHAR NOT NULL, reason VARCHAR NOT NULL,
        start_time DOUBLE NOT NULL, node VARCHAR, node_pool VARCHAR)""",
)
"""The tables of the device inventory and of the open incidents."""

Incidents = Mapping[tuple[str, str], tuple[float, str, str]]
"""(GPU UUID, reason) -> (start, node, pool) of each GPU now unavailable."""

_INVENTORY_TYPES = dict.fromkeys(
    ("cluster", "node", "device_id", "gpu_uuid", "gpu_index", "mig_profile"), "VARCHAR")
_INCIDENTS_TYPES = {"cluster": "VARCHAR", "gpu_uuid": "VARCHAR", "reason": "VARCHAR",
                    "start_time": "DOUBLE", "node": "VARCHAR", "node_pool": "VARCHAR"}


class ResumeStore:
    """The cluster's resume state, in the warehouse's file. ``save`` holds ``lock``, as
    every write to the file does."""

    def __init__(self, connection: Callable[[], duckdb.DuckDBPyConnection],
                 lock: threading.RLock, cluster: str, database: Path) -> None:
        self._connection = connection
        self._lock = lock
        self.cluster = cluster
        self._database = database
        for ddl in STATE_DDL:
            connection().execute(ddl)
        self._saved: tuple[object, object] | None = None
        """The state last saved or loaded (``save`` writes only changes)."""

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        return self._connection()

    def team_month_costs(self) -> dict[tuple[str, str], float]:
        """Each team's cost of allocated GPUs by UTC calendar month (``"2026-11"``), over
        the latest two months the warehouse holds: a restarted exporter's month-to-date
        spend goes on from them."""
        c = literal(self.cluster)
        return {(month, team): float(cost) for month, team, cost in self.con.execute(f"""
            SELECT strftime(time, '%Y-%m') AS month, COALESCE(team, ''), SUM(cost_usd)
            FROM gpu_usage
            WHERE cluster = {c} AND state = 'allocated' AND cost_usd IS NOT NULL
              AND time >= (SELECT date_trunc('month', max(time)) - INTERVAL 1 MONTH
                           FROM gpu_usage WHERE cluster = {c})
            GROUP BY ALL""").fetchall()}

    def load(self) -> tuple[dict[str, dict[str, DeviceIdentity]],
                            dict[tuple[str, str], tuple[float, str, str]]]:
        """The device inventory and open incidents the last run saved."""
        inventory: dict[str, dict[str, DeviceIdentity]] = {}
        for node, device_id, uuid, index, mig in self.con.execute(
                "SELECT node, device_id, gpu_uuid, gpu_index, mig_profile FROM "
                f"device_inventory WHERE cluster = {literal(self.cluster)} "
                "ORDER BY node, device_id").fetchall():
            inventory.setdefault(node, {})[device_id] = DeviceIdentity(uuid, device_id, index,
                                                                       mig)
        incidents = {(uuid, reason): (start, node, pool) for uuid, reason, start, node, pool
                     in self.con.execute(
                         "SELECT gpu_uuid, reason, start_time, node, node_pool FROM "
                         f"open_incidents WHERE cluster = {literal(self.cluster)}").fetchall()}
        self._saved = (inventory, incidents)
        return inventory, dict(incidents)

    def save(self, inventory: Mapping[str, Mapping[str, DeviceIdentity]],
             incidents: Incidents) -> None:
        """Replace the saved inventory and open incidents, when they changed (one
        transaction, right away: it must hold at a SIGKILL)."""
        with self._lock:
            if self._saved == (inventory, incidents):
                return
            devices = [(self.cluster, node, d.device_id, d.gpu_uuid, d.gpu_index,
                        d.mig_profile)
                       for node, devs in inventory.items() for d in devs.values()]
            open_ = [(self.cluster, uuid, reason, float(start), node, pool)
                     for (uuid, reason), (start, node, pool) in incidents.items()]
            cur = self.con.cursor()
            try:
                cur.execute("BEGIN")
                for table, rows, types in (("device_inventory", devices, _INVENTORY_TYPES),
                                           ("open_incidents", open_, _INCIDENTS_TYPES)):
                    cur.execute(f"DELETE FROM {table} WHERE cluster = "
                                f"{literal(self.cluster)}")
                    if rows:
                        with csv_batch(self._database, rows, types) as source:
                            cur.execute(f"INSERT INTO {table} SELECT * FROM {source}")
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            finally:
                cur.close()
            self._saved = ({n: dict(d) for n, d in inventory.items()}, dict(incidents))
