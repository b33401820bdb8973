"""Workload profiles: what a kind of job looks like to DCGM, one device and one step at a time.

Each profile has a recognisable signature in the fields, in the semantics of NVIDIA's DCGM
profiling metrics (``exporter.model.bottleneck`` sets them out): SM occupancy stays below SM
active, and SM active below GR active.

==============  =====  ================================================================
profile         power  signature
==============  =====  ================================================================
healthy         0.85   GR engine, SM active and tensor pipe busy; modest DRAM and PCIe
input_bound     0.58   compute phases (power 0.80) broken by periodic stalls (GR ~0.05,
                       power 0.15, two steps in six) with PCIe RX bursts
small_batch     0.35   GPU_UTIL above 90 %, the engine half busy, SMs a third filled,
                       few warps
comm_bound      0.50   NVLink (or PCIe both ways without NVLink) near saturation, SM
                       active low
memory_bound    0.75   DRAM active high, tensor pipe nearly idle
idle            0.04   almost no activity while the pod holds framebuffer memory
                       (notebooks)
throttled       0.98   at the power cap: hot (>= 85 C) with thermal/power clock-event
                       reasons and a reduced SM clock (~62 %)
==============  =====  ================================================================

Power follows one load curve per GPU model: ``idle + power_ratio * (limit - idle)`` watts,
from the model's idle floor to its power limit (``idle_power_watts`` and
``power_limit_watts`` in ``exporter.model.catalog``; H100 70 to 700 W, H200 75 to 700 W,
A100 80GB 60 to 400 W, A100 40GB 55 to 400 W, L4 16 to 72 W, T4 10 to 70 W, V100 40 to
300 W, P100 26 to 250 W, P4 7 to 75 W). The ``power`` column is each profile's
``power_ratio``, the mean of what ``activity`` gives step by step
(``DCGM_FI_DEV_POWER_USAGE`` wanders around it); a pod whose containers have not started
yet (pulling its image) draws 0.03, and a GPU no pod holds sits at its idle floor (0). A
time-shared GPU draws the mean of its pods' ratios (each runs for an equal slice); a MIG
instance draws its fraction of the curve (compute slices / 7) at its pod's ratio.

``mean_power_ratio`` gives the ratio the simulator's energy counter
(``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``) advances at: constant while what a device does
stays the same (``simulator.cluster`` sets out down GPUs and NotReady nodes).

``activity`` is pure: the same pod, device and step always give the same numbers, so the
exposition and the ground truth agree by construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from simulator.rng import mix

PROFILES = ("healthy", "input_bound", "small_batch", "comm_bound", "memory_bound", "idle",
            "throttled")

# NVML clock event reason bits (nvmlClocksEventReason*).
CLOCK_GPU_IDLE = 0x1
CLOCK_SW_POWER_CAP = 0x4
CLOCK_SW_THERMAL = 0x20
CLOCK_HW_THERMAL = 0x40
CLOCK_HW_POWER_BRAKE = 0x80

INPUT_STALL_PERIOD = 6
"""Steps in one load-then-compute cycle of an input-bound job; the first two stall."""
INPUT_STALL_STEPS = 2

POWER_RATIO = {
    "healthy": 0.85,
    "input_bound": (INPUT_STALL_STEPS * 0.15 + (INPUT_STALL_PERIOD - INPUT_STALL_STEPS) * 0.8)
    / INPUT_STALL_PERIOD,
    "small_batch": 0.35,
    "comm_bound": 0.5,
    "memory_bound": 0.75,
    "idle": 0.04,
    "throttled": 0.98,
}
"""Each profile's mean ``power_ratio`` once its containers run: where its draw sits between
the GPU's idle floor (0) and its power limit (1). ``activity`` draws around these."""
STARTING_POWER_RATIO = 0.03
"""A pod whose containers have not started yet (pulling its image, loading its model)."""


@dataclass(frozen=True, slots=True)
class Activity:
    """What one DCGM entity (GPU or MIG instance) does during one step.

    Rates are fractions of the device's link bandwidth; ``memory_ratio`` is the share of
    the entity's framebuffer in use; ``power_ratio`` runs from idle (0) to the limit (1).
    """

    gr_engine_active: float
    sm_active: float
    sm_occupancy: float
    tensor_active: float
    dram_active: float
    pcie_tx_ratio: float
    pcie_rx_ratio: float
    nvlink_ratio: float
    gpu_util_percent: float
    memory_ratio: float
    power_ratio: float
    temp_celsius: float
    clock_event_reasons: int
    sm_clock_ratio: float


