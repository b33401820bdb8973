"""deploy/ rendered by kubectl kustomize: hardened, least-privileged, probed, persistent;
each component (a monitor, its rules, the weekly report job) added on its own; a
NetworkPolicy that lets through every endpoint the shipped configuration reaches."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any, get_args

import pytest
import yaml

from exporter.config import Config, load_config
from exporter.runtime.egress import Endpoint, Purpose, blocked, outbound_endpoints
from tests.timing import limit

ROOT = Path(__file__).parents[1]
DEPLOY = ROOT / "deploy"
COMPONENTS = sorted(p.name for p in (DEPLOY / "components").iterdir() if p.is_dir())
MONITORS = {"servicemonitor": "ServiceMonitor", "clusterpodmonitoring": "ClusterPodMonitoring"}
ADDS = MONITORS | {"prometheus-rules": "PrometheusRule", "gmp-rules": "ClusterRules",
                   "bigquery-report": "CronJob"}
"""Component -> the one kind it adds."""
SHIPPED_IN_BASE = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                   "ConfigMap", "Service", "PersistentVolumeClaim", "Deployment",
                   "NetworkPolicy"}

Objects = dict[str, dict[str, Any]]


def render(tmp: Path, *components: str) -> list[dict[str, Any]]:
    """deploy/ rendered by ``kubectl kustomize`` through an overlay in ``tmp`` that adds
    the named components, as a user's overlay would."""
    tmp.mkdir(parents=True, exist_ok=True)
    base = PurePosixPath(os.path.relpath(DEPLOY, tmp))
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [str(base)],
        "components": [str(base / "components" / c) for c in components]}))
    proc = subprocess.run(["kubectl", "kustomize", str(tmp)], capture_output=True, text=True,
                          timeout=limit(60))
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def by_kind(docs: list[dict[str, Any]]) -> Objects:
    kinds = [d["kind"] for d in docs]
    assert len(set(kinds)) == len(kinds), kinds
    return {d["kind"]: d for d in docs}


@pytest.fixture(scope="module")
def objects() -> Objects:
    proc = subprocess.run(["kubectl", "kustomize", str(DEPLOY)], capture_output=True,
                          text=True, timeout=limit(60), check=True)
    return by_kind([d for d in yaml.safe_load_all(proc.stdout) if d])


@pytest.fixture(scope="module")
def with_component(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Objects]:
    """Component -> the base with only that component added."""
    return {c: by_kind(render(tmp_path_factory.mktemp(c), c)) for c in COMPONENTS}


def test_everything_is_there(objects: Objects) -> None:
    assert set(objects) == SHIPPED_IN_BASE
    for kind, obj in objects.items():
        if kind not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == "gke-gpu-exporter", kind


def test_the_base_scrapes_nothing_and_each_monitor_comes_alone(
        objects: Objects, with_component: dict[str, Objects]) -> None:
    """A cluster has one monitor's CRDs, or scrapes twice with both: each is a component."""
    assert set(COMPONENTS) == set(ADDS)
    for component, rendered in with_component.items():
        assert set(rendered) == SHIPPED_IN_BASE | {ADDS[component]}, component
        assert rendered["Deployment"] == objects["Deployment"], component


def test_the_components_listed_in_the_base_render_the_same(
        tmp_path: Path, with_component: dict[str, Objects]) -> None:
    """Uncommenting ``components:`` in deploy/kustomization.yaml adds what an overlay adds."""
    copy = tmp_path / "deploy"
    subprocess.run(["cp", "-r", str(DEPLOY), str(copy)], check=True, timeout=limit(30))
    text = (copy / "kustomization.yaml").read_text()
    enabled = text.replace("# components:", "components:").replace("#   - components/",
                                                                     "  - components/")
    assert enabled.count("  - components/") == len(COMPONENTS)
    (copy / "kustomization.yaml").write_text(enabled)
    proc = subprocess.run(["kubectl", "kustomize", str(copy)], capture_output=True, text=True,
                          timeout=limit(60))
    assert proc.returncode == 0, proc.stderr
    rendered = by_kind([d for d in yaml.safe_load_all(proc.stdout) if d])
    assert set(rendered) == SHIPPED_IN_BASE | set(ADDS.values())
    for component, kind in ADDS.items():
        if kind != "CronJob":
            assert rendered[kind]["spec"] == with_component[component][kind]["spec"], kind
    pod = rendered["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    overlaid = with_component["bigquery-report"]["CronJob"]["spec"]["jobTemplate"]["spec"][
        "template"]["spec"]
    assert pod["containers"] == overlaid["containers"]
    assert pod["volumes"] == overlaid["volumes"]


