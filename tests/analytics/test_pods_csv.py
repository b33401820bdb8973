"""A pods CSV: its rows read, its jobs, and the week as it recorded it (the baseline a
replay of it is set beside)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.week import Week
from analytics.whatif import compare, pods_csv, render, trace
from analytics.whatif.measure import Measured
from exporter.model.catalog import GPU_MODELS

START = datetime(2026, 11, 16, tzinfo=UTC)
WEEK = Week(START, START + timedelta(days=1))
HEADER = "created,scheduled,deleted,gpus,gpu_model,team,pod"


def t(hours: float) -> str:
    return (START + timedelta(hours=hours)).isoformat().replace("+00:00", "Z")


def write(tmp_path: Path, rows: list[str], header: str = HEADER) -> Path:
    path = tmp_path / "pods.csv"
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


def recorded(tmp_path: Path, rows: list[str], header: str = HEADER) -> Measured:
    m = pods_csv.recorded(pods_csv.read_pods(write(tmp_path, rows, header)), WEEK)
    assert m is not None
    return m


# ----------------------------------------------------------------------------- the record

@pytest.mark.parametrize(("row", "wait_hours", "held_gpu_hours"), [
    (f"{t(1)},{t(3)},{t(5)},1,nvidia-l4,a,p", 2.0, 2.0),
    (f"{t(1)},{t(1)},{t(5)},2,nvidia-l4,a,p", 0.0, 8.0),
    (f"{t(1)},{t(2)},{t(4)},0.5,nvidia-l4,a,p", 1.0, 1.0),
    (f"{t(1)},,{t(4)},1,nvidia-l4,a,p", 3.0, 0.0),
    (f"{t(1)},{t(2)},,1,nvidia-l4,a,p", 1.0, 4.0),
    (f"{t(1)},,,1,nvidia-l4,a,p", 5.0, 0.0),
    (f"{t(-2)},{t(-1)},{t(3)},1,nvidia-l4,a,p", None, 3.0),
    (f"{t(20)},{t(30)},{t(32)},1,nvidia-l4,a,p", 4.0, 0.0),
], ids=["waited", "at-once", "fraction", "withdrawn", "running-at-the-end",
        "waiting-at-the-end", "before-the-week", "past-the-week"])
def test_the_week_as_a_pods_csv_recorded_it(tmp_path: Path, row: str, wait_hours: float | None,
                                            held_gpu_hours: float) -> None:
    """Waits are created to scheduled (else to deletion, else to the file's last time, in
    the week); GPU-hours held are scheduled to deleted (else to the file's last time), in
    the week, times the GPUs."""
    last = f"{t(0)},{t(0)},{t(6)},1,nvidia-l4,z,last"  # the file ends at 6h
    m = recorded(tmp_path, [row, last])
    a = m.waits[m.waits.team == "a"]
    if wait_hours is None:
        assert a.empty, "created before the week: not a wait of it"
    else:
        assert a.wait_seconds.tolist() == [pytest.approx(wait_hours * 3600)]
    teams = m.teams.set_index("team")
    held = teams.gpu_hours.get("a")
    assert (0.0 if held is None or math.isnan(held) else held) == pytest.approx(held_gpu_hours)
    assert m.headline["allocated_gpu_hours"] == pytest.approx(held_gpu_hours + 6.0)


def test_what_a_pods_csv_does_not_record_is_unknown_not_zero(tmp_path: Path) -> None:
    m = recorded(tmp_path, [f"{t(1)},{t(2)},{t(3)},1,nvidia-l4,a,p"])
    for key in ("cost_usd", "gpu_hours", "utilization", "idle_cost_usd",
                "unallocated_cost_usd", "fleet_cost_usd_per_utilized_hour"):
        assert m.headline[key] is None, key
    assert (m.reclaims, m.causes, m.stranded_gpu_hours, m.stranded_cost_usd) == \
        (None, None, None, None)
    assert m.teams.cost_usd.isna().all() and m.teams.utilization.isna().all()


def test_a_recorded_utilisation_is_the_gpu_time_weighted_mean(tmp_path: Path) -> None:
    m = recorded(tmp_path, [f"{t(1)},{t(1)},{t(2)},1,nvidia-l4,a,p,0.2",
                            f"{t(1)},{t(1)},{t(4)},1,nvidia-l4,a,q,80",
                            f"{t(1)},{t(1)},{t(2)},1,nvidia-l4,a,r,"],
                 HEADER + ",utilization")
    assert m.headline["utilization"] == pytest.approx((0.2 * 1 + 0.8 * 3) / 4)


def test_a_pods_csv_without_a_scheduled_column_records_no_week(tmp_path: Path) -> None:
    """Its waits are not known: no baseline, the reason said; its pods run from their
    creation to their deletion, none withdrawn."""
    path = write(tmp_path, [f"{t(1)},{t(4)},1,nvidia-l4,a,p", f"{t(2)},,1,nvidia-l4,a,q"],
                 "created,deleted,gpus,gpu_model,team,pod")
    f = pods_csv.read_pods(path)
    assert pods_csv.recorded(f, WEEK) is None
    assert pods_csv.unrecorded(f) == ("pods.csv has no scheduled column, so no recorded "
                                      "wait to check a replay against")
    jobs = {j.job: j for j in f.jobs}
    assert (jobs["p"].run_seconds, jobs["p"].run_basis, jobs["p"].deadline_seconds) == \
        (3 * 3600, "measured", None)
    assert jobs["q"].run_basis == "lower_bound", "still running at the file's last time"


pods = st.lists(st.tuples(
    st.integers(0, 47 * 60), st.one_of(st.none(), st.integers(0, 600)),
    st.one_of(st.none(), st.integers(1, 900)), st.sampled_from([0.25, 0.5, 1, 2, 8]),
    st.sampled_from(["a", "b", "c"])), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture])
@given(pods)
def test_every_pod_created_in_the_week_is_one_recorded_wait(
        tmp_path: Path, rows: list[tuple[int, int | None, int | None, float, str]]) -> None:
    """Whatever the rows, each pod created in the week is one wait, never negative, and the
    GPU-hours held are the pods' GPUs times their time scheduled in the week."""
    lines = []
    for i, (created, waited, ran, gpus, team) in enumerate(rows):
        c = START + timedelta(minutes=created) - timedelta(hours=1)
        s = None if waited is None else c + timedelta(minutes=waited)
        d = None if ran is None else (s or c) + timedelta(minutes=ran)
        lines.append(",".join([c.isoformat(), s.isoformat() if s else "",
                               d.isoformat() if d else "", f"{gpus:g}", "nvidia-l4", team,
                               f"p{i}"]))
    f = pods_csv.read_pods(write(tmp_path, lines))
    m = pods_csv.recorded(f, WEEK)
    assert m is not None
    in_week = [p for p in f.pods if WEEK.start <= p.created < WEEK.end]
    assert len(m.waits) == len(in_week)
    assert (m.waits.wait_seconds >= 0).all()
    assert int(m.teams.pods.sum()) == len(in_week)
    end = min(f.until, WEEK.end)
    held = sum(p.gpus * max(0.0, (min(p.ended or f.until, end)
                                   - max(p.scheduled, WEEK.start)).total_seconds())
               for p in f.pods if p.scheduled is not None) / 3600
    assert m.headline["allocated_gpu_hours"] == pytest.approx(held, abs=1e-6)


# ----------------------------------------------------------------------------- the comparison

def replayed(wait_p90: float, held: float = 10.0) -> Measured:
    """A replay's figures: one team, ``a``."""
    teams = pd.DataFrame({"team": ["a"], "gpu_hours": [held], "cost_usd": [50.0],
                          "utilization": [None], "cost_per_utilized_hour": [None],
                          "pods": [1], "wait_p50_seconds": [0.0],
                          "wait_p90_seconds": [wait_p90], "pending_gpu_hours": [0.0]})
    return Measured({"cost_usd": 100.0, "gpu_hours": 20.0, "allocated_gpu_hours": held},
                    teams, pd.DataFrame({"cause": ["no_capacity"], "gpu_hours": [1.0]}),
                    pd.DataFrame({"node_pool": ["l4"], "gpu_hours": [20.0],
                                  "cost_usd": [100.0], "availability": [1.0],
                                  "stranded_gpu_hours": [0.0], "stranded_cost_usd": [0.0]}),
                    0, pd.DataFrame({"team": ["a"], "wait_seconds": [wait_p90],
                                     "gpus": [1.0]}))


def test_a_replay_of_a_pods_csv_is_set_beside_the_week_it_recorded(tmp_path: Path) -> None:
    """The record is the baseline: its waits are the changes' base; what it does not
    record has no change; no cause of its waits is read as 0; without a replay on the
    layout it ran on, the fidelity says why there is none."""
    week = recorded(tmp_path, [f"{t(1)},{t(3)},{t(5)},1,nvidia-l4,a,p"])
    c = compare.compare(week, None, replayed(600.0), 300, "no layout given")
    s = c.summary.set_index("figure")
    p90 = "Queue wait p90, pods submitted in the week"
    assert (s.loc[p90, "actual"], s.loc[p90, "delta"]) == (7200.0, 600.0 - 7200.0)
    assert pd.isna(s.loc["Cost", "actual"]) and pd.isna(s.loc["Cost", "delta"])
    assert s.loc["GPU-hours held by pods", "delta"] == pytest.approx(10.0 - 2.0)
    assert "gpu_hours_actual" not in c.causes, "the record has no causes"
    assert c.fidelity.empty and c.unchecked == "no layout given"
    assert c.teams.set_index("team").loc["a", "wait_p90_seconds_delta"] == 600.0 - 7200.0
    page = render.Page("t", [], c, proposed="proposed", actual="as recorded")
    md = render.markdown(page, chart=None)
    assert "| | as recorded | proposed | change |".replace("| |", "|  |") in md
    assert "## Fidelity\n\nNo fidelity check: no layout given." in md
    assert render.TABLES["fidelity"] not in md, "no heading over a table that is not there"
    assert "No fidelity check: no layout given." in render.terminal(page)


@pytest.mark.parametrize(("replay_p90", "within"), [(7200.0, True), (7200.0 + 900, False)])
def test_a_pods_csv_replayed_on_its_own_layout_is_checked_on_what_it_records(
        tmp_path: Path, replay_p90: float, within: bool) -> None:
    """The fidelity checks the GPU-hours held and each team's waits, not the cost or the
    capacity, which the file does not record."""
    week = recorded(tmp_path, [f"{t(1)},{t(3)},{t(13)},1,nvidia-l4,a,p"])
    c = compare.compare(week, replayed(replay_p90), None, 300)
    checks = c.fidelity.set_index("check")
    assert list(checks.index) == ["GPU-hours held by pods", "a wait p50 (s)", "a wait p90 (s)"]
    assert bool(checks.loc["a wait p90 (s)", "ok"]) is within
    assert c.unchecked is None


@pytest.mark.parametrize(("actual", "replay", "why"), [
    (None, None, compare.NO_WEEK),
    ("week", None, compare.NO_OWN_REPLAY),
])
def test_the_fidelity_says_why_there_is_none(tmp_path: Path, actual: str | None,
                                             replay: str | None, why: str) -> None:
    week = recorded(tmp_path, [f"{t(1)},{t(3)},{t(5)},1,nvidia-l4,a,p"]) if actual else None
    c = compare.compare(week, None, replayed(60.0), 300)
    assert c.fidelity.empty and c.unchecked == why


def test_a_failed_replay_leaves_what_was_measured(tmp_path: Path) -> None:
    """No proposed replay: the record and the week's own replay are still compared."""
    week = recorded(tmp_path, [f"{t(1)},{t(3)},{t(5)},1,nvidia-l4,a,p"])
    c = compare.compare(week, replayed(7200.0), None, 300)
    assert c.summary.proposed.isna().all()
    page = render.Page("t", [], c, proposed="proposed", actual="as recorded")
    assert "Queue wait p90" in render.terminal(page)
    assert render.markdown(page, chart=None).count("## ") >= 3


# ----------------------------------------------------------------------------- utilisation

LAYOUT = {"cluster": "elsewhere", "region": "us-central1", "pools": [
    {"name": "l4", "accelerator": "nvidia-l4", "gpus_per_node": 2, "nodes": 1,
     "zone": "us-central1-a"}]}


@pytest.mark.parametrize(("header", "cell", "utilization"), [
    (HEADER, "", None), (HEADER + ",utilization", ",0.4", 0.4)])
def test_utilisation_not_in_the_trace_is_unknown_in_its_replay(
        tmp_path: Path, header: str, cell: str, utilization: float | None) -> None:
    """A replay of pods whose utilisation the file does not have measures none: the
    utilisation, its cost per utilised hour and the idle cost are unknown, not 93 % or
    $0."""
    from analytics.whatif import engine, layout, scenario
    from exporter.config import Prices

    jobs = pods_csv.read_pods(write(tmp_path, [
        f"{t(1)},{t(1)},{t(3)},1,nvidia-l4,a,p{cell}",
        f"{t(2)},{t(2)},{t(4)},1,nvidia-l4,b,q{cell}"], header)).jobs
    built = scenario.build(jobs, layout.parse(LAYOUT), WEEK.start, WEEK.end,
                           engine.RESOLUTION)
    played = engine.play(built.scenario, WEEK, engine.Pricing.load(Prices(), "us-central1"),
                         engine.utilizations(jobs))
    played.store.close()
    h = played.measured.headline
    assert h["allocated_gpu_hours"] == pytest.approx(4.0)
    if utilization is None:
        assert (h["utilization"], h["idle_cost_usd"],
                h["fleet_cost_usd_per_utilized_hour"]) == (None, None, None)
        assert played.measured.teams.utilization.isna().all()
        c = compare.compare(None, None, played.measured, 300)
        s = c.summary.set_index("figure")
        assert render.value(s.loc["Utilisation", "proposed"], "ratio") == "—"
    else:
        assert h["utilization"] == pytest.approx(utilization)
        assert h["idle_cost_usd"] is not None and h["idle_cost_usd"] > 0


def test_a_full_loop_replay_of_pods_without_utilisation_shows_none() -> None:
    """The full loop draws utilisation from the jobs' profiles: not a measurement."""
    from analytics.whatif import measure

    m = measure.without_utilization(replayed(60.0))
    assert all(m.headline.get(k) is None for k in measure.UTILIZATION_FIGURES)
    assert m.teams.utilization.isna().all()


# ----------------------------------------------------------------------------- models

MODELS = sorted(GPU_MODELS)


@settings(max_examples=60, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(MODELS), min_size=1, max_size=4))
def test_a_pod_may_accept_several_gpu_models(tmp_path: Path, accepted: list[str]) -> None:
    """``gpu_model`` lists the models a pod accepts, joined by ``|``: read as written (each
    once, in its order), through a pods CSV and a trace file alike."""
    cell = trace.MODELS_SEPARATOR.join(accepted)
    [job] = pods_csv.read_pods(write(tmp_path, [f"{t(1)},{t(1)},{t(2)},1,{cell},a,p"])).jobs
    assert trace.models(job.gpu_model) == tuple(dict.fromkeys(accepted))
    assert trace.read(trace.write([job], tmp_path / "trace.csv")) == [job]


