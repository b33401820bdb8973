"""The email arrives whole: its HTML under the size at which Gmail clips a message, the
message under 500 KB, however long the week's tables; each table cut to its first rows with
a line that says how many it has and where they all are; the first rows attached."""

from __future__ import annotations

import email
import email.policy
import re
import time
from email.message import EmailMessage
from pathlib import Path

import pytest

from analytics import mail, mail_parts, render
from analytics.charts import CHARTS, TEAMS_SHOWN
from analytics.report import WeeklyReport, build
from analytics.store import DuckDBStore
from analytics.week import parse_week
from exporter import duck
from exporter.config import Report as ReportConfig
from exporter.config import load_config
from exporter.model.prices import load_price_book
from exporter.sinks.schema import TABLES
from exporter.sinks.warehouse import CURRENT_PODS_VIEW
from tests.layout import layout_problems

HTML_MOST = 100_000
"""Bytes of the HTML part, decoded: Gmail clips a message whose HTML passes about 102 KB."""
MESSAGE_MOST = 500_000
"""Bytes of the whole message as sent."""

START = "2026-11-16 00:00:00+00"
MODELS = "['nvidia-h100-80gb', 'nvidia-tesla-a100', 'nvidia-l4', 'nvidia-tesla-t4']"
CAUSES = "['no_capacity', 'fragmented', 'quota', 'scaling_up', 'stockout', 'preempted']"
GPUS, TEAMS, NAMESPACES, POOLS = 480, 40, 120, 24


