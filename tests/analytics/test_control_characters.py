"""No control character from the cluster (a NUL or an escape in a label or annotation)
reaches any report output: Markdown, HTML, JSON, CSV or the mail."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics import format as fmt
from analytics import mail, render
from analytics.charts import CHARTS
from analytics.report import build
from analytics.store import DuckDBStore
from analytics.week import parse_week
from exporter.config import load_config
from exporter.model import compute
from exporter.sinks.warehouse import Warehouse
from tests.analytics.conftest import HOUR, W46, compute_pod
from tests.exporter.test_compute import PRICE, node, pod, reading

CONTROLS = [chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)]]
"""C0, DEL and C1."""
LINE = "\n"
"""The one control character an output may hold: its own line breaks."""

hostile = st.tuples(st.text(max_size=6), st.sampled_from(CONTROLS),
                    st.text(max_size=6)).map("".join)
"""A name with at least one control character, anywhere, among any other characters."""


@given(st.text())
def test_text_holds_no_control_character_and_keeps_the_others(s: str) -> None:
    out = fmt.text(s)
    assert not set(out) & set(CONTROLS)
    assert [c for c in out if c != " "] == [c for c in s if c not in CONTROLS and c != " "]
    assert fmt.text(out) == out


def _strings(v: Any) -> list[str]:
    if isinstance(v, str):
        return [v]
    if isinstance(v, dict):
        return [s for k, x in v.items() for s in [k, *_strings(x)]]
    if isinstance(v, list):
        return [s for x in v for s in _strings(x)]
    return []


def _warehouse(path: Path, team: str, allocation: str, namespace: str, name: str) -> None:
    owner = compute.Owner("uid-x", namespace, name, team, name, allocation)
    wh = Warehouse(path, "c", interval=HOUR)
    start = W46 + 7 * 86400  # 2026-W47
    for h in range(6):
        dev = reading("GPU-x", pods=(), DCGM_FI_PROF_GR_ENGINE_ACTIVE=0.05,
                      DCGM_FI_DEV_FB_USED=500, DCGM_FI_DEV_FB_FREE=21500)
        dev.pods.append(compute_pod(namespace, name))
        states = compute.device_states({"n1": node()}, {"n1": [dev]}, frozenset(), {},
                                       {(namespace, name): owner}, PRICE, {})
        wh.add_usage(compute.usage_rows(states, start + h * HOUR, HOUR))
    wh.add_pods([pod(uid="uid-x", namespace=namespace, name=name, workload=name,
                     created_unix=start, scheduled_unix=start + 60, labels={"team": team})],
                start + 7 * HOUR, lambda p: team)
    wh.flush(start + 8 * HOUR)
    wh.close()


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(team=hostile, allocation=hostile, namespace=hostile, name=hostile)
def test_no_control_character_reaches_any_output(tmp_path_factory: Any, team: str,
                                                 allocation: str, namespace: str,
                                                 name: str) -> None:
    path = tmp_path_factory.mktemp("ctl") / "w.duckdb"
    _warehouse(path, team, allocation, namespace, name)
    store = DuckDBStore(path)
    report = build(store, parse_week("2026-W47"), {}, 0.995, "c", allocation="cost-center")
    team_report = build(store, parse_week("2026-W47"), {}, 0.995, "c", team=team)
    store.close()
    assert not report.frame("cost_by_team").empty  # the names did reach the report
    cfg = load_config(None, {"report": {"platform_recipients": ["p@example.com"]}}).report
    outputs = {"markdown": render.markdown(report),
               "html": render.html_page(report, {k: f"{k}.png" for k in CHARTS}),
               "json": render.as_json(report),
               **{f"{n}.csv": _csv(report, n) for n in report.tables}}
    for r in (report, team_report):
        msg = mail.compose(r, cfg, ["p@example.com"], charts=dict.fromkeys(CHARTS, b""))
        outputs[f"subject of {r.team}"] = str(msg["Subject"])
        for i, part in enumerate(msg.walk()):
            if not part.is_multipart():
                outputs[f"mail part {i} of {r.team}"] = part.get_content() \
                    if part.get_content_maintype() == "text" else ""
    outputs |= {f"json {i}": s
                for i, s in enumerate(_strings(json.loads(outputs["json"])))}
    found = {where: sorted({repr(c) for c in out if c in CONTROLS and c != LINE})
             for where, out in outputs.items()}
    bad = {k: v for k, v in found.items() if v}
    assert bad == {}, bad


def _csv(report: Any, name: str) -> str:
    buf = io.StringIO(newline="")
    render._csv(report, name, report.tables[name], buf)
    return buf.getvalue()
