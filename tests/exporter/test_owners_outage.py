"""A view the exporter lacks moves no cost to another team: with namespaces forbidden, or
pods forbidden while new pods start, each team's cost stays its true cost within one
interval (what cannot be known goes to team ``unknown``, counted and logged), and
``/readyz`` says what the exporter cannot see while it cannot see it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest

from exporter.demo import KINDS, demo_config
from exporter.model import compute
from exporter.model.compute import Owner
from exporter.model.prices import load_price_book
from exporter.runtime import owners
from exporter.runtime.app import open_exporter
from exporter.runtime.service import Exporter
from simulator.scenario import Scenario, parse_scenario
from simulator.server import SimulatorServer
from tests.conftest import scenario_data
from tests.exporter.test_exporter import families
from tests.timing import limit

NAMESPACES = [{"name": "team-a", "team": "alpha", "team_on_pods": False},
              {"name": "team-b", "team": "beta", "team_on_pods": False}]
"""The team label only on the namespaces: a pod's team is its namespace's label."""
HOUR = 3600.0


def scenario(**overrides: Any) -> Scenario:
    return parse_scenario(scenario_data(namespaces=NAMESPACES, **overrides), "owners")


async def until(condition: Callable[[], bool], seconds: float = 60.0) -> None:
    async with asyncio.timeout(seconds):
        while not condition():  # noqa: ASYNC110 - the watches run in this loop
            await asyncio.sleep(0.01)


async def step(sim: SimulatorServer, exporter: Exporter, steps: int,
               kinds: Collection[str] = tuple(KINDS)) -> None:
    """Advance the simulator a step at a time, one cycle after each once the exporter's
    watches of ``kinds`` (those the API still serves it) have caught up."""
    for _ in range(steps):
        await sim.advance(sim.cluster.step)
        await until(lambda: all(exporter.kube.resource_versions[k] >=
                                sim.store.last_version(KINDS[k]) for k in kinds))
        await exporter.cycle(sim.cluster.now)


def true_cost(sim: SimulatorServer, start: float) -> dict[str, float]:
    """Each team's true cost since ``start``: its pods' GPU-seconds at list price."""
    sim.cluster.close()
    truth = sim.cluster.truth.report(start, sim.cluster.now, utilization=False)
    prices = load_price_book(None, sim.scenario.region).prices
    out: dict[str, float] = {}
    for (team, ns, accel, prov), secs in truth.seconds_by(
            "team", "namespace", "accelerator", "provisioning", state="allocated").items():
        out[team or ns] = out.get(team or ns, 0.0) + secs / HOUR * prices[(accel, prov)]
    return out


def cost_by_team(exporter: Exporter) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, usd in exporter.totals.cost_usd.items():
        if key[0] == "allocated":
            out[key[2]] = out.get(key[2], 0.0) + usd
    return out


def one_interval(sim: SimulatorServer) -> dict[str, float]:
    """Each team's cost over the last interval: every pod started within the run costs
    the exporter at most one interval it was not yet seen in (cycles count from the
    states they see)."""
    return true_cost(sim, sim.cluster.now - sim.cluster.step)


def assert_within_one_interval(ours: dict[str, float], truth: dict[str, float],
                               interval: dict[str, float]) -> None:
    assert set(ours) <= set(truth), "every team's cost its own, no other team's"
    for team, usd in truth.items():  # a team whose first pod started in the last interval
        assert usd - interval[team] - 1e-9 <= ours.get(team, 0.0) <= usd + 1e-9, team


def source_up(exporter: Exporter, kind: str) -> float:
    (value,) = [v for lbl, v in families(exporter.metrics.text)["gke_gpu_exporter_source_up"]
                if lbl["source"] == "kubernetes" and lbl["target"] == kind]
    return value


def unowned_gpus(exporter: Exporter) -> float:
    (sample,) = families(exporter.metrics.text)["gke_gpu_exporter_unowned_gpus"]
    return sample[1]


async def test_namespaces_forbidden_put_no_cost_on_a_guessed_team(
        make_server: Callable[..., Any], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """Namespaces forbidden from the start, the team label only on them: no cost goes to
    a namespace's name (the old guess) nor to any team; it is team ``unknown``'s, its GPUs
    counted, logged once, and the exporter is not ready. Once namespaces are allowed,
    each team's cost from then on is its true cost within one interval."""
    caplog.set_level(logging.INFO, "exporter.runtime.service")
    sim: SimulatorServer = await make_server(scenario())
    sim.api.forbid("namespaces", HOUR)
    for job in ("train", "shared", "spotjob"):
        sim.cluster.submit(job, run_seconds=HOUR)
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    start = sim.cluster.now
    async with open_exporter(cfg) as exporter:
        kube = exporter.kube
        await until(lambda: kube.synced["nodes"].is_set() and kube.synced["pods"].is_set()
                    and "namespaces" in kube.denied)
        await exporter.cycle(sim.cluster.now)
        for _ in range(3):  # during the fault, cycle by cycle
            await step(sim, exporter, 1, ("nodes", "pods"))
            reasons = exporter.unready()
            assert reasons and reasons[0].startswith("no list of namespaces from the "
                                                     "Kubernetes API yet (last error: HTTP 403")
            assert source_up(exporter, "namespaces") == 0.0
            truth = true_cost(sim, start)
            assert set(truth) == {"alpha", "beta"}
            ours = cost_by_team(exporter)
            assert set(ours) == {compute.UNKNOWN_TEAM}, "never team-a, team-b or a guess"
            total = sum(truth.values())
            assert total - sum(one_interval(sim).values()) <= ours[compute.UNKNOWN_TEAM] \
                <= total + 1e-9
            allocated = sum(d.fraction for d in exporter.states if d.state == "allocated")
            assert allocated > 0
            assert unowned_gpus(exporter) == pytest.approx(allocated)
        logged = [r for r in caplog.records if r.getMessage() == "gpu owners unknown"]
        assert len(logged) == 1, "once per episode"

        sim.api.forbid("namespaces", 0)
        await until(lambda: source_up_now(exporter, "namespaces"))
        await step(sim, exporter, 1)  # the interval before it still saw the unknown team
        since, before = sim.cluster.now, cost_by_team(exporter)
        await step(sim, exporter, 3)
        assert exporter.unready() == []
        assert unowned_gpus(exporter) == 0.0
        after = {t: usd - before.get(t, 0.0) for t, usd in cost_by_team(exporter).items()
                 if usd - before.get(t, 0.0) > 0}
        assert_within_one_interval(after, true_cost(sim, since), one_interval(sim))
        assert [r for r in caplog.records if r.getMessage() == "gpu owners known again"]