def test_pod_security_restricted(objects: Objects) -> None:
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert objects["Namespace"]["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"] == "restricted"


def test_probes_and_graceful_shutdown(objects: Objects) -> None:
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    config = yaml.safe_load(objects["ConfigMap"]["data"]["config.yaml"])
    shutdown = load_config(None, config).shutdown_timeout
    assert pod["terminationGracePeriodSeconds"] > shutdown + 5


def test_rbac_is_read_only(objects: Objects) -> None:
    rules = objects["ClusterRole"]["rules"]
    readable = {"": {"pods", "nodes", "namespaces", "events"},
                "kueue.x-k8s.io": {"workloads", "clusterqueues", "localqueues"}}
    for rule in rules:
        (group,) = rule["apiGroups"]
        assert set(rule["verbs"]) <= {"get", "list", "watch"}
        assert set(rule["resources"]) <= readable[group]
    assert {g for r in rules for g in r["apiGroups"]} == set(readable)
    (subject,) = objects["ClusterRoleBinding"]["subjects"]
    assert subject["name"] == objects["ServiceAccount"]["metadata"]["name"]
    assert objects["Deployment"]["spec"]["template"]["spec"]["serviceAccountName"] == \
        subject["name"]


def test_workload_identity_and_scraping(objects: Objects,
                                        with_component: dict[str, Objects]) -> None:
    assert "iam.gke.io/gcp-service-account" in \
        objects["ServiceAccount"]["metadata"]["annotations"]
    pod_labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    for component, kind in MONITORS.items():
        monitor = with_component[component][kind]
        selector = monitor["spec"]["selector"]["matchLabels"]
        target = pod_labels if kind == "ClusterPodMonitoring" else \
            objects["Service"]["metadata"]["labels"]
        assert selector.items() <= target.items(), kind
        assert "app.kubernetes.io/name" in selector, "cluster-wide: select this app only"
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] == "metrics"
        assert monitor["metadata"]["labels"]["app.kubernetes.io/name"] == "gke-gpu-exporter"
    ingress = objects["NetworkPolicy"]["spec"]["ingress"]
    assert [p["port"] for rule in ingress for p in rule["ports"]] == [9808]


def test_the_monitors_keep_the_exporters_labels(with_component: dict[str, Objects]) -> None:
    """The exporter's namespace and pod labels win over the target's (tests/
    test_scrape_labels.py shows it on a real Prometheus)."""
    sm = with_component["servicemonitor"]["ServiceMonitor"]
    assert sm["metadata"]["namespace"] == "gke-gpu-exporter"
    assert all(ep["honorLabels"] is True for ep in sm["spec"]["endpoints"])
    cpm = with_component["clusterpodmonitoring"]["ClusterPodMonitoring"]
    assert cpm["spec"]["targetLabels"]["metadata"] == []


def test_the_shipped_config_is_valid(objects: Objects) -> None:
    cfg = load_config(None, yaml.safe_load(objects["ConfigMap"]["data"]["config.yaml"]))
    assert cfg.kubernetes.in_cluster and str(cfg.warehouse.path).startswith(
        "/var/lib/gke-gpu-exporter")
    volumes = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0][
        "volumeMounts"]
    assert any(str(cfg.warehouse.path).startswith(v["mountPath"]) and not v.get("readOnly")
               for v in volumes)


def test_the_warehouse_outlives_the_pod(objects: Objects) -> None:
    """The DuckDB file (and the BigQuery outbox in it) is on a PersistentVolumeClaim,
    mounted at its directory, written by one pod at a time."""
    cfg = load_config(None, yaml.safe_load(objects["ConfigMap"]["data"]["config.yaml"]))
    deployment = objects["Deployment"]["spec"]
    assert deployment["replicas"] == 1 and deployment["strategy"]["type"] == "Recreate"
    pod = deployment["template"]["spec"]
    (container,) = pod["containers"]
    (mount,) = [m for m in container["volumeMounts"]
                if m["mountPath"] == str(PurePosixPath(cfg.warehouse.path).parent)]
    assert not mount.get("readOnly")
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" not in volume
    pvc = objects["PersistentVolumeClaim"]
    assert volume["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"] == 65532
    (tmp,) = [v for v in pod["volumes"]
              if v["name"] == next(m["name"] for m in container["volumeMounts"]
                                   if m["mountPath"] == "/tmp")]
    assert "emptyDir" in tmp


