"""Scenario files: the default loads; every bad field gets one clear error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.model.durations import parse_duration
from simulator.scenario import ScenarioError, load_scenario, parse_scenario
from tests.conftest import scenario_data
from tests.timing import limit


def test_default_scenario_is_valid() -> None:
    s = load_scenario()
    assert s.cluster == "demo"
    assert {p.accelerator for p in s.pools} >= {"nvidia-h100-80gb", "nvidia-tesla-a100",
                                                "nvidia-l4", "nvidia-tesla-t4"}
    assert any(p.sharing for p in s.pools) and any(p.mig_partition_size for p in s.pools)
    assert {f.kind for f in s.faults} == {"xid", "node_not_ready", "spot_preemption",
                                          "endpoint"}


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90), ("30m", 1800), ("1d6h", 108000), ("2h30m", 9000), (45, 45), (1.5, 1.5),
    ("30", 30),
])
def test_durations(text: Any, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "-5", "1w", "", True, "5 s"])
def test_bad_durations(text: Any) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def _pool(**kw: Any) -> dict[str, Any]:
    return {"name": "p", "accelerator": "nvidia-l4", "gpus_per_node": 1, "nodes": 1, **kw}


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("unknown accelerator", {"pools": [_pool(accelerator="nvidia-b300")]},
     "pools[0].accelerator: 'nvidia-b300' is not allowed; allowed values: 'nvidia-h200-141gb'"),
    ("gpu count not offered", {"pools": [_pool(gpus_per_node=3)]},
     "gpus_per_node 3 is not offered for nvidia-l4; allowed: 1, 2, 4, 8"),
    ("mig on L4", {"pools": [_pool(mig_partition_size="1g.5gb")]},
     "mig_partition_size: nvidia-l4 does not support MIG"),
    ("unknown mig profile",
     {"pools": [_pool(accelerator="nvidia-tesla-a100", mig_partition_size="1g.10gb")]},
     "allowed: 1g.5gb, 2g.10gb, 3g.20gb, 7g.40gb"),
    ("mig layout without mig", {"pools": [_pool(dcgm_mig_layout="gpu_and_instances")]},
     "dcgm_mig_layout applies to a pool with mig_partition_size"),
    ("unknown mig layout",
     {"pools": [_pool(accelerator="nvidia-tesla-a100", mig_partition_size="1g.5gb",
                      dcgm_mig_layout="both")]},
     "pools[0].dcgm_mig_layout: 'both' is not allowed; allowed values: 'instances' or "
     "'gpu_and_instances'"),
    ("unknown field", {"pools": [_pool(colour="red")]}, "pools[0].colour: unknown field"),
    ("bad duration", {"step": "fast"}, "step: 'fast' is not a duration"),
    ("workload namespace", {"workloads": [{**scenario_data()["workloads"][0],
                                           "namespace": "nope"}]},
     "namespace 'nope' is not one of team-a, team-b"),
    ("workload without pool",
     {"workloads": [{**scenario_data()["workloads"][0], "accelerator": "nvidia-l4"}]},
     "no pool offers nvidia-l4 on-demand"),
    ("fault gpu out of range",
     {"faults": [{"at": "1h", "kind": "xid", "node": "h100/0", "gpu": 9, "code": 79}]},
     "gpu 9 does not exist on h100 (gpus 0..7)"),
    ("unknown xid",
     {"faults": [{"at": "1h", "kind": "xid", "node": "h100/0", "code": 13}]},
     "code 13 is not a simulated XID; allowed: 48, 63, 64, 74, 79, 94, 95"),
    ("spot preemption of on-demand pool",
     {"faults": [{"at": "1h", "kind": "spot_preemption", "pool": "h100"}]},
     "spot_preemption needs a spot pool; h100 is on-demand"),
    ("fault kind", {"faults": [{"at": "1h", "kind": "meteor", "node": "h100/0"}]},
     "faults[0].kind: 'meteor' is not allowed; allowed values: 'xid', 'node_not_ready'"),
    ("duplicate pool", {"pools": [_pool(), _pool()]}, "pools: name 'p' is used twice"),
    ("unknown hostname kind", {"pools": [_pool(dcgm_hostname="ip")]},
     "pools[0].dcgm_hostname: 'ip' is not allowed; allowed values: 'node' or 'pod'"),
    ("service over an unknown pool", {"dcgm_service": {"pools": ["h100", "a100"]}},
     "dcgm_service: pool 'a100' is not one of h100, l4, mig, t4-spot"),
    ("stockout of an unknown pool", {"stockouts": [{"pool": "a100", "at": "1h"}]},
     "stockouts[0]: pool 'a100' is not one of h100, l4, mig, t4-spot"),
    ("stockout of a pool that does not autoscale", {"stockouts": [{"pool": "h100", "at": 0}]},
     "stockouts[0]: pool h100 does not autoscale"),
    ("stockout reason", {"stockouts": [{"pool": "h100", "at": 0, "reason": "sold_out"}]},
     "stockouts[0].reason: 'sold_out' is not allowed; allowed values: 'out_of_resources' or "
     "'quota_exceeded'"),
    ("taint effect", {"pools": [_pool(taints=[{"key": "a", "effect": "Never"}])]},
     "pools[0].taints[0].effect: 'Never' is not allowed"),
]


@pytest.mark.parametrize(("case", "override", "message"), BAD, ids=[b[0] for b in BAD])
def test_invalid_scenarios_name_the_field(case: str, override: dict[str, Any],
                                          message: str) -> None:
    data = scenario_data(**override)
    if "pools" in override and "workloads" not in override:
        data["workloads"] = []
        data["faults"] = []
    with pytest.raises(ScenarioError) as err:
        parse_scenario(data, "bad.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("bad.yaml: ")


def test_cli_rejects_bad_file_with_one_message(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    data = scenario_data(pools=[_pool(accelerator="nvidia-k80")], workloads=[], faults=[])
    path.write_text(yaml.safe_dump(data))
    proc = subprocess.run([sys.executable, "-m", "exporter", "simulate", "--check",
                           "--scenario", str(path)], capture_output=True, text=True,
                          timeout=limit(60), check=False)
    assert proc.returncode == 2
    assert "pools[0].accelerator: 'nvidia-k80' is not allowed" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize(("content", "message"), [
    ("pools: [", "not valid YAML"),
    ("- just\n- a list\n", "a scenario is a YAML mapping"),
])
def test_unreadable_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(content)
    with pytest.raises(ScenarioError, match=message):
        load_scenario(path)


def test_missing_file() -> None:
    with pytest.raises(ScenarioError, match="cannot read scenario"):
        load_scenario("/nonexistent/scenario.yaml")


def test_scaling_keeps_the_mix() -> None:
    s = load_scenario().scaled(1000)
    assert sum(p.nodes for p in s.pools) == 1000
    base = load_scenario()
    ratio = {p.name: p.nodes for p in s.pools}
    assert ratio["t4"] > ratio["l4-shared"]  # the shape of the default is kept
    w0 = next(w for w in base.workloads if w.name == "batch-embed")
    w1 = next(w for w in s.workloads if w.name == "batch-embed")
    assert w0.arrivals_per_day is not None and w1.arrivals_per_day is not None
    assert w1.arrivals_per_day == pytest.approx(w0.arrivals_per_day * 1000 / 15)


def test_scenarios_may_use_every_model_of_the_catalogue() -> None:
    from typing import get_args

    from exporter.model.catalog import GPU_MODELS
    from simulator.scenario import Accelerator
    assert set(get_args(Accelerator)) == set(GPU_MODELS)


def test_europe_scenario_runs_h200_and_l4_in_europe_west1() -> None:
    s = load_scenario("europe")
    assert s.region == "europe-west1"
    assert {p.accelerator for p in s.pools} == {"nvidia-h200-141gb", "nvidia-l4"}
    assert all(p.zone.startswith("europe-west1-") for p in s.pools if p.zone)
