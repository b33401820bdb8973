"""Why a pod's GPUs are not doing more: one class per pod over a sliding window.

On a time-shared GPU the class describes the GPU: DCGM cannot tell the sharing pods apart.

What the fields mean (NVIDIA's DCGM profiling metrics; all ratios 0-1, means over the
window):

- GR engine active: the share of time a compute context had work in the engine; the GPU's
  *temporal* use. ``DCGM_FI_DEV_GPU_UTIL`` says much less: only that some kernel ran during
  NVML's sample period, so a single-thread kernel reads 100 %.
- SM active: the share of SM cycles with at least one warp resident, over all SMs. NVIDIA
  calls 0.8 necessary for effective use and under 0.5 likely ineffective. Divided by GR
  active it is the *fill*: how much of the GPU a kernel occupies while one runs.
- SM occupancy: resident warps as a share of the maximum, over all SMs. Divided by SM
  active it is the warps per active SM: few warps cannot hide latency. Tensor-core GEMMs
  run at low occupancy by design, so it only counts while the tensor pipe and DRAM are quiet.
- Tensor pipe active, DRAM active: how busy the tensor cores and the memory interface are
  (DRAM peaks at about 0.8 in practice).
- PCIe and NVLink bytes: traffic per direction as a share of the link's bandwidth.
  Collectives send and receive alike, so PCIe counts as a collective link by the smaller of
  its two directions; input copies go one way.

- Clock-event reasons (``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``, field 112, which DCGM before
  3.x named ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``; the sources read both names and hand
  on the newer one): a bitmask of why the clocks are held down at the sample, of which the
  software and hardware power caps (0x4, 0x80), hardware slowdown (0x8) and the software
  and hardware thermal slowdowns (0x20, 0x40) count as throttling.
- Power and thermal violation (``DCGM_FI_DEV_POWER_VIOLATION``,
  ``DCGM_FI_DEV_THERMAL_VIOLATION``): cumulative counters of the time the GPU was held
  below its application clocks by its power limit or by heat, in nanoseconds (NVML's
  violation time; DCGM's header said microseconds until DCGM 4.1 corrected it, with the
  field read the same way, and dcgm-exporter's counters file says nanoseconds). The share
  of the window in violation is the counter's increase between consecutive samples over
  the time between them, a counter that went down counted as restarted from zero (a
  driver reload) as Prometheus's ``increase`` counts it. The sync-boost, board-limit,
  low-utilisation and reliability counters say why the clocks sit below their application
  setting for reasons other than power or heat, and are not read.

The throttled share is the larger of the share of samples with a throttling reason and
the share of the window in power or thermal violation (either counter): what DCGM reports
of it. Only where DCGM publishes neither does a hot GPU (mean temperature >= 85 C) count as
throttled: where the bitmask is present and has no throttling bit, a hot GPU is running at
its clocks.

Rules, first match wins. dcgm-exporter's default counters have GR, tensor, DRAM and PCIe
but not SM active, SM occupancy, NVLink bytes, clock-event reasons or violation counters:
where a rule needs a field that is missing and the others cannot settle it, the class is
``insufficient_signal`` rather than a guess.

=====================  ===================================================================
class                  evidence
=====================  ===================================================================
idle                   GR active < 0.05 (without profiling fields: GPU_UTIL < 5 %)
throttled              throttled share >= 50 %: thermal or power clock-event reasons in
                       half the samples, or half the window in power or thermal
                       violation; without either field, mean GPU temperature >= 85 C
comm_bound             a link (NVLink, or PCIe both ways) >= 30 % busy while the SMs are
                       quiet: SM active < 0.45, or without SM fields tensor < 0.2 and DRAM
                       < 0.5. Undecided on an NVLink GPU (not a MIG instance) without
                       NVLink bytes when the engine is busy (GR >= 0.5) and the SMs may
                       be quiet.
input_bound            >= 15 % of samples stalled (GR < 0.2) while others run (GR >= 0.6)
small_batch            few warps per active SM (occupancy / SM active < 0.2) while tensor
                       (< 0.2) and DRAM (< 0.5) are quiet
input_bound            the engine busy < 60 % of the time, with kernels that fill >= half
                       the GPU while they run (undecided without SM active)
small_batch            the engine busy < 60 % of the time with kernels that fill less; or
                       busy, tensor and DRAM quiet, and kernels that fill < half the GPU
                       (undecided without SM active)
memory_bound           DRAM active >= 0.7 and tensor pipe < 0.2
healthy                none of the above
insufficient_signal    no GR and GPU_UTIL >= 5 %, or a rule above undecided
=====================  ===================================================================

Every figure the rules read is in the diagnosis's evidence, whichever rule decided.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

from exporter.model.catalog import GPU_MODELS, GpuModel

THROTTLE_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # sw power cap, hw slowdown, thermal, brake
CLOCK_REASONS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
"""The clock-event bitmask by its current name (``catalog.DCGM_RENAMED`` maps the older
one onto it where readings enter)."""
VIOLATIONS = ("DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION")
"""Cumulative nanoseconds held below the application clocks by power, by heat."""
VIOLATION_SECONDS = 1e-9
"""Seconds in one unit of a violation counter."""
SIGNAL_FIELDS = ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE",
                 "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                 "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP",
                 "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES",
                 "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES", CLOCK_REASONS,
                 *VIOLATIONS)
"""The fields ``classify`` reads."""

IDLE_GR = 0.05
IDLE_GPU_UTIL = 5.0
THROTTLED_SHARE = 0.5
THROTTLED_TEMP_C = 85.0
COMM_LINK_SHARE = 0.3
COMM_SM_MAX = 0.45
COMM_GR_MIN = 0.5
STALL_GR = 0.2
STALL_SHARE = 0.15
RUNNING_GR = 0.6
BUSY_GR = 0.6
"""Below this mean GR activity the engine waits for work 40 % of the time or more."""
FILL_MIN = 0.5
"""SM active / GR active: kernels that occupy at least half the GPU while they run."""
WARPS_MIN = 0.2
"""SM occupancy / SM active: below it, too few warps per active SM to hide latency."""
TENSOR_BUSY = 0.2
DRAM_BUSY = 0.5
MEMORY_DRAM_MIN = 0.7
MEMORY_TENSOR_MAX = TENSOR_BUSY




@dataclass(slots=True)
class Signals:
    """What the rules read: means over the window and the shares that need every sample.
    From live samples (``signals``) or from warehouse rows aggregated in SQL (the weekly
    report): one set of rules either way. None: the field was not reported."""

    gr: float | None
    """Mean DCGM_FI_PROF_GR_ENGINE_ACTIVE."""
    sm: float | None = None
    occupancy: float | None = None
    tensor: float | None = None
    dram: float | None = None
    gpu_util_percent: float | None = None
    temp_celsius: float | None = None
    """Mean GPU temperature."""
    nvlink_tx_bytes_per_second: float | None = None
    nvlink_rx_bytes_per_second: float | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    stalled_share: float = 0.0
    """Share of samples with GR < STALL_GR."""
    max_gr: float = 0.0
    throttled_share: float | None = None
    """The larger of the share of samples with a thermal or power clock-event reason and
    the share of the window in power or thermal violation; None where DCGM reports
    neither."""


@dataclass(frozen=True, slots=True)
class Diagnosis:
    bottleneck: str
    signals: Signals
    model: GpuModel | None

    @property
    def evidence(self) -> dict[str, float]:
        """Every figure the rules read (``evidence``); worked out when asked for, since the
        live classifier needs only the class."""
        return evidence(self.signals, self.model)


def _mean(samples: Sequence[Mapping[str, float]], name: str) -> float | None:
    values = [s[name] for s in samples if name in s]
    return math.fsum(values) / len(values) if values else None  # as statistics.fmean


def increase(before: float, after: float) -> float:
    """A cumulative counter's increase from ``before`` to ``after``; one that went down
    restarted from zero in between."""
    return after - before if after >= before else after


def violation_share(increases: Sequence[float], seconds: Sequence[float]) -> float | None:
    """The share of time in violation over consecutive pairs of a counter's samples: their
    increases (counter units) over the seconds between them; None without a pair (at most
    1, a counter cannot run faster than time)."""
    span = math.fsum(seconds)
    return min(math.fsum(increases) * VIOLATION_SECONDS / span, 1.0) if span > 0 else None


def throttled_share(reasons_share: float | None, violations: Sequence[float | None]
                    ) -> float | None:
    """The throttled share from the clock-event reasons and each violation counter's share:
    the largest of those reported, None if none is."""
    known = [v for v in (reasons_share, *violations) if v is not None]
    return max(known) if known else None


def signals(samples: Sequence[Mapping[str, float]],
            times: Sequence[float] | None = None) -> Signals:
    """The signals in one pod's GPUs' DCGM samples, taken at ``times`` (seconds; without
    them the violation counters, which need the time between samples, are not read)."""
    gr_values = [s[_GR] for s in samples if _GR in s]
    reasons = [int(s[CLOCK_REASONS]) for s in samples if CLOCK_REASONS in s]
    sm, occ, tensor, dram, util, temp, nv_tx, nv_rx, pcie_tx, pcie_rx = [
        _mean(samples, name) for name in _MEAN_FIELDS]
    violations: list[float | None] = []
    if times is not None:
        for name in VIOLATIONS:
            points = [(t, s[name]) for t, s in zip(times, samples, strict=True) if name in s]
            pairs = list(pairwise(points))
            violations.append(violation_share(
                [increase(a, b) for (_, a), (_, b) in pairs],
                [tb - ta for (ta, _), (tb, _) in pairs]))
    return Signals(
        math.fsum(gr_values) / len(gr_values) if gr_values else None, sm, occ, tensor, dram,
        util, temp, nv_tx, nv_rx, pcie_tx, pcie_rx,
        stalled_share=sum(1 for v in gr_values if v < STALL_GR) / len(gr_values)
        if gr_values else 0.0,
        max_gr=max(gr_values, default=0.0),
        throttled_share=throttled_share(
            sum(1 for r in reasons if r & THROTTLE_BITS) / len(reasons) if reasons else None,
            violations))


_GR = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
_MEAN_FIELDS = tuple(name for name in SIGNAL_FIELDS
                     if name not in (_GR, CLOCK_REASONS, *VIOLATIONS))
"""The fields averaged into ``Signals``, in its field order after ``gr``."""


class Window:
    """One pod's samples over a sliding window, so that its ``signals`` are those of
    ``signals`` over the same samples without going through them all again: the time of
    each sample, each field's values in the same order (NaN where a sample lacks the
    field), how many samples have each field, and the counts of stalled and throttled
    samples. Of each violation counter, also the increase and the seconds since the
    counter's previous sample in the window, by sample. Times and values are packed arrays
    of doubles, one of times for all fields (a window of 20 samples of 12 fields holds
    about 3 KB)."""

    __slots__ = ("_counts", "_last", "_pairs", "_stalled", "_throttled", "_times",
                 "_values")

    def __init__(self) -> None:
        self._times: array[float] = array("d")
        self._values: dict[str, array[float]] = {}
        self._counts: dict[str, int] = {}
        self._stalled = 0
        self._throttled = 0
        self._pairs: dict[str, tuple[array[float], array[float]]] = {}
        """Violation counter -> (increase, seconds) since its previous sample in the window,
        by sample (NaN where none)."""
        self._last: dict[str, tuple[float, float]] = {}
        """Violation counter -> (time, value) of its last sample in the window."""

    def add(self, when: float, sample: Mapping[str, float]) -> None:
        """Add the sample taken at ``when`` (later than any before)."""
        values, counts = self._values, self._counts
        for name in SIGNAL_FIELDS:
            value = sample.get(name)
            kept = values.get(name)
            if value is None:
                if kept is not None:
                    kept.append(_NAN)
                continue
            if kept is None:  # the samples before had no such field
                kept = values[name] = array("d", _NO_VALUE) * len(self._times)
                counts[name] = 0
            if name == CLOCK_REASONS:
                value = int(value)
                self._throttled += bool(value & THROTTLE_BITS)
            elif name == _GR:
                self._stalled += value < STALL_GR
            kept.append(value)
            counts[name] += 1
        if self._pairs or any(name in sample for name in VIOLATIONS):
            self._add_pairs(when, sample)
        self._times.append(when)

    def _add_pairs(self, when: float, sample: Mapping[str, float]) -> None:
        for name in VIOLATIONS:
            value = sample.get(name)
            pairs = self._pairs.get(name)
            if value is None:
                if pairs is not None:
                    pairs[0].append(_NAN)
                    pairs[1].append(_NAN)
                continue
            if pairs is None:
                pairs = self._pairs[name] = (array("d", _NO_VALUE) * len(self._times),
                                             array("d", _NO_VALUE) * len(self._times))
            last = self._last.get(name)
            pairs[0].append(_NAN if last is None else increase(last[1], value))
            pairs[1].append(_NAN if last is None else when - last[0])
            self._last[name] = (when, value)

    def expire(self, until: float) -> None:
        """Drop the samples taken at or before ``until``."""
        gone = bisect.bisect_right(self._times, until)
        if not gone:
            return
        del self._times[:gone]
        counts = self._counts
        empty = []
        for name, values in self._values.items():
            # NaN (v != v): the sample had no value; most cycles drop one sample
            present = ([v] if (v := values[0]) == v else []) if gone == 1 else \
                [v for v in values[:gone] if v == v]
            if present:
                if name == CLOCK_REASONS:
                    self._throttled -= sum(bool(int(v) & THROTTLE_BITS) for v in present)
                elif name == _GR:
                    self._stalled -= sum(v < STALL_GR for v in present)
                counts[name] -= len(present)
            if counts[name]:
                del values[:gone]
            else:  # no sample left has the field
                empty.append(name)
        for name in empty:
            del self._values[name], counts[name]
        for name, (increases, seconds) in list(self._pairs.items()):
            kept = self._values.get(name)
            if kept is None:  # no sample left has the counter
                del self._pairs[name], self._last[name]
                continue
            del increases[:gone], seconds[:gone]
            first = next(i for i, v in enumerate(kept) if v == v)
            increases[first] = seconds[first] = _NAN  # its previous sample has gone

    def _mean(self, name: str, n: int) -> float | None:
        values = self._values.get(name)
        if values is None:
            return None
        count = self._counts[name]
        return math.fsum(values if count == n else (v for v in values if v == v)) / count

    def signals(self) -> Signals:
        """``signals`` of the samples in the window."""
        n = len(self._times)
        mean = self._mean
        sm, occ, tensor, dram, util, temp, nv_tx, nv_rx, pcie_tx, pcie_rx = [
            mean(name, n) for name in _MEAN_FIELDS]
        gr = self._values.get(_GR)
        counts = self._counts
        grs = counts.get(_GR, 0)
        reasons = counts.get(CLOCK_REASONS, 0)
        top = 0.0
        if gr is not None:
            top = max(gr) if grs == n else max(v for v in gr if v == v)
        share = self._throttled / reasons if reasons else None
        if self._pairs:
            share = throttled_share(share, [violation_share(
                [v for v in pairs[0] if v == v], [v for v in pairs[1] if v == v])
                for pairs in self._pairs.values()])
        # positional: by keyword, Signals takes twice as long to build (a pod a cycle)
        return Signals(
            mean(_GR, n), sm, occ, tensor, dram, util, temp, nv_tx, nv_rx, pcie_tx, pcie_rx,
            self._stalled / grs if grs else 0.0, top, share)


_NAN = math.nan
_NO_VALUE = (math.nan,)


def classify(samples: Sequence[Mapping[str, float]], accelerator: str | None, *,
             mig: bool = False, times: Sequence[float] | None = None) -> Diagnosis:
    """The bottleneck class of one pod from its GPUs' DCGM samples in the window (taken at
    ``times``, which the violation counters need)."""
    return decide(signals(samples, times), accelerator, mig=mig)


def evidence(s: Signals, model: GpuModel | None) -> dict[str, float]:
    """Every figure the rules read, as it is shown with the class (keys in ``EVIDENCE``'s
    order, only those the pod has)."""
    out: dict[str, float] = {}
    gr, sm, occ = s.gr, s.sm, s.occupancy
    for key, value in (("gr_engine_active", gr), ("sm_active", sm), ("sm_occupancy", occ),
                       ("tensor_active", s.tensor), ("dram_active", s.dram),
                       ("gpu_util_percent", s.gpu_util_percent),
                       ("gpu_temp_celsius", s.temp_celsius),
                       ("throttled_share", s.throttled_share)):
        if value is not None:
            out[key] = value
    if gr is not None:
        out["stalled_share"] = s.stalled_share
        if sm is not None and gr > 0:
            out["sm_fill"] = sm / gr
    if occ is not None and sm:
        out["warps_per_active_sm"] = occ / sm
    if model is not None:
        if model.has_nvlink and (nvlink := _nvlink_share(s, model)) is not None:
            out["nvlink_share"] = nvlink
        if (pcie := _pcie_share(s, model)) is not None:
            out["pcie_share"] = pcie
    return out


def _nvlink_share(s: Signals, model: GpuModel) -> float | None:
    """The busier direction's NVLink traffic as a share of the link."""
    tx, rx = s.nvlink_tx_bytes_per_second, s.nvlink_rx_bytes_per_second
    return None if tx is None or rx is None else max(tx, rx) / model.nvlink_bytes_per_second