UNALLOCATED = Activity(0.0, 0.0, 0.0, 0.0, 0.0, 0.0002, 0.0001, 0.0, 0.0, 0.0, 0.0, 31.0,
                       CLOCK_GPU_IDLE, 0.11)


def _noise(h: int, i: int) -> float:
    """The i-th of four numbers in [-1, 1) carved from one 64-bit hash."""
    return ((h >> (16 * i)) & 0xFFFF) / 32768.0 - 1.0


def _clip(x: float) -> float:
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else x


@lru_cache(maxsize=65536)
def pod_memory_ratio(profile: str, pod_key: int) -> float:
    """The share of a GPU's memory a pod of this profile keeps, fixed for its life."""
    lo, hi = {
        "healthy": (0.78, 0.95), "input_bound": (0.55, 0.85), "small_batch": (0.18, 0.42),
        "comm_bound": (0.80, 0.95), "memory_bound": (0.85, 0.97), "idle": (0.35, 0.60),
        "throttled": (0.80, 0.95),
    }[profile]
    return lo + (hi - lo) * ((mix(pod_key, 7) >> 11) / (1 << 53))


def input_stalled(pod_key: int, step: int) -> bool:
    """Whether an input-bound pod waits for data during ``step``."""
    return (step + pod_key % INPUT_STALL_PERIOD) % INPUT_STALL_PERIOD < INPUT_STALL_STEPS


def mean_power_ratio(profile: str, started: bool) -> float:
    """The power ratio a pod of ``profile`` draws on average (``POWER_RATIO``; before its
    containers start, ``STARTING_POWER_RATIO``)."""
    if profile not in POWER_RATIO:
        raise ValueError(f"unknown workload profile {profile!r}")
    return POWER_RATIO[profile] if started else STARTING_POWER_RATIO


