"""The shipped Managed Prometheus rules see the workloads' series.

Google Managed Prometheus does not run a rule as written: its operator rewrites each
expression, adding equality matchers to every vector selector, and adds the same labels to
every result (``scope`` in pkg/operator/apis/monitoring/v1/rules_config.go of
GoogleCloudPlatform/prometheus-engine). A ``ClusterRules`` gets the cluster's
``project_id``, ``location`` and ``cluster``; a namespaced ``Rules`` also gets
``namespace="<its namespace>"``. ``scope_expr`` and ``scope_groups`` below do the same to
the rules rendered from deploy/components/gmp-rules, and a real Prometheus runs them over
series scraped with the job GMP's operator makes of the shipped ClusterPodMonitoring
(tests/test_scrape_labels.py builds it), from an exposition whose GPU workloads live in
another namespace than the exporter's. The rules record and alert on them; the same rules
as a ``Rules`` in the exporter's namespace record and alert on nothing.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import start_prometheus
from tests.test_deploy import by_kind, render
from tests.test_scrape_labels import gmp_jobs
from tests.timing import limit

PROJECT, LOCATION, CLUSTER = "my-gpu-project", "us-central1", "my-gke-cluster"
CLUSTER_SCOPE = {"project_id": PROJECT, "location": LOCATION, "cluster": CLUSTER}
EXPORTER_NAMESPACE = "gke-gpu-exporter"
WORKLOAD_NAMESPACE = "research"

# ------------------------------------------------------------- the operator's rewrite

_TOKEN = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<duration>(?:\d+(?:ms|[smhdwy]))+\b)
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<other>.)
""", re.X | re.S)
_MATCHER = re.compile(r"""\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*
                          ("(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)\s*,?""", re.X)
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_WORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "sum", "min", "max", "avg",
          "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile"}
"""Never a metric name: operators, numbers, aggregations (``sum by (x) (...)``)."""


def _tokens(expr: str) -> Iterator[tuple[str, str]]:
    for m in _TOKEN.finditer(expr):
        assert m.lastgroup is not None
        yield m.lastgroup, m.group()


def _matchers(block: str) -> list[tuple[str, str, str]]:
    """``{a="x", b=~"y"}``'s matchers as (name, operator, value)."""
    inner, out, at = block[1:-1], [], 0
    while inner[at:].strip():
        m = _MATCHER.match(inner, at)
        assert m, f"cannot read matchers {block!r}"
        out.append((m.group(1), m.group(2), json.loads(m.group(3))
                    if m.group(3)[0] == '"' else m.group(3)[1:-1]))
        at = m.end()
    return out


def _scoped(block: str, scope: dict[str, str]) -> str:
    """A selector's matcher block with ``scope``'s equality matchers added (GMP's
    ``setSelector``: an existing matcher of the name must be the same equality)."""
    existing = _matchers(block)
    for name, value in scope.items():
        for m_name, op, m_value in existing:
            if m_name == name and (op != "=" or m_value != value):
                raise ValueError(f"conflicting label matcher {m_name}{op}{m_value!r}")
    added = [f"{name}={json.dumps(value)}" for name, value in sorted(scope.items()) if value]
    inner = block[1:-1].strip().rstrip(",")
    return "{" + ", ".join([*([inner] if inner else []), *added]) + "}"


