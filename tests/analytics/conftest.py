"""A small warehouse, two weeks long, with names a hostile cluster could hold, and a real
SMTP server on loopback (STARTTLS, AUTH) that keeps what it receives."""

from __future__ import annotations

import email
import email.policy
import logging
import socket
import ssl
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from exporter import duck
from exporter.model import compute
from exporter.model.records import ClusterQueueInfo, FlavorQuota, WorkloadInfo
from exporter.sinks.schema import GPU_FREE, GPU_PENDING, Table
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


def add_rows(path: Path, table: Table, rows: Iterable[Mapping[str, Any]]) -> None:
    """Rows written into the file's ``table`` as the exporter would, every column the
    schema declares (those a row leaves out NULL)."""
    names = table.names
    con = duck.connect(path)
    con.executemany(f"INSERT INTO {table.name} ({', '.join(names)}) "
                    f"VALUES ({', '.join('?' * len(names))})",
                    [[r.get(n) for n in names] for r in rows])
    con.close()


W47 = W46 + 7 * 86400  # Monday 2026-11-16


def at(day: int, hour: float) -> float:
    """Unix seconds of a day (0: Monday) and hour of 2026-W47."""
    return W47 + day * 86400 + hour * HOUR


def pending(uid: str, start: float, hours: float, cause: str, *, since: float | None = None,
            **fields: Any) -> list[dict[str, Any]]:
    """A pod's (or a Workload's) hourly ``gpu_pending`` rows from ``start`` for ``hours``
    (a last part hour its fraction), waiting since ``since`` (default: ``start``)."""
    gpus = fields.pop("gpus", 1)
    rows, t, left = [], start, hours * HOUR
    while left > 0:
        seconds = min(HOUR, left)
        rows.append({"id": f"{uid}-{t:.0f}-{cause}", "time": _utc(t), "interval_seconds": HOUR,
                     "cluster": "c", "kind": "pod", "uid": uid, "name": uid, "gpus": gpus,
                     "gpus_per_pod": gpus, "cause": cause, "seconds": seconds,
                     "gpu_seconds": gpus * seconds,
                     "wait_seconds": t + seconds - (start if since is None else since),
                     "evidence_source": "default-scheduler"} | fields)
        t, left = t + HOUR, left - seconds
    return rows


def free(pool: str, model: str, provisioning: str, start: float, hours: int, use: str,
         gpus: float, price: float, **fields: Any) -> list[dict[str, Any]]:
    """A pool's hourly ``gpu_free`` rows of one use: ``gpus`` physical GPUs free at
    ``price`` US dollars an hour each."""
    return [{"id": f"{pool}-{start + h * HOUR:.0f}-{use}", "time": _utc(start + h * HOUR),
             "interval_seconds": HOUR, "cluster": "c", "node_pool": pool, "gpu_model": model,
             "provisioning": provisioning, "zone": "us-central1-a", "use": use,
             "gpu_seconds": gpus * HOUR, "cost_usd": gpus * price,
             "fragmentation_ratio": 0.0, "largest_free_gpus": int(gpus)} | fields
            for h in range(hours)]


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


H100, A100, L4 = "nvidia-h100-80gb", "nvidia-tesla-a100", "nvidia-l4"
SCHEDULER_FULL = ("0/12 nodes are available: 12 Insufficient nvidia.com/gpu. preemption: "
                  "0/12 nodes are available: 12 No preemption victims found for incoming pod.")
NO_POOL_FITS = ("0/15 nodes are available: 3 Insufficient nvidia.com/gpu, 12 node(s) didn't "
                "match Pod's node affinity/selector. preemption: 0/15 nodes are available: "
                "3 No preemption victims found for incoming pod, 12 Preemption is not helpful "
                "for scheduling.")


