"""The ``gke-gpu-exporter`` command line."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from exporter import __version__
from exporter.logs import LEVELS, configure, ctx, set_level
from exporter.model.durations import parse_duration
from exporter.runtime.lifecycle import Stopped, stop_on_signals, wait_for_shutdown

if TYPE_CHECKING:
    import pandas as pd
    from google.cloud import bigquery

    from analytics.reconcile import Bill
    from analytics.report import WeeklyReport
    from analytics.store import Store
    from analytics.week import Week
    from analytics.weekly import Replays
    from exporter.config import Config

log = logging.getLogger(__name__)


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _scenario_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", metavar="FILE|NAME",
                   help="scenario YAML, or an embedded one: default (the demo cluster), "
                        "fleet (8-GPU training fleet, for scale), kueue (the default, two "
                        "teams' Jobs queued by Kueue) or europe (H200 and L4 in europe-west1)")
    p.add_argument("--seed", type=int, help="override the scenario's random seed")
    p.add_argument("--nodes", type=int, metavar="N",
                   help="scale the cluster to about N nodes (load scales alike)")


_LOG_LEVEL_HELP = "least severe log level written (default: the config's log_level, else info)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gke-gpu-exporter",
        description="GPU observability and cost analytics for GKE.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--log-level", choices=LEVELS, help=_LOG_LEVEL_HELP)
    sub = parser.add_subparsers(dest="command", required=True)

    sim = sub.add_parser("simulate", help="serve a simulated GKE GPU cluster: dcgm-exporter "
                         "endpoints, the Kubernetes API, a kubeconfig")
    _scenario_args(sim)
    clock = sim.add_mutually_exclusive_group()
    clock.add_argument("--speed", type=float, default=1.0,
                       help="simulated seconds per real second (default 1)")
    clock.add_argument("--manual", action="store_true",
                       help="time moves only through POST /sim/advance?seconds=N")
    clock.add_argument("--wall-clock", action="store_true",
                       help="start at the current time and follow the wall clock")
    sim.add_argument("--warmup", type=_duration, default=0.0, metavar="DURATION",
                     help="simulate this long (e.g. 6h) before serving")
    sim.add_argument("--api-port", type=int, default=0, help="Kubernetes API port (default: free)")
    sim.add_argument("--dcgm-port", type=int, default=9400,
                     help="dcgm-exporter port on every node address (default 9400)")
    sim.add_argument("--out", type=Path, default=Path("sim-out"),
                     help="where to write kubeconfig and targets.txt (default ./sim-out)")
    sim.add_argument("--check", action="store_true",
                     help="validate the scenario, print a summary and exit")

    run = sub.add_parser("run", help="the exporter service: scrape, compute, serve /metrics, "
                         "write the warehouse")
    run.add_argument("--config", metavar="FILE", help="YAML config (settings may also come "
                     "from GKE_GPU_EXPORTER_* environment variables)")
    run.add_argument("--check-config", action="store_true",
                     help="validate the config and price book (exit 1 if invalid), then "
                     "check what start-up needs from this host: Kubernetes credentials, "
                     "the warehouse directory, the listen address and port (exit 2 if "
                     "refused); exit 0 when all is well")
    run.add_argument("--log-level", choices=LEVELS, default=argparse.SUPPRESS,
                     help=_LOG_LEVEL_HELP)

    demo = sub.add_parser("demo", help="the product on a simulated cluster, no cloud needed")
    _scenario_args(demo)
    demo.add_argument("--duration", type=_duration, default=7 * 86400.0, metavar="DURATION",
                      help="how much simulated time to run (default 7d)")
    demo.add_argument("--step", type=_duration, default=300.0, metavar="DURATION",
                      help="simulated time between exporter cycles (default 5m; the "
                           "scenario's DCGM sample period is set to it)")
    demo.add_argument("--out", type=Path, default=Path("demo-out"),
                      help="where to write outputs (default ./demo-out)")
    demo.add_argument("--bigquery-emulator", action="store_true",
                      help="also write the tables to BigQuery: a local emulator (needs "
                           "pip install 'gke-gpu-exporter[emulator]')")
    demo.add_argument("--serve", action="store_true",
                      help="keep /metrics and the cluster up afterwards, in real time: one "
                           "cycle per step (Ctrl-C to stop); writes OUT/prometheus.yml, a "
                           "Prometheus config that scrapes it")
    demo.add_argument("--port", type=int, default=0, metavar="N",
                      help="with --serve, the port of /metrics (default: a free one)")

    report = sub.add_parser("report", help="reports from the warehouse")
    kinds = report.add_subparsers(dest="report", required=True)
    weekly = kinds.add_parser("weekly", help="the weekly cost and bottleneck report, for the "
                              "platform and each team")
    _warehouse_args(weekly)
    weekly.add_argument("--email", action="store_true",
                        help="mail it: the platform report and each team's slice to the "
                             "recipients in the config's report section")
    weekly.add_argument("--email-preview", metavar="DIR", type=Path,
                        help="write each message --email would send, without sending it (no "
                             "SMTP server needed): DIR/email.eml as it would be sent, "
                             "DIR/email.html with its charts beside it for a browser; each "
                             "team's in DIR/teams/<team>/. With no recipients configured, "
                             "the platform report's, addressed to nobody")
    weekly.add_argument("--force", action="store_true",
                        help="write (and mail) it even for a week with data for less than "
                             "report.min_coverage of its hours")
    weekly.add_argument("--config", metavar="FILE", help="YAML config (cluster, SLA target, "
                        "prices, warehouse, report recipients and SMTP)")
    weekly.add_argument("--whatif-budget", type=_duration, metavar="DURATION",
                        help="replay the week on the layout each action implies for this "
                             "long at most (default: the config's report.whatif_budget, "
                             "unset: every action; 0: none)")
    weekly.add_argument("--outcome", metavar="FILE", type=Path,
                        help="also write the outcome as JSON: the week, ok or thin (a week "
                             "refused for its coverage), and the share of its hours covered")
    bill = kinds.add_parser("reconcile", help="the week's GPU cost beside the GPU SKUs of the "
                            "Cloud Billing export, per day and namespace, each gap's likely "
                            "cause")
    billed = bill.add_mutually_exclusive_group(required=True)
    billed.add_argument("--billing-table", metavar="PROJECT.DATASET.TABLE",
                        help="the detailed usage cost export in BigQuery "
                             "(gcp_billing_export_resource_v1_<BILLING_ACCOUNT_ID>), of "
                             "clusters with GKE cost allocation on")
    billed.add_argument("--billing-file", metavar="PATH", type=Path,
                        help="the same export's rows as Parquet (a file, a directory or a "
                             "glob of files), e.g. the demo's sample bill "
                             "demo-out/billing_export.parquet")
    _warehouse_args(bill)
    bill.add_argument("--config", metavar="FILE", help="YAML config (warehouse, BigQuery "
                      "endpoint and credentials)")
    whatif = sub.add_parser(
        "whatif", help="replay a week's jobs on a cluster layout: cost, queue and SLA beside "
        "the week's, with the deltas")
    _warehouse_args(whatif, out="whatif-out")
    whatif.add_argument("--layout", metavar="FILE", type=Path,
                        help="the layout to replay on (YAML; start from the week's own, "
                             "which whatif writes to OUT/layout.yaml). Without it: the week "
                             "on its own layout, to see how faithful a replay is")
    whatif.add_argument("--trace", metavar="FILE", type=Path,
                        help="replay these jobs instead of the week's: a trace whatif wrote "
                             "(trace.csv, edited or not), or a plain pods CSV (created, "
                             "scheduled, deleted, gpus, gpu_model, team, ...); without a "
                             "warehouse it needs --layout")
    whatif.add_argument("--recorded-layout", metavar="FILE", type=Path,
                        help="for a trace without a warehouse: the layout its cluster ran "
                             "on (YAML). The trace is replayed on it first, that replay "
                             "checked against a pods CSV's recorded waits (the fidelity), "
                             "and the changes measured from it")
    whatif.add_argument("--step", type=_duration, default=300.0, metavar="DURATION",
                        help="the week's interval, which its fidelity bounds allow a wait "
                             "to differ by; with --full-loop, the simulated time between the "
                             "exporter's cycles too (default 5m)")
    whatif.add_argument("--full-loop", action="store_true",
                        help="replay through the simulator's HTTP and the exporter, a cycle "
                             "a step (minutes a week), rather than on the engine (seconds)")
    whatif.add_argument("--seed", type=int, default=1,
                        help="seed of the random Spot reclaims (default 1)")
    whatif.add_argument("--duration", type=_duration, default=7 * 86400.0, metavar="DURATION",
                        help="for a pods CSV without --week: how long to replay from the day "
                             "of its first pod (default 7d)")
    whatif.add_argument("--config", metavar="FILE", help="YAML config (prices, discounts, "
                        "warehouse)")
    return parser


def _warehouse_args(p: argparse.ArgumentParser, out: str = "report-out") -> None:
    """The week, the warehouse it is read from, the cluster and where the output goes
    (``out``, by default)."""
    p.add_argument("--week", metavar="YYYY-Www",
                   help="ISO week, e.g. 2026-W47 (default: the last complete week)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--store", metavar="duckdb:PATH|parquet:DIR",
                        help="a DuckDB warehouse (default: warehouse.path of the config), or "
                             "a week's snapshot the running exporter wrote for its scheduled "
                             "report")
    source.add_argument("--bigquery", metavar="PROJECT.DATASET",
                        help="the warehouse in BigQuery (credentials: Application Default "
                             "Credentials; endpoint as in warehouse.bigquery)")
    p.add_argument("--cluster", metavar="NAME",
                   help="this cluster's rows only (default: every cluster the warehouse "
                        "holds, side by side)")
    p.add_argument("--out", type=Path, default=Path(out),
                   help=f"where to write it (default ./{out})")


def _matplotlib_dir() -> None:
    """Give matplotlib a private temporary directory where it cannot write under HOME.

    matplotlib keeps its font cache in ``~/.cache/matplotlib`` and reads its settings from
    ``~/.config/matplotlib``. With a read-only HOME (a container's read-only root file
    system) it falls back to a temporary directory by itself, but logs two warnings every
    time; this is the same fallback, quietly. ``MPLCONFIGDIR``, when set, wins.
    """
    if os.environ.get("MPLCONFIGDIR"):
        return
    try:
        if sys.platform.startswith(("linux", "freebsd")):
            dirs = [Path(os.environ.get(var) or Path.home() / default) / "matplotlib"
                    for var, default in (("XDG_CONFIG_HOME", ".config"),
                                         ("XDG_CACHE_HOME", ".cache"))]
        else:
            dirs = [Path.home() / ".matplotlib"]
    except RuntimeError:  # no HOME, and no home directory in the user database
        dirs = []
    if dirs and all(_writable_dir(d) for d in dirs):
        return
    path = tempfile.mkdtemp(prefix="gke-gpu-exporter-matplotlib-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    os.environ["MPLCONFIGDIR"] = path


def _writable_dir(path: Path) -> bool:
    """Whether ``path`` is a directory this process can write, or could create as one."""
    for p in (path, *path.parents):
        if p.exists():
            return p.is_dir() and os.access(p, os.W_OK | os.X_OK)
    return False


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure(os.environ.get("GKE_GPU_EXPORTER_LOG_FORMAT", "auto"), args.log_level or "info")
    _matplotlib_dir()
    if args.command == "run":
        return _run(args)
    if args.command == "report":
        return _reconcile(args) if args.report == "reconcile" else _report(args)
    if args.command == "whatif":
        return _whatif(args)
    from simulator.command import describe, load, simulate
    from simulator.scenario import ScenarioError

    try:
        scenario = load(args.scenario, args.seed, args.nodes)
    except ScenarioError as exc:
        print(f"error: invalid scenario\n{exc}", file=sys.stderr)
        return 2
    if args.command == "simulate":
        if args.wall_clock:
            now = time.time()
            scenario = scenario.model_copy(update={
                "start": datetime.fromtimestamp(now - now % scenario.step, UTC)})
        if args.check:
            print(describe(scenario))
            return 0
        speed = 0.0 if args.manual else 1.0 if args.wall_clock else args.speed
        return asyncio.run(simulate(scenario, api_port=args.api_port,
                                    dcgm_port=args.dcgm_port, out=args.out,
                                    warmup=args.warmup, speed=speed, until=wait_for_shutdown))
    from exporter.demo import run_demo

    if args.step < 1:
        print("error: --step must be at least 1s", file=sys.stderr)
        return 2
    scenario = scenario.model_copy(update={"step": float(round(args.step))})
    from exporter.errors import ConfigError

    try:
        return asyncio.run(run_demo(scenario, duration=args.duration, out=args.out,
                                    serve_after=args.serve,
                                    bigquery_emulator=args.bigquery_emulator,
                                    replays=_demo_replays, port=args.port))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _one_line(exc: BaseException, first: bool = False) -> str:
    """An exception's message as one line: its lines joined, or (``first``, for a
    library's long messages) only the first."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[0] if first else "; ".join(lines)


