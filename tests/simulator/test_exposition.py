"""The simulated dcgm-exporter text is dcgm-exporter's format, checked against a real scrape."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from collections.abc import Callable

import pytest

from exporter.sources.dcgm_parser import parse_dcgm_text
from simulator.cluster import Cluster
from simulator.exposition import FIELD_FAMILIES, INSTANCE_FIELDS, render_node
from simulator.scenario import Scenario
from tests.conftest import FIXTURES, scenario_data
from tests.simulator.dcgm_text import Sample, by_gpu, samples
from tests.timing import limit

REAL_L4 = (FIXTURES / "dcgm" / "dcgm-exporter_L4_kops_driver580.prom").read_text()


def _meta(text: str) -> dict[str, list[str]]:
    """``{family: [its HELP line, its TYPE line]}``."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            out.setdefault(line.split()[2], []).append(line)
    return out


def _node(c: Cluster, pool: str) -> object:
    return next(n for n in c.live_nodes() if n.pool.name == pool)


def _default_install(make_scenario: Callable[..., Scenario]) -> Cluster:
    return Cluster(make_scenario(profiling={"sm_fields": False, "nvlink": False,
                                            "clock_events": False}))


def test_idle_l4_matches_a_real_scrape(make_scenario: Callable[..., Scenario]) -> None:
    c = _default_install(make_scenario)
    node = next(n for n in c.live_nodes() if n.pool.name == "l4")
    ours = render_node(c, node)
    real_meta, our_meta = _meta(REAL_L4), _meta(ours)
    # Same families with identical HELP and TYPE lines; we add only the XID field.
    assert set(our_meta) - set(real_meta) == {"DCGM_FI_DEV_XID_ERRORS"}
    for family, lines in real_meta.items():
        assert our_meta[family] == lines, family
    # Same label names on every series.
    real_labels = {frozenset(s.labels) for s in samples(REAL_L4)}
    our_labels = {frozenset(s.labels) for s in samples(ours)}
    assert our_labels == real_labels
    # Same framebuffer arithmetic: free + used + reserved is the card's memory.
    real = next(iter(by_gpu(REAL_L4).values()))
    for gpu in by_gpu(ours).values():
        assert gpu["DCGM_FI_DEV_FB_FREE"] + \
            gpu["DCGM_FI_DEV_FB_USED"] + gpu["DCGM_FI_DEV_FB_RESERVED"] == \
            real["DCGM_FI_DEV_FB_FREE"] + real["DCGM_FI_DEV_FB_USED"] + \
            real["DCGM_FI_DEV_FB_RESERVED"]
        assert gpu["DCGM_FI_DEV_GPU_UTIL"] == 0 == real["DCGM_FI_DEV_GPU_UTIL"]


def test_value_formats_match_dcgm_exporter(make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario())
    c.submit("train", run_seconds=3600)
    c.advance(300)
    text = render_node(c, _node(c, "h100"))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, value = re.match(r"^(\w+)\{.*\} (\S+)$", line).groups()  # type: ignore[union-attr]
        if (name.startswith("DCGM_FI_PROF_") and not name.endswith("_BYTES")) or \
                name == "DCGM_FI_DEV_POWER_USAGE":
            assert re.fullmatch(r"\d+\.\d{6}", value), line
        else:
            assert re.fullmatch(r"\d+", value), line


def test_pod_labels_on_held_gpus_only(make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario())
    pod = c.submit("half", run_seconds=3600)[0]
    gpus = samples(render_node(c, _node(c, "h100")))
    held = {s.labels["gpu"] for s in gpus if s.labels.get("pod") == pod.name}
    assert held == {str(u) for u in pod.units}
    assert all(s.labels["namespace"] == "team-b" and s.labels["container"] == "main"
               for s in gpus if "pod" in s.labels)
    assert {s.labels["gpu"] for s in gpus if "pod" not in s.labels} == \
        {str(g) for g in range(8)} - held


