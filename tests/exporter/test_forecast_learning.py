"""What the queue forecast learns over cycles (``exporter.runtime.forecasts``): run times
by family, each pool's maximum and scale-up delay, and the forecast made from a snapshot."""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.config import QueueForecast
from exporter.model.records import PodEvent, PodInfo
from exporter.runtime.forecast_history import Pools, RunTimes, family
from exporter.runtime.forecasts import Forecasts
from exporter.runtime.waits import Waits
from tests.exporter.test_pending_causes import A100, bound, node
from tests.exporter.test_waits import T0, observe, pending, snapshot

H = 3600.0
REAL_TRIGGER = ("pod triggered scale-up: [{https://www.googleapis.com/compute/v1/projects/"
                "qwiklabs-asl-02-cd54d6e804de/zones/us-central1-a/instanceGroups/"
                "gke-ml-gke-gpupool-18472bb2-grp 0->1 (max: 3)}]")
"""A GKE event's words (``tests/fixtures/scheduling/events_real.yaml``)."""


@pytest.mark.parametrize(("labels", "controller", "expected"), [
    ({}, "train-llama-x7k2p", "train-llama"),  # generateName's suffix
    ({}, "nightly-eval-28512340", "nightly-eval"),  # a CronJob's scheduled time
    ({}, "train-llama", "train-llama"),  # a name of its own stays
    ({"app.kubernetes.io/name": "bert"}, "bert-x7k2p", "bert"),
    ({"app": "vllm"}, "vllm-6d4f9b7c8d", "vllm"),
])
def test_a_pods_family(labels: dict[str, str], controller: str, expected: str) -> None:
    assert family("ml", labels, controller) == expected


def ended(uid: str, ran: float, name: str = "train", **kw: object) -> PodInfo:
    pod = replace(bound(uid, "a", 4, "Succeeded"), workload=name, scheduled_unix=T0,
                  finished_unix=T0 + ran)
    return replace(pod, **kw)  # type: ignore[arg-type]


def test_remaining_time_is_the_median_left_of_longer_runs_at_the_closest_level() -> None:
    runs = RunTimes()
    for i, h in enumerate([1, 2, 3, 4, 10]):
        runs.learn(ended(f"p{i}", h * H))
    runs.learn(ended("p0", 99 * H))  # seen once
    runs.learn(ended("gone", 50 * H, disrupted=True))  # taken away: no run
    runs.learn(ended("spot", 50 * H, phase="Failed", reason="Terminated"))
    assert runs.run("ml", "train") == 3 * H
    assert runs.remaining("ml", "train", 2.5 * H) == pytest.approx(1.5 * H)  # 3, 4, 10 left
    # no family of its name: the namespace's runs answer
    assert runs.remaining("ml", "other", 0.5 * H) == pytest.approx(2.5 * H)
    # longer than every run known: as long again as it has run
    assert runs.remaining("ml", "train", 20 * H) == 20 * H
    assert runs.run("elsewhere", "x") == 3 * H  # the cluster's
    assert RunTimes().run("ml", "train") is None


def test_a_pools_maximum_and_scale_up_delay_come_from_the_autoscaler_and_the_nodes() -> None:
    pools = Pools()
    said = PodEvent("ml", "p", "p", "TriggeredScaleUp", REAL_TRIGGER, "cluster-autoscaler",
                    T0, T0)
    snap = snapshot(T0 + 60, [pending("p")], events={"p": {"TriggeredScaleUp": said}})
    one = {"a": replace(node("a", A100), pool="gpupool")}
    pools.learn(replace(snap, nodes=one), {"gpupool", "other"})
    assert pools.max_nodes == {"gpupool": 3}
    assert pools.delay("gpupool", 600.0) == 600.0  # none seen yet: the default
    two = one | {"b": replace(node("b", A100), pool="gpupool")}
    pools.learn(replace(snap, now=T0 + 420, nodes=two, events={}), {"gpupool"})
    assert pools.delay("gpupool", 600.0) == 420.0


def test_the_forecast_of_a_snapshot_waits_for_the_running_pods_like_it() -> None:
    """Two full nodes of 8, each with a pod of a family that ran 3 h before; a pod waits:
    it is expected when the first of them ends, 3 h after they started."""
    waits, forecasts = Waits(), Forecasts(QueueForecast(interval=0))
    history = tuple(ended(f"old{i}", 3 * H, name="train-x7k2p") for i in range(3))
    running = [replace(bound(f"r{i}", n, 8), workload="train-b2c4d",
                       scheduled_unix=T0 - H * (i + 1)) for i, n in enumerate("ab")]
    snap = snapshot(T0, [*running, pending("p", 8)], ended=history)
    observe(waits, snap)
    got = forecasts.observe(snap, waits.figures, waits.shapes, lambda p: None, lambda w: "")
    assert got.made_unix == T0
    start = got.starts["p"]
    assert (start.start, start.basis) == (T0 + H, "forecast")  # r1 started 2 h ago
    assert got.counts()["forecast"] == 1
    # not due again within the interval
    later = Forecasts(QueueForecast(interval=600))
    first = later.observe(snap, waits.figures, waits.shapes, lambda p: None, lambda w: "")
    again = later.observe(replace(snap, now=T0 + 60), waits.figures, waits.shapes,
                          lambda p: None, lambda w: "")
    assert again is first


def test_a_pool_from_zero_and_in_two_zones() -> None:
    """A pool with no node yet learns its delay from its first; its maximum is its zones'
    groups' together (GKE has an instance group per zone)."""
    pools = Pools()
    zones = [f"pod triggered scale-up: [{{https://www.googleapis.com/compute/v1/projects/p/"
             f"zones/{z}/instanceGroups/gke-ml-gpupool-{h}-grp 0->1 (max: 2)}}]"
             for z, h in (("us-central1-a", "1a2b3c4d"), ("us-central1-b", "5e6f7a8b"))]
    events = {f"p{i}": {"TriggeredScaleUp": PodEvent("ml", f"p{i}", f"p{i}",
                                                     "TriggeredScaleUp", words,
                                                     "cluster-autoscaler", T0, T0)}
              for i, words in enumerate(zones)}
    snap = replace(snapshot(T0 + 30, [], events=events), nodes={})
    pools.learn(snap, {"gpupool"})
    assert pools.max_nodes == {"gpupool": 4}
    first = {"a": replace(node("a", A100), pool="gpupool")}
    pools.learn(replace(snap, now=T0 + 300, nodes=first), {"gpupool"})
    assert pools.delay("gpupool", 600.0) == 300.0