@pytest.mark.parametrize(("cell", "error"), [
    ("nvidia-l4|nvidia-k80", "gpu_model 'nvidia-k80' is not one of"),
    ("nvidia-l4||nvidia-tesla-t4", "gpu_model '' is not one of"),
    ("nvidia-l4,nvidia-tesla-t4", "pods.csv:2: 8 cells, the header has 7"),
])
def test_a_bad_model_in_a_list_is_named(tmp_path: Path, cell: str, error: str) -> None:
    with pytest.raises(trace.TraceError, match=error):
        pods_csv.read_pods(write(tmp_path, [f"{t(1)},{t(1)},{t(2)},1,{cell},a,p"]))


def test_a_pod_accepting_several_models_asks_for_them_by_node_affinity() -> None:
    """The Kubernetes way: ``cloud.google.com/gke-accelerator In [...]``, no nodeSelector
    on the accelerator; a node of any of them passes the filter, another does not."""
    from simulator import placement
    from simulator.scenario import parse_scenario

    sc = parse_scenario({
        "cluster": "c", "namespaces": [{"name": "default"}], "pools": [
            {"name": n, "accelerator": m, "gpus_per_node": 1, "nodes": 1}
            for n, m in (("a100", "nvidia-tesla-a100"), ("l4", "nvidia-l4"),
                         ("t4", "nvidia-tesla-t4"))],
        "workloads": [{"name": "w", "kind": "finetuning", "namespace": "default",
                       "accelerator": "nvidia-tesla-a100", "accelerators": ["nvidia-l4"],
                       "accelerator_selector": False, "arrivals_per_day": 0}]}, "test")
    w = sc.workloads[0]
    c = placement.pod_constraints(w, sc)
    assert placement.ACCELERATOR not in c.node_selector
    assert {"key": placement.ACCELERATOR, "operator": "In",
            "values": ["nvidia-tesla-a100", "nvidia-l4"]} in c.affinity[0]
    p = placement.Placement(sc)
    assert [pool.name for pool in sc.pools if p.eligible(pool, w)] == ["a100", "l4"]


