"""exporter.runtime.egress: the endpoints a configuration connects to, and a NetworkPolicy's
egress rules read as Kubernetes reads them."""

from __future__ import annotations

from typing import Any

import pytest

from exporter.config import load_config
from exporter.runtime.egress import Endpoint, allows, blocked, outbound_endpoints

DNS = [Endpoint("dns", 53, protocol="UDP", in_cluster=True, setting="(always)"),
       Endpoint("dns", 53, protocol="TCP", in_cluster=True, setting="(always)")]
DISCOVERED = Endpoint("dcgm-exporter", 9400, in_cluster=True, setting="dcgm.discovery")
METADATA = [Endpoint("metadata-server", 80, "169.254.169.254", setting="Workload Identity"),
            Endpoint("metadata-server", 988, "169.254.169.252", setting="Workload Identity")]
MAIL = {"schedule": "mon 07:00", "platform_recipients": ["p@example.com"]}


@pytest.mark.parametrize(("settings", "expected"), [
    ({}, [*DNS, DISCOVERED]),
    ({"kubernetes": {"in_cluster": True}, "dcgm": {"discovery": {"port": 9500}}},
     [*DNS, Endpoint("kubernetes-api", 443, "kubernetes.default.svc",
                     setting="kubernetes.in_cluster"),
      Endpoint("dcgm-exporter", 9500, in_cluster=True, setting="dcgm.discovery")]),
    ({"dcgm": {"targets": ["http://10.0.0.5:9400/metrics", "https://dcgm.example.com/m"]}},
     [*DNS, Endpoint("dcgm-exporter", 9400, "10.0.0.5", setting="dcgm.targets"),
      Endpoint("dcgm-exporter", 443, "dcgm.example.com", setting="dcgm.targets")]),
    ({"dcgm": {"prometheus": {"url": "http://prometheus.monitoring:9090"}}},
     [*DNS, Endpoint("prometheus-api", 9090, "prometheus.monitoring", in_cluster=True,
                     setting="dcgm.prometheus.url")]),
    ({"dcgm": {"cloud_monitoring": {"project": "my-gpu-project"}}},
     [*DNS, Endpoint("google-apis", 443, "monitoring.googleapis.com",
                     setting="dcgm.cloud_monitoring"), *METADATA]),
    ({"warehouse": {"bigquery": {"enabled": True, "project": "my-gpu-project"}},
      "prices": {"catalog": {"enabled": True}}},
     [*DNS, DISCOVERED,
      Endpoint("google-apis", 443, "cloudbilling.googleapis.com", setting="prices.catalog"),
      Endpoint("google-apis", 443, "bigquery.googleapis.com", setting="warehouse.bigquery"),
      *METADATA]),
    # the emulator: no credentials, so no metadata server
    ({"warehouse": {"bigquery": {"enabled": True, "project": "my-gpu-project",
                                 "endpoint": "http://localhost:9050", "anonymous": True}}},
     [*DNS, DISCOVERED,
      Endpoint("google-apis", 9050, "localhost", setting="warehouse.bigquery")]),
    ({"cloud_monitoring": {"enabled": True, "project": "my-gpu-project",
                           "location": "us-central1", "endpoint": "127.0.0.1:8085",
                           "anonymous": True}},
     [*DNS, DISCOVERED, Endpoint("google-apis", 8085, "127.0.0.1", setting="cloud_monitoring")]),
    ({"remote_write": {"url": "https://metrics.example.com/api/v1/write"}},
     [*DNS, DISCOVERED,
      Endpoint("remote-write", 443, "metrics.example.com", setting="remote_write.url")]),
    # scheduled without recipients: written, not mailed
    ({"report": {"schedule": "mon 07:00"}}, [*DNS, DISCOVERED]),
    ({"report": MAIL | {"smtp": {"host": "smtp.example.com", "port": 465}}},
     [*DNS, DISCOVERED, Endpoint("smtp", 465, "smtp.example.com", setting="report.smtp")]),
], ids=["defaults", "in-cluster", "static-targets", "prometheus-api", "cloud-monitoring-dcgm",
        "bigquery-and-catalogue", "bigquery-emulator", "cloud-monitoring-local",
        "remote-write", "report-unmailed", "report-mailed"])
def test_outbound_endpoints(settings: dict[str, Any], expected: list[Endpoint]) -> None:
    assert list(outbound_endpoints(load_config(None, settings))) == expected


SMTP = Endpoint("smtp", 587, "smtp.example.com")
METADATA_80 = METADATA[0]
SERVICE = Endpoint("prometheus-api", 9090, "prometheus.monitoring", in_cluster=True)


@pytest.mark.parametrize(("rule", "endpoint", "allowed"), [
    ({}, SMTP, True),                                          # no ports, no peers: all
    ({"ports": [{"port": 587}]}, SMTP, True),                  # protocol TCP by default
    ({"ports": [{"port": 587, "protocol": "UDP"}]}, SMTP, False),
    ({"ports": [{"port": 500, "endPort": 600}]}, SMTP, True),
    ({"ports": [{"port": 465}]}, SMTP, False),
    ({"ports": [{"protocol": "TCP"}]}, SMTP, True),            # every TCP port
    ({"ports": [{"port": "smtp"}]}, SMTP, False),              # named: never a remote port
    ({"to": [{"ipBlock": {"cidr": "169.254.169.254/32"}}], "ports": [{"port": 80}]},
     METADATA_80, True),
    ({"to": [{"ipBlock": {"cidr": "169.254.0.0/16", "except": ["169.254.169.254/32"]}}]},
     METADATA_80, False),
    ({"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}, SMTP, False),  # a name: address unknown
    ({"to": [{"namespaceSelector": {}}]}, SERVICE, True),
    ({"to": [{"namespaceSelector": {}}]}, SMTP, False),
])
def test_an_egress_rule_allows(rule: dict[str, Any], endpoint: Endpoint, allowed: bool) -> None:
    assert allows(rule, endpoint) is allowed


def test_no_egress_rule_allows_nothing() -> None:
    assert blocked([SMTP, SERVICE], []) == [SMTP, SERVICE]
    assert blocked([SMTP, SERVICE], [{"ports": [{"port": 9090}]}]) == [SMTP]
