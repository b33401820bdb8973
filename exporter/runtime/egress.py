"""Where the exporter connects, read from its configuration: what the egress of its
NetworkPolicy must allow (``deploy/networkpolicy.yaml``; docs/deploying.md: Network policy).

``outbound_endpoints(config)`` lists the endpoints a configuration reaches out to;
``blocked(endpoints, egress)`` those that a NetworkPolicy's egress rules refuse. Both are
pure: nothing is resolved or connected to.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from exporter.config import Config

Purpose = Literal["dns", "kubernetes-api", "dcgm-exporter", "prometheus-api", "google-apis",
                  "metadata-server", "remote-write", "smtp"]
Protocol = Literal["TCP", "UDP"]

DCGM_EXPORTER_PORT = 9400
"""dcgm-exporter's port (GKE's managed one's too), where a discovered pod names none."""
KUBERNETES_API_PORT = 443
"""The port of the cluster's API server as a pod's traffic reaches it on GKE (other
distributions may serve it on 6443)."""
METADATA_SERVER = (("169.254.169.254", 80), ("169.254.169.252", 988))
"""The GKE metadata server, which gives Workload Identity's tokens to Google's client
libraries: 169.254.169.254:80 under GKE Dataplane V2, 169.254.169.252:988 otherwise."""
BIGQUERY = "bigquery.googleapis.com"
MONITORING = "monitoring.googleapis.com"
CLOUD_BILLING = "cloudbilling.googleapis.com"
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One destination the exporter connects to."""

    purpose: Purpose
    port: int
    host: str | None = None
    """A name or an address; None: many (the cluster's DNS, discovered pods)."""
    protocol: Protocol = "TCP"
    in_cluster: bool = False
    """A pod or Service of the cluster (a NetworkPolicy's pod and namespace selectors can
    name it), not an address outside it."""
    setting: str = ""
    """The configuration setting that asks for it."""

    def __str__(self) -> str:
        where = f"{self.host}:{self.port}" if self.host else f"port {self.port}"
        return f"{self.purpose} {where}/{self.protocol} ({self.setting})"


def _url(purpose: Purpose, url: str, setting: str) -> Endpoint:
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 443)
    return Endpoint(purpose, port, host, in_cluster=_cluster_name(host), setting=setting)


def _grpc(host_port: str | None, default: str, setting: str) -> Endpoint:
    """A Google API over gRPC: ``host:port`` when overridden, else Google's host on 443."""
    if not host_port:
        return Endpoint("google-apis", 443, default, setting=setting)
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        host, port = host_port, "443"
    return Endpoint("google-apis", int(port), host, in_cluster=_cluster_name(host),
                    setting=setting)


def _cluster_name(host: str) -> bool:
    """A Service's DNS name (``name.namespace``, ``....svc``, ``....cluster.local``)."""
    try:
        ipaddress.ip_address(host)
        return False
    except ValueError:
        pass
    return host.endswith((".svc", ".cluster.local")) or host.count(".") == 1


def outbound_endpoints(config: Config) -> tuple[Endpoint, ...]:
    """Every endpoint ``config`` makes the running exporter (``gke-gpu-exporter run``, its
    scheduled report included) connect to, each once, in the order of the settings."""
    out: list[Endpoint] = [Endpoint("dns", 53, protocol=p, in_cluster=True, setting="(always)")
                           for p in ("UDP", "TCP")]
    google: list[Endpoint] = []  # credentials from the metadata server

    def google_api(endpoint: Endpoint, anonymous: bool) -> None:
        out.append(endpoint)
        if not anonymous:
            google.append(endpoint)

    if config.kubernetes.in_cluster:
        out.append(Endpoint("kubernetes-api", KUBERNETES_API_PORT, "kubernetes.default.svc",
                            setting="kubernetes.in_cluster"))
    dcgm = config.dcgm
    if dcgm.cloud_monitoring.project:
        cm = dcgm.cloud_monitoring
        google_api(_grpc(cm.endpoint, MONITORING, "dcgm.cloud_monitoring"), cm.anonymous)
    elif dcgm.prometheus.url:
        out.append(_url("prometheus-api", dcgm.prometheus.url, "dcgm.prometheus.url"))
    elif dcgm.targets:
        out += [_url("dcgm-exporter", t, "dcgm.targets") for t in dcgm.targets]
    else:
        out.append(Endpoint("dcgm-exporter", dcgm.discovery.port or DCGM_EXPORTER_PORT,
                            in_cluster=True, setting="dcgm.discovery"))
    catalog = config.prices.catalog
    if catalog.enabled:
        google_api(_grpc(catalog.endpoint, CLOUD_BILLING, "prices.catalog"), catalog.anonymous)
    bq = config.warehouse.bigquery
    bq_endpoint = _url("google-apis", bq.endpoint, "warehouse.bigquery") if bq.endpoint else \
        Endpoint("google-apis", 443, BIGQUERY, setting="warehouse.bigquery")
    if config.warehouse.enabled and bq.enabled:
        google_api(bq_endpoint, bq.anonymous)
    report = config.report
    if report.schedule and report.billing_table:
        google_api(bq_endpoint, bq.anonymous)
    gcm = config.cloud_monitoring
    if gcm.enabled:
        google_api(_grpc(gcm.endpoint, MONITORING, "cloud_monitoring"), gcm.anonymous)
    if config.remote_write.url:
        out.append(_url("remote-write", config.remote_write.url, "remote_write.url"))
    if report.schedule and (report.platform_recipients or any(report.team_recipients.values())):
        smtp = report.smtp
        out.append(Endpoint("smtp", smtp.port, smtp.host, in_cluster=_cluster_name(smtp.host),
                            setting="report.smtp"))
    if google:
        out += [Endpoint("metadata-server", port, host, setting="Workload Identity")
                for host, port in METADATA_SERVER]
    return tuple(dict.fromkeys(out))


# ------------------------------------------------------------- NetworkPolicy egress


def _port_allows(rule_ports: Sequence[Mapping[str, Any]] | None, endpoint: Endpoint) -> bool:
    if not rule_ports:
        return True  # no ports: every port
    for p in rule_ports:
        if p.get("protocol", "TCP") != endpoint.protocol:
            continue
        port = p.get("port")
        if port is None:
            return True
        if isinstance(port, int) and port <= endpoint.port <= p.get("endPort", port):
            return True
        # a named port names a port of a pod the policy selects, never a remote one
    return False


def _peer_allows(peer: Mapping[str, Any], endpoint: Endpoint) -> bool:
    if "ipBlock" in peer:
        try:
            address = ipaddress.ip_address(endpoint.host or "")
        except ValueError:
            return False  # a name: its address is not known here
        block = peer["ipBlock"]
        return address in ipaddress.ip_network(block["cidr"]) and not any(
            address in ipaddress.ip_network(e) for e in block.get("except", []))
    return endpoint.in_cluster  # pod and namespace selectors name pods of the cluster


def allows(rule: Mapping[str, Any], endpoint: Endpoint) -> bool:
    """Whether one egress rule of a NetworkPolicy lets ``endpoint`` through."""
    peers = rule.get("to") or []
    return _port_allows(rule.get("ports"), endpoint) and (
        not peers or any(_peer_allows(p, endpoint) for p in peers))


def blocked(endpoints: Iterable[Endpoint],
            egress: Sequence[Mapping[str, Any]]) -> list[Endpoint]:
    """The endpoints no rule of a NetworkPolicy's ``spec.egress`` allows (an empty list of
    rules allows nothing, as Kubernetes reads a policy with the Egress type)."""
    return [e for e in endpoints if not any(allows(rule, e) for rule in egress)]
