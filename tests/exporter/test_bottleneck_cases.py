"""The bottleneck classes on readings written from NVIDIA's field semantics, not from the
simulator: each workload as DCGM would show it, with every profiling field and with only
the counters a default dcgm-exporter install collects.

How the readings were written (NVIDIA's DCGM profiling metrics): GR engine active is the
time a kernel has the engine; SM active the share of SM cycles with a warp resident (at
most GR active); SM occupancy the resident warps as a share of the maximum (at most SM
active); cuBLAS GEMMs keep few warps per SM and a busy tensor pipe; DRAM active peaks near
0.8; GPU_UTIL only says that some kernel ran in NVML's sample period. PCIe and NVLink are
bytes per second per direction; collectives move as much each way.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from exporter.model.bottleneck import CLOCK_REASONS, SIGNAL_FIELDS, VIOLATIONS, classify

FIXTURE = Path(__file__).parents[1] / "fixtures" / "dcgm" / "dcgm-exporter_default-counters.csv"


def default_counters() -> frozenset[str]:
    """The fields of dcgm-exporter's ``etc/default-counters.csv``."""
    with FIXTURE.open() as f:
        rows = [r for r in csv.reader(f) if r and not r[0].lstrip().startswith("#")]
    return frozenset(r[0].strip() for r in rows)


DEFAULT = default_counters()

GB = 1e9
G = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
SM = "DCGM_FI_PROF_SM_ACTIVE"
OCC = "DCGM_FI_PROF_SM_OCCUPANCY"
TENSOR = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
DRAM = "DCGM_FI_PROF_DRAM_ACTIVE"
UTIL = "DCGM_FI_DEV_GPU_UTIL"
TEMP = "DCGM_FI_DEV_GPU_TEMP"
NV_TX, NV_RX = "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES"
PCIE_TX, PCIE_RX = "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"
POWER_VIOLATION, THERMAL_VIOLATION = VIOLATIONS
NS = 1e9
"""Violation counters count nanoseconds."""


@dataclass(frozen=True)
class Case:
    name: str
    accelerator: str
    reading: dict[str, float]
    """Each sample of the window, unless ``samples`` says otherwise."""
    full: str
    """The class with every profiling field."""
    default: str | None
    """The class with dcgm-exporter's default counters; None: not a case for them."""
    samples: list[dict[str, float]] = field(default_factory=list)
    mig: bool = False
    every_seconds: float = 30.0
    """The time between samples."""

    def window(self, fields: frozenset[str] | None = None) -> list[dict[str, float]]:
        samples = [self.reading | s for s in self.samples] or [self.reading] * 20
        return [{k: v for k, v in s.items() if fields is None or k in fields}
                for s in samples]

    def times(self) -> list[float]:
        return [i * self.every_seconds for i in range(len(self.samples) or 20)]


def counter(name: str, *values: float) -> list[dict[str, float]]:
    """Samples of a cumulative counter."""
    return [{name: v} for v in values]


