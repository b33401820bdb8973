"""The exporter's own labels survive each way deploy/ has Prometheus scrape it.

The exporter's series carry the namespace, pod and cluster of the GPU's workload; the
monitors in deploy/components give every target labels of the same names. A real Prometheus
scrapes the exporter running on the simulated cluster three ways: a plain static job; the
job prometheus-operator generates from the shipped ServiceMonitor
(pkg/prometheus/promcfg.go, generateServiceMonitorConfig); and the job Google Managed
Prometheus's operator generates from the shipped ClusterPodMonitoring
(pkg/operator/apis/monitoring/v1/pod_config.go). Both are built here from the rendered
manifests, so a change to them is what gets tested. Kubernetes service discovery is
replaced by one static target carrying the meta labels discovery would give the exporter's
pod, and the operators' relabelling runs on them unchanged.

Every dashboard query and variable and every rule expression (each alert's also with its
comparisons turned into ``bool`` ones, so that it answers when it does not fire) must give
the same series and values on all three, ignoring the labels the exporter never sets
(job, instance, …) and those a scrape path adds to series the exporter leaves without
them.

The three servers must store the very same samples for values to be comparable: they scrape
the exporter through a pass-through that stamps each sample with the moment it read
/metrics, then stops, and all are queried at one instant after that.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from simulator.scenario import load_scenario
from simulator.server import SimulatorServer
from tests.conftest import post_faults, start_exporter, start_prometheus
from tests.test_dashboards_alerts import ALERTS, ALL_RULES, BOARDS, panel_exprs
from tests.test_deploy import by_kind, render
from tests.timing import limit

CLUSTER = "live"
"""The exporter's cluster name, and GMP's (deploy/config.yaml: the GKE cluster's name)."""
TICK = 3.0
"""Seconds between two reads of the exporter's /metrics; the servers scrape every second,
so each gets every read however its scrapes fall."""
RATE_INTERVAL = "30s"
"""$__rate_interval for reads every 3 s: several samples in each window."""
NEVER_EXPORTED = {"job", "instance", "endpoint", "service", "container", "project_id",
                  "location", "top_level_controller_name", "top_level_controller_type"}
"""Target labels the exporter never sets on its own series."""

Config = dict[str, Any]
Answer = dict[frozenset[tuple[str, str]], str]


# ------------------------------------------------------------- what the operators generate


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _relabel(rules: Sequence[dict[str, Any]]) -> list[Config]:
    """The CRDs' camelCase relabelling rules as Prometheus configuration."""
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label",
            "separator": "separator", "regex": "regex", "replacement": "replacement",
            "modulus": "modulus", "action": "action"}
    return [{keys[k]: v.lower() if k == "action" else v for k, v in r.items()} for r in rules]


def _pod(deployment: Config, port: str) -> tuple[Config, Config, str]:
    """The Deployment's pod template, its container serving ``port`` and a pod name."""
    spec = deployment["spec"]["template"]
    (container,) = [c for c in spec["spec"]["containers"]
                    if any(p.get("name") == port for p in c.get("ports", []))]
    return spec, container, f"{deployment['metadata']['name']}-7c9d5f8b46-x2kqp"