def test_the_weekly_report_job(objects: Objects, with_component: dict[str, Objects]) -> None:
    """Mondays 07:00 UTC, never two at once, as hardened as the exporter, from BigQuery."""
    rendered = with_component["bigquery-report"]
    job = rendered["CronJob"]
    assert job["metadata"]["namespace"] == "gke-gpu-exporter"
    spec = job["spec"]
    assert (spec["schedule"], spec["timeZone"], spec["concurrencyPolicy"]) == (
        "0 7 * * 1", "Etc/UTC", "Forbid")
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    exporter = objects["Deployment"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == exporter["serviceAccountName"]
    for key in ("runAsNonRoot", "runAsUser", "seccompProfile"):
        assert pod["securityContext"][key] == exporter["securityContext"][key], key
    (container,) = pod["containers"]
    (exporter_container,) = exporter["containers"]
    assert container["image"] == exporter_container["image"]
    assert container["securityContext"] == exporter_container["securityContext"]
    assert container["resources"]["limits"]["memory"]
    assert [container.get("command", []), container["args"]] == [[], [
        "report", "weekly", "--config", "/etc/gke-gpu-exporter/config.yaml",
        "--bigquery", "PROJECT_ID.gke_gpu", "--out", "/tmp/report", "--email"]]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config = mounts["/etc/gke-gpu-exporter"]
    assert config["readOnly"] and volumes[config["name"]]["configMap"]["name"] == \
        objects["ConfigMap"]["metadata"]["name"]
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]


@pytest.mark.parametrize("component", ["", "bigquery-report"], ids=["exporter", "report job"])
def test_the_smtp_password_is_a_mounted_file_never_an_environment_variable(
        objects: Objects, with_component: dict[str, Objects], component: str) -> None:
    """What a process inherits (the scheduled report's child, anything it runs) holds no
    secret: the password is read from the Secret's file, ``report.smtp.password_file``."""
    pod = with_component[component]["CronJob"]["spec"]["jobTemplate"]["spec"]["template"][
        "spec"] if component else objects["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert [e["name"] for e in container.get("env", []) if "valueFrom" in e] == []
    assert [e for e in container.get("envFrom", []) if "secretRef" in e] == []
    cfg = load_config(None, _documented(objects["ConfigMap"]["data"]["config.yaml"]))
    smtp = cfg.report.smtp
    assert smtp.password is None and smtp.password_file is not None
    assert cfg.report.platform_recipients and smtp.security == "starttls"
    file = PurePosixPath(smtp.password_file)
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(file.parent)]
    assert mount["readOnly"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    secret = volume["secret"]
    assert secret["secretName"] == "gke-gpu-exporter-smtp" and "items" not in secret
    assert file.name == "password"  # the key docs/deploying.md creates the Secret with
    # readable by the pod's group (its fsGroup), by no other user
    mode = secret["defaultMode"]
    assert mode & 0o040 and not mode & 0o007, oct(mode)
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]


# ---------------------------------------------------------------------------- the rules


def test_the_rules_components_carry_the_rules(with_component: dict[str, Objects]) -> None:
    """Each rules component ships alerts/rules.yaml whole: the PrometheusRule in the
    exporter's namespace, the ClusterRules in none (GMP evaluates it cluster-wide)."""
    rules = yaml.safe_load((ROOT / "alerts" / "rules.yaml").read_text())["groups"]
    operator = with_component["prometheus-rules"]["PrometheusRule"]
    assert operator["metadata"]["namespace"] == "gke-gpu-exporter"
    assert operator["spec"]["groups"] == rules
    gmp = with_component["gmp-rules"]["ClusterRules"]
    assert (gmp["apiVersion"], "namespace" in gmp["metadata"]) == (
        "monitoring.googleapis.com/v1", False)
    assert [{k: v for k, v in g.items() if k != "interval"} for g in gmp["spec"]["groups"]] \
        == rules
    for obj in (operator, gmp):
        assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == "gke-gpu-exporter"


def _overlay(block_marker: str) -> str:
    """The overlay docs/deploying.md shows: its YAML block holding ``block_marker``."""
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "deploying.md").read_text(),
                        re.S)
    (block,) = [str(b) for b in blocks if block_marker in b]
    return block