def fleet_warehouse(path: Path) -> Path:
    """A week of a fleet, hour by hour, as the weekly-report benchmark makes one at minute
    resolution: ``GPUS`` GPUs in ``POOLS`` pools, pods of ``TEAMS`` teams in ``NAMESPACES``
    namespaces turning over every six hours (thousands of workloads), each pod's hour of
    waiting for a node, with the scheduler's words for it, and an incident per pool: every
    table as long as a large cluster's, and names as long as a real cluster's."""
    con = duck.connect(path)
    for table in TABLES:
        con.execute(table.duckdb_ddl())
    con.execute(CURRENT_PODS_VIEW)
    team = f"'research-division-team-' || (g % {TEAMS})"
    namespace = f"'ml-platform-namespace-' || (g % {NAMESPACES})"
    pool = f"'gpu-node-pool-' || (g // 8 % {POOLS})"
    pod = "'training-job-' || g || '-' || (h // 6) || '-worker-0'"
    con.execute(f"""
        INSERT INTO gpu_usage BY NAME
        SELECT md5(g || '|' || h) AS id, TIMESTAMPTZ '{START}' + to_hours(h) AS time,
               3600 AS interval_seconds, 'fleet' AS cluster,
               'gke-fleet-gpu-node-' || (g // 8) AS node, {pool} AS node_pool,
               'us-central1-a' AS zone, {MODELS}[1 + g % 4] AS gpu_model,
               CASE WHEN g % 5 = 0 THEN 'spot' ELSE 'on-demand' END AS provisioning,
               'GPU-' || g AS gpu_uuid, (g % 8)::VARCHAR AS gpu_index, 'GPU-' || g AS device_id,
               CASE WHEN alloc THEN {namespace} END AS namespace,
               CASE WHEN alloc THEN {pod} END AS pod,
               CASE WHEN alloc THEN 'uid-' || g || '-' || (h // 6) END AS pod_uid,
               CASE WHEN alloc THEN {team} END AS team,
               CASE WHEN alloc THEN 'training-job-' || g || '-' || (h // 6) END AS workload,
               CASE WHEN alloc THEN 'allocated' ELSE 'unallocated' END AS state,
               3600 AS gpu_seconds, util AS utilization, util AS gr_engine_active,
               util * 0.8 AS sm_active, 0.5 AS sm_occupancy, util * 0.4 AS tensor_active,
               0.3 AS dram_active, 1e9 AS pcie_tx_bytes_per_second,
               1e9 AS pcie_rx_bytes_per_second, 0 AS nvlink_tx_bytes_per_second,
               0 AS nvlink_rx_bytes_per_second, util * 100 AS gpu_util_percent,
               300 AS power_watts, 60 AS temperature_celsius, 40e9 AS memory_used_bytes,
               80e9 AS memory_total_bytes, 0 AS last_xid, 0 AS clock_event_reasons,
               price AS price_usd_per_hour, price AS cost_usd
        FROM (SELECT g, h, hash(g, h // 6) % 10 < 8 AS alloc,
                     (hash(g, h) % 1000) / 1000.0 AS util,
                     [11.06, 2.93, 0.71, 0.35][1 + g % 4] AS price
              FROM range({GPUS}) r(g), range(168) t(h))""")
    con.execute(f"""
        INSERT INTO gpu_pods BY NAME
        SELECT md5(uid) AS id, 'fleet' AS cluster, uid AS pod_uid, {namespace} AS namespace,
               'training-job-' || g || '-' || j || '-worker-0' AS pod, {team} AS team,
               'training-job-' || g || '-' || j AS workload, 'Job' AS owner_kind, 1 AS gpus,
               {MODELS}[1 + g % 4] AS gpu_model, 'gke-fleet-gpu-node-' || (g // 8) AS node,
               'Running' AS phase, t - INTERVAL 1 HOUR AS created, t AS scheduled,
               t + INTERVAL 6 HOUR AS finished, 3600 AS queue_wait_seconds, 0 AS priority,
               '' AS priority_class, t AS updated
        FROM (SELECT g, j, 'uid-' || g || '-' || j AS uid,
                     TIMESTAMPTZ '{START}' + to_hours(j * 6) AS t
              FROM range({GPUS}) r(g), range(28) s(j))""")
    con.execute(f"""
        INSERT INTO gpu_pending BY NAME
        SELECT md5('p' || uid) AS id, t - INTERVAL 1 HOUR AS time, 3600 AS interval_seconds,
               'fleet' AS cluster, {namespace} AS namespace, {team} AS team,
               'training-job-' || g || '-' || j AS workload, 'pod' AS kind, uid,
               'training-job-' || g || '-' || j || '-worker-0' AS name, 1 AS gpus,
               1 AS gpus_per_pod, {MODELS}[1 + g % 4] AS gpu_model, {pool} AS node_pool,
               {CAUSES}[1 + (g + j) % 6] AS cause, 3600 AS seconds, 3600 AS gpu_seconds,
               3600 AS wait_seconds, 'default-scheduler' AS evidence_source,
               '0/' || {GPUS // 8} || ' nodes are available: ' || {GPUS // 8} ||
               ' Insufficient nvidia.com/gpu. preemption: 0/' || {GPUS // 8} || ' nodes are '
               || 'available: ' || {GPUS // 8} || ' No preemption victims found for incoming '
               || 'pod.' AS evidence
        FROM (SELECT g, j, 'uid-' || g || '-' || j AS uid,
                     TIMESTAMPTZ '{START}' + to_hours(j * 6) AS t
              FROM range({GPUS}) r(g), range(1, 28) s(j))""")
    con.execute(f"""
        INSERT INTO availability_events BY NAME
        SELECT md5('e' || p) AS id, 'fleet' AS cluster, 'gke-fleet-gpu-node-' || (p * 8) AS node,
               'gpu-node-pool-' || p AS node_pool, 'GPU-' || (p * 64) AS gpu_uuid,
               'xid' AS reason, TIMESTAMPTZ '{START}' + to_hours(p) AS start_time,
               TIMESTAMPTZ '{START}' + to_hours(p) + INTERVAL 30 MINUTE AS end_time,
               1800 AS seconds
        FROM range({POOLS}) r(p)""")
    con.close()
    return path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> WeeklyReport:
    path = fleet_warehouse(tmp_path_factory.mktemp("fleet") / "w.duckdb")
    store = DuckDBStore(path)
    report = build(store, parse_week("2026-W47"), load_price_book(None, "us-central1").prices,
                   0.995, "fleet")
    store.close()
    return report


def cfg_report() -> ReportConfig:
    return load_config(None, {"report": {"platform_recipients": ["p@example.com"]}}).report


def html_of(msg: EmailMessage) -> str:
    part = msg.get_body(("html",))
    assert part is not None
    html = part.get_content()
    assert isinstance(html, str)
    return html