def source_up_now(exporter: Exporter, kind: str) -> bool:
    return exporter.kube.up.get(kind, False) and kind not in exporter.kube.denied


async def test_pods_forbidden_while_pods_start_keep_each_teams_cost(
        make_server: Callable[..., Any], tmp_path: Path) -> None:
    """A minute of 403 on pods while new pods start on the GPUs: their GPUs are their
    namespace's team's (labels the exporter holds), during the fault and after it, each
    team's cost within one interval of the truth; /readyz says pods are forbidden."""
    sim: SimulatorServer = await make_server(scenario())
    for job in ("train", "shared"):
        sim.cluster.submit(job, run_seconds=HOUR)
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    start = sim.cluster.now
    async with open_exporter(cfg) as exporter:
        async with asyncio.timeout(limit(30)):
            await exporter.kube.wait_synced()
        await exporter.cycle(sim.cluster.now)
        await step(sim, exporter, 2)
        assert exporter.unready() == []

        sim.api.forbid("pods", HOUR)
        sim.api.end_watches()
        await until(lambda: "pods" in exporter.kube.denied)
        for job in ("slice", "spotjob"):  # team-a's and team-b's, started in the fault
            sim.cluster.submit(job, run_seconds=HOUR)
        for _ in range(2):  # a minute: two 30 s intervals
            await step(sim, exporter, 1, ("nodes", "namespaces"))
            reasons = exporter.unready()
            assert reasons and reasons[0].startswith(
                "the Kubernetes API forbids pods to the exporter (HTTP 403): cannot ")
            assert source_up(exporter, "pods") == 0.0
            assert unowned_gpus(exporter) == 0.0
            assert_within_one_interval(cost_by_team(exporter), true_cost(sim, start),
                                       one_interval(sim))
        new = [o for d in exporter.states for o in d.owners if o.uid == ""]
        assert {(o.namespace, o.team) for o in new} == {("team-a", "alpha"),
                                                        ("team-b", "beta")}, \
            "the pods started in the fault run, unseen, on their namespaces' teams"

        sim.api.forbid("pods", 0)
        await until(lambda: source_up_now(exporter, "pods"))
        await step(sim, exporter, 3)
        assert exporter.unready() == []
        assert_within_one_interval(cost_by_team(exporter), true_cost(sim, start),
                                   one_interval(sim))
        assert all(o.uid for d in exporter.states for o in d.owners), "all in the view again"