def waits_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The week 2026-W47 of the waits warehouse, its ``gpu_pending`` and ``gpu_free`` rows.

    Monday and Tuesday nothing waits: the H100 pools, the A100 MIG pool and the L4 pool sit
    free. On Wednesday team alpha's two 4-GPU pretraining pods wait six hours on fragments
    of the on-demand H100 pool, then six more on the full pool at its maximum, while spot
    H100s sit free that they do not tolerate. On Thursday team beta's A100 Job waits ten
    hours for Kueue's quota while four A100s sit free; a pod pulls its image for six
    minutes; a scale-up takes twenty. On Friday a two-GPU L4 pod waits two hours on a
    failed scale-up, and a spot pod waits 45 minutes again after its node was reclaimed. On
    Saturday a notebook asks for a T4 no pool offers, ten hours."""
    p = [
        *pending("uid-pretrain-0", at(2, 0), 6, "fragmented", team="alpha", namespace="ns-a",
                 workload="pretrain", gpus=4, gpu_model=H100, node_pool="h100-ondemand",
                 evidence=SCHEDULER_FULL),
        *pending("uid-pretrain-1", at(2, 0), 6, "fragmented", team="alpha", namespace="ns-a",
                 workload="pretrain", gpus=4, gpu_model=H100, node_pool="h100-ondemand",
                 evidence=SCHEDULER_FULL),
        *(row for uid in ("uid-pretrain-0", "uid-pretrain-1")
          for row in pending(uid, at(2, 6), 6, "no_capacity", since=at(2, 0), team="alpha",
                             namespace="ns-a", workload="pretrain", gpus=4, gpu_model=H100,
                             node_pool="h100-ondemand", evidence_source="cluster-autoscaler",
                             evidence="pod didn't trigger scale-up: 1 max node group size "
                                      "reached")),
        *pending("wl-train-a100", at(3, 0), 10, "quota", team="beta", namespace="ns-b",
                 kind="workload", name="job-train-a100-5f2c1", workload="train-a100", gpus=4,
                 gpus_per_pod=1, gpu_model=A100, cluster_queue="research",
                 evidence_source="kueue",
                 evidence="couldn't assign flavors to pod set main: insufficient unused quota "
                          "for nvidia.com/gpu in flavor a100, 4 more needed"),
        *pending("uid-serve-0", at(3, 3), 0.1, "starting", team="alpha", namespace="ns-a",
                 workload="serve", gpu_model=H100, node_pool="h100-ondemand",
                 evidence_source="kubelet",
                 evidence='Pulling image "us-docker.pkg.dev/acme/serve:2.1"'),
        *pending("uid-finetune-0", at(3, 12), 1 / 3, "scaling_up", team="alpha",
                 namespace="ns-a", workload="finetune", gpu_model=H100,
                 node_pool="h100-ondemand", evidence_source="cluster-autoscaler",
                 evidence="pod triggered scale-up: [{https://www.googleapis.com/compute/v1/"
                          "projects/acme/zones/us-central1-a/instanceGroups/"
                          "gke-c-h100-ondemand-1a2b3c-grp 3->4 (max: 4)}]"),
        *pending("uid-eval-big", at(4, 8), 2, "stockout", team="alpha", namespace="ns-a",
                 workload="eval-big", gpus=2, gpu_model=L4, node_pool="p",
                 evidence_source="cluster-autoscaler",
                 evidence="Node scale up in zones us-central1-a associated with this pod "
                          "failed: GCE out of resources. Pod is at risk of not being "
                          "scheduled."),
        *pending("uid-infer-spot-0", at(4, 14), 0.75, "preempted", team="beta",
                 namespace="ns-b", workload="infer", gpu_model=H100, node_pool="h100-spot",
                 evidence_source="kubelet",
                 evidence="Pod was terminated in response to imminent node shutdown."),
        *pending("uid-notebook", at(5, 0), 10, "unschedulable", team="beta",
                 namespace=HOSTILE, workload="notebook", gpu_model="nvidia-tesla-t4",
                 evidence=NO_POOL_FITS),
    ]
    waiting = {int((r["time"].timestamp() - W47) // HOUR) for r in p}
    f = [
        *free("h100-ondemand", H100, "on-demand", at(0, 0), 48, "no_demand", 8, 9.8),
        *free("h100-ondemand", H100, "on-demand", at(2, 0), 6, "fragment", 4, 9.8,
              fragmentation_ratio=0.5, largest_free_gpus=2),
        *free("h100-spot", H100, "spot", at(0, 0), 48, "no_demand", 4, 2.25),
        *free("h100-spot", H100, "spot", at(2, 0), 12, "mismatch", 4, 2.25),
        *free("a100-ondemand", A100, "on-demand", at(3, 0), 8, "quota", 4, 2.93),
        # the MIG pool's 1g.5gb slices (one GPU's worth) and the L4 pool's free GPU fit
        # none of the pods that wait
        *(row for h in range(7 * 24)
          for row in free("a100-mig", A100, "on-demand", at(0, h), 1,
                          "mismatch" if h in waiting else "no_demand", 1, 2.93,
                          largest_free_gpus=7)),
        *(row for h in range(7 * 24)
          for row in free("p", L4, "on-demand", at(0, h), 1,
                          "fragment" if h in (4 * 24 + 8, 4 * 24 + 9) else
                          "mismatch" if h in waiting else "no_demand", 1, 0.7)),
    ]
    return p, f


@pytest.fixture(scope="session")
def waits_warehouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small warehouse, and why its pods waited in 2026-W47 and what sat free then
    (``waits_rows``)."""
    path = build_warehouse(tmp_path_factory.mktemp("waits") / "w.duckdb")
    p, f = waits_rows()
    add_rows(path, GPU_PENDING, p)
    add_rows(path, GPU_FREE, f)
    return path


REFUSED_DOMAIN = "refused.example.com"
"""Recipients at this domain are refused (550), as a server refuses an unknown user."""


class Inbox:
    def __init__(self) -> None:
        self.messages: list[tuple[list[str], EmailMessage]] = []
        self.raw: dict[str, bytes] = {}
        """The bytes of the latest message to each recipient, as received."""

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
        self.raw |= dict.fromkeys(envelope.rcpt_tos, envelope.content)
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
    # aiosmtpd's own chatter (a client gone as the server stops) is not the product's, and
    # may come after the test's log capture has closed
    logging.getLogger("mail.log").setLevel(logging.WARNING)
    controller = Controller(inbox, hostname="127.0.0.1", port=port, tls_context=server_ctx,
                            require_starttls=True, authenticator=_auth,
                            auth_require_tls=True)
    controller.start()
    yield inbox, port, ca_file
    controller.stop()