CASES = [
    Case("LLM pretraining, 8 x H100 over NVLink: GEMMs at low occupancy, tensor pipe busy",
         "nvidia-h100-80gb",
         {G: 0.96, SM: 0.88, OCC: 0.22, TENSOR: 0.45, DRAM: 0.35, UTIL: 100, TEMP: 71,
          NV_TX: 60 * GB, NV_RX: 58 * GB, PCIE_TX: 1 * GB, PCIE_RX: 2 * GB, CLOCK_REASONS: 0},
         "healthy", "healthy"),
    Case("FP32 simulation on L4: every SM busy, no tensor work",
         "nvidia-l4",
         {G: 0.97, SM: 0.92, OCC: 0.45, TENSOR: 0.0, DRAM: 0.3, UTIL: 100, TEMP: 66,
          PCIE_TX: 0.2 * GB, PCIE_RX: 0.3 * GB, CLOCK_REASONS: 0},
         # without SM active, busy SMs and a kernel on a few SMs look the same
         "healthy", "insufficient_signal"),
    Case("notebook holding a GPU, nothing running",
         "nvidia-l4",
         {G: 0.01, SM: 0.005, OCC: 0.002, TENSOR: 0.0, DRAM: 0.003, UTIL: 0, TEMP: 35,
          PCIE_TX: 0.001 * GB, PCIE_RX: 0.001 * GB, CLOCK_REASONS: 0x1},
         "idle", "idle"),
    Case("dataloader-bound ResNet on A100: CPU decode, GPU_UTIL high, SM active low",
         "nvidia-tesla-a100",
         {G: 0.18, SM: 0.15, OCC: 0.07, TENSOR: 0.08, DRAM: 0.06, UTIL: 85, TEMP: 50,
          NV_TX: 0.0, NV_RX: 0.0, PCIE_TX: 0.3 * GB, PCIE_RX: 3 * GB, CLOCK_REASONS: 0},
         # the engine waits between steps, but its kernels fill the GPU when they run
         "input_bound", "insufficient_signal"),
    Case("under-fed fine-tuning on H100: GPU_UTIL 90 %, the engine busy a third of the time",
         "nvidia-h100-80gb",
         {G: 0.3, SM: 0.26, OCC: 0.13, TENSOR: 0.12, DRAM: 0.1, UTIL: 90, TEMP: 55,
          NV_TX: 2 * GB, NV_RX: 2 * GB, PCIE_TX: 0.5 * GB, PCIE_RX: 6 * GB, CLOCK_REASONS: 0},
         "input_bound", "insufficient_signal"),
    Case("dataloader-starved training: the engine stalls for most samples, runs in bursts",
         "nvidia-l4",
         {SM: 0.2, OCC: 0.1, TENSOR: 0.15, DRAM: 0.08, UTIL: 40, TEMP: 52,
          PCIE_TX: 0.2 * GB, PCIE_RX: 4 * GB, CLOCK_REASONS: 0}, "input_bound", "input_bound",
         samples=[{G: 0.02}] * 14 + [{G: 0.9}] * 6),
    Case("small-batch inference on L4: the engine busy, few warps on each active SM",
         "nvidia-l4",
         {G: 0.92, SM: 0.55, OCC: 0.08, TENSOR: 0.06, DRAM: 0.15, UTIL: 98, TEMP: 58,
          PCIE_TX: 0.4 * GB, PCIE_RX: 0.6 * GB, CLOCK_REASONS: 0},
         "small_batch", "insufficient_signal"),
    Case("launch-bound eager PyTorch on T4: tiny kernels on a few SMs, GPU_UTIL 93 %",
         "nvidia-tesla-t4",
         {G: 0.45, SM: 0.12, OCC: 0.05, TENSOR: 0.02, DRAM: 0.05, UTIL: 93, TEMP: 54,
          PCIE_TX: 0.3 * GB, PCIE_RX: 0.4 * GB, CLOCK_REASONS: 0},
         "small_batch", "insufficient_signal"),
    Case("all-reduce bound data parallel, 8 x H100: NVLink at half its bandwidth",
         "nvidia-h100-80gb",
         {G: 0.85, SM: 0.25, OCC: 0.04, TENSOR: 0.1, DRAM: 0.2, UTIL: 99, TEMP: 62,
          NV_TX: 220 * GB, NV_RX: 215 * GB, PCIE_TX: 1 * GB, PCIE_RX: 1 * GB, CLOCK_REASONS: 0},
         # default counters have no NVLink bytes: quiet SMs could be waiting on the link
         "comm_bound", "insufficient_signal"),
    Case("all-reduce over PCIe on 2 x T4 (no NVLink): both directions busy",
         "nvidia-tesla-t4",
         {G: 0.8, SM: 0.3, OCC: 0.05, TENSOR: 0.08, DRAM: 0.15, UTIL: 97, TEMP: 60,
          PCIE_TX: 6.5 * GB, PCIE_RX: 6.8 * GB, CLOCK_REASONS: 0},
         "comm_bound", "comm_bound"),
    Case("embedding lookups on A100: DRAM near its practical peak, tensor pipe idle",
         "nvidia-tesla-a100",
         {G: 0.95, SM: 0.8, OCC: 0.6, TENSOR: 0.03, DRAM: 0.78, UTIL: 100, TEMP: 67,
          NV_TX: 10 * GB, NV_RX: 10 * GB, PCIE_TX: 0.5 * GB, PCIE_RX: 0.5 * GB,
          CLOCK_REASONS: 0},
         "memory_bound", "memory_bound"),
    Case("H100 at 88 C with the hardware thermal slowdown reason set",
         "nvidia-h100-80gb",
         {G: 0.93, SM: 0.85, OCC: 0.3, TENSOR: 0.4, DRAM: 0.35, UTIL: 100, TEMP: 88,
          NV_TX: 20 * GB, NV_RX: 20 * GB, PCIE_TX: 1 * GB, PCIE_RX: 1 * GB,
          CLOCK_REASONS: 0x40},
         "throttled", "throttled"),
    # a power cap at a normal temperature shows only in the clock-event reasons
    Case("H100 held at its software power cap, 72 C",
         "nvidia-h100-80gb",
         {G: 0.95, SM: 0.86, OCC: 0.25, TENSOR: 0.5, DRAM: 0.4, UTIL: 100, TEMP: 72,
          NV_TX: 30 * GB, NV_RX: 30 * GB, PCIE_TX: 1 * GB, PCIE_RX: 1 * GB, CLOCK_REASONS: 0x4},
         "throttled", None),
    # DCGM's bitmask says no throttling: a GPU running hot at its clocks is not throttled
    Case("H100 at 90 C, clock-event reasons reported and none set",
         "nvidia-h100-80gb",
         {G: 0.93, SM: 0.85, OCC: 0.3, TENSOR: 0.4, DRAM: 0.35, UTIL: 100, TEMP: 90,
          NV_TX: 20 * GB, NV_RX: 20 * GB, PCIE_TX: 1 * GB, PCIE_RX: 1 * GB, CLOCK_REASONS: 0},
         "healthy", None),
    Case("H100 at 90 C, neither clock-event reasons nor violation counters reported",
         "nvidia-h100-80gb",
         {G: 0.93, SM: 0.85, OCC: 0.3, TENSOR: 0.4, DRAM: 0.35, UTIL: 100, TEMP: 90,
          NV_TX: 20 * GB, NV_RX: 20 * GB, PCIE_TX: 1 * GB, PCIE_RX: 1 * GB},
         "throttled", "throttled"),
    # 18 s of every 30 s held below the application clocks by the power limit, at 74 C
    Case("L4 power-capped 60 % of the time, by the power violation counter",
         "nvidia-l4",
         {G: 0.95, SM: 0.9, OCC: 0.4, TENSOR: 0.3, DRAM: 0.4, UTIL: 100, TEMP: 74,
          PCIE_TX: 0.2 * GB, PCIE_RX: 0.3 * GB, THERMAL_VIOLATION: 7 * NS},
         "throttled", None,
         samples=counter(POWER_VIOLATION, *(900 * NS + 18 * NS * i for i in range(10)))),
    Case("L4 power-capped 40 % of the time: not throttled, whatever its temperature",
         "nvidia-l4",
         {G: 0.95, SM: 0.9, OCC: 0.4, TENSOR: 0.3, DRAM: 0.4, UTIL: 100, TEMP: 88,
          PCIE_TX: 0.2 * GB, PCIE_RX: 0.3 * GB},
         "healthy", None,
         samples=counter(POWER_VIOLATION, *(12 * NS * i for i in range(10)))),
    # a driver reload restarts the counter: the increase is counted from zero, so the
    # window still reads 16 s of every 30 s (a plain difference would read -134 s)
    Case("thermal violation counter restarted in the window, throttled 53 % of the time",
         "nvidia-l4",
         {G: 0.95, SM: 0.9, OCC: 0.4, TENSOR: 0.3, DRAM: 0.4, UTIL: 100, TEMP: 80,
          PCIE_TX: 0.2 * GB, PCIE_RX: 0.3 * GB},
         "throttled", None,
         samples=counter(THERMAL_VIOLATION, 100 * NS, 116 * NS, 132 * NS, 148 * NS, 16 * NS,
                         32 * NS, 48 * NS)),
    # after a restart from a large count, a small reading is not a huge increase
    Case("thermal violation counter restarted from 5,000 s, 1 s of violation since",
         "nvidia-l4",
         {G: 0.95, SM: 0.9, OCC: 0.4, TENSOR: 0.3, DRAM: 0.4, UTIL: 100, TEMP: 86,
          PCIE_TX: 0.2 * GB, PCIE_RX: 0.3 * GB},
         "healthy", None,
         samples=counter(THERMAL_VIOLATION, 5000 * NS, 5000 * NS, 5000 * NS, 1 * NS, 1 * NS)),
    Case("MIG 1g.10gb instance serving a model (no GPU_UTIL on MIG)",
         "nvidia-tesla-a100",
         {G: 0.7, SM: 0.6, OCC: 0.3, TENSOR: 0.25, DRAM: 0.3, TEMP: 60},
         "healthy", "healthy", mig=True),
    Case("MIG instance running tiny kernels: SMs a third filled",
         "nvidia-tesla-a100",
         {G: 0.7, SM: 0.2, OCC: 0.06, TENSOR: 0.03, DRAM: 0.08, TEMP: 55},
         "small_batch", "insufficient_signal", mig=True),
    Case("driver without profiling support, kernels running",
         "nvidia-tesla-t4", {UTIL: 70, TEMP: 60}, "insufficient_signal", "insufficient_signal"),
    Case("driver without profiling support, nothing running",
         "nvidia-tesla-t4", {UTIL: 0, TEMP: 34}, "idle", "idle"),
]