def _store(args: argparse.Namespace, cfg: Config) -> Store:
    """The warehouse ``--store`` or ``--bigquery`` names (default: the config's file)."""
    import re

    import duckdb

    from analytics.store import BigQueryStore, DuckDBStore, ParquetStore
    from exporter.config import DATASET_ID, PROJECT_ID
    from exporter.duck import WarehouseLocked
    from exporter.errors import ConfigError
    from exporter.sinks.bigquery import make_client

    if args.bigquery:
        project, _, dataset = args.bigquery.rpartition(".")
        if not re.match(PROJECT_ID, project) or not re.match(DATASET_ID, dataset):
            raise ConfigError(f"--bigquery {args.bigquery!r} is not PROJECT.DATASET")
        bq = cfg.warehouse.bigquery.model_copy(update={"project": project, "dataset": dataset})
        client = make_client(bq)
        _dataset_exists(client, project, dataset)
        return BigQueryStore(client, f"{project}.{dataset}")
    spec = args.store or f"duckdb:{cfg.warehouse.path}"
    kind, _, location = spec.partition(":")
    if kind not in ("duckdb", "parquet") or not location:
        raise ConfigError(f"--store {spec!r}: expected duckdb:PATH or parquet:DIR")
    path = Path(location)
    if not path.exists():
        raise ConfigError(f"no warehouse at {path}; {_held(path)}")
    try:
        return DuckDBStore(path) if kind == "duckdb" else ParquetStore(path)
    except WarehouseLocked:
        raise
    except duckdb.Error as exc:
        raise ConfigError(f"--store {spec}: not a {kind} warehouse: "
                          f"{_one_line(exc, True)}") from None


