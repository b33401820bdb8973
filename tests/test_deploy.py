"""deploy/ rendered by kubectl kustomize: hardened, least-privileged, probed, scraped."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.config import load_config

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def objects() -> dict[str, dict[str, Any]]:
    proc = subprocess.run(["kubectl", "kustomize", str(ROOT / "deploy")], capture_output=True,
                          text=True, timeout=60, check=True)
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return {d["kind"]: d for d in docs}


def test_everything_is_there(objects: dict[str, dict[str, Any]]) -> None:
    assert set(objects) == {"Namespace", "ServiceAccount", "ClusterRole",
                            "ClusterRoleBinding", "ConfigMap", "Service", "Deployment",
                            "PodMonitoring", "ServiceMonitor", "NetworkPolicy"}
    for kind, obj in objects.items():
        if kind not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == "gke-gpu-exporter", kind


def test_pod_security_restricted(objects: dict[str, dict[str, Any]]) -> None:
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


def test_probes_and_graceful_shutdown(objects: dict[str, dict[str, Any]]) -> None:
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    config = yaml.safe_load(objects["ConfigMap"]["data"]["config.yaml"])
    shutdown = load_config(None, config).shutdown_timeout
    assert pod["terminationGracePeriodSeconds"] > shutdown + 5


def test_rbac_is_read_only(objects: dict[str, dict[str, Any]]) -> None:
    rules = objects["ClusterRole"]["rules"]
    for rule in rules:
        assert rule["apiGroups"] == [""]
        assert set(rule["verbs"]) <= {"get", "list", "watch"}
        assert set(rule["resources"]) <= {"pods", "nodes", "namespaces"}
    (subject,) = objects["ClusterRoleBinding"]["subjects"]
    assert subject["name"] == objects["ServiceAccount"]["metadata"]["name"]
    assert objects["Deployment"]["spec"]["template"]["spec"]["serviceAccountName"] == \
        subject["name"]


def test_workload_identity_and_scraping(objects: dict[str, dict[str, Any]]) -> None:
    assert "iam.gke.io/gcp-service-account" in \
        objects["ServiceAccount"]["metadata"]["annotations"]
    labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    for kind in ("PodMonitoring", "ServiceMonitor"):
        selector = objects[kind]["spec"]["selector"]["matchLabels"]
        target = labels if kind == "PodMonitoring" else objects["Service"]["metadata"]["labels"]
        assert selector.items() <= target.items(), kind
        assert objects[kind]["spec"]["endpoints"][0]["port"] == "metrics"
    ingress = objects["NetworkPolicy"]["spec"]["ingress"]
    assert [p["port"] for rule in ingress for p in rule["ports"]] == [9808]


def test_the_shipped_config_is_valid(objects: dict[str, dict[str, Any]]) -> None:
    cfg = load_config(None, yaml.safe_load(objects["ConfigMap"]["data"]["config.yaml"]))
    assert cfg.kubernetes.in_cluster and str(cfg.warehouse.path).startswith(
        "/var/lib/gke-gpu-exporter")
    volumes = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0][
        "volumeMounts"]
    assert any(str(cfg.warehouse.path).startswith(v["mountPath"]) and not v.get("readOnly")
               for v in volumes)
