"""A small warehouse, two weeks long, with names a hostile cluster could hold, and a real
SMTP server on loopback (STARTTLS, AUTH) that keeps what it receives."""

from __future__ import annotations

import email
import email.policy
import socket
import ssl
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from exporter.model import compute
from exporter.model.records import ClusterQueueInfo, FlavorQuota, WorkloadInfo
from exporter.sinks.warehouse import Warehouse
from tests.exporter.test_compute import PRICE, node, pod, reading

PASSWORD = "s3cret-Pa55word"
HOSTILE = "<script>alert(1)</script>"
W46 = 1_794_182_400.0  # 2026-11-09T00:00:00Z, Monday of 2026-W46
HOUR = 3600.0


def owners() -> dict[tuple[str, str], compute.Owner]:
    return {("ns-a", "train-0"): compute.Owner("uid-a", "ns-a", "train-0", "alpha", "train",
                                               "cc-100"),
            (HOSTILE, HOSTILE): compute.Owner("uid-h", HOSTILE, HOSTILE, HOSTILE, HOSTILE,
                                              HOSTILE)}


def hour_rows(start: float, busy: float) -> list[compute.UsageRow]:
    readings = {"n1": [
        reading("GPU-a", pods=(), DCGM_FI_PROF_GR_ENGINE_ACTIVE=busy, DCGM_FI_PROF_SM_ACTIVE=busy,
                DCGM_FI_PROF_PIPE_TENSOR_ACTIVE=0.5, DCGM_FI_PROF_DRAM_ACTIVE=0.3,
                DCGM_FI_DEV_GPU_UTIL=99, DCGM_FI_DEV_FB_USED=6000, DCGM_FI_DEV_FB_FREE=16000),
        reading("GPU-h", pods=(), DCGM_FI_PROF_GR_ENGINE_ACTIVE=0.01,
                DCGM_FI_DEV_FB_USED=500, DCGM_FI_DEV_FB_FREE=21500),
        reading("GPU-free", DCGM_FI_PROF_GR_ENGINE_ACTIVE=0.0)]}
    readings["n1"][0].pods.append(compute_pod("ns-a", "train-0"))
    readings["n1"][1].pods.append(compute_pod(HOSTILE, HOSTILE))
    states = compute.device_states({"n1": node()}, readings, frozenset(), {}, owners(), PRICE,
                                   {})
    return compute.usage_rows(states, start, HOUR)


def compute_pod(namespace: str, name: str):  # type: ignore[no-untyped-def]
    from exporter.model.records import PodOnDevice

    return PodOnDevice(namespace, name, "c")


def build_warehouse(path: Path, cluster: str = "c", weeks: int = 2) -> Path:
    wh = Warehouse(path, cluster, interval=HOUR)
    for h in range(14 * 24 - weeks * 7 * 24, 14 * 24):
        # week one: the training pod is busier than in week two
        wh.add_usage(hour_rows(W46 + h * HOUR, 0.9 if h < 7 * 24 else 0.6))
    wh.add_pods([pod(uid="uid-a", namespace="ns-a", name="train-0", created_unix=W46 + 7 * 86400,
                     scheduled_unix=W46 + 7 * 86400 + 600, workload="train"),
                 pod(uid="uid-h", namespace=HOSTILE, name=HOSTILE, workload=HOSTILE,
                     created_unix=W46 + 8 * 86400, scheduled_unix=W46 + 8 * 86400 + 60,
                     labels={"team": HOSTILE})],
                W46 + 9 * 86400, lambda p: p.labels.get("team", "alpha"),
                # the training pod's Job waited 15 minutes for Kueue, then 10 for a node
                admission_of=lambda p: compute.Admission(p.created_unix - 900, 900.0,
                                                         "research")
                if p.uid == "uid-a" else None)
    wh.add_event("n1", "p", "GPU-free", "xid", W46 + 10 * 86400, W46 + 10 * 86400 + 1800)
    wh.add_quotas([ClusterQueueInfo("research", "", {"nvidia-l4": FlavorQuota(2, None, 1, 0)},
                                    0, 1)], W46 + 9 * 86400)
    # a Job Kueue has not admitted by the week's end: no pod, 12 hours of 1 GPU waiting
    wh.add_workloads([WorkloadInfo(
        uid="wl-eval", namespace="ns-a", name="job-eval-7c2d1", local_queue="research",
        cluster_queue=None, created_unix=W46 + 13.5 * 86400, queued_unix=W46 + 13.5 * 86400,
        admitted_unix=None, finished_unix=None, gpus=1, accelerator="nvidia-l4", priority=0,
        priority_class="", owner_kind="Job", owner_name="eval")],
        W46 + 13.5 * 86400 + 60, lambda w: "alpha", lambda w: "research", complete=True)
    wh.flush(W46 + 14 * 86400)
    wh.close()
    return path


@pytest.fixture(scope="session")
def small_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_warehouse(tmp_path_factory.mktemp("report") / "w.duckdb")


@pytest.fixture(scope="session")
def shared_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small warehouse's cluster ``c``, and a second cluster ``d`` writing to the same
    file the second week only (as clusters sharing one BigQuery dataset do)."""
    path = build_warehouse(tmp_path_factory.mktemp("shared") / "w.duckdb")
    return build_warehouse(path, cluster="d", weeks=1)


REFUSED_DOMAIN = "refused.example.com"
"""Recipients at this domain are refused (550), as a server refuses an unknown user."""


class Inbox:
    def __init__(self) -> None:
        self.messages: list[tuple[list[str], EmailMessage]] = []

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str,
                          rcpt_options: list[str]) -> str:
        if address.endswith("@" + REFUSED_DOMAIN):
            return "550 5.1.1 no such user here"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        msg = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(msg, EmailMessage)
        self.messages.append((list(envelope.rcpt_tos), msg))
        return "250 OK"


def _auth(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
    ok = isinstance(data, LoginPassword) and data.login == b"reports" and \
        data.password == PASSWORD.encode()
    return AuthResult(success=ok, handled=False)


@pytest.fixture
def smtp_server(tmp_path: Path) -> Iterator[tuple[Inbox, int, Path]]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port, tls_context=server_ctx,
                            require_starttls=True, authenticator=_auth,
                            auth_require_tls=True)
    controller.start()
    yield inbox, port, ca_file
    controller.stop()