def service_monitor_jobs(monitor: Config, service: Config, deployment: Config,
                         address: str) -> list[Config]:
    """prometheus-operator's scrape jobs for a ServiceMonitor (role endpoints)."""
    ns = monitor["metadata"]["namespace"]
    spec = monitor["spec"]
    jobs = []
    for i, ep in enumerate(spec["endpoints"]):
        (svc_port,) = [p for p in service["spec"]["ports"] if p["name"] == ep["port"]]
        template, container, pod = _pod(deployment, svc_port["targetPort"])
        meta = {"__meta_kubernetes_namespace": service["metadata"]["namespace"],
                "__meta_kubernetes_service_name": service["metadata"]["name"],
                "__meta_kubernetes_endpoint_port_name": svc_port["name"],
                "__meta_kubernetes_endpoint_address_target_kind": "Pod",
                "__meta_kubernetes_endpoint_address_target_name": pod,
                "__meta_kubernetes_pod_name": pod,
                "__meta_kubernetes_pod_container_name": container["name"],
                "__meta_kubernetes_pod_phase": "Running"}
        for k, v in service["metadata"].get("labels", {}).items():
            meta[f"__meta_kubernetes_service_label_{_sanitize(k)}"] = v
            meta[f"__meta_kubernetes_service_labelpresent_{_sanitize(k)}"] = "true"
        for k, v in template["metadata"]["labels"].items():
            meta[f"__meta_kubernetes_pod_label_{_sanitize(k)}"] = v
        endpoints = ["__meta_kubernetes_endpoint_address_target_kind",
                     "__meta_kubernetes_endpoint_address_target_name"]
        relabel: list[Config] = [
            {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
        relabel += [{"action": "keep",
                     "source_labels": [f"__meta_kubernetes_service_label_{_sanitize(k)}",
                                       f"__meta_kubernetes_service_labelpresent_{_sanitize(k)}"],
                     "regex": f"({v});true"}
                    for k, v in sorted(spec["selector"]["matchLabels"].items())]
        relabel += [
            {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"],
             "regex": ep["port"]},
            {"source_labels": endpoints, "separator": ";", "regex": "Node;(.*)",
             "replacement": "${1}", "target_label": "node"},
            {"source_labels": endpoints, "separator": ";", "regex": "Pod;(.*)",
             "replacement": "${1}", "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"],
             "target_label": "container"},
            {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
             "regex": "(Failed|Succeeded)"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job",
             "replacement": "${1}"}]
        if spec.get("jobLabel"):
            relabel.append({"source_labels": [
                f"__meta_kubernetes_service_label_{_sanitize(spec['jobLabel'])}"],
                "target_label": "job", "regex": "(.+)", "replacement": "${1}"})
        relabel.append({"target_label": "endpoint", "replacement": ep["port"]})
        relabel += _relabel(ep.get("relabelings", []))
        job: Config = {"job_name": f"serviceMonitor/{ns}/{monitor['metadata']['name']}/{i}",
                       "honor_labels": bool(ep.get("honorLabels", False)),
                       "static_configs": [{"targets": [address], "labels": meta}],
                       "relabel_configs": relabel}
        if ep.get("metricRelabelings"):
            job["metric_relabel_configs"] = _relabel(ep["metricRelabelings"])
        jobs.append(job)
    return jobs


GMP_PROTECTED = {"project_id", "location", "cluster", "namespace", "job", "instance",
                 "__address__"}
"""Labels GMP's operator refuses to let relabelling write or drop (pod_config.go)."""
GMP_CEL_PROTECTED = GMP_PROTECTED | {"top_level_controller", "top_level_controller_type"}
"""targetLabel values the CRD's validation rule refuses (pod_types.go)."""


def _gmp_metric_relabeling(rules: Sequence[dict[str, Any]]) -> list[Config]:
    """GMP's checks of metricRelabeling (convertRelabelingRule and the CRD's rules)."""
    for r in rules:
        action, target = r.get("action", "replace").lower(), r.get("targetLabel", "")
        regex = re.compile(f"^(?:{r.get('regex', '(.*)')})$")
        if target in GMP_CEL_PROTECTED:
            raise ValueError(f"GMP refuses {r}: {target} is protected")
        if action == "labeldrop" and any(regex.match(p) for p in GMP_PROTECTED):
            raise ValueError(f"GMP refuses {r}: it would drop a protected label")
        if action == "labelkeep" and not all(regex.match(p) for p in GMP_PROTECTED):
            raise ValueError(f"GMP refuses {r}: it would drop a protected label")
        if action not in ("replace", "hashmod", "labeldrop", "labelkeep", "keep", "drop"):
            raise ValueError(f"GMP refuses {r}: action {action} not allowed")
    return _relabel(rules)


_CONTROLLER = ["__meta_kubernetes_pod_controller_kind",
               "__meta_kubernetes_pod_labelpresent_pod_template_hash",
               "__meta_kubernetes_pod_controller_name"]
_KIND_NAME = ["__meta_kubernetes_pod_controller_kind", "__meta_kubernetes_pod_controller_name"]
GMP_METADATA: dict[str, list[Config]] = {
    label: [{"action": "replace", "source_labels": [f"__meta_kubernetes_{source}"],
             "target_label": label}]
    for label, source in (("namespace", "namespace"), ("pod", "pod_name"),
                          ("container", "pod_container_name"), ("node", "pod_node_name"))
} | {
    "top_level_controller_name": [
        {"action": "replace", "source_labels": ["__meta_kubernetes_pod_controller_name"],
         "target_label": "top_level_controller_name"},
        {"action": "replace", "source_labels": _CONTROLLER,
         "regex": "ReplicaSet;true;(.+)-[a-z0-9]+", "target_label": "top_level_controller_name"},
        {"action": "replace", "source_labels": _KIND_NAME, "regex": r"Job;(.+)-\d{8}$",
         "target_label": "top_level_controller_name"}],
    "top_level_controller_type": [
        {"action": "replace", "source_labels": ["__meta_kubernetes_pod_controller_kind"],
         "target_label": "top_level_controller_type"},
        {"action": "replace", "source_labels": _CONTROLLER,
         "regex": "ReplicaSet;true;(.+)-[a-z0-9]+", "target_label": "top_level_controller_type",
         "replacement": "Deployment"},
        {"action": "replace", "source_labels": _KIND_NAME, "regex": r"Job;(.+)-\d{8}$",
         "target_label": "top_level_controller_type", "replacement": "CronJob"}]}
"""The target labels ``targetLabels.metadata`` can ask for, as GMP writes them."""


def gmp_jobs(monitor: Config, deployment: Config, address: str, project: str,
             location: str, cluster: str) -> list[Config]:
    """GMP's scrape jobs for a PodMonitoring or ClusterPodMonitoring (role pod)."""
    spec, kind = monitor["spec"], monitor["kind"]
    cluster_scoped = kind == "ClusterPodMonitoring"
    default = ["container", "pod", "top_level_controller_name", "top_level_controller_type"]
    metadata = spec.get("targetLabels", {}).get(
        "metadata", [*default, "namespace"] if cluster_scoped else default)
    ns = deployment["metadata"]["namespace"]
    jobs = []
    for ep in spec["endpoints"]:
        template, container, pod = _pod(deployment, ep["port"])
        labels = template["metadata"]["labels"] | {"pod-template-hash": "7c9d5f8b46"}
        meta = {"__meta_kubernetes_namespace": ns, "__meta_kubernetes_pod_name": pod,
                "__meta_kubernetes_pod_container_name": container["name"],
                "__meta_kubernetes_pod_container_port_name": ep["port"],
                "__meta_kubernetes_pod_node_name": "gke-gpu-pool-1-node",
                "__meta_kubernetes_pod_controller_kind": "ReplicaSet",
                "__meta_kubernetes_pod_controller_name": pod.rsplit("-", 1)[0],
                "__meta_kubernetes_pod_phase": "Running"}
        for k, v in labels.items():
            meta[f"__meta_kubernetes_pod_label_{_sanitize(k)}"] = v
            meta[f"__meta_kubernetes_pod_labelpresent_{_sanitize(k)}"] = "true"
        relabel: list[Config] = [
            {"action": "replace", "target_label": "project_id", "replacement": project},
            {"action": "replace", "target_label": "location", "replacement": location},
            {"action": "replace", "target_label": "cluster", "replacement": cluster}]
        if not cluster_scoped:
            relabel.append({"action": "keep", "source_labels": ["__meta_kubernetes_namespace"],
                            "regex": monitor["metadata"]["namespace"]})
        relabel += [{"action": "keep",
                     "source_labels": [f"__meta_kubernetes_pod_label_{_sanitize(k)}"],
                     "regex": v} for k, v in sorted(spec["selector"]["matchLabels"].items())]
        for key in GMP_METADATA:
            if key in metadata or (key == "namespace" and not cluster_scoped):
                relabel += GMP_METADATA[key]
        relabel += [
            {"action": "replace", "replacement": monitor["metadata"]["name"],
             "target_label": "job"},
            {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
             "regex": "(Failed|Succeeded)"},
            {"action": "replace", "source_labels": ["__meta_kubernetes_pod_name"],
             "target_label": "__tmp_instance"},
            {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
             "regex": ep["port"]},
            {"action": "replace", "source_labels": ["__tmp_instance",
                                                    "__meta_kubernetes_pod_container_port_name"],
             "regex": "(.+);(.+)", "replacement": "$1:$2", "target_label": "instance"}]
        for m in spec.get("targetLabels", {}).get("fromPod", []):
            relabel += _relabel(_gmp_metric_relabeling([{
                "action": "replace", "targetLabel": m.get("to", m["from"]),
                "sourceLabels": [f"__meta_kubernetes_pod_label_{_sanitize(m['from'])}"]}]))
        job: Config = {"job_name": f"{kind}/{monitor['metadata']['name']}/{ep['port']}",
                       "static_configs": [{"targets": [address], "labels": meta}],
                       "relabel_configs": relabel}
        if ep.get("metricRelabeling"):
            job["metric_relabel_configs"] = _gmp_metric_relabeling(ep["metricRelabeling"])
        jobs.append(job)
    return jobs


# ------------------------------------------------------------- the queries


def _boolean(expr: str) -> str:
    """``expr`` with each comparison made a ``bool`` one: the series it filters, as 0 or 1."""
    out, depth, quote, i = [], 0, "", 0
    while i < len(expr):
        c = expr[i]
        if quote:
            quote = "" if c == quote and expr[i - 1] != "\\" else quote
        elif c in "\"'`":
            quote = c
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif depth == 0 and (m := re.match(r"(==|!=|>=|<=|>|<)(?!\s*bool\b)", expr[i:])):
            out.append(m.group(1) + " bool")
            i += len(m.group(1))
            continue
        out.append(c)
        i += 1
    return "".join(out)


def queries() -> list[tuple[str, str]]:
    """(what, PromQL) for every dashboard panel and variable and every rule."""
    out = [(f"{board}: {title}", expr.replace("[1m]", f"[{RATE_INTERVAL}]"))
           for board, title, expr in panel_exprs()]
    for name, board in BOARDS.items():
        for v in board["templating"]["list"]:
            if v["type"] == "query" and (m := re.fullmatch(r"label_values\((.+), (\w+)\)",
                                                           v["query"]["query"])):
                expr = m.group(1).replace('"$cluster"', '".*"')
                out.append((f"{name}: variable {v['name']}", f"group by ({m.group(2)}) ({expr})"))
    for rule in ALL_RULES:
        name = rule.get("record") or rule["alert"]
        out.append((f"rule {name}", rule["expr"]))
        if "alert" in rule:
            out.append((f"rule {name} (bool)", _boolean(rule["expr"])))
    out.append(("every exported series", '{__name__=~"gke_gpu_.+"}'))
    return out


# ------------------------------------------------------------- the servers


class Stamper:
    """Serves the exporter's /metrics as last read, each sample stamped with the moment it
    was read: once at ``start``, then every TICK seconds from ``run`` to ``stop``."""

    def __init__(self, source: str) -> None:
        self.source, self.body, self.last, self.reads = source, b"", 0.0, 0
        self._task: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        async with aiohttp.ClientSession() as s:
            await self._read(s)
        app = web.Application()
        app.router.add_get("/metrics", self._serve)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return f"127.0.0.1:{self._runner.addresses[0][1]}"

    async def _read(self, s: aiohttp.ClientSession) -> None:
        async with s.get(self.source) as r:
            text = await r.text()
        now = time.time()
        ms = int(now * 1000)
        self.body = "".join(line + (f" {ms}\n" if line and not line.startswith("#") else "\n")
                            for line in text.splitlines()).encode()
        self.last = now
        self.reads += 1

    def run(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        async with aiohttp.ClientSession() as s:
            while True:
                await asyncio.sleep(TICK)
                await self._read(s)

    async def _serve(self, _: web.Request) -> web.Response:
        return web.Response(body=self.body,
                            headers={"Content-Type": "text/plain; version=0.0.4"})

    def stop(self) -> float:
        """Stop reading; returns when the last /metrics served was read."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        return self.last

    async def close(self) -> None:
        self.stop()
        if self._runner is not None:
            await self._runner.cleanup()


async def _answer(s: aiohttp.ClientSession, url: str, expr: str, at: float,
                  target: dict[str, str]) -> Answer:
    """The query's series at ``at``, less the labels that are the target's, not the
    exporter's: by name, or by value where ``target`` gives one."""
    async with s.get(f"{url}/api/v1/query", params={"query": expr, "time": str(at)}) as r:
        body = await r.json()
    assert body["status"] == "success", (expr, body)
    data = body["data"]
    if data["resultType"] == "scalar":
        return {frozenset(): data["result"][1]}
    out: Answer = {}
    for item in data["result"]:
        key = frozenset((k, v) for k, v in item["metric"].items()
                        if k not in NEVER_EXPORTED and target.get(k) != v)
        assert key not in out, f"{expr}: two series become {dict(key)}"
        out[key] = item["value"][1]
    return out


def _same(a: str, b: str) -> bool:
    return a == b or math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)


def _differences(expected: Answer, got: Answer) -> str:
    missing = [dict(k) for k in expected.keys() - got.keys()]
    extra = [dict(k) for k in got.keys() - expected.keys()]
    values = [(dict(k), expected[k], got[k]) for k in expected.keys() & got.keys()
              if not _same(expected[k], got[k])]
    if not (missing or extra or values):
        return ""
    return f"missing {missing[:3]}, unexpected {extra[:3]}, values {values[:3]}"


async def _targets(s: aiohttp.ClientSession, url: str) -> dict[str, str]:
    """The labels of the server's one active target, once it has been scraped."""
    async with asyncio.timeout(limit(30)):
        while True:
            async with s.get(f"{url}/api/v1/targets") as r:
                active = (await r.json())["data"]["activeTargets"]
            if active and all(t["health"] == "up" for t in active):
                (target,) = active
                return dict(target["labels"])
            await asyncio.sleep(0.5)


def _exporter_env(kubeconfig: Path, tmp: Path) -> dict[str, str]:
    return os.environ | {
        "GKE_GPU_EXPORTER_INTERVAL": "1", "GKE_GPU_EXPORTER_PORT": "0",
        "GKE_GPU_EXPORTER_LISTEN_ADDRESS": "127.0.0.1", "GKE_GPU_EXPORTER_CLUSTER": CLUSTER,
        "GKE_GPU_EXPORTER_DCGM__TIMEOUT": "0.8",
        "GKE_GPU_EXPORTER_KUBERNETES__KUBECONFIG": str(kubeconfig),
        "GKE_GPU_EXPORTER_WAREHOUSE__PATH": str(tmp / "w.duckdb"),
        "GKE_GPU_EXPORTER_BUDGETS": '{"research": 1000}'}


@pytest.mark.timeout(120)
async def test_every_query_answers_the_same_on_every_scrape_path(tmp_path: Path) -> None:
    operator = by_kind(render(tmp_path / "operator", "servicemonitor"))
    gmp = by_kind(render(tmp_path / "gmp", "clusterpodmonitoring"))
    (pm,) = [d for d in gmp.values() if d["kind"] in ("PodMonitoring", "ClusterPodMonitoring")]

    sim = SimulatorServer(load_scenario("default"))
    await sim.start()
    procs: list[asyncio.subprocess.Process] = []
    stamper: Stamper | None = None
    try:
        await sim.advance(6 * 3600)
        for _ in range(4):  # more pretraining than the H100s hold: a queue
            sim.cluster.submit("llm-pretrain")
        sim.cluster.submit("hparam-sweep", run_seconds=86400)  # a spot job to preempt
        await sim.advance(15 * 60)
        kubeconfig = sim.write_outputs(tmp_path).kubeconfig
        exporter, port = await start_exporter(_exporter_env(kubeconfig, tmp_path))
        procs.append(exporter)
        async with aiohttp.ClientSession() as s:
            await asyncio.sleep(2)  # the exporter's first cycles, before the faults
            await post_faults(s, sim.api_url)
        for _ in range(2):
            await sim.advance(sim.cluster.step)
            await asyncio.sleep(1)
        stamper = Stamper(f"http://127.0.0.1:{port}/metrics")
        address = await stamper.start()
        paths = {
            "static": [{"job_name": "gke-gpu-exporter",
                        "static_configs": [{"targets": [address]}]}],
            "prometheus-operator ServiceMonitor": service_monitor_jobs(
                operator["ServiceMonitor"], operator["Service"], operator["Deployment"],
                address),
            f"GMP {pm['kind']}": gmp_jobs(pm, gmp["Deployment"], address, "my-gpu-project",
                                          "us-central1", CLUSTER)}
        urls = {}
        for i, (name, jobs) in enumerate(paths.items()):
            (tmp_path / str(i)).mkdir()
            config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                      "rule_files": [str(ALERTS / "rules.yaml")], "scrape_configs": jobs}
            proc, urls[name] = await start_prometheus(tmp_path / str(i), config)
            procs.append(proc)
        async with aiohttp.ClientSession() as s:
            # every server has the first read before the next: the same samples in all
            targets = {name: await _targets(s, url) for name, url in urls.items()}
            stamper.run()
            await asyncio.sleep(6 * TICK)  # a few samples for every rate
            last = stamper.stop()
            await asyncio.sleep(6)  # all scraped the last one; rules evaluated on it
            at = round(last + 4.5, 3)
            for name, url in urls.items():
                reads = await _answer(s, url, "count_over_time(gke_gpu_sla_target_ratio[5m])",
                                      at, {})
                assert list(reads.values()) == [str(stamper.reads)], f"{name} missed a read"

            differences = []
            for what, expr in queries():
                for name, url in list(urls.items())[1:]:
                    expected, got = await asyncio.gather(
                        _answer(s, urls["static"], expr, at, targets[name]),
                        _answer(s, url, expr, at, targets[name]))
                    if diff := _differences(expected, got):
                        differences.append(f"{name}: {what}: {diff}")
            assert not differences, "\n".join(differences)
            series = await _answer(s, urls["static"], '{__name__=~"gke_gpu_.+"}', at, {})
            assert any({"namespace", "pod"} <= dict(k).keys() for k in series), \
                "no series with a workload's namespace and pod to compare"
    finally:
        if stamper is not None:
            await stamper.close()
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
        await sim.stop()
