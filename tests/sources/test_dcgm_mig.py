"""MIG in both dcgm-exporter layouts (tests/sources/mig_samples.py): every physical GPU is
read once, through its instances, on every path DCGM readings come by."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from google.cloud.monitoring_v3 import TimeSeries

from exporter.model import compute
from exporter.model.records import DeviceReading, ParseResult, PodOnDevice
from exporter.sources import cloud_monitoring, prometheus_api
from exporter.sources.dcgm_devices import collect, fold_mig_parents
from exporter.sources.dcgm_parser import parse_dcgm_text
from tests.simulator.dcgm_text import samples
from tests.sources.mig_samples import A100, A100_RC, H100_0, H100_JSON, H100_TEXT, with_gpu_xid

# -------------------------------------------------------------- the same rule on every path


def from_text(text: str) -> ParseResult:
    return parse_dcgm_text(text)


def from_prometheus_api(text: str) -> ParseResult:
    """The scrape as a Prometheus instant query returns it."""
    vector = [{"metric": {"__name__": s.name, **s.labels}, "value": [1.0, repr(s.value)]}
              for s in samples(text)]
    return prometheus_api.readings(vector, 1000)


def from_cloud_monitoring(text: str) -> ParseResult:
    """The scrape as Google Managed Prometheus keeps it in Cloud Monitoring."""
    def series(labels: dict[str, str], value: float) -> Any:
        return TimeSeries.pb(TimeSeries(
            metric={"labels": labels},
            resource={"type": "prometheus_target", "labels": {"cluster": "prod"}},
            points=[{"value": {"double_value": value}}]))
    return collect((s for sample in samples(text) for s in cloud_monitoring.dcgm_samples(
        sample.name, [series(sample.labels, sample.value)])), 1000)


PATHS: list[Callable[[str], ParseResult]] = [from_text, from_prometheus_api,
                                             from_cloud_monitoring]


@pytest.mark.parametrize("read", PATHS, ids=lambda f: f.__name__)
@pytest.mark.parametrize(("text", "devices", "gpus"), [
    # 2.4.0-rc.2: the A100's own series and its one 1g.5gb instance's -> the instance alone
    (A100_RC, {f"{A100}/13": "1g.5gb"}, 1 / 7),
    # current: GPU 0's two 1g.10gb instances and seven whole GPUs, each once
    (H100_TEXT, {f"{H100_0}/11": "1g.10gb", f"{H100_0}/13": "1g.10gb"}
     | {m["gpu_uuid"]: None for m in H100_JSON["metrics"]["DCGM_FI_DEV_FB_FREE"]
        if not m.get("mig_profile")}, 7 + 2 / 7),
], ids=["2.4.0-rc.2", "instances-only"])
def test_one_device_per_instance_and_none_for_the_partitioned_gpu(
        read: Callable[[str], ParseResult], text: str, devices: dict[str, str | None],
        gpus: float) -> None:
    got = read(text).devices
    assert {d.device_id: d.mig_profile for d in got} == devices
    assert len(got) == len(devices)  # no device twice
    assert sum(compute.mig_fraction(d.mig_profile) for d in got) == pytest.approx(gpus)


@pytest.mark.parametrize("read", PATHS, ids=lambda f: f.__name__)
def test_the_gpus_device_readings_go_to_its_instance(
        read: Callable[[str], ParseResult]) -> None:
    (inst,) = read(A100_RC).devices
    assert inst.fields == {
        # the instance's own
        "DCGM_FI_DEV_XID_ERRORS": 0, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.995687,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.930433, "DCGM_FI_PROF_DRAM_ACTIVE": 0.800339,
        # the physical GPU's, which hold for each of its instances
        "DCGM_FI_DEV_SM_CLOCK": 1215, "DCGM_FI_DEV_MEM_CLOCK": 1215,
        "DCGM_FI_DEV_MEMORY_TEMP": 69, "DCGM_FI_DEV_GPU_TEMP": 61,
        "DCGM_FI_DEV_POWER_USAGE": 409.692, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 319159391,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
    }  # not the whole GPU's framebuffer, PCIe bytes or activity: they are not this slice's


@pytest.mark.parametrize("read", PATHS, ids=lambda f: f.__name__)
@pytest.mark.parametrize(("gpu_xid", "instance_xid"), [
    (79, 79),  # the GPU fell off the bus: its instance with it
    (48, 48),  # double-bit ECC error
    (13, 0),   # not fatal: the instance's own last XID stands
])
def test_a_fatal_xid_of_the_gpu_is_its_instances(
        read: Callable[[str], ParseResult], gpu_xid: int, instance_xid: int) -> None:
    (inst,) = read(with_gpu_xid(gpu_xid)).devices
    assert inst.fields["DCGM_FI_DEV_XID_ERRORS"] == instance_xid


def _reading(instance: str | None, fields: dict[str, float],
             pods: list[PodOnDevice] | None = None) -> DeviceReading:
    return DeviceReading("GPU-a", "0", "n1", "NVIDIA A100-SXM4-40GB",
                         None if instance is None else "3g.20gb", instance, pods or [], fields)


@pytest.mark.parametrize(("devices", "expected"), [
    # no MIG: unchanged
    ([_reading(None, {"DCGM_FI_DEV_GPU_UTIL": 40})], {"GPU-a": {"DCGM_FI_DEV_GPU_UTIL": 40}}),
    # the instance keeps its own readings; only what it lacks comes from the GPU
    ([_reading(None, {"DCGM_FI_DEV_GPU_TEMP": 70, "DCGM_FI_DEV_FB_USED": 9000}),
      _reading("1", {"DCGM_FI_DEV_GPU_TEMP": 66, "DCGM_FI_DEV_FB_USED": 100})],
     {"GPU-a/1": {"DCGM_FI_DEV_GPU_TEMP": 66, "DCGM_FI_DEV_FB_USED": 100}}),
    # clock-event reasons and power are the GPU's, for every instance
    ([_reading("1", {}), _reading("2", {}),
      _reading(None, {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0x20,
                      "DCGM_FI_DEV_POWER_USAGE": 350.0})],
     {f"GPU-a/{i}": {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0x20,
                     "DCGM_FI_DEV_POWER_USAGE": 350.0} for i in "12"}),
    # an instance's own fatal XID is kept even when the GPU reports none
    ([_reading(None, {"DCGM_FI_DEV_XID_ERRORS": 0}),
      _reading("1", {"DCGM_FI_DEV_XID_ERRORS": 95})],
     {"GPU-a/1": {"DCGM_FI_DEV_XID_ERRORS": 95}}),
], ids=["whole-gpu", "own-readings-win", "gpu-wide-fields", "instance-fatal-xid"])
def test_fold_mig_parents(devices: list[DeviceReading],
                          expected: dict[str, dict[str, float]]) -> None:
    assert {d.device_id: d.fields for d in fold_mig_parents(devices)} == expected


def test_the_gpus_pods_are_not_its_instances() -> None:
    """A pod label on the GPU's own series does not say which instance the pod holds."""
    gpu = _reading(None, {}, [PodOnDevice("ml", "train-0", "main")])
    (inst,) = fold_mig_parents([gpu, _reading("1", {})])
    assert inst.pods == []