def test_the_fleet_tables_are_long(fleet: WeeklyReport) -> None:
    """What the bound below is proved on: tables far longer than an email shows."""
    assert len(fleet.tables["bottlenecks"]) > 10_000
    assert len(fleet.frame("cost_by_namespace")) > NAMESPACES
    assert len(fleet.frame("daily_cost_by_team").columns) > TEAMS
    assert len(fleet.frame("incidents")) == POOLS
    assert len(fleet.frame("waits")) > 100


def test_a_fleet_week_email_stays_under_gmail_clipping_and_500_kb(fleet: WeeklyReport,
                                                                   tmp_path: Path) -> None:
    began = time.perf_counter()
    msg = mail.compose(fleet, cfg_report(), ["p@example.com"], folder=tmp_path / "report")
    took = time.perf_counter() - began
    html = html_of(msg)
    assert len(html.encode()) < HTML_MOST
    assert len(mail.wire(msg)) < MESSAGE_MOST
    assert took < 30, "the first rows are read, not every row"
    assert layout_problems(html) == []
    # every table cut to its first rows says so, and where the rest is
    cut = re.findall(r"(\d+) of [\d,]+ (rows|teams) shown;[^<]* in the report folder\.", html)
    assert len(cut) == len(render.cuts(fleet, mail_parts.ROWS)) > 5
    # the daily cost: the costliest teams and the GPU time no pod held, (unallocated)
    assert sorted({(int(n), unit) for n, unit in cut}) == [(mail_parts.ROWS, "rows"),
                                                          (TEAMS_SHOWN + 1, "teams")]
    assert f"Every row of every table, as CSV: {(tmp_path / 'report').absolute()}" in html


def test_a_long_table_shows_its_first_rows_and_says_where_they_all_are(
        fleet: WeeklyReport, tmp_path: Path) -> None:
    msg = mail.compose(fleet, cfg_report(), ["p@example.com"], folder=tmp_path)
    html, text = html_of(msg), msg.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    total = len(fleet.tables["bottlenecks"])
    attached = {p.get_filename() or "": p.get_content() for p in msg.iter_attachments()}
    (first,) = [f for f in attached if f.startswith("bottlenecks-first-")]
    rows = int(first.removeprefix("bottlenecks-first-").removesuffix(".csv"))
    line = (f"10 of {total:,} rows shown; the first {rows:,} rows in the attached {first}, "
            "all of them in bottlenecks.csv in the report folder.")
    assert line in html
    assert line.replace(first, f"`{first}`").replace("bottlenecks.csv", "`bottlenecks.csv`") \
        in text
    section = html.split('<h2 id="bottlenecks-by-workload">Bottlenecks by workload</h2>', 1)[
        1].split("<h2", 1)[0]
    assert section.count("<tr>") == 1 + mail_parts.ROWS
    # the attachment: the header and the first rows of the CSV the report folder holds
    render.write_csv(fleet, "bottlenecks", fleet.tables["bottlenecks"], tmp_path / "b.csv")
    full = (tmp_path / "b.csv").read_text().splitlines(keepends=True)
    assert attached[first].splitlines(keepends=True) == full[:rows + 1]
    # a wide table: the costliest teams, then the GPU time no pod held
    daily = html.split('<h2 id="daily-cost-by-team">Daily cost by team</h2>', 1)[1] \
        .split("</tr>", 1)[0]
    assert re.findall(r"<th[^>]*>([^<]*)</th>", daily)[1:] == [
        *[str(c) for c in fleet.frame("daily_cost_by_team").columns[:TEAMS_SHOWN]],
        "(unallocated)"]
    assert f"{TEAMS_SHOWN + 1} of {TEAMS + 1} teams shown; all of them in the attached " \
           "daily_cost_by_team.csv and in the report folder." in html


def test_the_attachments_stay_within_their_budget(fleet: WeeklyReport) -> None:
    cuts = render.cuts(fleet, mail_parts.ROWS)
    attached = mail_parts.attachments(fleet, cuts)
    assert len(cuts) > 5
    assert sum(len(a.data) for a in attached.values()) <= mail_parts.ATTACHMENTS_BYTES
    assert all(0 < a.rows <= mail_parts.ATTACHED_ROWS for a in attached.values())
    whole = {n for n, a in attached.items() if a.whole}
    assert "daily_cost_by_team" in whole and "bottlenecks" not in whole