def test_the_default_counters_are_dcgm_exporters() -> None:
    """The profiling fields a default install collects, from its counters file."""
    assert {f for f in DEFAULT if f.startswith("DCGM_FI_PROF_")} == {
        G, TENSOR, DRAM, PCIE_TX, PCIE_RX}
    assert set(SIGNAL_FIELDS) - DEFAULT == {SM, OCC, NV_TX, NV_RX, CLOCK_REASONS,
                                            POWER_VIOLATION, THERMAL_VIOLATION}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_with_every_profiling_field(case: Case) -> None:
    got = classify(case.window(), case.accelerator, mig=case.mig, times=case.times())
    assert got.bottleneck == case.full


@pytest.mark.parametrize("case", [c for c in CASES if c.default is not None],
                         ids=lambda c: c.name)
def test_with_the_default_counters(case: Case) -> None:
    got = classify(case.window(DEFAULT), case.accelerator, mig=case.mig, times=case.times())
    assert got.bottleneck == case.default
    assert case.default in (case.full, "insufficient_signal")  # never a different guess


def test_the_evidence_names_what_decided() -> None:
    small = next(c for c in CASES if c.name.startswith("small-batch"))
    ev = classify(small.window(), small.accelerator).evidence
    assert ev["warps_per_active_sm"] == pytest.approx(0.08 / 0.55)
    assert ev["sm_fill"] == pytest.approx(0.55 / 0.92)
    pcie = next(c for c in CASES if "over PCIe" in c.name)
    # collectives by the quieter direction: 6.5 GB/s of a T4's 16 GB/s
    assert classify(pcie.window(), pcie.accelerator).evidence["pcie_share"] == \
        pytest.approx(6.5 / 16)