def scope_expr(expr: str, scope: dict[str, str]) -> str:
    """``expr`` with ``scope``'s matchers in every vector selector, as GMP runs it."""
    tokens = list(_tokens(expr))
    out: list[str] = []
    i = 0

    def next_significant(j: int) -> int:
        while j < len(tokens) and tokens[j][0] == "space":
            j += 1
        return j

    def take_block(j: int, opening: str, closing: str) -> tuple[str, int]:
        """The text from the ``opening`` at ``j`` to its ``closing``, and what follows."""
        depth, parts = 0, []
        while True:
            kind, text = tokens[j]
            parts.append(text)
            if kind == "other" and text == opening:
                depth += 1
            elif kind == "other" and text == closing:
                depth -= 1
                if depth == 0:
                    return "".join(parts), j + 1
            j += 1

    while i < len(tokens):
        kind, text = tokens[i]
        if kind == "ident" and text.lower() in _GROUPING:
            out.append(text)
            j = next_significant(i + 1)
            if j < len(tokens) and tokens[j] == ("other", "("):
                out.extend(t for _, t in tokens[i + 1:j])
                labels, i = take_block(j, "(", ")")
                out.append(labels)
            else:
                i += 1
            continue
        if kind == "ident" and text.lower() not in _WORDS:
            j = next_significant(i + 1)
            if j < len(tokens) and tokens[j] == ("other", "("):
                out.append(text)  # a function or an aggregation
                i += 1
                continue
            out.append(text)  # a metric name
            if j < len(tokens) and tokens[j] == ("other", "{"):
                out.extend(t for _, t in tokens[i + 1:j])
                block, i = take_block(j, "{", "}")
                out.append(_scoped(block, scope))
            else:
                out.append(_scoped("{}", scope))
                i += 1
            continue
        if kind == "other" and text == "{":  # a selector of matchers only
            block, i = take_block(i, "{", "}")
            out.append(_scoped(block, scope))
            continue
        out.append(text)
        i += 1
    return "".join(out)


def operator_scope(obj: dict[str, Any]) -> dict[str, str]:
    """The labels GMP's operator scopes a rules object's expressions and results to
    (``RuleGroupsConfig`` of each kind), in this cluster."""
    scopes = {"GlobalRules": {}, "ClusterRules": CLUSTER_SCOPE,
              "Rules": CLUSTER_SCOPE | {"namespace": obj["metadata"].get("namespace", "")}}
    return scopes[obj["kind"]]


def scope_groups(groups: list[dict[str, Any]], scope: dict[str, str]) -> list[dict[str, Any]]:
    """GMP's ``scope``: every expression scoped, every result labelled with the scope (a
    rule that sets one of those labels itself is refused)."""
    out = []
    for group in groups:
        rules = []
        for rule in group["rules"]:
            labels = dict(rule.get("labels", {}))
            for name, value in scope.items():
                if name in labels:
                    raise ValueError(f"label {name!r} already set on rule {rule}")
                if value:
                    labels[name] = value
            rules.append(rule | {"expr": scope_expr(rule["expr"], scope), "labels": labels})
        out.append(group | {"rules": rules})
    return out


@pytest.mark.parametrize(("expr", "scoped"), [
    # the operator's own test case (rules_config_test.go, TestGenerateClusterRules)
    ("test_expr", 'test_expr{cluster="c", location="l", project_id="p"}'),
    ('up{job="x"} == 0', 'up{job="x", cluster="c", location="l", project_id="p"} == 0'),
    ('absent(up{job="x"})', 'absent(up{job="x", cluster="c", location="l", project_id="p"})'),
    ("sum by (cluster, le) (rate(a_total[5m])) > 4 * 3600",
     'sum by (cluster, le) (rate(a_total{cluster="c", location="l", project_id="p"}[5m]))'
     " > 4 * 3600"),
    ("a > on (cluster) group_left () (1 - b) and bool c offset 5m",
     'a{cluster="c", location="l", project_id="p"} > on (cluster) group_left () '
     '(1 - b{cluster="c", location="l", project_id="p"}) and bool '
     'c{cluster="c", location="l", project_id="p"} offset 5m'),
    ('label_replace(x, "dst", "$1", "src", "(.*)") or {__name__="y"}',
     'label_replace(x{cluster="c", location="l", project_id="p"}, "dst", "$1", "src", "(.*)")'
     ' or {__name__="y", cluster="c", location="l", project_id="p"}'),
    ("scalar(days_in_month() - day_of_month()) * 1e3 + Inf",
     "scalar(days_in_month() - day_of_month()) * 1e3 + Inf"),
    ('max_over_time(x{cluster="c"}[1h:5m])',
     'max_over_time(x{cluster="c", cluster="c", location="l", project_id="p"}[1h:5m])'),
])
def test_the_rewrite_scopes_every_selector(expr: str, scoped: str) -> None:
    assert scope_expr(expr, {"project_id": "p", "location": "l", "cluster": "c"}) == scoped


def test_the_rewrite_refuses_what_the_operator_refuses() -> None:
    with pytest.raises(ValueError, match="conflicting"):
        scope_expr('x{cluster="elsewhere"}', {"cluster": "c"})
    with pytest.raises(ValueError, match="already set"):
        scope_groups([{"name": "g", "rules": [{"record": "r", "expr": "x",
                                               "labels": {"cluster": "c"}}]}], {"cluster": "c"})


