"""Why a pod's GPUs are not doing more: one class per pod over a sliding window.

On a time-shared GPU the class describes the GPU: DCGM cannot tell the sharing pods apart.

Rules, first match wins, over the samples of the pod's GPUs in the window (ratios 0-1;
link rates as a share of the GPU model's bandwidth):

=====================  ===================================================================
class                  evidence
=====================  ===================================================================
insufficient_signal    no ``DCGM_FI_PROF_*`` fields: enable DCGM_FI_PROF_GR_ENGINE_ACTIVE,
                       DCGM_FI_PROF_SM_ACTIVE, DCGM_FI_PROF_SM_OCCUPANCY,
                       DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, DCGM_FI_PROF_DRAM_ACTIVE and the
                       NVLink/PCIe bytes in dcgm-exporter's counters file
idle                   mean GR engine active < 0.05
throttled              thermal or power clock-event reasons in >= 50 % of samples, or mean
                       GPU temperature >= 85 C
comm_bound             NVLink traffic >= 30 % of link bandwidth and SM active < 0.45
input_bound            >= 15 % of samples stalled (GR < 0.2) while others run (GR >= 0.6)
small_batch            GPU_UTIL >= 80 % (on MIG, which has no GPU_UTIL: GR >= 0.05) while
                       SM active < 0.35 (GR < 0.5 without SM fields)
memory_bound           DRAM active >= 0.7 and tensor pipe < 0.2
healthy                none of the above
=====================  ===================================================================
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from exporter.catalog import GPU_MODELS

CLASSES = ("insufficient_signal", "idle", "throttled", "comm_bound", "input_bound",
           "small_batch", "memory_bound", "healthy")
THROTTLE_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # sw power cap, hw slowdown, thermal, brake
CLOCK_REASONS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
SIGNAL_FIELDS = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE",
                 "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE",
                 "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES",
                 "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", CLOCK_REASONS)
"""The fields ``classify`` reads."""

IDLE_GR = 0.05
THROTTLED_SHARE = 0.5
THROTTLED_TEMP_C = 85.0
COMM_LINK_SHARE = 0.3
COMM_SM_MAX = 0.45
STALL_GR = 0.2
STALL_SHARE = 0.15
RUNNING_GR = 0.6
SMALL_BATCH_GPU_UTIL = 80.0
SMALL_BATCH_SM_MAX = 0.35
MEMORY_DRAM_MIN = 0.7
MEMORY_TENSOR_MAX = 0.2


@dataclass(frozen=True, slots=True)
class Diagnosis:
    bottleneck: str
    evidence: dict[str, float]


@dataclass(slots=True)
class Signals:
    """What the rules read: means over the window and the shares that need every sample.
    From live samples (``signals``) or from warehouse rows aggregated in SQL (the weekly
    report): one set of rules either way."""

    gr: float | None
    """Mean DCGM_FI_PROF_GR_ENGINE_ACTIVE; None without profiling fields."""
    sm: float | None = None
    tensor: float | None = None
    dram: float | None = None
    gpu_util_percent: float | None = None
    temp: float | None = None
    nvlink_tx: float | None = None
    nvlink_rx: float | None = None
    stalled_share: float = 0.0
    """Share of samples with GR < STALL_GR."""
    max_gr: float = 0.0
    throttled_share: float | None = None
    """Share of samples with a thermal or power clock-event reason; None if unreported."""


def _mean(samples: Sequence[Mapping[str, float]], name: str) -> float | None:
    values = [s[name] for s in samples if name in s]
    return math.fsum(values) / len(values) if values else None  # as statistics.fmean


def signals(samples: Sequence[Mapping[str, float]]) -> Signals:
    """The signals in one pod's GPUs' DCGM samples."""
    gr_values = [s["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] for s in samples
                 if "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in s]
    reasons = [int(s[CLOCK_REASONS]) for s in samples if CLOCK_REASONS in s]
    return Signals(
        gr=math.fsum(gr_values) / len(gr_values) if gr_values else None,
        sm=_mean(samples, "DCGM_FI_PROF_SM_ACTIVE"),
        tensor=_mean(samples, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
        dram=_mean(samples, "DCGM_FI_PROF_DRAM_ACTIVE"),
        gpu_util_percent=_mean(samples, "DCGM_FI_DEV_GPU_UTIL"),
        temp=_mean(samples, "DCGM_FI_DEV_GPU_TEMP"),
        nvlink_tx=_mean(samples, "DCGM_FI_PROF_NVLINK_TX_BYTES"),
        nvlink_rx=_mean(samples, "DCGM_FI_PROF_NVLINK_RX_BYTES"),
        stalled_share=sum(1 for v in gr_values if v < STALL_GR) / len(gr_values)
        if gr_values else 0.0,
        max_gr=max(gr_values, default=0.0),
        throttled_share=sum(1 for r in reasons if r & THROTTLE_BITS) / len(reasons)
        if reasons else None)


_MEANS = (("sm", "DCGM_FI_PROF_SM_ACTIVE"), ("tensor", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
          ("dram", "DCGM_FI_PROF_DRAM_ACTIVE"), ("gpu_util_percent", "DCGM_FI_DEV_GPU_UTIL"),
          ("temp", "DCGM_FI_DEV_GPU_TEMP"), ("nvlink_tx", "DCGM_FI_PROF_NVLINK_TX_BYTES"),
          ("nvlink_rx", "DCGM_FI_PROF_NVLINK_RX_BYTES"))
_MEAN_FIELDS = tuple(name for _, name in _MEANS)
_GR = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"


class Window:
    """One pod's samples over a sliding window, kept by field, so that its ``signals`` are
    those of ``signals`` over the same samples without going through them all again: each
    field's values in arrival order, with the time of each, and the counts of stalled and
    throttled samples. Values and times are packed arrays of doubles (a window of 20
    samples of 9 fields holds about 6 KB; as deques of floats it held about 19 KB)."""

    __slots__ = ("_stalled", "_throttled", "_times", "_values")

    def __init__(self) -> None:
        self._times: dict[str, array[float]] = {}
        self._values: dict[str, array[float]] = {}
        self._stalled = 0
        self._throttled = 0

    def add(self, when: float, sample: Mapping[str, float]) -> None:
        """Add the sample taken at ``when`` (later than any before)."""
        for name in SIGNAL_FIELDS:
            value = sample.get(name)
            if value is None:
                continue
            if name == CLOCK_REASONS:
                value = int(value)
                self._throttled += bool(value & THROTTLE_BITS)
            elif name == _GR:
                self._stalled += value < STALL_GR
            times = self._times.get(name)
            if times is None:
                times = self._times[name] = array("d")
                self._values[name] = array("d")
            times.append(when)
            self._values[name].append(value)

    def expire(self, until: float) -> None:
        """Drop the samples taken at or before ``until``."""
        for name, times in self._times.items():
            gone = bisect.bisect_right(times, until)
            if not gone:
                continue
            values = self._values[name]
            if name == CLOCK_REASONS:
                self._throttled -= sum(bool(int(v) & THROTTLE_BITS) for v in values[:gone])
            elif name == _GR:
                self._stalled -= sum(v < STALL_GR for v in values[:gone])
            del times[:gone]
            del values[:gone]

    def signals(self) -> Signals:
        """``signals`` of the samples in the window."""
        get = self._values.get
        sm, tensor, dram, util, temp, tx, rx = [
            math.fsum(v) / len(v) if (v := get(name)) else None for name in _MEAN_FIELDS]
        gr = get(_GR)
        reasons = get(CLOCK_REASONS)
        # positional: by keyword, Signals takes twice as long to build (a pod a cycle)
        return Signals(
            math.fsum(gr) / len(gr) if gr else None, sm, tensor, dram, util, temp, tx, rx,
            self._stalled / len(gr) if gr else 0.0, max(gr) if gr else 0.0,
            self._throttled / len(reasons) if reasons else None)


def classify(samples: Sequence[Mapping[str, float]], accelerator: str | None) -> Diagnosis:
    """The bottleneck class of one pod from its GPUs' DCGM samples in the window."""
    return decide(signals(samples), accelerator)