def test_hostname_is_the_node_or_the_exporters_own_pod(
        make_scenario: Callable[..., Scenario]) -> None:
    """``dcgm_hostname: pod`` prints the dcgm-exporter pod's name, as some versions do."""
    pools = [{**p, "dcgm_hostname": "pod"} if p["name"] == "l4" else p
             for p in scenario_data()["pools"]]
    c = Cluster(make_scenario(pools=pools))
    for pool, want in (("l4", "dcgm_pod_name"), ("h100", "name")):
        node = _node(c, pool)
        assert {s.labels["Hostname"] for s in samples(render_node(c, node))} == \
            {getattr(node, want)}, pool
    l4 = _node(c, "l4")
    assert c.store.get("Pod", f"gke-managed-system/{l4.dcgm_pod_name}") is not None  # type: ignore[attr-defined]


def test_mig_instances(make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario())
    pods = [c.submit("slice", run_seconds=3600)[0] for _ in range(3)]
    text = render_node(c, _node(c, "mig"))
    ss = samples(text)
    uuids = {s.labels["UUID"] for s in ss}
    assert len(uuids) == 1  # every instance carries its parent GPU's UUID
    assert {s.labels["GPU_I_PROFILE"] for s in ss} == {"1g.5gb"}
    assert {s.labels["GPU_I_ID"] for s in ss} == {str(i) for i in range(7, 14)}
    assert not any(s.name == "DCGM_FI_DEV_GPU_UTIL" for s in ss)
    assert {s.labels.get("pod") for s in ss} - {None} == {p.name for p in pods}
    inst = by_gpu(text, pod=pods[0].name)
    (values,) = inst.values()
    assert values["DCGM_FI_DEV_FB_FREE"] + values["DCGM_FI_DEV_FB_USED"] == 4864


REAL_A100_RC = (FIXTURES / "dcgm" / "dcgm-exporter_A100_mig_gpu_and_instance_2.4.0-rc.2.prom"
                ).read_text()


def _mig_layout(make_scenario: Callable[..., Scenario], layout: str) -> Cluster:
    pools = [{**p, "dcgm_mig_layout": layout} if p["name"] == "mig" else p
             for p in scenario_data()["pools"]]
    c = Cluster(make_scenario(pools=pools))
    c.submit("slice", run_seconds=3600)
    c.advance(300)
    return c


def test_mig_gpu_and_instances_layout_is_2_4_0_rc_2s(
        make_scenario: Callable[..., Scenario]) -> None:
    """``dcgm_mig_layout: gpu_and_instances`` prints the GPU's own series beside its
    instances', split between them as in NVIDIA's documented 2.4.0-rc.2 scrape."""
    c = _mig_layout(make_scenario, "gpu_and_instances")
    node = _node(c, "mig")
    ours = samples(render_node(c, node))

    def fields(ss: list[Sample], instance: bool) -> set[str]:
        return {s.name for s in ss if ("GPU_I_ID" in s.labels) == instance}

    real = samples(REAL_A100_RC)
    assert fields(real, True) <= fields(ours, True) <= INSTANCE_FIELDS
    assert fields(real, False) & {name for name, *_ in FIELD_FAMILIES} <= fields(ours, False)
    assert "DCGM_FI_DEV_GPU_UTIL" not in fields(ours, False)  # not in MIG mode, GPU either
    gpu = [s for s in ours if "GPU_I_ID" not in s.labels]
    assert not any("pod" in s.labels for s in gpu)  # pods hold instances, not the GPU
    fb = {s.name: s.value for s in gpu if s.name.startswith("DCGM_FI_DEV_FB_")}
    assert sum(fb.values()) == node.model.memory_mib  # type: ignore[attr-defined]


def test_both_mig_layouts_read_as_the_same_devices(
        make_scenario: Callable[..., Scenario]) -> None:
    """What the exporter makes of either layout: the instances, each once, the GPU's
    device readings on each of them."""
    read = {}
    for layout in ("instances", "gpu_and_instances"):
        c = _mig_layout(make_scenario, layout)
        read[layout] = parse_dcgm_text(render_node(c, _node(c, "mig"))).devices
    for layout, devices in read.items():
        assert len(devices) == 7 and all(d.mig_profile == "1g.5gb" for d in devices), layout
        assert all("DCGM_FI_DEV_GPU_TEMP" in d.fields for d in devices), layout
    assert [(d.device_id, d.pods) for d in read["instances"]] == \
        [(d.device_id, d.pods) for d in read["gpu_and_instances"]]


