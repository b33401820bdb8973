"""Workload profiles: each shows its own signature in the DCGM fields, and only its own."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import pytest

from exporter.model.bottleneck import classify
from simulator.cluster import Cluster
from simulator.exposition import render_node
from simulator.profiles import (
    CLOCK_HW_POWER_BRAKE,
    CLOCK_HW_THERMAL,
    CLOCK_SW_POWER_CAP,
    CLOCK_SW_THERMAL,
    PROFILES,
    Activity,
    activity,
)
from simulator.scenario import Profiling, Scenario
from tests.simulator.dcgm_text import by_gpu

THROTTLE_BITS = CLOCK_SW_THERMAL | CLOCK_HW_THERMAL | CLOCK_SW_POWER_CAP | CLOCK_HW_POWER_BRAKE


def window(profile: str, steps: int = 120, pod_key: int = 11) -> list[Activity]:
    return [activity(profile, pod_key, 5, k, True, True, True) for k in range(steps)]


def mean(xs: list[Activity], field: str) -> float:
    return statistics.fmean(getattr(a, field) for a in xs)


SIGNATURES: dict[str, Callable[[list[Activity]], bool]] = {
    "healthy": lambda w: mean(w, "gr_engine_active") >= 0.85 and mean(w, "sm_active") >= 0.75
    and mean(w, "tensor_active") >= 0.4 and max(a.temp_celsius for a in w) < 85
    and not any(a.clock_event_reasons & THROTTLE_BITS for a in w),
    "input_bound": lambda w: min(a.gr_engine_active for a in w) < 0.15
    and max(a.gr_engine_active for a in w) > 0.75
    and max(a.pcie_rx_ratio for a in w) > 0.3 and 0.4 < mean(w, "gr_engine_active") < 0.8,
    "small_batch": lambda w: mean(w, "gpu_util_percent") >= 85 and mean(w, "sm_active") <= 0.3
    and mean(w, "sm_active") < 0.5 * mean(w, "gr_engine_active")
    and mean(w, "sm_occupancy") < 0.2 * mean(w, "sm_active") and mean(w, "nvlink_ratio") < 0.3,
    "comm_bound": lambda w: mean(w, "nvlink_ratio") >= 0.4 and mean(w, "sm_active") <= 0.4,
    "memory_bound": lambda w: mean(w, "dram_active") >= 0.75 and mean(w, "tensor_active") <= 0.15,
    "idle": lambda w: mean(w, "gr_engine_active") <= 0.05 and mean(w, "memory_ratio") >= 0.3,
    "throttled": lambda w: min(a.temp_celsius for a in w) >= 85
    and all(a.clock_event_reasons & THROTTLE_BITS for a in w)
    and mean(w, "sm_clock_ratio") <= 0.75,
}


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_shows_its_signature_and_no_other(profile: str) -> None:
    for pod_key in (1, 2, 3, 99):
        w = window(profile, pod_key=pod_key)
        matched = {name for name, sig in SIGNATURES.items() if sig(w)}
        assert matched == {profile}


def test_small_batch_gpu_util_overstates_work() -> None:
    """As on real GPUs: GPU_UTIL says 'a kernel ran', GR engine active says how much."""
    w = window("small_batch")
    assert mean(w, "gpu_util_percent") / 100 - mean(w, "gr_engine_active") > 0.3


def test_input_stalls_are_periodic_with_pcie_bursts() -> None:
    w = window("input_bound", steps=12, pod_key=0)
    stalled = [a.gr_engine_active < 0.15 for a in w]
    assert stalled == [True, True, False, False, False, False] * 2
    assert all(a.pcie_rx_ratio > 0.3 for a, s in zip(w, stalled, strict=True) if s)


def test_comm_bound_uses_pcie_without_nvlink() -> None:
    a = activity("comm_bound", 1, 1, 1, True, True, False)
    assert a.nvlink_ratio == 0 and a.pcie_rx_ratio > 0.3


def test_startup_phase_is_idle_with_memory_filling() -> None:
    a = activity("healthy", 1, 1, 1, False, False, True)
    assert a.gr_engine_active == 0 and a.gpu_util_percent == 0 and 0 < a.memory_ratio < 0.5


@pytest.mark.parametrize("profile", PROFILES)
def test_signature_reaches_the_exposition(profile: str,
                                          make_scenario: Callable[..., Scenario]) -> None:
    """The pod's GPUs on its node's dcgm-exporter text carry the profile's signature."""
    c = Cluster(make_scenario())
    pod = c.submit("train", profile=profile, run_seconds=86400)[0]
    assert pod.node is not None
    fields: dict[str, list[float]] = {}
    for _ in range(24):
        c.advance(c.step)
        gpus = by_gpu(render_node(c, pod.node), pod=pod.name)
        assert len(gpus) == 8
        for values in gpus.values():
            for k, v in values.items():
                fields.setdefault(k, []).append(v)

    def avg(name: str) -> float:
        return statistics.fmean(fields["DCGM_FI_" + name])

    checks = {
        "healthy": avg("PROF_GR_ENGINE_ACTIVE") > 0.85 and avg("PROF_PIPE_TENSOR_ACTIVE") > 0.4,
        "input_bound": min(fields["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]) < 0.15
        and max(fields["DCGM_FI_PROF_PCIE_RX_BYTES"]) > 0.3 * 64e9,
        "small_batch": avg("DEV_GPU_UTIL") > 85 and avg("PROF_SM_ACTIVE") < 0.3
        and avg("PROF_SM_OCCUPANCY") < 0.2,
        "comm_bound": avg("PROF_NVLINK_TX_BYTES") > 0.4 * 450e9 and avg("PROF_SM_ACTIVE") < 0.4,
        "memory_bound": avg("PROF_DRAM_ACTIVE") > 0.75 and avg("PROF_PIPE_TENSOR_ACTIVE") < 0.15,
        "idle": avg("PROF_GR_ENGINE_ACTIVE") < 0.05 and avg("DEV_FB_USED") > 0.3 * 81029,
        "throttled": min(fields["DCGM_FI_DEV_GPU_TEMP"]) >= 85
        and all(int(r) & THROTTLE_BITS for r in fields["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"])
        and avg("DEV_SM_CLOCK") < 0.8 * 1980,
    }
    assert checks[profile]


@pytest.mark.parametrize("profile", PROFILES)
def test_a_profile_reads_as_itself_in_the_fields_dcgm_semantics_define(profile: str) -> None:
    """Never above: occupancy over SM active, SM active over GR active (a warp resident
    means an active SM, an active SM a busy engine)."""
    for pod_key in (1, 2, 3, 99):
        for a in window(profile, pod_key=pod_key):
            assert a.sm_occupancy <= a.sm_active + 0.01 <= a.gr_engine_active + 0.06


COUNTERS = {
    "every profiling field": Profiling(),
    "dcgm-exporter's default counters": Profiling(sm_fields=False, nvlink=False,
                                                  clock_events=False),
}


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("counters", list(COUNTERS))
@pytest.mark.parametrize("workload", ["train", "spotjob"])   # 8 x H100 NVLink, 2 x T4 PCIe
def test_the_classifier_reads_each_profile_from_the_exposition(
        profile: str, counters: str, workload: str,
        make_scenario: Callable[..., Scenario]) -> None:
    """The exporter's rules over a pod's samples: its profile with every profiling field;
    with the default counters its profile or insufficient_signal, never another class."""
    c = Cluster(make_scenario(profiling=COUNTERS[counters].model_dump()))
    pod = c.submit(workload, profile=profile, run_seconds=86400)[0]
    assert pod.node is not None
    samples = []
    for _ in range(20):
        c.advance(c.step)
        gpus = list(by_gpu(render_node(c, pod.node), pod=pod.name).values())
        samples.append({k: statistics.fmean(g[k] for g in gpus if k in g)
                        for k in {k for g in gpus for k in g}})
    got = classify(samples, pod.node.model.accelerator).bottleneck
    if counters == "every profiling field":
        assert got == profile
    else:
        assert got in (profile, "insufficient_signal")