async def test_kueue_forbidden_is_not_ready_and_its_discovery_refused_is_counted(
        make_server: Callable[..., Any], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """Kueue's Workloads forbidden: not ready (queue wait would lose admission). Kueue's
    API group's discovery forbidden: counted by reason, logged once, not ready."""
    sim: SimulatorServer = await make_server(scenario(kueue={
        "cluster_queues": [{"name": "research", "flavors": [
            {"accelerator": "nvidia-h100-80gb", "nominal_gpus": 8}]}],
        "local_queues": [{"name": "research", "namespace": "team-a",
                          "cluster_queue": "research"}]}))
    sim.api.forbid("workloads", HOUR)
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    async with open_exporter(cfg) as exporter:
        kube = exporter.kube
        await until(lambda: "workloads" in kube.denied and all(
            kube.synced[k].is_set() for k in KINDS))
        await exporter.cycle(sim.cluster.now)
        assert kube.kueue is True
        reasons = exporter.unready()
        assert reasons and reasons[0].startswith("no list of workloads from the Kubernetes "
                                                 "API yet (last error: HTTP 403")
        assert source_up(exporter, "workloads") == 0.0
        sim.api.forbid("workloads", 0)
        await until(lambda: kube.synced["workloads"].is_set())
        await exporter.cycle(sim.cluster.now)
        assert exporter.unready() == []

    sim.api.forbid("kueue.x-k8s.io", HOUR)
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path / "b").kubeconfig,
                      tmp_path / "b")
    with caplog.at_level(logging.WARNING, "exporter.sources.kube"):
        async with open_exporter(cfg) as exporter:
            kube = exporter.kube
            await until(lambda: sum(kube.discovery_errors.values()) >= 2 and all(
                kube.synced[k].is_set() for k in KINDS), 120)
            await exporter.cycle(sim.cluster.now)
            assert kube.kueue is None
            reasons = exporter.unready()
            assert reasons and reasons[0].startswith(
                "whether the cluster runs Kueue is unknown: its API group kueue.x-k8s.io "
                "cannot be discovered (HTTP 403")
            fams = families(exporter.metrics.text)
            assert [v for _, v in fams["gke_gpu_exporter_kubernetes_discovery_up"]] == [0.0]
            (errors,) = fams["gke_gpu_exporter_kubernetes_discovery_errors_total"]
            assert errors[0]["reason"] == "http_403" and errors[1] >= 2
            logged = [r for r in caplog.records if r.getMessage() == "kueue discovery failed"]
            assert len(logged) == 1, "once per episode"


async def test_a_pod_seen_before_keeps_its_owner_out_of_the_view(
        make_server: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU pod that leaves the view is its last known owner's, the most recently seen
    ``REMEMBERED_OWNERS`` of them, for ``REMEMBERED_SECONDS``; any other, its namespace's
    team; in a namespace the exporter does not know, team ``unknown``."""
    monkeypatch.setattr(owners, "REMEMBERED_OWNERS", 2)
    sim: SimulatorServer = await make_server(scenario())
    for job in ("train", "shared", "slice", "spotjob"):
        sim.cluster.submit(job, run_seconds=HOUR)
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    async with open_exporter(cfg) as exporter:
        async with asyncio.timeout(limit(30)):
            await exporter.kube.wait_synced()
        await step(sim, exporter, 2)
        seen = {(o.namespace, o.name): o for d in exporter.states for o in d.owners}
        assert len(seen) > 2 and all(o.uid for o in seen.values())
        again = {k: exporter.owners.unviewed_owner(*k) for k in seen}
        assert sum(again[k] == o for k, o in seen.items()) == 2, "the last two remembered"
        for k, o in seen.items():
            assert again[k].team == o.team == {"team-a": "alpha", "team-b": "beta"}[k[0]]
        assert exporter.owners.unviewed_owner("elsewhere", "p").team == compute.UNKNOWN_TEAM

        monkeypatch.setattr(owners, "REMEMBERED_OWNERS", 100)
        monkeypatch.setattr(owners, "REMEMBERED_SECONDS", 45.0)
        await step(sim, exporter, 1)
        key, owner = next(iter(seen.items()))
        sim.cluster.delete_pod(sim.cluster.pods["/".join(key)], grace_seconds=0)
        await step(sim, exporter, 1)
        assert all(p.name != key[1] for p in exporter.kube.pods.values()), "out of the view"
        assert exporter.owners.unviewed_owner(*key) == owner, "seen 30 s ago: remembered"
        await step(sim, exporter, 1)
        assert exporter.owners.unviewed_owner(*key) == Owner("", *key, owner.team, key[1]), \
            "seen 60 s ago: forgotten"
