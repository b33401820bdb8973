"""A MIG-partitioned GPU is priced and counted once, whichever layout its dcgm-exporter
prints (fixtures: tests/fixtures/dcgm/README.md); the simulator drives both end to end."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from exporter.demo import caught_up, demo_config, step_both
from exporter.model import compute
from exporter.model.compute import DeviceIdentity
from exporter.model.prices import load_price_book
from exporter.model.records import DeviceReading
from exporter.model.totals import Totals
from exporter.runtime.app import open_exporter
from exporter.sources.dcgm_parser import parse_dcgm_text
from exporter.sources.kube import NodeInfo
from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.sources.mig_samples import A100, A100_RC, H100_0, H100_TEXT, with_gpu_xid
from tests.timing import limit

PRICES = load_price_book(None, "us-central1")
A100_HOUR = PRICES.hourly("nvidia-tesla-a100", "on-demand")
H100_HOUR = PRICES.hourly("nvidia-h100-80gb", "on-demand")


def node(accelerator: str, devices: int, mig_profile: str | None = None) -> NodeInfo:
    """A Ready on-demand node whose Kubernetes device count is what DCGM reports."""
    return NodeInfo(name="n1", pool="p", accelerator=accelerator, provisioning="on-demand",
                    zone="us-central1-a", instance_type="", ready=True, capacity_gpus=devices,
                    allocatable_gpus=devices, clients_per_gpu=1, mig_profile=mig_profile,
                    address="10.0.0.1")


def states(text: str, n: NodeInfo) -> list[compute.DeviceState]:
    readings = {n.name: parse_dcgm_text(text).devices}
    price = {(n.accelerator or "", "on-demand"): PRICES.hourly(n.accelerator or "",
                                                                "on-demand") or 0.0}
    return compute.device_states({n.name: n}, readings, frozenset(), {}, {}, price, {})


CASES = [
    # one A100 with one 1g.5gb slice: a seventh of its price, not that plus a whole GPU
    pytest.param(A100_RC, node("nvidia-tesla-a100", 1, "1g.5gb"), {A100: 1 / 7},
                 (A100_HOUR or 0) / 7, id="2.4.0-rc.2"),
    # 8 x H100, GPU 0 as two 1g.10gb instances: 2/7 of a GPU there, whole GPUs elsewhere
    pytest.param(H100_TEXT, node("nvidia-h100-80gb", 9), {H100_0: 2 / 7},
                 (H100_HOUR or 0) * (7 + 2 / 7), id="instances-only"),
]


@pytest.mark.parametrize(("text", "n", "gpu_share", "usd_per_hour"), CASES)
def test_cost_per_hour_is_price_times_the_instances_fractions(
        text: str, n: NodeInfo, gpu_share: dict[str, float], usd_per_hour: float) -> None:
    got = states(text, n)
    assert sum(d.price_usd_per_hour or 0 for d in got) == pytest.approx(usd_per_hour)
    for uuid, share in gpu_share.items():
        mine = [d for d in got if d.gpu_uuid == uuid]
        assert all(d.mig_profile is not None for d in mine)  # no device for the whole GPU
        assert sum(d.fraction for d in mine) == pytest.approx(share)


@pytest.mark.parametrize(("text", "n", "gpu_share", "usd_per_hour"), CASES)
def test_availability_counts_the_instances_share_of_each_gpu(
        text: str, n: NodeInfo, gpu_share: dict[str, float], usd_per_hour: float) -> None:
    totals = Totals()
    totals.add(compute.usage_rows(states(text, n), start=0.0, seconds=60.0))
    for uuid, share in gpu_share.items():
        assert totals.up_seconds[uuid] / 60.0 == pytest.approx(share)  # GPU-s per second
    assert not totals.down_seconds


def test_a_fatal_xid_of_the_gpu_makes_its_instances_unavailable() -> None:
    (inst,) = states(with_gpu_xid(79), node("nvidia-tesla-a100", 1, "1g.5gb"))
    assert (inst.device_id, inst.state, inst.reason) == (f"{A100}/13", "unavailable", "xid")


# ------------------------------------------------------------ the inventory across a change


def _seen(uuid: str, instance: str | None) -> DeviceReading:
    return DeviceReading(uuid, "0", "n1", "NVIDIA A100-SXM4-40GB",
                         None if instance is None else "1g.5gb", instance)


def _known(*device_ids: str) -> dict[str, DeviceIdentity]:
    return {i: DeviceIdentity(i.split("/")[0], i, "0", "1g.5gb" if "/" in i else None)
            for i in device_ids}


@pytest.mark.parametrize(("known", "seen", "kept"), [
    # MIG enabled since the GPU was remembered whole: the whole GPU is not missing
    (_known("GPU-a", "GPU-b"), [_seen("GPU-a", "7"), _seen("GPU-a", "8")], {"GPU-b"}),
    # MIG disabled: its instances are not missing
    (_known("GPU-a/7", "GPU-a/8", "GPU-b/7"), [_seen("GPU-a", None)], {"GPU-b/7"}),
    # an instance not reported this time stays known (and missing)
    (_known("GPU-a/7", "GPU-a/8"), [_seen("GPU-a", "7")], {"GPU-a/7", "GPU-a/8"}),
    # devices Kubernetes counts but DCGM never showed are not GPUs DCGM replaced
    (_known("n1/k8s-mig-0"), [_seen("GPU-a", "7")], {"n1/k8s-mig-0"}),
], ids=["mig-enabled", "mig-disabled", "instance-missing", "kubernetes-only"])
def test_without_superseded(known: dict[str, DeviceIdentity], seen: list[DeviceReading],
                            kept: set[str]) -> None:
    assert set(compute.without_superseded(known, seen)) == kept


# ------------------------------------------------------------------ end to end, both layouts

MIG_ONLY: dict[str, Any] = {
    "pools": [{"name": "mig", "accelerator": "nvidia-tesla-a100", "gpus_per_node": 1,
               "nodes": 1, "mig_partition_size": "3g.20gb"}],
    "workloads": [{"name": "slice", "kind": "batch_inference", "namespace": "team-a",
                   "accelerator": "nvidia-tesla-a100", "mig_partition_size": "3g.20gb",
                   "arrivals_per_day": 0}],
}


@pytest.mark.parametrize("layout", ["instances", "gpu_and_instances"])
async def test_exporter_counts_a_partitioned_gpu_once_in_either_layout(
        layout: str, make_server: Callable[..., Any],
        make_scenario: Callable[..., Scenario], tmp_path: Path) -> None:
    """An A100 cut into two 3g.20gb instances (6/7 of it), one of them held: 6/7 of a
    GPU-second and of its price per second, whether or not the GPU's own series come too."""
    pools = [{**MIG_ONLY["pools"][0], "dcgm_mig_layout": layout}]
    sim: SimulatorServer = await make_server(make_scenario(pools=pools,
                                                           workloads=MIG_ONLY["workloads"]))
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    async with open_exporter(cfg) as exporter:
        async with asyncio.timeout(limit(10)):
            await exporter.kube.wait_synced()
        sim.cluster.submit("slice", profile="healthy", run_seconds=7200)
        await caught_up(sim, exporter)
        await exporter.cycle(sim.cluster.now)
        began = sim.cluster.now
        await step_both(sim, exporter, 4)
        seconds = sim.cluster.now - began
        totals = exporter.totals
        assert sum(totals.gpu_seconds.values()) / seconds == pytest.approx(6 / 7)
        assert sum(totals.cost_usd.values()) == pytest.approx(
            (A100_HOUR or 0) * 6 / 7 * seconds / 3600)
        by_state = {k[0]: v / seconds for k, v in totals.gpu_seconds.items()}
        assert by_state == pytest.approx({"allocated": 3 / 7, "unallocated": 3 / 7})
        assert sum(totals.up_seconds.values()) / seconds == pytest.approx(6 / 7)
