"""Dashboards and alert rules: promtool, unit tests for every alert, the Grafana dashboard
linter's rules, and every expression parsing and naming metrics that exist."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from exporter.metrics.families import FAMILIES, exposed_names
from tests.timing import limit

ROOT = Path(__file__).parents[1]
ALERTS, DASHBOARDS = ROOT / "alerts", ROOT / "dashboards"
RULES: dict[str, Any] = yaml.safe_load((ALERTS / "rules.yaml").read_text())
ALL_RULES = [r for g in RULES["groups"] for r in g["rules"]]
ALERT_RULES = [r for r in ALL_RULES if "alert" in r]
RECORDED = {r["record"] for r in ALL_RULES if "record" in r}
UNIT_TESTS = ("tests.yaml", "tests-slow.yaml")


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.parent.name + "_build", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUILD = _load(DASHBOARDS / "build.py")
BOARDS = {name: json.loads(text) for name, text in BUILD.render().items()}
PANELS = [(name, p) for name, board in BOARDS.items() for p in board["panels"]]
GRAFANA_VARS = {"$__rate_interval": "1m", "$__range": "1h", "$cluster": ".*", "$team": ".*",
                "$namespace": ".*", "$pool": ".*", "$model": ".*", "$node": ".*", "$gpu": ".*"}


def grafana_expr(expr: str, **chosen: str) -> str:
    """A panel's query as Prometheus sees it once Grafana substitutes its variables (all
    values, or those ``chosen``: ``cluster="live"``)."""
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, chosen.get(var[1:], value))
    return expr


def panel_exprs(**chosen: str) -> list[tuple[str, str, str]]:
    return [(name, p["title"], grafana_expr(t["expr"], **chosen)) for name, p in PANELS
            for t in p["targets"]]


def annotation_exprs() -> list[tuple[str, str, str]]:
    return [(name, a["name"], grafana_expr(a["expr"])) for name, b in BOARDS.items()
            for a in b["annotations"]["list"]]


def exported_metrics() -> set[str]:
    """Every series name the exporter can expose (its catalogue)."""
    return {name for family in FAMILIES for name in exposed_names(family)}


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=limit(120))


# ---------------------------------------------------------------------------- rules


def test_rules_pass_promtool_check() -> None:
    proc = promtool("check", "rules", "alerts/rules.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_unit_test_passes_and_repeats(tmp_path: Path) -> None:
    for _ in range(2):  # deterministic: the same result twice
        proc = promtool("test", "rules", *UNIT_TESTS, cwd=ALERTS)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    tests = [t for f in UNIT_TESTS for t in yaml.safe_load((ALERTS / f).read_text())["tests"]]
    firing, quiet = set(), set()
    for t in tests:
        for case in t.get("alert_rule_test", []):
            (firing if case["exp_alerts"] else quiet).add(case["alertname"])
    names = {r["alert"] for r in ALERT_RULES}
    assert firing == names and quiet == names


@pytest.mark.parametrize("rule", ALERT_RULES, ids=[r["alert"] for r in ALERT_RULES])
def test_every_alert_is_actionable(rule: dict[str, Any]) -> None:
    # page and ticket reach the on-call; info reaches the pod's owner, named on the alert
    assert rule["labels"]["severity"] in ("page", "ticket", "info")
    if rule["labels"]["severity"] == "info":
        assert "gke_gpu_allocation_info" in rule["expr"] and "team" in rule["expr"]
    assert rule.get("for"), "every alert waits before firing"
    ann = rule["annotations"]
    assert ann["summary"] and ann["description"] and ann["runbook_url"]


def _anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page's sections, as GitHub makes them."""
    return {re.sub(r"[^a-z0-9-]", "", h.lower().replace(" ", "-"))
            for h in re.findall(r"^#+ (.+)$", page.read_text(), re.M)}