def decide(s: Signals, accelerator: str | None) -> Diagnosis:
    """The rules of the module docstring, first match wins."""
    if s.gr is None:
        evidence = {} if s.gpu_util_percent is None else \
            {"gpu_util_percent": s.gpu_util_percent}
        return Diagnosis("insufficient_signal", evidence)
    gr, sm, tensor, dram, util, temp = s.gr, s.sm, s.tensor, s.dram, s.gpu_util_percent, s.temp
    evidence = {"gr_engine_active": gr}
    if sm is not None:
        evidence["sm_active"] = sm
    if tensor is not None:
        evidence["tensor_active"] = tensor
    if dram is not None:
        evidence["dram_active"] = dram
    if util is not None:
        evidence["gpu_util_percent"] = util
    if temp is not None:
        evidence["gpu_temp_celsius"] = temp
    if gr < IDLE_GR:
        return Diagnosis("idle", evidence)
    throttled = s.throttled_share or 0.0
    if s.throttled_share is not None:
        evidence["throttled_share"] = throttled
    if throttled >= THROTTLED_SHARE or (temp is not None and temp >= THROTTLED_TEMP_C):
        return Diagnosis("throttled", evidence)
    model = GPU_MODELS.get(accelerator or "")
    if model is not None and model.has_nvlink and s.nvlink_tx is not None and \
            s.nvlink_rx is not None:
        link = max(s.nvlink_tx, s.nvlink_rx) / model.nvlink_bytes_per_second
        evidence["nvlink_share"] = link
        sm_or_tensor = sm if sm is not None else (tensor or 0.0)
        if link >= COMM_LINK_SHARE and sm_or_tensor < COMM_SM_MAX:
            return Diagnosis("comm_bound", evidence)
    evidence["stalled_share"] = s.stalled_share
    if s.stalled_share >= STALL_SHARE and s.max_gr >= RUNNING_GR:
        return Diagnosis("input_bound", evidence)
    # MIG instances have no GPU_UTIL: there, kernels running (GR engine busy) while SMs
    # sit mostly empty is the same launch-bound signature.
    launching = util >= SMALL_BATCH_GPU_UTIL if util is not None else gr >= IDLE_GR
    if launching and ((sm is not None and sm < SMALL_BATCH_SM_MAX) or (sm is None and gr < 0.5)):
        return Diagnosis("small_batch", evidence)
    if dram is not None and tensor is not None and dram >= MEMORY_DRAM_MIN and \
            tensor < MEMORY_TENSOR_MAX:
        return Diagnosis("memory_bound", evidence)
    return Diagnosis("healthy", evidence)
