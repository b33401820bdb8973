"""Right-sizing and spot candidates (``analytics.figures.rightsizing``)."""

from __future__ import annotations

import pandas as pd
import pytest

from analytics.figures.rightsizing import rightsizing_table, spot_table
from tests.analytics.figures.frames import pods, states, workspace

PRICES = {("nvidia-h100-80gb", "on-demand"): 11.0, ("nvidia-tesla-a100", "on-demand"): 2.9,
          ("nvidia-l4", "on-demand"): 0.7, ("nvidia-tesla-t4", "on-demand"): 0.35,
          ("nvidia-h100-80gb", "spot"): 2.2, ("nvidia-l4", "spot"): 0.28}


def rightsizing(p: pd.DataFrame) -> pd.DataFrame:
    """The right-sizing table of the pods, at ``PRICES``."""
    return rightsizing_table(workspace(PRICES, pods=p)).frame()


@pytest.mark.parametrize(("model", "peak_gib", "util", "nvlink", "fit"), [
    ("nvidia-h100-80gb", 8, 0.25, False, "nvidia-tesla-a100"),   # L4: 0.25x989 > 0.8x121
    ("nvidia-h100-80gb", 8, 0.05, False, "nvidia-tesla-t4"),     # 49 TFLOPS fits a T4
    ("nvidia-h100-80gb", 70, 0.9, False, None),                  # needs the H100
    ("nvidia-h100-80gb", 8, 0.25, True, "nvidia-tesla-a100"),    # A100 has NVLink too
    ("nvidia-l4", 20, 0.1, False, None),                         # 20 GiB > 90 % of a T4
    ("nvidia-l4", 10, 0.1, False, "nvidia-tesla-t4"),
    ("nvidia-l4", None, 0.1, False, None),                       # memory unknown
])
def test_cheapest_fit(model: str, peak_gib: float | None, util: float, nvlink: bool,
                      fit: str | None) -> None:
    peak = None if peak_gib is None else peak_gib * 2**30
    p = pods(gpu_model=model, peak_memory_bytes=peak, utilization=util,
             nvlink_tx_bytes_per_second=0.1 * 450e9 if nvlink else 0.0)
    assert list(rightsizing(p).suggested_model) == ([fit] if fit else [])


def test_rightsizing_saving_is_the_price_ratio() -> None:
    t = rightsizing(pods(utilization=0.05))
    (row,) = t.itertuples()
    assert row.suggested_model == "nvidia-tesla-t4"
    assert row.weekly_saving_usd == pytest.approx(10.0 * (1 - 0.35 / 11.0))
    assert rightsizing(pods(mig=True, utilization=0.05)).empty


def test_spot_candidates_are_on_demand_batch_jobs() -> None:
    p = pods(rows=[{"pod_uid": "job", "workload": "train"},
                   {"pod_uid": "svc", "workload": "serve"},
                   {"pod_uid": "already", "workload": "cheap", "provisioning": "spot"}])
    s = states(("c", "job", "ns", "job", "t", "train", "Job", "", 1, None, None, None, None,
                "", None, ""),
               ("c", "svc", "ns", "svc", "t", "serve", "ReplicaSet", "", 1, None, None, None,
                None, "", None, ""),
               ("c", "already", "ns", "a", "t", "cheap", "Job", "", 1, None, None, None,
                None, "", None, ""))
    t = spot_table(workspace(PRICES, pods=p, pod_states=s)).frame()
    assert list(t.workload) == ["train"]
    assert t.weekly_saving_usd.iloc[0] == pytest.approx(10.0 * (1 - 2.2 / 11.0))


def test_rightsizing_of_no_pods_is_empty() -> None:
    assert rightsizing(pods().iloc[0:0]).empty


def test_spot_candidates_of_a_team_without_batch_jobs() -> None:
    s = states(("c", "u1", "ns", "p1", "t", "w", "ReplicaSet", "", 1, None, None, None, None,
                "", None, ""))
    assert spot_table(workspace(PRICES, pods=pods(), pod_states=s)).empty