def activity(profile: str, pod_key: int, device_key: int, step: int, started: bool,
             multi_gpu: bool, has_nvlink: bool) -> Activity:
    """The DCGM-visible activity of a pod of ``profile`` on one device during ``step``."""
    h = mix(pod_key, device_key, step)
    n0, n1, n2, n3 = _noise(h, 0), _noise(h, 1), _noise(h, 2), _noise(h, 3)
    mem = pod_memory_ratio(profile, pod_key)
    if not started:  # pulling the image, loading the model: memory filling, no kernels
        return Activity(0.0, 0.0, 0.0, 0.0, 0.0, 0.0005, 0.02, 0.0, 0.0, mem * 0.3,
                        STARTING_POWER_RATIO,
                        38.0 + n0, CLOCK_GPU_IDLE, 0.2)
    reasons = 0
    sm_clock = 1.0
    if profile == "healthy":
        gr, sm, occ, tensor, dram = 0.93 + 0.04 * n0, 0.86 + 0.05 * n1, 0.55 + 0.06 * n2, \
            0.58 + 0.08 * n3, 0.38 + 0.06 * n0
        pcie_tx, pcie_rx = 0.01, 0.03 + 0.01 * n1
        link = 0.12 + 0.03 * n2 if multi_gpu else 0.0
        util, power, temp = 99.0 + n3, 0.85 + 0.05 * n1, 71.0 + 3 * n2
    elif profile == "input_bound":
        if input_stalled(pod_key, step):
            gr, sm, occ, tensor, dram = 0.05 + 0.015 * n0, 0.025 + 0.005 * n1, 0.015, \
                0.01, 0.04 + 0.01 * n2
            pcie_tx, pcie_rx = 0.01, 0.45 + 0.08 * n3
            util, power, temp = 9.0 + 4 * n0, 0.15, 55.0 + 2 * n1
        else:
            gr, sm, occ, tensor, dram = 0.88 + 0.04 * n0, 0.80 + 0.05 * n1, \
                0.50 + 0.06 * n2, 0.50 + 0.08 * n3, 0.35 + 0.05 * n0
            pcie_tx, pcie_rx = 0.01, 0.04 + 0.01 * n1
            util, power, temp = 97.0 + 2 * n2, 0.8, 66.0 + 2 * n3
        link = 0.08 if multi_gpu else 0.0
    elif profile == "small_batch":
        # tiny kernels back to back: the engine busy, few SMs and few warps each
        gr, sm, occ, tensor, dram = 0.55 + 0.05 * n0, 0.20 + 0.04 * n1, 0.025 + 0.01 * n2, \
            0.05 + 0.03 * n3, 0.12 + 0.03 * n0
        pcie_tx, pcie_rx = 0.04 + 0.01 * n1, 0.06 + 0.02 * n2
        link = 0.03 if multi_gpu else 0.0
        util, power, temp = 94.0 + 4 * n3, 0.35 + 0.05 * n0, 54.0 + 2 * n1
    elif profile == "comm_bound":
        # collective kernels hold the engine on a few SMs while they wait on the link
        gr, sm, occ, tensor, dram = 0.82 + 0.05 * n0, 0.27 + 0.05 * n1, 0.05 + 0.01 * n2, \
            0.11 + 0.04 * n3, 0.22 + 0.04 * n0
        link = 0.58 + 0.10 * n1
        pcie_tx, pcie_rx = 0.02, 0.03
        util, power, temp = 97.0 + 2 * n2, 0.5 + 0.05 * n3, 61.0 + 2 * n0
    elif profile == "memory_bound":
        gr, sm, occ, tensor, dram = 0.90 + 0.04 * n0, 0.72 + 0.05 * n1, 0.45 + 0.05 * n2, \
            0.06 + 0.03 * n3, 0.86 + 0.05 * n0
        pcie_tx, pcie_rx = 0.01, 0.03
        link = 0.05 if multi_gpu else 0.0
        util, power, temp = 99.0 + n1, 0.75 + 0.05 * n2, 66.0 + 2 * n3
    elif profile == "idle":
        gr = 0.008 + 0.007 * n0
        sm, occ, tensor, dram = gr * 0.5, gr * 0.3, 0.0, 0.004 + 0.003 * n1
        pcie_tx, pcie_rx, link = 0.0005, 0.0005, 0.0
        util = 0.0 if n2 < 0.7 else 2.0 + n3
        power, temp = 0.04, 36.0 + 2 * n3
        reasons = CLOCK_GPU_IDLE
        sm_clock = 0.2
    elif profile == "throttled":
        gr, sm, occ, tensor, dram = 0.90 + 0.04 * n0, 0.78 + 0.05 * n1, 0.50 + 0.05 * n2, \
            0.45 + 0.06 * n3, 0.36 + 0.05 * n0
        pcie_tx, pcie_rx = 0.01, 0.03
        link = 0.1 if multi_gpu else 0.0
        util, power, temp = 99.0 + n1, 0.98 + 0.02 * n2, 89.0 + 3 * n3
        reasons = CLOCK_SW_THERMAL | CLOCK_HW_THERMAL if n0 < 0.4 else (
            CLOCK_SW_POWER_CAP | CLOCK_HW_POWER_BRAKE | CLOCK_SW_THERMAL)
        sm_clock = 0.62 + 0.05 * n2
    else:
        raise ValueError(f"unknown workload profile {profile!r}")
    if link and not has_nvlink:  # collectives go over PCIe instead
        pcie_tx, pcie_rx, link = max(pcie_tx, link * 0.8), max(pcie_rx, link * 0.8), 0.0
    return Activity(_clip(gr), _clip(sm), _clip(occ), _clip(tensor), _clip(dram),
                    _clip(pcie_tx), _clip(pcie_rx), _clip(link),
                    min(100.0, max(0.0, round(util))), _clip(mem), _clip(power), temp,
                    reasons, sm_clock)


def combine(shares: list[Activity], clients: int) -> Activity:
    """A time-shared GPU: each pod runs for an equal slice; memory adds up.

    ``clients`` is the pool's ``max-shared-clients-per-gpu``: a pod's memory on a shared GPU
    is its own share scaled to one client's portion.
    """
    if len(shares) == 1 and clients == 1:
        return shares[0]
    n = len(shares)

    def mean(values: list[float]) -> float:
        return sum(values) / n

    return Activity(
        mean([a.gr_engine_active for a in shares]), mean([a.sm_active for a in shares]),
        mean([a.sm_occupancy for a in shares]), mean([a.tensor_active for a in shares]),
        mean([a.dram_active for a in shares]), mean([a.pcie_tx_ratio for a in shares]),
        mean([a.pcie_rx_ratio for a in shares]), mean([a.nvlink_ratio for a in shares]),
        max(a.gpu_util_percent for a in shares),
        _clip(sum(a.memory_ratio for a in shares) / clients),
        mean([a.power_ratio for a in shares]), max(a.temp_celsius for a in shares),
        max(a.clock_event_reasons for a in shares) if all(
            a.clock_event_reasons for a in shares) else 0,
        max(a.sm_clock_ratio for a in shares),
    )