def _pcie_share(s: Signals, model: GpuModel) -> float | None:
    """The quieter direction's PCIe traffic as a share of the link (a collective sends and
    receives alike; a one-way copy is input, not communication)."""
    tx, rx = s.pcie_tx_bytes_per_second, s.pcie_rx_bytes_per_second
    return None if tx is None or rx is None else min(tx, rx) / model.pcie_bytes_per_second


EVIDENCE = ("gr_engine_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
            "gpu_util_percent", "gpu_temp_celsius", "throttled_share", "stalled_share",
            "sm_fill", "warps_per_active_sm", "nvlink_share", "pcie_share",
            "power_limit_share", "watts_per_utilized_gpu")
"""The evidence a class is shown with, in ``evidence``'s order. The last two are the
weekly report's, from the warehouse's power and energy: the GPU's mean draw as a share of
its model's power limit (at the cap: power-throttled), and its energy over its utilised
GPU-seconds (watts per GPU's worth of work: high where a throttled GPU burns power for
little)."""

RESTS_ON = {
    "idle": ("gr_engine_active", "gpu_util_percent"),
    "throttled": ("throttled_share", "gpu_temp_celsius", "power_limit_share",
                  "watts_per_utilized_gpu"),
    "comm_bound": ("sm_active", "tensor_active", "dram_active", "nvlink_share", "pcie_share"),
    "input_bound": ("gr_engine_active", "stalled_share", "sm_fill"),
    "small_batch": ("gr_engine_active", "gpu_util_percent", "sm_fill", "warps_per_active_sm"),
    "memory_bound": ("tensor_active", "dram_active"),
    "healthy": ("sm_active", "tensor_active", "dram_active"),
    "insufficient_signal": ("gr_engine_active", "tensor_active", "dram_active",
                            "gpu_util_percent"),
}
"""The evidence each class rests on: what a reader is shown beside it (the whole evidence
goes to the machine-readable outputs)."""