# ------------------------------------------------------------- on a real Prometheus


class Exposition:
    """The exporter's /metrics for one allocated, idle GPU of a workload in another
    namespace than the exporter's, a pending pod, GPUs of that namespace waiting on a
    stockout and for quota, a pool whose scale-ups fail, and a team over its budget;
    counters grow at each scrape."""

    def __init__(self) -> None:
        self.scrapes = 0

    async def serve(self, _: web.Request) -> web.Response:
        self.scrapes += 1
        n = self.scrapes
        gpu = f'cluster="{CLUSTER}",node="gke-h100-1",uuid="GPU-1",mig_instance=""'
        owner = f'namespace="{WORKLOAD_NAMESPACE}",pod="train-0",team="research"'
        waiting = (f'cluster="{CLUSTER}",namespace="{WORKLOAD_NAMESPACE}",team="research",'
                   'pool="a100",model="nvidia-tesla-a100"')
        text = "\n".join([
            f"gke_gpu_allocation_info{{{gpu},{owner}}} 1",
            f"gke_gpu_utilization_ratio{{{gpu}}} 0.01",
            f'gke_gpu_state{{{gpu},state="allocated"}} 1',
            f"gke_gpu_up_seconds_total{{{gpu}}} {30 * n}",
            f'gke_gpu_down_seconds_total{{{gpu},reason="xid"}} {3 * n}',
            f'gke_gpu_sla_target_ratio{{cluster="{CLUSTER}"}} 0.995',
            f'gke_gpu_cost_usd_total{{{gpu},{owner},pool="h100",state="allocated"}} {10 * n}',
            f'gke_gpu_team_month_cost_usd{{cluster="{CLUSTER}",team="research"}} 5000',
            f'gke_gpu_team_budget_usd{{cluster="{CLUSTER}",team="research"}} 1000',
            f'gke_gpu_oldest_pending_seconds{{cluster="{CLUSTER}",{owner.split(",pod")[0]},'
            f'team="research",model="nvidia-h100-80gb"}} 20000',
            f'gke_gpu_pending_cause_gpus{{{waiting},cause="stockout"}} 4',
            f'gke_gpu_pending_cause_oldest_seconds{{{waiting},cause="quota"}} 20000',
            f'gke_gpu_pending_gpu_seconds_total{{{waiting},cause="quota"}} {240 * n}',
            f'gke_gpu_scale_up_failures_total{{cluster="{CLUSTER}",pool="a100",'
            f'reason="out_of_resources"}} {n}',
            f'gke_gpu_exporter_last_cycle_timestamp_seconds{{cluster="{CLUSTER}"}} {n}',
            ""])
        return web.Response(text=text, content_type="text/plain")


async def _query(s: aiohttp.ClientSession, url: str, expr: str) -> list[dict[str, Any]]:
    async with s.get(f"{url}/api/v1/query", params={"query": expr}) as r:
        body = await r.json()
    assert body["status"] == "success", (expr, body)
    return list(body["data"]["result"])


def _rule_file(tmp: Path, groups: list[dict[str, Any]]) -> str:
    tmp.mkdir()
    (tmp / "rules.yaml").write_text(json.dumps({"groups": groups}))
    return str(tmp / "rules.yaml")


async def _run(tmp: Path, groups: list[dict[str, Any]], jobs: list[dict[str, Any]],
               wanted: str, procs: list[asyncio.subprocess.Process]) -> str:
    """A Prometheus with ``groups`` as its rules and ``jobs``, once ``wanted`` answers
    and its rules have been evaluated twice more."""
    proc, url = await start_prometheus(tmp, {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [_rule_file(tmp, groups)], "scrape_configs": jobs})
    procs.append(proc)
    async with aiohttp.ClientSession() as s:
        async with asyncio.timeout(limit(60)):
            while True:
                if await _query(s, url, wanted):
                    break
                await asyncio.sleep(0.5)
        await asyncio.sleep(2.5)
        async with s.get(f"{url}/api/v1/rules") as r:
            loaded = (await r.json())["data"]["groups"]
    assert sorted(g["name"] for g in loaded) == sorted(g["name"] for g in groups)
    bad = [(r["name"], r.get("lastError")) for g in loaded for r in g["rules"]
           if r["health"] != "ok"]
    assert not bad, bad
    return url


