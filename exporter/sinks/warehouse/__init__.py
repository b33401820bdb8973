"""The local warehouse: DuckDB tables ``gpu_usage``, ``gpu_pods``, ``availability_events``
and, on a cluster with Kueue, ``kueue_quotas`` and ``kueue_workloads``.

``gpu_usage`` has one row per device, owner and warehouse interval (default 60 s):
GPU-seconds, cost and time-weighted means of the DCGM readings. Each cycle's rows are
staged as the cycle ends, one Parquet file per interval in the directory beside the
database (``<file>.staging``: a kill loses at most the cycle under way), and aggregated in
SQL once their interval is complete; the files go once their rows are written. Staged as
rows of a table in the database, they were inserted and deleted again every interval: at
8,000 GPUs that cost 25-30 ms of a cycle's CPU and nearly tripled the write-ahead log (4.9
MiB a cycle, 1.8 MiB without). A file made when staging was a table (``usage_staging``)
has its staged rows moved to files as it opens. A file the warehouse cannot use (a staged
file that does not read, a stray, a write-ahead log DuckDB dropped) is set aside in the
staging directory's ``quarantine`` folder, counted and logged once, and the writes go on.
Every row has a deterministic id (a hash of cluster, interval, device, pod and state) and a
write skips the ids already there, so a restart or a retried flush never double-counts. The
tables have no key: DuckDB holds a key's index in memory, and it would grow with the table
past the connection's small memory limit.

``gpu_usage`` is a view over one table per UTC day (``gpu_usage_raw_20261109``) and one of
hourly rows (``HOURLY``). A write goes to its day's table and looks only at the intervals it
writes, so neither it nor DuckDB's checkpoint after it grows with the months behind it; the
small ``gpu_pods`` and ``availability_events`` are looked up by the ids written. A file
made when ``gpu_usage`` was one keyed table opens with the keys dropped and that table as
``HOURLY``. ``gpu_pods`` keeps the latest state of each GPU pod, ``kueue_workloads`` of
each Workload; ``availability_events`` one row per incident.

Hourly, the retention rolls ``gpu_usage`` rows older than ``raw_retention`` up to one row per
hour in ``HOURLY`` (how each column combines is declared in ``schema``), dropping each day's
table once it is rolled up, and deletes rows older than ``retention``. ``snapshot`` copies
what a week's report reads to Parquet, and ``report_runs`` records the weeks whose scheduled
report is made (``scheduled_report``).

Batches reach DuckDB as a file that a statement reads, written next to the database and
deleted once read: each cycle's usage rows as Parquet, the few other rows as CSV
(``batch_files``). Statements take no bound parameters, their values written into them as
literals: DuckDB's Python client imports pandas (and pyarrow) to bind parameters or to scan
Python data, some 100 MiB the exporter does without.

The parts, each in its module, all on the one connection ``Warehouse`` holds:

- ``facade``: ``Warehouse``, the connection, its lock, and when to flush, checkpoint,
  reopen and maintain;
- ``staging``: the staged Parquet files, the order a flush writes them in, the quarantine;
- ``tables``: the daily and hourly tables of ``gpu_usage`` and the view over them;
- ``writes``: staged intervals and batches into the tables (and the outbox);
- ``changes``: the pods', incidents', quotas' and Workloads' rows until a flush writes them;
- ``migrations``: the chain that brings a file of any earlier release up to date;
- ``retention``: the roll-up of old days into ``HOURLY`` and the expiry;
- ``resume``: the state a restarted exporter goes on from (device inventory, open incidents,
  month-to-date team costs);
- ``reports``: the weeks reported and the snapshot a week's report reads.
"""

from exporter.sinks.warehouse.facade import Warehouse
from exporter.sinks.warehouse.migrations import MIGRATIONS
from exporter.sinks.warehouse.resume import ResumeStore
from exporter.sinks.warehouse.retention import MAINTENANCE_INTERVAL
from exporter.sinks.warehouse.staging import QUARANTINE
from exporter.sinks.warehouse.tables import CURRENT_PODS_VIEW, HOURLY, raw_table

__all__ = ["CURRENT_PODS_VIEW", "HOURLY", "MAINTENANCE_INTERVAL", "MIGRATIONS", "QUARANTINE",
           "ResumeStore", "Warehouse", "raw_table"]
