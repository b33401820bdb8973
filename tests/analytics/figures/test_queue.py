"""Queue waits, pending GPU-hours and the longest waits (``analytics.figures.queue``)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from analytics.figures.queue import longest_waits, longest_waits_of, queue
from analytics.week import Week
from tests.analytics.figures.frames import WEEK, T, pod_state, states


def test_queue_percentiles_and_pending_gpu_hours() -> None:
    s = states(*[pod_state(f"p{i}", "2026-11-17 00:00", f"2026-11-17 00:{i:02d}")
                 for i in range(11)],                       # waits 0..10 minutes
               pod_state("old", "2026-11-10", "2026-11-10 01:00"),  # scheduled last week
               pod_state("stuck", "2026-11-22 22:00", None, gpus=2))  # pending at the end
    (row,) = queue(s, WEEK).itertuples()
    # the waits begun in the week: 0..10 minutes, and 2 h of the one still waiting (a lower
    # bound); the pod submitted the week before is not of them
    assert row.pods == 12
    assert row.p50_seconds == 330 and row.p90_seconds == pytest.approx(594)
    assert row.p99_seconds == pytest.approx(600 + 0.89 * (7200 - 600))
    # 0+1+...+10 minutes of 1 GPU, plus 2 h x 2 GPUs still pending
    assert row.pending_gpu_hours == pytest.approx(55 / 60 + 4)
    longest = longest_waits(s, WEEK)
    assert list(longest.pod[:2]) == ["stuck", "p10"]
    assert list(longest.state[:2]) == ["still pending", "scheduled"]


WAITS = [
    # (case, the pod's last state, its pending GPU-hours in the week, its longest-waits state)
    ("pending at the week's end", pod_state("p", "2026-11-22 22:00", None, gpus=2),
     4.0, "still pending"),
    ("deleted while pending", pod_state("p", "2026-11-22 20:00", None, gpus=2,
                                        phase="Deleted", finished=T("2026-11-22 21:00")),
     2.0, None),
    ("scheduled after waiting", pod_state("p", "2026-11-22 20:00", "2026-11-22 21:30",
                                          gpus=2),
     3.0, "scheduled"),
]


@pytest.mark.parametrize(("case", "pod", "pending_gpu_hours", "longest"), WAITS,
                         ids=[c[0] for c in WAITS])
def test_a_wait_ends_when_scheduled_or_deleted(case: str, pod: tuple[Any, ...],
                                               pending_gpu_hours: float,
                                               longest: str | None) -> None:
    s = states(pod)
    (row,) = queue(s, WEEK).itertuples()
    assert row.pending_gpu_hours == pytest.approx(pending_gpu_hours)
    assert list(longest_waits(s, WEEK).state) == ([longest] if longest else [])


def awaiting(job: str, queued: str, gpus: int, finished: str | None = None,
             team: str = "t") -> pd.DataFrame:
    """A Kueue Workload not admitted by the week's end, as ``AWAITING_ADMISSION`` reads it."""
    return pd.DataFrame([{
        "cluster": "c", "workload_uid": f"wl-{job}", "namespace": "ns",
        "workload": f"job-{job}-1a2b3", "owner_name": job, "team": team,
        "gpu_model": "nvidia-l4", "gpus": gpus, "queued": T(queued, tz="UTC"),
        "finished": T(finished, tz="UTC") if finished else None, "cluster_queue": "cq"}])


AWAITING = [
    # (case, the Workload, its pending GPU-hours in the week, its longest-waits state)
    ("awaiting admission at the week's end", awaiting("train", "2026-11-22 20:00", 8),
     32.0, "awaiting admission"),
    ("deleted before admission", awaiting("train", "2026-11-22 20:00", 8,
                                          finished="2026-11-22 21:00"),
     8.0, None),
    ("submitted before the week", awaiting("train", "2026-11-09 00:00", 1),
     168.0, "awaiting admission"),
]


@pytest.mark.parametrize(("case", "workload", "pending_gpu_hours", "longest"), AWAITING,
                         ids=[c[0] for c in AWAITING])
def test_a_job_awaiting_admission_waits_with_all_its_gpus(
        case: str, workload: pd.DataFrame, pending_gpu_hours: float,
        longest: str | None) -> None:
    """A Job Kueue has not admitted has no pod: its wait counts from its submission (or
    last requeue), with every GPU it asks for, beside the pods' of its team and model."""
    pods = states(pod_state("p", "2026-11-22 22:00", None, gpus=2))  # 2 h x 2 GPUs
    (row,) = queue(pods, WEEK, workload).itertuples()
    assert row.pending_gpu_hours == pytest.approx(4.0 + pending_gpu_hours)
    # the percentiles are of the waits begun in the week: the pod's, and the Job's if it
    # was submitted in it (one wait, however many pods it will have)
    assert row.pods == 1 + (workload.queued[0] >= WEEK.start)
    (alone,) = queue(states(), WEEK, workload).itertuples()
    assert alone.pending_gpu_hours == pytest.approx(pending_gpu_hours)
    top = longest_waits_of([pods], WEEK, awaiting=workload)
    if longest is None:
        assert list(top.pod) == ["p"]
    else:
        assert list(top.pod) == ["train", "p"]
        assert top.state[0] == longest and top.gpus[0] == workload.gpus[0]
        assert top.wait_seconds[0] == (WEEK.end - workload.queued[0]).total_seconds()


def test_no_pod_states_no_queue_and_no_waits() -> None:
    empty = pd.DataFrame()
    week = Week(WEEK.start, WEEK.end)
    assert queue(empty, week).empty and longest_waits(empty, week).empty