def _held(path: Path) -> str:
    """What the directory of a missing ``path`` holds that could be a warehouse."""
    where = path.parent
    if not where.is_dir():
        return f"no directory {where}"
    found = sorted(p.name + ("/" if p.is_dir() else "") for p in where.iterdir()
                   if p.suffix == ".duckdb" or (p.is_dir() and any(p.glob("*.parquet"))))
    return f"{where}/ holds {', '.join(found)}" if found else f"{where}/ holds no warehouse"


def _dataset_exists(client: bigquery.Client, project: str, dataset: str) -> None:
    """Raise ``ConfigError`` naming the project's datasets when ``dataset`` is not one."""
    from google.api_core.exceptions import NotFound

    from exporter.errors import ConfigError

    try:
        client.get_dataset(f"{project}.{dataset}", timeout=60)
    except NotFound:
        held = sorted(d.dataset_id for d in client.list_datasets(project, timeout=60))
        raise ConfigError(f"no dataset {dataset!r} in project {project}; it has: "
                          f"{', '.join(held) if held else 'no dataset'}") from None


def _bill(args: argparse.Namespace, cfg: Config) -> Bill:
    """The bill ``--billing-file`` or ``--billing-table`` names, checked to be there."""
    from analytics import reconcile
    from exporter.sinks.bigquery import make_client

    if args.billing_file is not None:
        return reconcile.BillingFile(args.billing_file)
    project = reconcile.table_id(args.billing_table).split(".", 1)[0]
    bill = reconcile.BillingExport(
        make_client(cfg.warehouse.bigquery.model_copy(update={"project": project})),
        args.billing_table)
    bill.check()
    return bill


