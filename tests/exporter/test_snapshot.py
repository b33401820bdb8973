"""Answers placed on their nodes: what a cycle knows, what it cannot tell, and what it
could not place."""

from __future__ import annotations

from dataclasses import replace

from exporter.errors import SourceTimeout
from exporter.model.placement import Placement
from exporter.model.records import ParseResult, TargetScrape
from exporter.model.snapshot import place_answers
from tests.exporter.test_compute import node, reading

NODES = {n: node(n, address=f"10.0.0.{i}") for i, n in enumerate(("n1", "n2", "n3"), 1)}
PLACE = Placement(NODES, [])
A, B = "http://10.0.0.1:9400/metrics", "http://10.0.0.2:9400/metrics"


def answer(url: str, *hosts: str, complete: bool = True) -> TargetScrape:
    devices = [replace(reading(f"GPU-{url[-12:]}-{i}", DCGM_FI_DEV_GPU_UTIL=1.0), hostname=h)
               for i, h in enumerate(hosts)]
    return TargetScrape(url, ParseResult(devices), 0.1, 100, complete)


def test_each_gpu_goes_to_the_node_its_labels_name_not_the_targets() -> None:
    placed = place_answers({A: None}, [answer(A, "n1", "n3")], PLACE, False, {})
    assert {n: len(d) for n, d in placed.readings.items()} == {"n1": 1, "n3": 1}
    assert placed.covered == {A: {"n1", "n3"}} and not placed.unknown_nodes


def test_an_exporter_that_answers_without_gpus_says_its_node_has_none() -> None:
    placed = place_answers({A: "n1"}, [answer(A)], PLACE, False, {})
    assert placed.readings == {"n1": []}


def test_a_failed_target_leaves_its_nodes_unknown_not_down() -> None:
    failed = SourceTimeout("dcgm", B, "no answer")
    placed = place_answers({A: None, B: None}, [answer(A, "n1"), failed], PLACE, False,
                           {B: {"n3"}})
    assert placed.unknown_nodes == {"n2", "n3"}   # its own node (by address) and its last
    assert "n2" not in placed.readings and "n3" not in placed.readings


def test_a_failed_query_api_leaves_every_node_unknown() -> None:
    placed = place_answers({"http://prometheus:9090": None},
                           [SourceTimeout("dcgm", "http://prometheus:9090", "slow")],
                           PLACE, True, {})
    assert placed.unknown_nodes == set(NODES) and not placed.readings


def test_a_gpu_on_no_known_node_is_counted_with_its_samples() -> None:
    placed = place_answers({"http://svc/metrics": None},
                           [answer("http://svc/metrics", "n1", "elsewhere", "gone")],
                           PLACE, False, {})
    lost, stray = placed.unplaced["http://svc/metrics"]
    assert lost == 2 and stray.hostname == "elsewhere"   # one field each
    assert set(placed.readings) == {"n1"}


def test_one_per_container_answer_makes_the_round_incomplete() -> None:
    placed = place_answers({A: None, B: None},
                           [answer(A, "n1"), answer(B, "n2", complete=False)], PLACE, False, {})
    assert not placed.complete
