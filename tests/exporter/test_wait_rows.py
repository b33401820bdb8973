"""The warehouse's rows of waits and free GPUs: summed per interval, split at its end."""

from __future__ import annotations

import math

import pytest

from exporter.model.pending import FreeRow, PendingRow, PoolFree, Said, Verdict, Waiting
from exporter.sinks.warehouse.waits import WaitRows, _pieces


@pytest.mark.parametrize(("start", "seconds", "pieces"), [
    (0.0, 30.0, [(0.0, 30.0)]),
    (30.0, 60.0, [(0.0, 30.0), (60.0, 30.0)]),
    (60.0, 60.0, [(60.0, 60.0)]),
    (50.0, 140.0, [(0.0, 10.0), (60.0, 60.0), (120.0, 60.0), (180.0, 10.0)]),
    (10.0, 0.0, []),
])
def test_a_stretch_of_time_is_split_at_interval_ends(start: float, seconds: float,
                                                     pieces: list[tuple[float, float]]) -> None:
    assert _pieces(start, seconds, 60.0) == pieces


def waiting(cause: str = "fragmented") -> Waiting:
    return Waiting("pod", "uid-1", "ml", "train-0", "train", "research", "nvidia-tesla-a100",
                   4, 4, 120.0, Verdict(cause, "a100", Said("0/3 nodes are available",  # type: ignore[arg-type]
                                                          "default-scheduler")))


def test_waits_are_summed_per_interval_and_cause_and_written_once_it_ended() -> None:
    rows = WaitRows("c", 60.0)
    rows.add([PendingRow(0.0, 30.0, waiting()), PendingRow(30.0, 45.0, waiting()),
              PendingRow(75.0, 30.0, waiting("scaling_up"))], [])
    pending, _ = rows.ready(60.0)
    assert [(r["cause"], r["seconds"], r["gpu_seconds"]) for r in pending] == [
        ("fragmented", 60.0, 240.0)]
    assert pending[0]["evidence"] == "0/3 nodes are available"
    assert pending[0]["evidence_source"] == "default-scheduler"
    rows.drop(60.0)
    pending, _ = rows.ready(math.inf)
    assert sorted((r["cause"], r["seconds"]) for r in pending) == [
        ("fragmented", 15.0), ("scaling_up", 30.0)]
    assert len({r["id"] for r in pending}) == 2


def test_free_gpus_are_summed_per_pool_and_use_with_their_cost_and_fragmentation() -> None:
    pf = PoolFree("a100", "nvidia-tesla-a100", "on-demand", "us-central1-b",
                  {"fragment": 3.0}, {"fragment": 9.0}, units=3, largest=2)
    rows = WaitRows("c", 60.0)
    rows.add([], [FreeRow(0.0, 60.0, pf, "fragment")])
    _, free = rows.ready(60.0)
    assert len(free) == 1
    row = free[0]
    assert row["gpu_seconds"] == 180.0
    assert row["cost_usd"] == pytest.approx(9.0 / 60)
    assert row["fragmentation_ratio"] == 1.0, "every free GPU a fragment of the waiting pod"
    assert row["largest_free_gpus"] == 2
    idle = PoolFree("a100", "nvidia-tesla-a100", "on-demand", "us-central1-b",
                    {"no_demand": 3.0}, {"no_demand": 9.0}, units=3, largest=2)
    rows = WaitRows("c", 60.0)
    rows.add([], [FreeRow(0.0, 60.0, idle, "no_demand")])
    (row,) = rows.ready(60.0)[1]
    assert row["fragmentation_ratio"] is None, "nothing waited for it: no figure"