@pytest.mark.parametrize(("samples", "share"), [
    (counter(POWER_VIOLATION, 0.0, 18 * NS, 36 * NS), 0.6),
    # the larger of the two counters
    ([{POWER_VIOLATION: 0.0, THERMAL_VIOLATION: 0.0},
      {POWER_VIOLATION: 18 * NS, THERMAL_VIOLATION: 6 * NS}], 0.6),
    ([{POWER_VIOLATION: 0.0, THERMAL_VIOLATION: 0.0},
      {POWER_VIOLATION: 3 * NS, THERMAL_VIOLATION: 27 * NS}], 0.9),
    # and of the counters and the reasons (whose share is of samples)
    ([{CLOCK_REASONS: 0x20}, {CLOCK_REASONS: 0x20}, {CLOCK_REASONS: 0}], 2 / 3),
    ([{CLOCK_REASONS: 0, POWER_VIOLATION: 0.0}, {CLOCK_REASONS: 0, POWER_VIOLATION: 3 * NS},
      {CLOCK_REASONS: 0x20, POWER_VIOLATION: 6 * NS}], 1 / 3),
    ([{CLOCK_REASONS: 0, POWER_VIOLATION: 0.0}, {CLOCK_REASONS: 0, POWER_VIOLATION: 3 * NS},
      {CLOCK_REASONS: 0, POWER_VIOLATION: 6 * NS}], 0.1),
    # samples without the counter between: over the time between those with it
    ([{POWER_VIOLATION: 0.0}, {}, {POWER_VIOLATION: 30 * NS}], 0.5),
    (counter(POWER_VIOLATION, 40 * NS, 1 * NS, 4 * NS), 4 / 60),  # restarted after 40 s
    (counter(POWER_VIOLATION, 0.0, 90 * NS), 1.0),  # never more than the time between
    (counter(POWER_VIOLATION, 5 * NS), None),  # one sample: no interval
    ([{TEMP: 90.0}] * 3, None),
])
def test_the_throttled_share(samples: list[dict[str, float]], share: float | None) -> None:
    """Samples 30 s apart."""
    got = classify(samples, "nvidia-l4", times=[30.0 * i for i in range(len(samples))])
    assert got.signals.throttled_share == (pytest.approx(share) if share is not None else None)


def test_without_times_the_violation_counters_are_not_read() -> None:
    samples = counter(POWER_VIOLATION, 0.0, 30 * NS)
    assert classify(samples, "nvidia-l4").signals.throttled_share is None