def decide(s: Signals, accelerator: str | None, *, mig: bool = False) -> Diagnosis:
    """The rules of the module docstring, first match wins. ``mig``: the pod runs on MIG
    instances, which have no NVLink to wait on."""
    model = GPU_MODELS.get(accelerator or "")
    gr, sm, occ, tensor, dram = s.gr, s.sm, s.occupancy, s.tensor, s.dram

    def found(bottleneck: str) -> Diagnosis:
        return Diagnosis(bottleneck, s, model)

    if gr is None:
        util = s.gpu_util_percent
        return found("idle" if util is not None and util < IDLE_GPU_UTIL
                     else "insufficient_signal")
    if gr < IDLE_GR:
        return found("idle")
    if s.throttled_share >= THROTTLED_SHARE if s.throttled_share is not None else \
            s.temp_celsius is not None and s.temp_celsius >= THROTTLED_TEMP_C:
        return found("throttled")
    # quiet SMs: True, False or None (not measured)
    quiet = sm < COMM_SM_MAX if sm is not None else None if tensor is None or dram is None \
        else tensor < TENSOR_BUSY and dram < DRAM_BUSY
    if quiet is not False:
        nvlink = None
        link = 0.0
        if model is not None:
            if model.has_nvlink and (nvlink := _nvlink_share(s, model)) is not None:
                link = nvlink
            if (pcie := _pcie_share(s, model)) is not None:
                link = max(link, pcie)
        if link >= COMM_LINK_SHARE:
            return found("comm_bound" if quiet else "insufficient_signal")
        if gr >= COMM_GR_MIN and not mig and nvlink is None and model is not None and \
                model.has_nvlink:
            return found("insufficient_signal")
    if s.stalled_share >= STALL_SHARE and s.max_gr >= RUNNING_GR:
        return found("input_bound")
    busy = (tensor is not None and tensor >= TENSOR_BUSY) or \
        (dram is not None and dram >= DRAM_BUSY)
    if not busy and occ is not None and sm and occ / sm < WARPS_MIN:
        return found("small_batch")
    if gr < BUSY_GR:
        if sm is None:
            return found("insufficient_signal")
        return found("input_bound" if sm / gr >= FILL_MIN else "small_batch")
    if not busy:
        if sm is None:
            return found("insufficient_signal")
        if sm / gr < FILL_MIN:
            return found("small_batch")
    if dram is not None and tensor is not None and dram >= MEMORY_DRAM_MIN and \
            tensor < MEMORY_TENSOR_MAX:
        return found("memory_bound")
    return found("healthy")
