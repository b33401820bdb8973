"""Events are recorded as Kubernetes records them: the same event again counts on one
object, the scheduler's in a series, and all of them go an hour after their last write."""

from __future__ import annotations

from typing import Any

import pytest

from simulator.events import (
    EVENT_TTL,
    EventLog,
    Involved,
    field_selector,
    go_duration,
    pulled,
)
from simulator.store import ApiStore

POD = Involved("Pod", "team-a", "train-abcde", "uid-1")
T0 = 1_795_000_000.0


def log() -> EventLog:
    return EventLog(ApiStore(), seed=1, scheduler_instance="default-scheduler-test")


def only(events: EventLog) -> dict[str, Any]:
    (obj,) = events.objects()
    return obj


def test_the_same_event_again_counts_on_one_object() -> None:
    events = log()
    for i in range(3):
        events.record(POD, "NotTriggerScaleUp", "pod didn't trigger scale-up: 1 max node "
                      "group size reached", component="cluster-autoscaler", now=T0 + 60 * i)
    obj = only(events)
    assert (obj["count"], obj["firstTimestamp"], obj["lastTimestamp"]) == (
        3, "2026-11-18T11:06:40Z", "2026-11-18T11:08:40Z")
    assert obj["source"] == {"component": "cluster-autoscaler"}
    assert obj["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "team-a",
                                     "name": "train-abcde", "uid": "uid-1"}
    assert str(obj["metadata"]["name"]).startswith("train-abcde.")


def test_another_message_is_another_event() -> None:
    events = log()
    events.record(POD, "NotTriggerScaleUp", "a", component="cluster-autoscaler", now=T0)
    events.record(POD, "NotTriggerScaleUp", "b", component="cluster-autoscaler", now=T0)
    assert sorted(e["message"] for e in events.objects()) == ["a", "b"]


@pytest.mark.parametrize(("seconds", "written"), [
    (0, None),         # the first: eventTime only
    (300, 2),          # the second makes a series, written at once
    (600, 2),          # later ones are counted, not written ...
    (1800 + 300, 8),   # ... until the broadcaster's heartbeat, 30 minutes after
], ids=["first", "second", "counted", "heartbeat"])
def test_the_schedulers_events_are_a_series(seconds: int, written: int | None) -> None:
    events = log()
    t = 0
    while t <= seconds:
        events.record(POD, "FailedScheduling", "0/1 nodes are available: ...",
                      component="default-scheduler", now=T0 + t, warning=True)
        events.tick(T0 + t)
        t += 300
    obj = only(events)
    assert obj["firstTimestamp"] is None and obj["lastTimestamp"] is None
    assert obj["eventTime"] == "2026-11-18T11:06:40.000000Z"
    assert obj["reportingComponent"] == "default-scheduler" and obj["type"] == "Warning"
    assert (obj.get("series") or {}).get("count") == written


def test_a_series_not_seen_for_six_minutes_ends_and_the_next_is_a_new_event() -> None:
    events = log()
    for t in (0, 300, 600):
        events.record(POD, "FailedScheduling", "m", component="default-scheduler", now=T0 + t)
    events.tick(T0 + 600 + 400)  # finished: its last count is written
    (obj,) = events.objects()
    assert obj["series"]["count"] == 3
    events.record(POD, "FailedScheduling", "m", component="default-scheduler", now=T0 + 1200)
    assert len(events.objects()) == 2


def test_events_go_an_hour_after_their_last_write() -> None:
    events = log()
    events.record(POD, "Scheduled", "assigned", component="default-scheduler", now=T0)
    events.record(POD, "NotTriggerScaleUp", "m", component="cluster-autoscaler", now=T0)
    events.record(POD, "NotTriggerScaleUp", "m", component="cluster-autoscaler", now=T0 + 1800)
    events.tick(T0 + EVENT_TTL - 30)
    assert len(events.objects()) == 2
    events.tick(T0 + EVENT_TTL)
    assert [e["reason"] for e in events.objects()] == ["NotTriggerScaleUp"]
    events.tick(T0 + 1800 + EVENT_TTL)
    assert events.objects() == []


@pytest.mark.parametrize(("selector", "kept"), [
    ("involvedObject.kind=Pod", ["Scheduled", "Pulling"]),
    ("involvedObject.kind=Pod,reason!=Pulling", ["Scheduled"]),
    ("source=kubelet,involvedObject.kind=Pod", ["Pulling"]),
    ("involvedObject.fieldPath=spec.containers{main}", ["Pulling"]),
    ("involvedObject.kind==Node", ["Rebooted"]),
])
def test_field_selectors_over_events(selector: str, kept: list[str]) -> None:
    events = log()
    events.record(POD, "Scheduled", "s", component="default-scheduler", now=T0)
    events.record(Involved("Pod", "team-a", "train-abcde", "uid-1", "spec.containers{main}"),
                  "Pulling", "p", component="kubelet", now=T0, host="node-1")
    events.record(Involved("Node", "", "node-1", "uid-n"), "Rebooted", "r",
                  component="kubelet", now=T0, host="node-1")
    match = field_selector(selector)
    assert sorted(e["reason"] for e in events.objects() if match(e)) == sorted(kept)


@pytest.mark.parametrize(("seconds", "text"), [
    (45, "45s"), (120, "2m0s"), (90.5, "1m30.5s"), (3725, "1h2m5s"), (0.25, "0.25s")])
def test_durations_print_as_go_prints_them(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


def test_the_kubelets_pulled_message() -> None:
    assert pulled("ml/x:latest", 480, 123) == ('Successfully pulled image "ml/x:latest" in '
                                               '8m0s (8m0s including waiting). Image size: '
                                               '123 bytes.')