def _shipped_rule_files() -> dict[str, list[dict[str, Any]]]:
    """Every rules file the project ships -> its rules."""
    build = _load(ALERTS / "build.py")
    files = {"alerts/rules.yaml": RULES["groups"]}
    for path in build.MANIFESTS.values():
        files[str(path.relative_to(ROOT))] = yaml.safe_load(path.read_text())["spec"]["groups"]
    return {name: [r for g in groups for r in g["rules"]] for name, groups in files.items()}


def test_every_shipped_runbook_url_is_absolute_and_its_section_exists() -> None:
    """Alertmanager and Grafana show the link as it is: a relative one leads nowhere."""
    build = _load(ALERTS / "build.py")
    anchors = _anchors(ROOT / build.RUNBOOKS)
    files = _shipped_rule_files()
    assert len(files) == 3
    for name, rules in files.items():
        alerts = [r for r in rules if "alert" in r]
        assert len(alerts) == len(ALERT_RULES), name
        for rule in alerts:
            url = urlsplit(rule["annotations"]["runbook_url"])
            assert (url.scheme, url.netloc) == ("https", urlsplit(build.RUNBOOK_BASE).netloc)
            assert url.path == urlsplit(build.RUNBOOK_BASE).path + "/" + build.RUNBOOKS
            assert url.fragment in anchors, f"{name}: no runbook section for {rule['alert']}"


def test_the_fatal_xids_of_the_alerts_are_the_catalogs() -> None:
    """One list of hardware XIDs: the one that makes a GPU unavailable pages the on-call."""
    from exporter.model.catalog import FATAL_XIDS

    for name in ("GpuXidFatal", "GpuXidApplication"):
        (rule,) = [r for r in ALERT_RULES if r["alert"] == name]
        codes = {int(c) for c in re.findall(r"gke_gpu_last_xid == (\d+)", rule["expr"])}
        assert codes == set(FATAL_XIDS), name


def test_manifests_built_for_a_site(tmp_path: Path) -> None:
    """Runbook links under the site's base and the site's unallocated-cost and quota-wait
    thresholds, in the rule file and both manifests, and rules that still pass promtool."""
    subprocess.run([sys.executable, str(ALERTS / "build.py"), "--runbook-base",
                    "https://git.example.com/gpu/blob/main/", "--unallocated-usd-per-hour",
                    "200", "--quota-wait-hours", "0.5", "--out", str(tmp_path)], check=True,
                   timeout=limit(60))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "clusterrules.yaml", "prometheusrule.yaml", "rules.yaml"]
    plain = yaml.safe_load((tmp_path / "rules.yaml").read_text())["groups"]
    for name in ("prometheusrule.yaml", "clusterrules.yaml"):
        groups = yaml.safe_load((tmp_path / name).read_text())["spec"]["groups"]
        assert [{k: v for k, v in g.items() if k != "interval"} for g in groups] == plain
    rules = {r["alert"]: r for g in plain for r in g["rules"] if "alert" in r}
    assert all(r["annotations"]["runbook_url"].startswith(
        "https://git.example.com/gpu/blob/main/docs/runbooks.md#") for r in rules.values())
    cost = rules["GpuUnallocatedCapacityCost"]
    assert cost["expr"].endswith("> 200") and "$200 an hour" in cost["annotations"]["description"]
    quota = rules["GpuQuotaWaitLong"]
    assert quota["expr"].endswith("> 0.5 * 3600")
    assert "more than 0.5 h:" in quota["annotations"]["description"]
    check = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yaml")],
                           capture_output=True, text=True, timeout=limit(60))
    assert check.returncode == 0, check.stdout + check.stderr