def test_the_prometheus_selector_label_is_set_as_the_docs_show(tmp_path: Path) -> None:
    """The label a Prometheus's serviceMonitorSelector and ruleSelector match (e.g.
    ``release``) lands on the ServiceMonitor and the PrometheusRule, and nowhere else."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = PurePosixPath(os.path.relpath(DEPLOY, overlay))
    (overlay / "kustomization.yaml").write_text(
        _overlay("path: /metadata/labels/release").replace("../deploy", str(base)))
    proc = subprocess.run(["kubectl", "kustomize", str(overlay)], capture_output=True,
                          text=True, timeout=limit(60))
    assert proc.returncode == 0, proc.stderr
    rendered = by_kind([d for d in yaml.safe_load_all(proc.stdout) if d])
    assert set(rendered) == SHIPPED_IN_BASE | {"ServiceMonitor", "PrometheusRule"}
    labelled = {kind for kind, obj in rendered.items()
                if "release" in obj["metadata"].get("labels", {})}
    assert labelled == {"ServiceMonitor", "PrometheusRule"}
    assert len({rendered[k]["metadata"]["labels"]["release"] for k in labelled}) == 1


# ---------------------------------------------------------------------------- egress


def _merge(base: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in more.items():
        out[key] = _merge(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def _documented(text: str) -> dict[str, Any]:
    """deploy/config.yaml with the settings it shows commented out turned on."""
    data: dict[str, Any] = yaml.safe_load(re.sub(r"^( +)# ( *[a-z_]+:(?: |$))", r"\1\2",
                                                 text, flags=re.M))
    return data


FEATURES: dict[str, dict[str, Any]] = {
    "weekly email over STARTTLS (as config.yaml shows it)": {},
    "weekly email over TLS": {"report": {"smtp": {"port": 465, "security": "ssl"}}},
    "BigQuery": {"warehouse": {"bigquery": {"enabled": True}}},
    "reconciliation with the bill": {
        "warehouse": {"bigquery": {"enabled": True}},
        "report": {"billing_table": "billing-project.billing.gcp_billing_export_resource_v1_X"}},
    "Cloud Billing catalogue": {"prices": {"catalog": {"enabled": True}}},
    "Cloud Monitoring custom metrics": {"cloud_monitoring": {
        "enabled": True, "project": "my-gpu-project", "location": "us-central1"}},
    "DCGM from a Prometheus API": {"dcgm": {"prometheus": {
        "url": "http://prometheus.monitoring:9090"}}},
    "DCGM from Cloud Monitoring": {"dcgm": {"cloud_monitoring": {"project": "my-gpu-project"}}},
    "remote write": {"remote_write": {"url": "http://prometheus:9090/api/v1/write"}},
}
"""What the docs turn on, on top of deploy/config.yaml (docs/deploying.md, report.md)."""


def _config(objects: Objects, features: dict[str, Any] | None) -> Config:
    text = objects["ConfigMap"]["data"]["config.yaml"]
    data = yaml.safe_load(text) if features is None else _merge(_documented(text), features)
    return load_config(None, data)


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector, as Kubernetes reads it."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, values = e["key"], e.get("values", [])
        holds = {"In": key in labels and labels[key] in values,
                 "NotIn": key not in labels or labels[key] not in values,
                 "Exists": key in labels, "DoesNotExist": key not in labels}[e["operator"]]
        if not holds:
            return False
    return True


def admits(policy: dict[str, Any], namespace: str, port: int) -> bool:
    """Whether a NetworkPolicy's ingress lets any pod of ``namespace`` (labelled, as every
    namespace is, with its name) reach ``port`` of the pods it selects."""
    own = policy["metadata"]["namespace"]
    for rule in policy["spec"].get("ingress", []):
        if rule.get("ports") and not any(p.get("protocol", "TCP") == "TCP" and p.get(
                "port") == port for p in rule["ports"]):
            continue
        if not rule.get("from"):
            return True  # from everywhere
        for peer in rule["from"]:
            if "ipBlock" in peer:
                continue
            selector = peer.get("namespaceSelector")
            in_namespace = namespace == own if selector is None else \
                _selects(selector, {"kubernetes.io/metadata.name": namespace})
            if in_namespace and not peer.get("podSelector"):  # any pod of it
                return True
    return False


@pytest.mark.parametrize(("namespace", "port", "admitted"), [
    ("gmp-system", 9808, True),
    ("monitoring", 9808, True),
    ("default", 9808, False),
    ("research", 9808, False),
    ("gke-gpu-exporter", 9808, False),
    ("gmp-system", 9400, False),
])
def test_metrics_are_let_in_from_the_scrapers_namespaces_only(
        objects: Objects, namespace: str, port: int, admitted: bool) -> None:
    """``/metrics`` names pods, teams and costs: Managed Prometheus' collectors
    (gmp-system) and prometheus-operator's Prometheus (monitoring) read it, no one else."""
    assert admits(objects["NetworkPolicy"], namespace, port) is admitted


