"""What if, in parts: the trace file and the pods CSV, the layout file, the scenario a
trace and a layout make, and the fidelity bounds."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.week import Week
from analytics.whatif import compare, layout, measure, pods_csv, render, scenario, trace
from analytics.whatif.measure import Measured
from exporter.model.catalog import GPU_MODELS

START = datetime(2026, 11, 16, tzinfo=UTC)
WEEK = Week(START, START + timedelta(days=7))


def make_job(**overrides: Any) -> trace.Job:
    fields: dict[str, Any] = {
        "job": "train-1", "namespace": "ml", "team": "research", "kind": "job",
        "submitted": START + timedelta(hours=1), "pods": 1, "gpus_per_pod": 8,
        "gpu_model": "nvidia-h100-80gb", "spot": False, "sharing": False, "mig_profile": None,
        "queue": None, "priority_class": "training", "priority": 500, "run_seconds": 3600.0,
        "run_basis": "measured", "startup_seconds": 0.0, "profile": "healthy",
        "utilization": 0.9, "reclaims": 0, "restarts": 0, "schedulable": True,
        "node_pool": "h100", "deadline_seconds": None, "memory_gib": None}
    return trace.Job(**(fields | overrides))


def make_layout(**overrides: Any) -> layout.Layout:
    data: dict[str, Any] = {
        "cluster": "lab", "pools": [
            {"name": "h100", "accelerator": "nvidia-h100-80gb", "gpus_per_node": 8,
             "nodes": 2},
            {"name": "l4", "accelerator": "nvidia-l4", "gpus_per_node": 4, "nodes": 1,
             "sharing": {"max_shared_clients_per_gpu": 2}},
            {"name": "t4-spot", "accelerator": "nvidia-tesla-t4", "gpus_per_node": 4,
             "nodes": 2, "spot": True}]}
    return layout.parse(data | overrides)


# ----------------------------------------------------------------------------- trace file

names = st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True)
jobs = st.builds(
    make_job, job=names, namespace=names, team=names,
    kind=st.sampled_from(["job", "always_on"]),
    submitted=st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2030, 1, 1),
                           timezones=st.just(UTC)).map(lambda t: t.replace(microsecond=0)),
    pods=st.integers(1, 64), gpus_per_pod=st.integers(1, 16),
    gpu_model=st.sampled_from(sorted(GPU_MODELS)), spot=st.booleans(), sharing=st.booleans(),
    mig_profile=st.sampled_from([None, "1g.5gb", "3g.40gb"]),
    queue=st.one_of(st.none(), names), priority=st.integers(-1000, 10**9),
    run_seconds=st.integers(1, 10**7).map(float),
    run_basis=st.sampled_from(["measured", "lower_bound", "estimated"]),
    startup_seconds=st.integers(0, 3600).map(float),
    profile=st.sampled_from(trace.PROFILES),
    utilization=st.one_of(st.none(), st.integers(0, 1000).map(lambda u: u / 1000)),
    reclaims=st.integers(0, 9), restarts=st.integers(0, 9), schedulable=st.booleans(),
    node_pool=st.one_of(st.none(), names),
    deadline_seconds=st.one_of(st.none(), st.integers(1, 10**6).map(float)),
    memory_gib=st.one_of(st.none(), st.integers(0, 141_000).map(lambda m: m / 1000)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.lists(jobs, min_size=1, max_size=5))
def test_a_trace_reads_back_as_it_was_written(tmp_path: Path, written: list[trace.Job]) -> None:
    path = trace.write(written, tmp_path / "trace.csv")
    assert trace.read(path) == written


@pytest.mark.parametrize(("edit", "error"), [
    ({"pods": "0"}, r"trace.csv:2: pods '0': must be a whole number >= 1"),
    ({"gpus_per_pod": "two"}, "gpus_per_pod 'two': not a number"),
    ({"gpu_model": "nvidia-k80"}, "gpu_model 'nvidia-k80': not one of"),
    ({"kind": "cron"}, "kind 'cron': must be job or always_on"),
    ({"spot": "maybe"}, "spot 'maybe': must be true or false"),
    ({"submitted": "yesterday"}, "submitted: 'yesterday' is not an RFC 3339 time"),
    ({"profile": "sleepy"}, "profile 'sleepy': not one of"),
    ({"run_seconds": ""}, "run_seconds '': not a number"),
    ({"job": ""}, "job is empty"),
])
def test_a_bad_cell_of_a_trace_is_named_by_line_and_column(
        tmp_path: Path, edit: dict[str, str], error: str) -> None:
    path = trace.write([make_job()], tmp_path / "trace.csv")
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    for column, value in edit.items():
        frame[column] = value
    frame.to_csv(path, index=False)
    with pytest.raises(trace.TraceError, match=error):
        trace.read(path)


def test_a_trace_missing_columns_says_which(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("job,namespace\na,b\n")
    with pytest.raises(trace.TraceError, match="missing columns team, kind, submitted"):
        trace.read(path)


@pytest.mark.parametrize(("cls", "util", "profile"), [
    ("comm_bound", 0.3, "comm_bound"),          # the class, whatever the utilisation
    ("insufficient_signal", 0.0, "idle"),       # the nearest profile's
    ("insufficient_signal", 0.93, "healthy"),
    ("insufficient_signal", 0.56, "small_batch"),
    (None, None, "healthy"),
    (None, math.nan, "healthy"),
])
def test_the_profile_a_job_replays_with(cls: str | None, util: float | None,
                                        profile: str) -> None:
    assert trace.profile_of(cls, util) == profile


def test_each_profile_replays_at_its_own_utilisation() -> None:
    means = trace.profile_utilization()
    assert set(means) == set(trace.PROFILES)
    assert means["idle"] < 0.05 < means["small_batch"] < means["healthy"]
    assert all(trace.profile_of(None, u) in trace.PROFILES for u in means.values())


# ----------------------------------------------------------------------------- pods CSV

PODS = """created,scheduled,deleted,gpus,gpu_model,team,namespace,pod,job,utilization,spot
2026-11-16T01:00:00Z,2026-11-16T01:10:00Z,2026-11-16T03:10:00Z,8,nvidia-h100-80gb,research,ml,p0,big,0.93,false
2026-11-16T01:00:00Z,2026-11-16T01:10:00Z,2026-11-16T03:10:00Z,8,nvidia-h100-80gb,research,ml,p1,big,0.93,false
2026-11-16T02:00:00Z,2026-11-16T02:00:00Z,2026-11-16T02:30:00Z,0.5,nvidia-l4,web,,p2,,55,
1794794400,,,2,nvidia-tesla-t4,batch,,p3,,,true
"""


def test_a_pods_csv_becomes_jobs(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(PODS)
    assert pods_csv.is_pods_csv(path)
    by_name = {j.job: j for j in pods_csv.of_pods_csv(path)}
    big, shared, waiting = by_name["big"], by_name["p2"], by_name["p3"]
    assert (big.pods, big.gpus_per_pod, big.run_seconds, big.run_basis, big.team) == \
        (2, 8, 7200.0, "measured", "research")
    assert big.submitted == datetime(2026, 11, 16, 1, tzinfo=UTC)
    assert big.profile == "healthy"
    assert (shared.sharing, shared.gpus_per_pod, shared.namespace, shared.run_seconds) == \
        (True, 1, "web", 1800.0)
    assert shared.profile == "small_batch", "55 % is read as 0.55"
    assert waiting.spot and waiting.run_basis == "estimated"
    assert waiting.submitted == datetime(2026, 11, 16, 2, tzinfo=UTC), "Unix seconds"
    assert waiting.run_seconds == 3600.0, "no T4 job ran to take the median of: an hour"


@pytest.mark.parametrize(("row", "error"), [
    ("x,,,1,nvidia-l4,t", r"pods.csv:2: created: 'x' is not an RFC 3339 time"),
    ("2026-11-16T00:00:00Z,,,1.5,nvidia-l4,t", "gpus 1.5 must be a whole number"),
    ("2026-11-16T00:00:00Z,,,1,nvidia-k80,t", "gpu_model 'nvidia-k80' is not one of"),
    ("2026-11-16T00:00:00Z,,,1,nvidia-l4,", "team is empty"),
    ("2026-11-16T01:00:00Z,2026-11-16T00:00:00Z,,1,nvidia-l4,t", "scheduled is before created"),
    ("2026-11-16T01:00:00Z,,2026-11-16T00:00:00Z,1,nvidia-l4,t", "deleted is before created"),
])
def test_a_bad_pod_row_is_named_by_line(tmp_path: Path, row: str, error: str) -> None:
    path = tmp_path / "pods.csv"
    path.write_text("created,scheduled,deleted,gpus,gpu_model,team\n" + row + "\n")
    with pytest.raises(trace.TraceError, match=error):
        pods_csv.of_pods_csv(path)


def test_every_bad_row_of_a_pods_csv_is_told_at_once(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    good = "2026-11-16T00:00:00Z,,,1,nvidia-l4,t"
    path.write_text("created,scheduled,deleted,gpus,gpu_model,team\n" + "\n".join(
        [good, "99999999999999999999,,,1,nvidia-l4,t", good, "2026-11-16T00:00:00Z,,,x,"
         "nvidia-l4,t"] + ["y,,,1,nvidia-l4,t"] * (pods_csv.BAD_ROWS_TOLD + 3)) + "\n")
    with pytest.raises(trace.TraceError) as caught:
        pods_csv.of_pods_csv(path)
    lines = str(caught.value).splitlines()
    assert lines[0] == (f"{path}:3: created: '99999999999999999999' is out of range as Unix "
                        "seconds")
    assert lines[1] == f"{path}:5: gpus 'x' is not a number"
    assert len(lines) == pods_csv.BAD_ROWS_TOLD + 1
    assert lines[-1] == f"{path}: 5 more rows it cannot read"


def test_a_pods_csv_missing_a_required_column_says_which(tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text("created,gpus,team\n2026-11-16T00:00:00Z,1,t\n")
    with pytest.raises(trace.TraceError, match="missing columns gpu_model"):
        pods_csv.of_pods_csv(path)


# ----------------------------------------------------------------------------- layout file

@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (90, "1m30s"), (3600, "1h"), (101100, "1d4h5m"), (1.5, 1.5)])
def test_durations_are_written_as_people_write_them(seconds: float, text: str | float) -> None:
    assert layout.duration_text(seconds) == text


def test_a_layout_reads_back_as_it_was_written(tmp_path: Path) -> None:
    original = make_layout(
        placement="spread", priority_classes={"training": 500, "default": 0},
        incidents=[{"at": "1d4h", "kind": "xid", "node": "h100/1", "gpu": 3, "code": 79,
                    "duration": "3h"}],
        moves=[{"match": {"team": "research"}, "to": {"spot": True, "run_scale": 1.2}}],
        kueue={"cluster_queues": [{"name": "q", "flavors": [
            {"accelerator": "nvidia-h100-80gb", "nominal_gpus": 8}]}],
            "local_queues": [{"name": "lq", "namespace": "ml", "cluster_queue": "q"}]})
    path = layout.write(original, tmp_path / "layout.yaml", "A test layout.")
    text = path.read_text()
    assert text.startswith("# A cluster layout") and "# A test layout." in text
    assert "at: 1d4h" in text and "duration: 3h" in text
    assert layout.load(path) == original


@pytest.mark.parametrize(("data", "error"), [
    ({"pools": []}, "pools: List should have at least 1 item"),
    ({"placment": "spread"}, "placment: unknown field"),
    ({"placement": "random"}, "placement: 'random' is not allowed; allowed values: 'compact' or"),
    ({"pools": [{"name": "a", "accelerator": "nvidia-l4", "gpus_per_node": 3, "nodes": 1}]},
     r"pools\[0\]: gpus_per_node 3 is not offered for nvidia-l4"),
    ({"pools": [{"name": "a", "accelerator": "nvidia-l4", "gpus_per_node": 1, "nodes": 1}] * 2},
     "pools: a named twice"),
    ({"spot": {"per_node_day": -1}}, "spot.per_node_day: Input should be greater than"),
])
def test_a_bad_layout_is_named_by_field(data: dict[str, Any], error: str) -> None:
    base = {"pools": [{"name": "a", "accelerator": "nvidia-l4", "gpus_per_node": 1,
                       "nodes": 1}]}
    with pytest.raises(layout.LayoutError, match=error):
        layout.parse(base | data, "lab.yaml")


# ----------------------------------------------------------------------------- scenario

def test_each_job_is_submitted_at_its_offset_with_its_run() -> None:
    a = make_job(job="a", submitted=START + timedelta(minutes=10), run_seconds=5000)
    b = make_job(job="b", submitted=START - timedelta(hours=2), run_basis="lower_bound")
    built = scenario.build([a, b], make_layout(), START, START + timedelta(days=1), 300)
    by_name = {j.name: j for j in built.scenario.jobs}
    assert by_name["a"].at == 600 and by_name["a"].run == 5000
    assert by_name["b"].at == -7200
    assert by_name["b"].run == 3600 + 300, "a lower bound runs past the end"
    assert len(built.scenario.workloads) == 1, "one shape, one template"
    assert built.notes == []


def test_a_job_no_pool_offers_is_left_out_and_said_so() -> None:
    jobs = [make_job(job="x", gpu_model="nvidia-tesla-a100"), make_job(job="y", pods=2)]
    built = scenario.build(jobs, make_layout(), START, START + timedelta(days=1), 300)
    assert [j.name for j in built.scenario.jobs] == ["y"]
    assert built.notes == ["1 jobs (8 GPU-hours) left out: no pool of the layout offers "
                           "8 x nvidia-tesla-a100 on-demand"]


def test_moves_put_jobs_on_other_gpus() -> None:
    moves = [{"match": {"team": "research"}, "to": {"gpu_model": "nvidia-tesla-t4",
                                                    "spot": True, "run_scale": 2}}]
    jobs = [make_job(job="a", gpus_per_pod=4), make_job(job="b", team="web")]
    built = scenario.build(jobs, make_layout(moves=moves), START, START + timedelta(days=1),
                           300)
    workloads = {w.name: w for w in built.scenario.workloads}
    a = next(j for j in built.scenario.jobs if j.name == "a")
    assert workloads[a.workload].accelerator == "nvidia-tesla-t4"
    assert workloads[a.workload].spot and a.run == 7200
    assert built.notes[0] == "1 jobs moved by the layout's moves"


def test_a_job_nothing_could_schedule_waits_in_the_replay_too() -> None:
    built = scenario.build([make_job(schedulable=False)], make_layout(), START,
                           START + timedelta(days=1), 300)
    [w] = built.scenario.workloads
    assert w.node_selector == scenario.UNSCHEDULABLE


def test_always_on_controllers_are_replicas_from_the_start() -> None:
    web = make_job(job="web", kind="always_on", pods=3, gpus_per_pod=1,
                   gpu_model="nvidia-l4", sharing=True, submitted=START - timedelta(days=3))
    built = scenario.build([web], make_layout(), START, START + timedelta(days=1), 300)
    [w] = built.scenario.workloads
    assert (w.name, w.replicas, w.sharing) == ("web", 3, "time-sharing")
    assert built.scenario.jobs == [] and built.jobs == 1


def test_spot_reclaims_come_at_the_layout_rate_and_are_the_same_for_a_seed() -> None:
    """Two Spot nodes at 0.5 reclaims a node-day over 20 days: about 20 reclaims."""
    lay = make_layout(spot={"per_node_day": 0.5, "restart_cost": "10m"})
    end = START + timedelta(days=20)
    faults = scenario.build([], lay, START, end, 300, seed=4).scenario.faults
    assert 10 <= len(faults) <= 32
    assert all(f.kind == "spot_preemption" and f.restart_cost == 600 for f in faults)
    assert {f.node for f in faults} <= {"t4-spot/0", "t4-spot/1"}
    assert faults == scenario.build([], lay, START, end, 300, seed=4).scenario.faults
    assert faults != scenario.build([], lay, START, end, 300, seed=5).scenario.faults


def test_a_pool_whose_reclaims_are_listed_is_reclaimed_then_only() -> None:
    lay = make_layout(spot={"per_node_day": 5},
                      incidents=[{"at": "2h", "kind": "spot_preemption", "node": "t4-spot/1"},
                                 {"at": "3h", "kind": "xid", "node": "gone/0", "code": 79}])
    built = scenario.build([], lay, START, START + timedelta(days=1), 300)
    assert [(f.at, f.node) for f in built.scenario.faults] == [(7200, "t4-spot/1")]
    assert "1 incidents left out" in built.notes[0]


def test_a_queue_kueue_does_not_know_is_only_a_label() -> None:
    lay = make_layout(kueue={"cluster_queues": [{"name": "q", "flavors": [
        {"accelerator": "nvidia-h100-80gb", "nominal_gpus": 8}]}],
        "local_queues": [{"name": "lq", "namespace": "ml", "cluster_queue": "q"}]})
    jobs = [make_job(job="a", queue="lq"), make_job(job="b", queue="other")]
    built = scenario.build(jobs, lay, START, START + timedelta(days=1), 300)
    queues = {j.name: next(w.queue for w in built.scenario.workloads if w.name == j.workload)
              for j in built.scenario.jobs}
    assert queues == {"a": "lq", "b": None}


# ----------------------------------------------------------------------------- fidelity

def measured(cost: float, hours: float, waits: dict[str, list[float]]) -> Measured:
    w = pd.DataFrame([(t, s, 1.0) for t, ss in waits.items() for s in ss],
                     columns=["team", "wait_seconds", "gpus"])
    g = w.groupby("team").wait_seconds
    teams = pd.DataFrame({"team": list(waits), "wait_p50_seconds": g.quantile(0.5).values,
                          "wait_p90_seconds": g.quantile(0.9).values})
    return Measured(headline={"cost_usd": cost, "gpu_hours": hours,
                              "allocated_gpu_hours": hours / 2},
                    teams=teams, causes=pd.DataFrame(columns=["cause", "gpu_hours"]),
                    pools=pd.DataFrame(columns=["availability"]), reclaims=0, waits=w)


@pytest.mark.parametrize(("replay", "failed"), [
    (measured(1019, 1009, {"a": [0, 0, 1000], "b": [3600] * 3}), []),
    (measured(1021, 1000, {"a": [0, 0, 1000], "b": [3600] * 3}), ["cost ($)"]),
    (measured(1000, 1011, {"a": [0, 0, 1000], "b": [3600] * 3}),
     ["GPU-hours", "GPU-hours held by pods"]),
    (measured(1000, 1000, {"a": [0, 0, 1500], "b": [3600] * 3}), ["a wait p90 (s)"]),
    (measured(1000, 1000, {"a": [0, 0, 1000], "b": [3960] * 3}), []),  # 10 %
    (measured(1000, 1000, {"a": [0, 0, 1000], "b": [3961] * 3}),
     ["b wait p50 (s)", "b wait p90 (s)"]),
    (measured(1000, 1000, {"a": [0, 300, 1000], "b": [3600] * 3}), []),  # one interval
    (measured(1000, 1000, {"a": [0, 0, 1000]}), ["b wait p50 (s)", "b wait p90 (s)"]),
])
def test_the_fidelity_bounds(replay: Measured, failed: list[str]) -> None:
    actual = measured(1000, 1000, {"a": [0, 0, 1000], "b": [3600] * 3})
    f = compare.fidelity(actual, replay, step=300)
    assert list(f[~f.ok].check) == failed


def test_a_job_of_the_trace_keeps_every_field_through_a_move() -> None:
    job = make_job()
    assert scenario.moved(job, []) is job
    moved = scenario.moved(job, make_layout(moves=[{"match": {"namespace": "ml"},
                                                    "to": {"mig_profile": "1g.5gb"}}]).moves)
    assert dataclasses.replace(moved, mig_profile=None, gpus_per_pod=8) == job


@pytest.mark.parametrize(("memory_gib", "to", "moves"), [
    (4.0, {"mig_profile": "1g.5gb", "gpu_model": "nvidia-tesla-a100"}, True),   # 4.75 GiB
    (6.0, {"mig_profile": "1g.5gb", "gpu_model": "nvidia-tesla-a100"}, False),
    (None, {"mig_profile": "1g.5gb", "gpu_model": "nvidia-tesla-a100"}, True),  # unknown
    (11.0, {"sharing": True}, True),     # an L4's 22.5 GiB between two clients
    (12.0, {"sharing": True}, False),
])
def test_a_move_to_a_slice_or_a_shared_gpu_takes_only_jobs_it_fits(
        memory_gib: float | None, to: dict[str, Any], moves: bool) -> None:
    job = make_job(gpu_model="nvidia-l4", gpus_per_pod=1, memory_gib=memory_gib)
    lay = make_layout(moves=[{"match": {"team": "research"}, "to": to}])
    after = scenario.moved(job, lay.moves, clients=2)
    assert (after is not job) == moves
    built = scenario.build([job], lay, START, START + timedelta(days=1), 300)
    assert ("left where they were: their memory does not fit" in built.notes[0]) != moves


def test_a_change_in_dollars_is_a_change_in_cost_and_each_team_shows_its_own() -> None:
    """Waiting is never priced; a team's p90 that the fleet's hides is in the terminal."""
    pools = pd.DataFrame({"node_pool": ["p"], "gpu_hours": [1000.0], "cost_usd": [1000.0],
                          "availability": [1.0], "stranded_gpu_hours": [0.0],
                          "stranded_cost_usd": [0.0]})

    def side(cost: float, b: float) -> Measured:
        m = measured(cost, 1000, {"a": [0] * 40, "b": [0] * 8 + [b] * 2})
        return dataclasses.replace(m, pools=pools, teams=m.teams.assign(
            cost_usd=[cost / 2, cost / 2], gpu_hours=[500.0, 500.0]))

    week, faster = side(1000, 3600), side(1300, 600)
    c = compare.compare(week, week, faster, step=300)
    s = c.summary.set_index("figure")
    assert s.loc["Cost", "delta_usd"] == pytest.approx(300)
    assert s.loc["GPU-hours waited"].isna()["delta_usd"], "waiting is not priced"
    assert s.loc["Queue wait p90, pods submitted in the week", "delta"] == 0, \
        "the fleet's p90 hides b's"
    page = render.Page(title="t", lines=[], comparison=c, notes=[], proposed="proposed")
    text = render.terminal(page)
    assert "change ($)" not in text
    [b] = [line for line in text.splitlines() if line.startswith("b ")]
    assert b.split()[-3:] == ["60m", "10m", "\N{MINUS SIGN}50m"]


def test_teams_and_namespaces_that_are_not_dns_labels_replay_under_their_own_names() -> None:
    job = make_job(namespace="Data Science", team="Data Science!")
    built = scenario.build([job, make_job(job="train-2")], make_layout(), START,
                           START + timedelta(days=1), 300)
    [odd] = [n for n in built.scenario.namespaces if n.name != "ml"]
    assert built.names == {odd.name: "Data Science", odd.team: "Data Science!"}
    waits = pd.DataFrame({"team": [odd.team, "research"], "wait_seconds": [0.0, 0.0],
                          "gpus": [8.0, 8.0]})
    m = Measured({}, pd.DataFrame({"team": [odd.team, "research"]}), pd.DataFrame(),
                 pd.DataFrame(), 0, waits)
    told = measure.told_as(m, built.names)
    assert list(told.teams.team) == ["Data Science!", "research"]
    assert list(told.waits.team) == ["Data Science!", "research"]


def test_a_pods_csv_withdraws_pods_deleted_waiting_and_runs_on_those_still_running(
        tmp_path: Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text("created,scheduled,deleted,gpus,gpu_model,team,pod\n"
                    "2026-11-16T00:00:00Z,,2026-11-16T03:00:00Z,1,nvidia-l4,t,gave-up\n"
                    "2026-11-16T01:00:00Z,2026-11-16T02:00:00Z,,1,nvidia-l4,t,running\n"
                    "2026-11-16T01:00:00Z,2026-11-16T01:00:00Z,2026-11-16T05:00:00Z,1,"
                    "nvidia-l4,t,done\n")
    jobs = {j.job: j for j in pods_csv.of_pods_csv(path)}
    assert jobs["gave-up"].deadline_seconds == 3 * 3600, "withdrawn at its deletion"
    assert jobs["running"].run_basis == "lower_bound"
    assert jobs["running"].run_seconds == 3 * 3600, "at least to the file's last time"
    assert (jobs["done"].run_basis, jobs["done"].deadline_seconds) == ("measured", None)
    built = scenario.build(list(jobs.values()), make_layout(pools=[{
        "name": "l4", "accelerator": "nvidia-l4", "gpus_per_node": 1, "nodes": 3}]),
        START, START + timedelta(hours=5), 300)
    by_name = {w.name: w for w in built.scenario.workloads}
    [withdrawn] = [t for t in built.scenario.jobs if t.name == "gave-up"]
    assert by_name[withdrawn.workload].active_deadline == 3 * 3600
    [running] = [t for t in built.scenario.jobs if t.name == "running"]
    assert running.run > 3 * 3600, "it does not end inside the window"