def test_manifests_are_generated_from_the_rules() -> None:
    build = _load(ALERTS / "build.py")
    for name, text in build.manifests().items():
        assert build.MANIFESTS[name].read_text() == text, f"{name} is stale: make alerts"
        doc = yaml.safe_load(text)
        groups = [{k: v for k, v in g.items() if k != "interval"} for g in doc["spec"]["groups"]]
        assert groups == RULES["groups"]
    gmp = yaml.safe_load(build.MANIFESTS["clusterrules.yaml"].read_text())
    # a namespaced Rules would only see series of its own namespace
    assert (gmp["apiVersion"], gmp["kind"]) == ("monitoring.googleapis.com/v1", "ClusterRules")
    assert "namespace" not in gmp["metadata"]
    assert all(g["interval"] for g in gmp["spec"]["groups"])
    operator = yaml.safe_load(build.MANIFESTS["prometheusrule.yaml"].read_text())
    assert (operator["apiVersion"], operator["kind"]) == ("monitoring.coreos.com/v1",
                                                          "PrometheusRule")


# ---------------------------------------------------------------------------- dashboards


def test_dashboards_are_generated_from_code() -> None:
    for name, board in BOARDS.items():
        committed = json.loads((DASHBOARDS / name).read_text())
        assert committed == board, f"{name} is stale: make dashboards"


def test_dashboard_uids_are_unique_and_stable() -> None:
    uids = [b["uid"] for b in BOARDS.values()]
    assert len(set(uids)) == len(uids) == 8
    assert all(u.startswith("gke-gpu-") for u in uids)


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_dashboard_lint(name: str) -> None:
    """The Grafana dashboard linter's rules."""
    board = BOARDS[name]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert "cluster" in variables
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"]["uid"] == "${datasource}", v["name"]
    titles = [p["title"] for p in board["panels"]]
    assert len(set(titles)) == len(titles), "panel titles are unique"
    assert board["title"] and board["description"]
    cells: set[tuple[int, int]] = set()
    for p in board["panels"]:
        where = f"{name}: {p['title']}"
        assert p["datasource"]["uid"] == "${datasource}", where
        assert p["description"], where
        assert p["fieldConfig"]["defaults"]["unit"], where
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, where
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{where} overlaps another panel"
        cells |= mine
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", where
            # a rate over Grafana's interval; a total over the range picked
            windows = re.findall(r"\b(?:rate|irate|increase)\([^\[]*\[([^\]]+)\]", t["expr"])
            assert len(windows) == len(re.findall(r"\b(?:rate|irate|increase)\(", t["expr"]))
            assert set(windows) <= {"$__rate_interval", "$__range", BUILD.ROLLING}, where
            for selector in re.findall(r"gke_gpu[:_][a-zA-Z0-9_:]*(\{[^}]*\})?", t["expr"]):
                assert "$cluster" in selector, f"{where} ignores the cluster variable"


def test_tables_are_tables_and_counts_of_nothing_are_zero() -> None:
    for name, p in PANELS:
        if p["type"] == "table":
            assert all(t.get("format") == "table" for t in p["targets"]), (name, p["title"])
        if p["type"] == "stat" and p["fieldConfig"]["defaults"]["unit"] in ("none",
                                                                          "currencyUSD"):
            # a count or a sum of nothing is 0, not No data
            assert p["targets"][0]["expr"].endswith(" or vector(0)"), (name, p["title"])


def test_one_gpu_count_everywhere() -> None:
    """Physical GPUs, MIG slices as fractions: the gauges of GPUs by state (or the available
    count, in the same unit); never a rate of the GPU-seconds counters (it aliases when the
    counters move less often than Prometheus scrapes), a count of series or of Kubernetes
    requests."""
    overview = {p["title"]: p for p in BOARDS["overview.json"]["panels"]}
    for title in ("Allocated GPUs", "Unavailable GPUs", "GPUs by state"):
        assert "gke_gpu_state_gpus{" in overview[title]["targets"][0]["expr"], title
    assert "gke_gpu_utilized_gpus{" in overview["Utilised GPUs"]["targets"][0]["expr"]
    counts = [(name, p) for name, p in PANELS
              if p["fieldConfig"]["defaults"]["unit"] == "none" and "GPUs" in p["title"]]
    assert len(counts) >= 6
    for name, p in counts:
        for t in p["targets"]:
            assert not re.search(r"\b(rate|increase)\(gke_gpu_\w*seconds_total", t["expr"]), \
                (name, p["title"])
    for name, p in PANELS:
        for t in p["targets"]:
            assert "node_allocated_gpus" not in t["expr"], (name, p["title"])
            assert not re.search(r"sum\S*\s*\(gke_gpu_state\b", t["expr"]), (name, p["title"])