def test_several_models_need_the_accelerator_by_affinity() -> None:
    from simulator.scenario import Workload

    with pytest.raises(ValueError, match="accelerator_selector: false"):
        Workload(name="w", kind="finetuning", namespace="default",
                 accelerator="nvidia-l4", accelerators=["nvidia-tesla-t4"],
                 arrivals_per_day=0)


@pytest.mark.parametrize(("models", "pools", "lands", "note"), [
    ("nvidia-tesla-a100|nvidia-l4", ("l4", "a100"), "a100", None),
    ("nvidia-l4|nvidia-tesla-a100", ("l4", "a100"), "a100", None),
    ("nvidia-tesla-a100|nvidia-l4", ("l4",), None, None),
    ("nvidia-h100-80gb|nvidia-tesla-t4", ("l4", "a100"), None,
     "1 jobs (1 GPU-hours) left out: no pool of the layout offers 1 x "
     "nvidia-h100-80gb|nvidia-tesla-t4 on-demand"),
], ids=["the-free-one", "in-any-order", "the-one-there-is", "none-there"])
def test_a_pod_accepting_several_models_lands_on_any_pool_of_them(
        tmp_path: Path, models: str, pools: tuple[str, ...], lands: str | None,
        note: str | None) -> None:
    """The L4 node is taken by a pod that accepts only L4 a minute before: the pod that
    accepts either runs at once on the A100 where there is one, else waits for the L4."""
    from analytics.whatif import engine, layout, scenario
    from exporter.config import Prices

    jobs = pods_csv.read_pods(write(tmp_path, [
        f"{t(1)},{t(1)},{t(3)},1,nvidia-l4,a,only-l4",
        f"{t(1 + 1 / 60)},{t(1 + 1 / 60)},{t(2 + 1 / 60)},1,{models},a,either"])).jobs
    accelerators = {"l4": "nvidia-l4", "a100": "nvidia-tesla-a100"}
    lay = layout.parse({"cluster": "c", "region": "us-central1", "pools": [
        {"name": n, "accelerator": accelerators[n], "gpus_per_node": 1, "nodes": 1,
         "zone": "us-central1-a"} for n in pools]})
    built = scenario.build(jobs, lay, WEEK.start, WEEK.end, engine.RESOLUTION)
    assert built.notes == ([note] if note else [])
    played = engine.play(built.scenario, WEEK, engine.Pricing.load(Prices(), "us-central1"),
                         {})
    try:
        held = dict(played.store.query(
            "SELECT DISTINCT workload, node_pool FROM {gpu_usage} "
            "WHERE state = 'allocated'", {}).itertuples(index=False))
    finally:
        played.store.close()
    if note:
        assert "either" not in held
        return
    assert held["only-l4"] == "l4"
    waits = played.measured.waits.wait_seconds.sort_values().tolist()
    if lands == "a100":
        assert held["either"] == "a100" and waits == [0.0, 0.0]
    else:
        assert held["either"] == "l4" and waits == [0.0, pytest.approx(2 * 3600 - 60)]