@pytest.mark.parametrize(("text", "most", "budget", "expected"), [
    ("a,b\n1,2\n3,4\n", 5, 1000, ("a,b\n1,2\n3,4\n", 2, True)),
    ("a,b\n1,2\n3,4\n", 1, 1000, ("a,b\n1,2\n", 1, False)),
    ("a,b\n1,2\n3,4\n", 5, 8, ("a,b\n1,2\n", 1, False)),
    ("a,b\n1,2\n3,4\n", 5, 7, ("a,b\n", 0, False)),
    # a quoted value across lines is one record: never cut inside it
    ('a,b\n"x\ny",2\n3,4\n', 5, 11, ("a,b\n", 0, False)),
    ('a,b\n"x\ny",2\n3,4\n', 5, 12, ('a,b\n"x\ny",2\n', 1, False)),
    ("a,b\n", 5, 1000, ("a,b\n", 0, True)),
    ("", 5, 1000, ("", 0, True)),
], ids=["all", "most", "budget", "header only", "quoted: none", "quoted: one", "no rows",
        "empty"])
def test_first_records(text: str, most: int, budget: int,
                       expected: tuple[str, int, bool]) -> None:
    assert mail_parts.first_records(text, most, budget) == expected


@pytest.mark.parametrize(("attached", "folder", "line"), [
    (mail_parts.Attachment("t.csv", b"", 40, True), "/r",
     "10 of 40 rows shown; all of them in the attached t.csv and in the report folder."),
    (mail_parts.Attachment("t-first-100.csv", b"", 100, False), "/r",
     "10 of 1,200 rows shown; the first 100 rows in the attached t-first-100.csv, all of "
     "them in t.csv in the report folder."),
    (mail_parts.Attachment("t-first-100.csv", b"", 100, False), None,
     "10 of 1,200 rows shown; the first 100 rows in the attached t-first-100.csv."),
    (None, "/r", "10 of 1,200 rows shown; all of them in t.csv in the report folder."),
    (None, None, "10 of 1,200 rows shown."),
], ids=["whole", "first rows", "no folder", "none attached", "neither"])
def test_the_line_under_a_cut_table(attached: mail_parts.Attachment | None,
                                    folder: str | None, line: str) -> None:
    total = 40 if attached is not None and attached.whole else 1200
    cut = render.Cut(10, total, "rows")
    assert mail_parts.notes({"t": cut}, {"t": attached} if attached else {}, folder) == \
        {"t": line}


def test_the_message_parses_back_as_sent(fleet: WeeklyReport) -> None:
    msg = mail.compose(fleet, cfg_report(), ["p@example.com"])
    back = email.message_from_bytes(mail.wire(msg), policy=email.policy.default)
    assert isinstance(back, EmailMessage)
    assert html_of(back).replace("\r\n", "\n") == html_of(msg)  # lines end in CRLF on the wire
    assert sorted(p.get_filename() or "" for p in back.walk()
                  if p.get_content_type() == "image/png") == sorted(f"{c}.png" for c in CHARTS)
    assert "Every row of every table" not in html_of(msg), "no folder: none named"


def test_the_layout_rule_finds_what_breaks_a_narrow_screen() -> None:
    """The rule the emails above are held to fails the layout they had before."""
    before = ('<html><head><title>t</title></head><body style="margin:0;">'
              '<table role="presentation" width="100%" style="max-width:760px;"><tr><td>'
              '<img src="a.png" width="700" style="display:block;max-width:100%;">'
              '<table style="border-collapse:collapse;min-width:40em;"><tr><td>1</td></tr>'
              '</table></td></tr></table></body></html>')
    assert layout_problems(before) == [
        "a table outside a box that scrolls sideways: <table role='presentation' "
        "width='100%' style='max-width:760px;'>",
        "a fixed width: <img src='a.png' width='700' style='display:block;max-width:100%;'>",
        "an image that does not shrink to the page: <img src='a.png' width='700' "
        "style='display:block;max-width:100%;'>",
        "a fixed min-width of 40em: <table style='border-collapse:collapse;min-width:40em;'>",
        "a table outside a box that scrolls sideways: <table style='border-collapse:collapse;"
        "min-width:40em;'>",
        "no viewport of the device's width"]