@pytest.mark.parametrize(("board", "title"), [
    ("availability.json", "Availability (1 d)"), ("availability.json", "Burn rate"),
    ("exporter-health.json", "Cycles in the last 5 minutes"),
    ("exporter-health.json", "Targets down"), ("gpu.json", "Temperature"),
    ("gpu.json", "Power / limit")])
def test_thresholds_colour_what_needs_action(board: str, title: str) -> None:
    (p,) = [p for p in BOARDS[board]["panels"] if p["title"] == title]
    steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[0]["value"] is None and len(steps) >= 2
    assert [s["value"] for s in steps[1:]] == sorted(s["value"] for s in steps[1:])


def test_the_gpu_dashboard_is_linked_from_the_overview() -> None:
    gpu = BOARDS["gpu.json"]
    names = [v["name"] for v in gpu["templating"]["list"]]
    assert names == ["datasource", "cluster", "pool", "model", "node", "gpu"]
    overview = BOARDS["overview.json"]
    assert any(f"/d/{gpu['uid']}?" in link.get("url", "") for link in overview["links"])
    rows = [p for p in overview["panels"] + BOARDS["availability.json"]["panels"]
            if p["fieldConfig"]["defaults"].get("links")]
    assert rows
    for p in rows:
        (link,) = p["fieldConfig"]["defaults"]["links"]
        assert link["url"].startswith(f"/d/{gpu['uid']}?")
        expr = p["targets"][0]["expr"]
        for field in re.findall(r"__data\.fields\.(\w+)", link["url"]):
            assert field in expr, (p["title"], field)   # the row has the label it links by
    titles = {p["title"] for p in gpu["panels"]}
    assert {"Utilisation", "Memory in use", "Temperature", "Power / limit", "SM clock",
            "XIDs"} <= titles


@pytest.mark.parametrize(("title", "reads", "by", "stacks"), [
    ("Pending GPUs by cause", "gke_gpu_pending_cause_gpus{", "cause", True),
    ("Oldest wait by cause", "gke_gpu_pending_cause_oldest_seconds{", "cause", False),
    ("GPU-hours waited over the range by team and cause",
     "increase(gke_gpu_pending_gpu_seconds_total{", "team, cause", False),
    ("Scale-up failures by pool and reason", "increase(gke_gpu_scale_up_failures_total{",
     "pool, reason", False),
    ("Stranded GPUs by pool and use", "gke_gpu_stranded_gpus{", "pool, use", True),
    ("Stranded GPUs: cost per hour", "gke_gpu_stranded_cost_usd_per_hour{", "pool", True),
    ("Pool fragmentation", "gke_gpu_pool_fragmentation_ratio{", "pool", False)])
def test_the_queue_dashboard_says_why_gpus_wait(title: str, reads: str, by: str,
                                                stacks: bool) -> None:
    """Each cause, use and failure reason a series of its own; parts of a whole (GPUs
    waiting, GPUs stranded and their cost) stacked; GPU-hours waited from the counter over
    the range, GPUs waiting from the gauge."""
    (p,) = [p for p in BOARDS["queue.json"]["panels"] if p["title"] == title]
    (t,) = p["targets"]
    assert reads in t["expr"] and f" by ({by}) (" in t["expr"]
    stacking = p["fieldConfig"]["defaults"].get("custom", {}).get("stacking", {})
    assert (stacking.get("mode") == "normal") == stacks