def test_time_shared_gpu_is_printed_once_per_pod(make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario())
    a, b = c.submit("shared", run_seconds=3600)[0], c.submit("shared", run_seconds=3600)[0]
    assert a.node is b.node and a.node is not None and a.units[0] // 2 == b.units[0] // 2
    util = [s for s in samples(render_node(c, a.node))
            if s.name == "DCGM_FI_PROF_GR_ENGINE_ACTIVE" and s.labels["gpu"] == "0"]
    assert {s.labels["pod"] for s in util} == {a.name, b.name}
    assert len({s.value for s in util}) == 1  # the same GPU, the same reading


def test_default_install_has_no_optional_fields(make_scenario: Callable[..., Scenario]) -> None:
    c = _default_install(make_scenario)
    names = {s.name for s in samples(render_node(c, _node(c, "h100")))}
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in names
    assert not names & {"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY",
                        "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"}
    no_dcp = Cluster(make_scenario(profiling={"dcp": False}))
    names = {s.name for s in samples(render_node(no_dcp, _node(no_dcp, "h100")))}
    assert not any(n.startswith("DCGM_FI_PROF_") for n in names)
    assert "DCGM_FI_DEV_GPU_UTIL" in names


def test_energy_counter_is_monotonic(make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario())
    node = _node(c, "h100")
    c.submit("train", run_seconds=1800)
    seen = []
    for _ in range(6):
        c.advance(600)
        seen.append([v["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
                     for v in by_gpu(render_node(c, node)).values()])
    for before, after in itertools.pairwise(seen):
        assert all(b < a for b, a in zip(before, after, strict=True))


def _promtool_problems(text: str) -> tuple[int, set[str]]:
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=limit(60), check=False)
    out = proc.stdout + proc.stderr
    assert "error while linting" not in out, out
    return proc.returncode, {line.split(" ", 1)[1] for line in out.splitlines() if line}


def test_promtool_lints_every_endpoint_like_the_real_exporter(
        make_scenario: Callable[..., Scenario]) -> None:
    """promtool parses every endpoint's text; its only lint remarks are the ones it also
    makes on real dcgm-exporter output (camelCase labels, counters without _total)."""
    _, real = _promtool_problems(REAL_L4)
    c = Cluster(make_scenario())
    for w in ("train", "shared", "slice", "spotjob"):
        c.submit(w, run_seconds=3600)
    c.advance(600)
    for node in c.live_nodes():
        code, ours = _promtool_problems(render_node(c, node))
        assert code in (0, 3), node.name
        assert ours <= real, ours - real


def test_same_seed_same_bytes_and_objects(make_scenario: Callable[..., Scenario]) -> None:
    from simulator.scenario import load_scenario

    def run(seed: int) -> tuple[list[str], str]:
        c = Cluster(load_scenario().model_copy(update={"seed": seed}))
        c.advance(86400)
        texts = [render_node(c, n) for n in sorted(c.live_nodes(), key=lambda n: n.name)]
        objects = json.dumps({k: c.store.list_objects(k) for k in ("Node", "Pod", "Namespace")},
                             sort_keys=True)
        return texts, objects

    first, second, other = run(7), run(7), run(8)
    assert first == second
    assert first[0] != other[0] and first[1] != other[1]


@pytest.mark.parametrize("pool", ["h100", "l4", "mig", "t4-spot"])
def test_every_gpu_present_when_healthy(pool: str,
                                        make_scenario: Callable[..., Scenario]) -> None:
    c = Cluster(make_scenario())
    node = _node(c, pool)
    assert {s.labels["UUID"] for s in samples(render_node(c, node))} == \
        {g.uuid for g in node.gpus}  # type: ignore[attr-defined]