def _google_errors() -> tuple[type[BaseException], ...]:
    """Google's client errors (credentials, API), caught where the command line talks to
    BigQuery; none when the client library is not installed."""
    try:
        from google.api_core.exceptions import GoogleAPIError
        from google.auth.exceptions import GoogleAuthError
    except ImportError:
        return ()
    return (GoogleAPIError, GoogleAuthError)


def _reconcile(args: argparse.Namespace) -> int:
    from analytics import holdings, reconcile
    from analytics.week import last_complete_week, parse_week
    from exporter.config import load_config
    from exporter.duck import WarehouseLocked
    from exporter.errors import ConfigError
    from exporter.model.prices import load_price_book

    google = _google_errors()
    try:
        cfg = load_config(args.config)
        week = parse_week(args.week) if args.week else last_complete_week(datetime.now(UTC))
        store = _store(args, cfg)
        problem = holdings.unknown_cluster(store, args.cluster)
        if problem:
            raise ConfigError(problem)
        bill = _bill(args, cfg)
    except (WarehouseLocked, ConfigError, ValueError) as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except google as exc:
        print(f"error: {_google_problem(exc)}", file=sys.stderr)
        return 2
    empty = holdings.empty_week(store, week, args.cluster)
    if empty:
        print(f"error: {empty}", file=sys.stderr)
        return 1
    bound = reconcile.cost_bound(
        load_price_book(cfg.prices.book, cfg.prices.region).prices)
    try:
        checked = reconcile.check(bill.gpu_lines(week.start, week.end, args.cluster, bound))
        table = reconcile.compare(reconcile.ours(store, week.start, week.end, args.cluster),
                                  checked.lines)
    except reconcile.BillCurrencyError as exc:
        print(f"error: reconciling {week.label}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the bill's or the warehouse's query, with its reason
        print(f"error: reconciling {week.label}: {_one_line(exc, True)}", file=sys.stderr)
        return 1
    title = (f"GPU cost against the bill {week.label} — "
             f"{args.cluster or 'every cluster'}")
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "reconcile.csv", index=False, float_format="%.2f")
    (args.out / "reconcile.md").write_text(reconcile.markdown(table, title, checked))
    s = reconcile.summary(table)
    note = checked.note()
    print(f"{title}: the exporter {s['cost_usd']:,.2f} USD, the bill {s['billed_net_usd']:,.2f}"
          f" after {s['credits_usd']:,.2f} of credits, gap {s['gap_usd']:,.2f}; "
          f"{int(s['unreconciled_rows'])} of {len(table)} rows unreconciled"
          f"{'; ' + note if note else ''}. Written to {args.out}/ (reconcile.md, "
          "reconcile.csv)")
    return 0