def test_an_overlay_lets_another_scraper_in_as_the_docs_show(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "deploying.md").read_text()
    (block,) = re.findall(r"```yaml\n(# kustomization.yaml of your overlay\n.*?)```", doc,
                          re.S)
    overlay = yaml.safe_load(block)
    overlay["resources"] = [os.path.relpath(DEPLOY, tmp_path)]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    proc = subprocess.run(["kubectl", "kustomize", str(tmp_path)], capture_output=True,
                          text=True, timeout=limit(60))
    assert proc.returncode == 0, proc.stderr
    policy = by_kind([d for d in yaml.safe_load_all(proc.stdout) if d])["NetworkPolicy"]
    assert admits(policy, "observability", 9808)
    assert not admits(policy, "gmp-system", 9808) and not admits(policy, "default", 9808)
    assert policy["spec"]["egress"]  # the rest of the policy as shipped


def test_the_network_policy_lets_the_shipped_config_out(objects: Objects) -> None:
    """Every endpoint deploy/config.yaml reaches, as shipped and with each feature the docs
    describe turned on, passes the shipped NetworkPolicy's egress."""
    egress = objects["NetworkPolicy"]["spec"]["egress"]
    seen: set[str] = set()
    for name, features in {"as shipped": None, **FEATURES}.items():
        endpoints = outbound_endpoints(_config(objects, features))
        assert not blocked(endpoints, egress), f"{name}: {blocked(endpoints, egress)}"
        seen |= {e.purpose for e in endpoints}
    assert seen == {"dns", "kubernetes-api", "dcgm-exporter", "prometheus-api", "google-apis",
                    "metadata-server", "remote-write", "smtp"}


def _without_port(egress: list[dict[str, Any]], port: int) -> list[dict[str, Any]]:
    """The egress rules less ``port`` (a rule left with no port goes: none would mean all)."""
    out = []
    for rule in egress:
        ports = [p for p in rule.get("ports", []) if p.get("port") != port]
        if ports or not rule.get("ports"):
            out.append(rule | {"ports": ports} if rule.get("ports") else rule)
    return out


@pytest.mark.parametrize(("removed", "features", "refused"), [
    (587, FEATURES["weekly email over STARTTLS (as config.yaml shows it)"],
     [Endpoint("smtp", 587, "smtp.example.com", setting="report.smtp")]),
    (465, FEATURES["weekly email over TLS"],
     [Endpoint("smtp", 465, "smtp.example.com", setting="report.smtp")]),
    (80, FEATURES["BigQuery"],
     [Endpoint("metadata-server", 80, "169.254.169.254", setting="Workload Identity")]),
    (9400, {}, [Endpoint("dcgm-exporter", 9400, in_cluster=True, setting="dcgm.discovery")]),
    (None, {"remote_write": {"url": "https://metrics.example.com:19291/api/v1/write"}},
     [Endpoint("remote-write", 19291, "metrics.example.com", setting="remote_write.url")]),
    (None, {"report": {"smtp": {"port": 2525}}},
     [Endpoint("smtp", 2525, "smtp.example.com", setting="report.smtp")]),
], ids=["smtp-587-removed", "smtp-465-removed", "metadata-80-removed", "dcgm-9400-removed",
        "remote-write-elsewhere", "smtp-elsewhere"])
def test_a_configured_endpoint_the_policy_refuses_is_reported(
        objects: Objects, removed: int | None, features: dict[str, Any],
        refused: list[Endpoint]) -> None:
    """The check fails for a policy without a port the configuration needs, and for a
    configuration on a port the policy does not open."""
    egress = objects["NetworkPolicy"]["spec"]["egress"]
    if removed is not None:
        egress = _without_port(egress, removed)
    assert blocked(outbound_endpoints(_config(objects, features)), egress) == refused


def test_the_docs_list_every_kind_of_endpoint() -> None:
    """docs/deploying.md's Network policy table has a row for each."""
    text = (ROOT / "docs" / "deploying.md").read_text()
    section = text.split("\n## Network policy\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z-]+)` \|", section, re.M)
    assert rows == list(get_args(Purpose))