@pytest.mark.timeout(120)
async def test_the_shipped_cluster_rules_see_another_namespaces_series(
        tmp_path: Path, serve: Any) -> None:
    rendered = by_kind(render(tmp_path / "deploy", "clusterpodmonitoring", "gmp-rules"))
    rules, monitor = rendered["ClusterRules"], rendered["ClusterPodMonitoring"]
    assert rendered["Deployment"]["metadata"]["namespace"] == EXPORTER_NAMESPACE
    # GMP evaluates every `interval`; 1 s here: when, not what, is evaluated
    groups = [g | {"interval": "1s"} for g in rules["spec"]["groups"]]
    exposition = Exposition()
    address = (await serve(exposition.serve)).removeprefix("http://").removesuffix("/metrics")
    jobs = gmp_jobs(monitor, rendered["Deployment"], address, PROJECT, LOCATION, CLUSTER)
    shipped = scope_groups(groups, operator_scope(rules))
    # the same rules as a namespaced Rules beside the exporter
    as_rules = rules | {"kind": "Rules",
                        "metadata": rules["metadata"] | {"namespace": EXPORTER_NAMESPACE}}
    namespace_rules = scope_groups(groups, operator_scope(as_rules))
    procs: list[asyncio.subprocess.Process] = []
    try:
        cluster_url, namespace_url = await asyncio.gather(
            _run(tmp_path / "cluster", shipped, jobs, "count(ALERTS) >= 10", procs),
            # three scrapes: time enough for any rate the rules take
            _run(tmp_path / "namespace", namespace_rules, jobs,
                 "count_over_time(gke_gpu_sla_target_ratio[1m]) >= 3", procs))
        async with aiohttp.ClientSession() as s:
            # the series as GMP stores them: the workload's namespace, GMP's cluster
            (info,) = await _query(s, cluster_url, "gke_gpu_allocation_info")
            assert info["metric"]["namespace"] == WORKLOAD_NAMESPACE != EXPORTER_NAMESPACE
            assert {k: info["metric"][k] for k in CLUSTER_SCOPE} == CLUSTER_SCOPE
            assert "exported_cluster" not in info["metric"]

            alerts = {(a["metric"]["alertname"], a["metric"].get("namespace"))
                      for a in await _query(s, cluster_url, "ALERTS")}
            assert alerts == {("GpuStrandedIdle", WORKLOAD_NAMESPACE),
                              ("GpuOldestPendingPod", WORKLOAD_NAMESPACE),
                              ("GpuStockout", WORKLOAD_NAMESPACE),
                              ("GpuQuotaWaitLong", WORKLOAD_NAMESPACE),
                              ("GpuScaleUpFailed", None),
                              ("GpuTeamBudgetOverrunForecast", None),
                              ("GpuAvailabilityBudgetBurnFast", None),
                              ("GpuAvailabilityBudgetBurnHigh", None),
                              ("GpuAvailabilityBudgetBurnSlow", None),
                              ("GpuAvailabilityBudgetBurnSteady", None)}
            recorded = await _query(s, cluster_url, '{__name__=~"gke_gpu:.+"}')
            assert {r["metric"]["__name__"] for r in recorded} == {
                r["record"] for g in groups for r in g["rules"] if "record" in r} - {
                "gke_gpu:unallocated_cost_usd_per_hour:rate1h",
                "gke_gpu:queue_wait_seconds:p90_rate1h"}  # no unallocated GPU, no wait
            for r in recorded:
                assert {k: r["metric"][k] for k in CLUSTER_SCOPE} == CLUSTER_SCOPE, r

            # as a namespaced Rules: nothing recorded, no alert but the exporter "absent"
            assert await _query(s, namespace_url, '{__name__=~"gke_gpu:.+"}') == []
            absent = await _query(s, namespace_url, "ALERTS")
            assert [a["metric"]["alertname"] for a in absent] == ["GkeGpuExporterAbsent"]
    finally:
        for proc in procs:
            proc.terminate()
            await proc.wait()