@pytest.mark.parametrize(("board", "title", "reads", "stacks"), [
    ("energy.json", "Energy over the range", "increase(gke_gpu_energy_joules_total{", False),
    ("energy.json", "CO2e over the range", "increase(gke_gpu_co2e_grams_total{", False),
    ("energy.json", "Power draw now", "rate(gke_gpu_energy_joules_total{", False),
    ("energy.json", "Power by state", "rate(gke_gpu_energy_joules_total{", True),
    ("energy.json", "Top pods by energy over the range",
     "increase(gke_gpu_pod_energy_joules_total{", False),
    ("energy.json", "Estimated energy share",
     "increase(gke_gpu_exporter_energy_intervals_total{", False),
    ("teams.json", "Energy and CO2e over the range by team",
     "increase(gke_gpu_energy_joules_total{", False)])
def test_energy_totals_are_increases_over_the_range(board: str, title: str, reads: str,
                                                    stacks: bool) -> None:
    """Energy and CO2e counters move once a cycle: totals are their increase over the range,
    power their rate over Grafana's interval; the fleet's power stacks up by state."""
    (p,) = [p for p in BOARDS[board]["panels"] if p["title"] == title]
    expr = p["targets"][0]["expr"]
    assert reads in expr
    assert ("[$__range]" in expr) == ("increase(" in reads)
    stacking = p["fieldConfig"]["defaults"].get("custom", {}).get("stacking", {})
    assert (stacking.get("mode") == "normal") == stacks


def test_a_ratio_over_a_selection_is_the_ratio_of_its_sums() -> None:
    """Never the largest (or mean) of per-group ratios: L4's effective cost read $70.24 from
    one namespace's ratio where the model's was $1.28."""
    for name, p in PANELS:
        for t in p.get("targets", []):
            assert not re.search(r"\b(max|min|avg)\b(\s+(by|without)\s*\([^)]*\))?\s*"
                                 r"\([^()]*_per_utilized_hour", t["expr"]), (name, p["title"])


def test_provisioning_points_grafana_at_the_dashboards() -> None:
    prov = yaml.safe_load((DASHBOARDS / "provisioning.yaml").read_text())
    (provider,) = prov["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]


# ---------------------------------------------------------------------------- expressions


def test_every_expression_parses(tmp_path: Path) -> None:
    """Dashboard queries (variables substituted) checked by promtool as recording rules."""
    rules = {"groups": [{"name": "panels", "rules": [
        {"record": f"panel:{i}", "expr": expr} for i, (_, _, expr) in
        enumerate(panel_exprs() + annotation_exprs())]}]}
    path = tmp_path / "panels.yaml"
    path.write_text(yaml.safe_dump(rules))
    proc = promtool("check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


_METRIC = re.compile(r"\b(gke_gpu[:_][a-zA-Z0-9_:]*)")


def test_every_metric_named_exists() -> None:
    known = exported_metrics() | RECORDED
    exprs = [e for _, _, e in panel_exprs() + annotation_exprs()] + \
        [r["expr"] for r in ALL_RULES]
    exprs += [v["query"]["query"] for b in BOARDS.values() for v in b["templating"]["list"]
              if v["type"] == "query"]
    named = {m for e in exprs for m in _METRIC.findall(e)}
    assert named and not named - known, sorted(named - known)


def test_every_dashboard_marks_xids_reclaims_notready_and_failed_scale_ups() -> None:
    for name, board in BOARDS.items():
        marks = {a["name"]: a for a in board["annotations"]["list"]}
        assert set(marks) == {"XID errors", "Spot reclaims", "Nodes NotReady",
                              "Scale-up failures"}, name
        assert all(a["enable"] and a["datasource"]["uid"] == "${datasource}"
                   and 'cluster=~"$cluster"' in a["expr"] for a in marks.values()), name