def _google_problem(exc: BaseException) -> str:
    """A Google client error in one line, credentials named as such."""
    from google.auth.exceptions import GoogleAuthError

    if isinstance(exc, GoogleAuthError):
        return f"no Google credentials for BigQuery: {_one_line(exc, True)}"
    return f"BigQuery: {_one_line(exc, True)}"


def _report(args: argparse.Namespace) -> int:

    from tqdm import tqdm

    from analytics import holdings
    from analytics.mail import MailError
    from analytics.week import last_complete_week, parse_week
    from analytics.weekly import ThinWeek, run_weekly
    from exporter.config import load_config
    from exporter.duck import WarehouseLocked
    from exporter.errors import ConfigError
    from exporter.model.prices import load_price_book

    google = _google_errors()
    try:
        cfg = load_config(args.config)
        book = load_price_book(cfg.prices.book, cfg.prices.region)
        week = parse_week(args.week) if args.week else last_complete_week(datetime.now(UTC))
        store = _store(args, cfg)
        problem = holdings.unknown_cluster(store, args.cluster)
        if problem:
            raise ConfigError(problem)
    except WarehouseLocked as exc:
        print(f"error: {exc}. The running exporter makes the weekly report itself "
              "(report.schedule); to make one now, stop the exporter or use BigQuery "
              "(--bigquery).", file=sys.stderr)
        return 2
    except (ConfigError, ValueError) as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except google as exc:
        print(f"error: {_google_problem(exc)}", file=sys.stderr)
        return 2
    empty = None if args.force else holdings.empty_week(store, week, args.cluster)
    if empty:
        _outcome(args.outcome, week.label, "thin", 0.0)
        print(f"error: {empty}; --force writes the report anyway", file=sys.stderr)
        return 1
    with tqdm(desc=f"report {week.label}", unit=" step", leave=False,
              disable=not sys.stderr.isatty()) as bar:
        def step(what: str) -> None:
            bar.set_postfix_str(what)
            bar.update(1)

        budget = cfg.report.whatif_budget if args.whatif_budget is None \
            else args.whatif_budget
        try:
            report, mailed = run_weekly(store, week, cfg, book, args.out, args.email, step,
                                        force=args.force, cluster=args.cluster,
                                        replays=None if budget == 0 else _replays(
                                            store, week, args.cluster, cfg, budget),
                                        preview=args.email_preview)
        except ThinWeek as exc:
            _outcome(args.outcome, week.label, "thin", exc.coverage)
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except (ConfigError, MailError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    h = report.headline
    _outcome(args.outcome, week.label, "ok", float(h["coverage"] or 0.0))
    print(f"{report.title}: ${h['cost_usd'] or 0:,.2f}, {h['allocated_gpu_hours'] or 0:,.0f} "
          f"allocated GPU-hours. Written to {args.out}/ (report.html, report.md, report.json, "
          f"one CSV per table; teams/ per team)" +
          (f", and accepted by {cfg.report.smtp.host}:{cfg.report.smtp.port} for {mailed} "
           f"recipient{'s' if mailed != 1 else ''}." if args.email else ".") +
          (f" Email preview in {args.email_preview}/ (email.eml and email.html per message)."
           if args.email_preview is not None else ""))
    return 0


def _whatif(args: argparse.Namespace) -> int:
    from datetime import timedelta

    import duckdb

    from analytics import holdings
    from analytics.week import Week, last_complete_week, parse_week
    from analytics.whatif.layout import LayoutError
    from analytics.whatif.trace import TraceError
    from exporter import whatif
    from exporter.config import load_config
    from exporter.duck import WarehouseLocked
    from exporter.errors import ConfigError
    from simulator.scenario import ScenarioError

    if args.step < 1:
        print("error: --step must be at least 1s", file=sys.stderr)
        return 2
    google = _google_errors()
    try:
        cfg = load_config(args.config)
        alone = args.trace is not None and args.store is None and args.bigquery is None
        if alone and args.layout is None and args.recorded_layout is None:
            raise ConfigError("--trace without a warehouse needs --layout: there is no week "
                              "to take the layout from")
        if args.recorded_layout is not None and not alone:
            raise ConfigError("--recorded-layout is for a trace without a warehouse: the "
                              "warehouse's week has its own layout")
        store = None if alone else _store(args, cfg)
        if store is not None:
            problem = holdings.unknown_cluster(store, args.cluster)
            if problem:
                raise ConfigError(problem)
        week = parse_week(args.week) if args.week else \
            None if alone else last_complete_week(datetime.now(UTC))
        if alone and week is not None and args.duration != 7 * 86400.0:
            week = Week(week.start, week.start + timedelta(seconds=args.duration))
        request = whatif.Request(out=args.out, step=float(round(args.step)), seed=args.seed,
                                 layout=args.layout, trace=args.trace, week=week,
                                 cluster=args.cluster, days=args.duration / 86400,
                                 full_loop=args.full_loop,
                                 recorded_layout=args.recorded_layout)
        if store is not None and week is not None:
            empty = holdings.empty_week(store, week, args.cluster)
            if empty:
                raise ConfigError(empty)
        return whatif.run(request, store, cfg)
    except WarehouseLocked as exc:
        print(f"error: {exc}. Use a copy of the warehouse file, or BigQuery (--bigquery).",
              file=sys.stderr)
        return 2
    except TraceError as exc:  # a line a bad row of the file, each named by line and column
        print("\n".join(f"error: {line}" for line in str(exc).splitlines() if line.strip()),
              file=sys.stderr)
        return 2
    except (ConfigError, LayoutError, ScenarioError, ValueError) as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except google as exc:
        print(f"error: {_google_problem(exc)}", file=sys.stderr)
        return 2
    except (duckdb.Error, MemoryError, OSError) as exc:  # what was written stays written
        print(f"error: {type(exc).__name__}: {_one_line(exc, True)}", file=sys.stderr)
        return 1


def _replays(store: Store, week: Week, cluster: str | None, cfg: Config,
             budget: float | None) -> Replays:
    """The platform report's actions replayed (within ``budget`` seconds, if one)."""
    from exporter.whatif import replay_levers

    def replays(platform: WeeklyReport) -> pd.DataFrame:
        return replay_levers(store, week, cluster, cfg, platform.frame("actions"),
                             platform.frame("spot"), budget, cfg.report.whatif_step)
    return replays


def _demo_replays(store: Store, week: Week, cfg: Config) -> Replays:
    """The demo report's actions replayed, as ``report weekly`` replays them."""
    return _replays(store, week, None, cfg, cfg.report.whatif_budget)


def _outcome(path: Path | None, week: str, outcome: str, coverage: float) -> None:
    """``report weekly --outcome FILE``: what the scheduled report reads of its child."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"week": week, "outcome": outcome, "coverage": coverage}))


def _bigquery(cfg: Config) -> str:
    bq = cfg.warehouse.bigquery
    if not bq.enabled:
        return "off"
    return f"{bq.project}.{bq.dataset} ({bq.location})" + \
        (f" at {bq.endpoint}" if bq.endpoint else "")


def _run(args: argparse.Namespace) -> int:
    """``run``: SIGINT and SIGTERM end it with one log line and exit 0 from here on, also
    while it starts."""
    stop_on_signals()
    try:
        return _start(args)
    except Stopped as stopped:
        log.info("stopped", extra=ctx(signal=stopped.signal, during="start-up"))
        return 0


def _config_errors(exc: BaseException) -> None:
    """Each line of a configuration error (each names its source) as an ``error:`` line."""
    for line in str(exc).splitlines():
        print(f"error: {line}", file=sys.stderr)


def _start(args: argparse.Namespace) -> int:
    from exporter.config import load_config
    from exporter.errors import ConfigError
    from exporter.model.prices import load_price_book
    from exporter.runtime.app import left_running, run
    from exporter.runtime.preflight import problems

    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        _config_errors(exc)
        return 1
    if args.log_level is None:
        set_level(cfg.log_level)
    log.debug("config loaded", extra=ctx(file=args.config, settings=cfg.model_dump(mode="json")))
    found = problems(cfg)
    unpriced: ConfigError | None = None
    if not any(p.setting == "prices.book" for p in found):  # else named among them
        try:
            book = load_price_book(cfg.prices.book, cfg.prices.region)
        except ConfigError as exc:
            unpriced = exc  # told with the host's problems, in one round
    if unpriced is not None:
        _config_errors(unpriced)
    for problem in found:
        print(f"error: {problem}", file=sys.stderr)
    if unpriced is not None:
        return 1  # the config is invalid, whatever the host says
    if found:
        return 2
    if args.check_config:
        d = cfg.dcgm
        targets = f"{len(d.targets)} static targets" if d.targets else \
            f"discovery in {d.discovery.namespace} ({d.discovery.label_selector})"
        if d.prometheus.url:
            targets = f"from the Prometheus API at {d.prometheus.url}"
        elif d.cloud_monitoring.project:
            targets = f"from Cloud Monitoring in project {d.cloud_monitoring.project}"
        gcm = cfg.cloud_monitoring
        print(f"config ok: cluster {cfg.cluster}, every {cfg.interval:g} s, dcgm {targets}, "
              f"prices {book.region} as of {book.as_of}, warehouse "
              f"{cfg.warehouse.path if cfg.warehouse.enabled else 'off'}, bigquery "
              f"{_bigquery(cfg)}, cloud monitoring "
              f"{f'project {gcm.project}' if gcm.enabled else 'off'}")
        return 0
    log.info("starting", extra=ctx(version=__version__, cluster=cfg.cluster))
    try:
        code = asyncio.run(run(cfg, config_file=args.config))
        if left_running():  # past shutdown_timeout: end now, as the deadline says
            logging.shutdown()
            os._exit(code)
        return code
    except ConfigError as exc:  # what the host refused after the checks passed
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2

if __name__ == "__main__":
    sys.exit(main())
