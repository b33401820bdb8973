"""Each pod's bottleneck class and the per-workload table (``analytics.figures.bottlenecks``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from analytics.figures.bottlenecks import bottleneck_table, classify_arrow, with_evidence
from analytics.workspace import Table
from exporter.model.bottleneck import Signals, decide
from tests.analytics.figures.frames import pods, workspace


def nvlink(tx: float, rx: float) -> dict[str, float]:
    """NVLink bytes per second sent and received, as ``Signals`` takes them."""
    return {"nvlink_tx_bytes_per_second": tx, "nvlink_rx_bytes_per_second": rx}


def pcie(tx: float, rx: float) -> dict[str, float]:
    """PCIe bytes per second sent and received, as ``Signals`` takes them."""
    return {"pcie_tx_bytes_per_second": tx, "pcie_rx_bytes_per_second": rx}


@pytest.mark.parametrize(("signals", "model", "cls"), [
    (Signals(gr=None, gpu_util_percent=40.0), "nvidia-l4", "insufficient_signal"),
    (Signals(gr=None, gpu_util_percent=4.0), "nvidia-l4", "idle"),
    (Signals(gr=0.049), "nvidia-l4", "idle"),
    (Signals(gr=0.8, throttled_share=0.5), "nvidia-l4", "throttled"),
    (Signals(gr=0.8, temp_celsius=85.0), "nvidia-l4", "throttled"),
    # DCGM says how much it throttled: a hot GPU below half is not throttled
    (Signals(gr=0.8, temp_celsius=90.0, throttled_share=0.0), "nvidia-l4",
     "insufficient_signal"),
    (Signals(gr=0.8, sm=0.7, temp_celsius=90.0, throttled_share=0.49), "nvidia-l4",
     "healthy"),
    # a link 30 % busy while the SMs are quiet; PCIe by its quieter direction
    (Signals(gr=0.5, sm=0.3, **nvlink(135e9, 10e9)), "nvidia-h100-80gb", "comm_bound"),
    (Signals(gr=0.5, sm=0.45, **nvlink(135e9, 10e9)), "nvidia-h100-80gb", "input_bound"),
    (Signals(gr=0.8, sm=0.3, **pcie(9.6e9, 9.6e9)), "nvidia-l4", "comm_bound"),
    (Signals(gr=0.8, sm=0.3, **pcie(1e9, 30e9)), "nvidia-l4", "small_batch"),
    (Signals(gr=0.8, tensor=0.1, dram=0.2, **pcie(9.6e9, 9.6e9)), "nvidia-l4", "comm_bound"),
    (Signals(gr=0.8, **pcie(9.6e9, 9.6e9)), "nvidia-l4", "insufficient_signal"),
    # an NVLink GPU without NVLink bytes: busy engine, quiet pipes
    (Signals(gr=0.8, tensor=0.1, dram=0.2), "nvidia-h100-80gb", "insufficient_signal"),
    (Signals(gr=0.8, tensor=0.5, dram=0.2), "nvidia-h100-80gb", "healthy"),
    (Signals(gr=0.5, stalled_share=0.15, max_gr=0.6), "nvidia-l4", "input_bound"),
    # the engine busy under 60 % of the time: waiting for input, or small kernels
    (Signals(gr=0.59, sm=0.3), "nvidia-l4", "input_bound"),
    (Signals(gr=0.59, sm=0.29), "nvidia-l4", "small_batch"),
    (Signals(gr=0.59, tensor=0.3, dram=0.3), "nvidia-l4", "insufficient_signal"),
    # few warps per active SM while tensor and DRAM are quiet
    (Signals(gr=0.9, sm=0.6, occupancy=0.11, tensor=0.1, dram=0.2), "nvidia-l4",
     "small_batch"),
    (Signals(gr=0.9, sm=0.6, occupancy=0.11, tensor=0.2, dram=0.2), "nvidia-l4", "healthy"),
    (Signals(gr=0.9, sm=0.44), "nvidia-l4", "small_batch"),
    (Signals(gr=0.9, sm=0.45), "nvidia-l4", "healthy"),
    (Signals(gr=0.9, tensor=0.1, dram=0.2), "nvidia-l4", "insufficient_signal"),
    (Signals(gr=0.8, sm=0.7, tensor=0.1, dram=0.7), "nvidia-l4", "memory_bound"),
    (Signals(gr=0.8, tensor=0.1, dram=0.7), "nvidia-h100-80gb", "memory_bound"),
    (Signals(gr=0.9, sm=0.8, tensor=0.6, dram=0.4, gpu_util_percent=99.0), "nvidia-l4",
     "healthy"),
])
def test_bottleneck_rules(signals: Signals, model: str, cls: str) -> None:
    assert decide(signals, model).bottleneck == cls


def test_a_workload_takes_the_class_of_most_of_its_gpu_hours() -> None:
    ws = workspace(pods=pods(rows=[
        {"pod_uid": "a", "gpu_seconds": 7200.0, "gr_engine_active": 0.01},
        {"pod_uid": "b", "gpu_seconds": 3600.0, "gr_engine_active": 0.9, "sm_active": 0.8,
         "tensor_active": 0.6, "dram_active": 0.3, "max_gr": 0.9}]))
    assert list(Table(ws, "pods").bottleneck) == ["idle", "healthy"]
    (row,) = bottleneck_table(ws).frame().itertuples()
    assert (row.bottleneck, row.pods, row.gpu_hours) == ("idle", 2, 3.0)
    assert row.evidence["gr_engine_active"] == pytest.approx(0.01)
    assert "release" in row.advice


def _opt(v: object) -> float | None:
    return None if v is None or (isinstance(v, float) and np.isnan(v)) else float(v)  # type: ignore[arg-type]


def pod_signals(row: Any) -> Signals:
    """A pod's week, as the warehouse aggregates it, as the classifier's signals."""
    def g(name: str) -> float | None:
        return _opt(getattr(row, name))

    return Signals(gr=g("gr_engine_active"), sm=g("sm_active"), occupancy=g("sm_occupancy"),
                   tensor=g("tensor_active"), dram=g("dram_active"),
                   gpu_util_percent=g("gpu_util_percent"), temp_celsius=g("temperature_celsius"),
                   nvlink_tx_bytes_per_second=g("nvlink_tx_bytes_per_second"),
                   nvlink_rx_bytes_per_second=g("nvlink_rx_bytes_per_second"),
                   pcie_tx_bytes_per_second=g("pcie_tx_bytes_per_second"),
                   pcie_rx_bytes_per_second=g("pcie_rx_bytes_per_second"),
                   stalled_share=g("stalled_share") or 0.0, max_gr=g("max_gr") or 0.0,
                   throttled_share=g("throttled_share"))


def test_the_pods_are_classified_by_the_exporters_rules() -> None:
    """The report classifies every pod at once; each pod gets what ``decide`` gives it."""
    rng = np.random.default_rng(7)
    n = 4000

    def maybe(values: np.ndarray, missing: float = 0.2) -> np.ndarray:
        return np.where(rng.random(n) < missing, np.nan, values)

    edges = np.array([0.0, 0.05, 0.15, 0.2, 0.3, 0.35, 0.45, 0.5, 0.6, 0.7, 1.0])
    p = pods(rows=[{} for _ in range(n)]).assign(
        gpu_model=rng.choice(["nvidia-h100-80gb", "nvidia-l4", "nvidia-tesla-a100",
                              "nvidia-tesla-t4", "other"], n),
        mig=rng.random(n) < 0.2,
        gr_engine_active=maybe(rng.choice(np.r_[edges, rng.random(20)], n)),
        sm_active=maybe(rng.choice(np.r_[edges, rng.random(20)], n)),
        sm_occupancy=maybe(rng.choice(np.r_[edges, rng.random(20)] / 3, n)),
        tensor_active=maybe(rng.choice(np.r_[edges, rng.random(20)], n)),
        dram_active=maybe(rng.choice(np.r_[edges, rng.random(20)], n)),
        gpu_util_percent=maybe(rng.choice([0.0, 50.0, 80.0, 99.0], n)),
        temperature_celsius=maybe(rng.choice([40.0, 85.0, 90.0], n)),
        nvlink_tx_bytes_per_second=maybe(rng.choice([0.0, 100e9, 135e9, 200e9], n)),
        nvlink_rx_bytes_per_second=maybe(rng.choice([0.0, 90e9, 135e9], n)),
        pcie_tx_bytes_per_second=maybe(rng.choice([0.0, 5e9, 9.6e9, 20e9], n)),
        pcie_rx_bytes_per_second=maybe(rng.choice([0.0, 9.6e9, 30e9], n)),
        stalled_share=maybe(rng.choice([0.0, 0.15, 0.3], n)),
        max_gr=maybe(rng.choice([0.0, 0.6, 0.9], n)),
        throttled_share=maybe(rng.choice([0.0, 0.5, 0.9], n)))
    got = with_evidence(classify_arrow(pa.Table.from_pandas(p, preserve_index=False))
                        .to_pandas())
    want = [decide(pod_signals(r), r.gpu_model, mig=r.mig) for r in p.itertuples()]
    assert list(got.bottleneck) == [d.bottleneck for d in want]
    for mine, theirs in zip(got.evidence, want, strict=True):
        assert list(mine) == list(theirs.evidence)
        assert mine == pytest.approx(theirs.evidence)
    assert len(set(got.bottleneck)) == 8
