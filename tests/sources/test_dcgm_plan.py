"""A page read by its target's plan gives what the full parse gives, field for field.

``parse_page`` reads a page of a shape seen before by position; every case here is read
twice (the first read learns the plan, the second uses it) and compared with
``parse_dcgm_text``, and each value a plan cannot vouch for sends the page to the full
parse."""

from __future__ import annotations

import pytest

from exporter.model.records import ParseResult
from exporter.runtime.service import DCGM_FIELDS_READ
from exporter.sources.dcgm_parser import parse_dcgm_text
from exporter.sources.dcgm_plan import PagePlan, parse_page, split_page
from simulator.cluster import Cluster
from simulator.exposition import render_node
from simulator.scenario import Scenario
from tests.conftest import FIXTURES
from tests.sources.test_dcgm_parser import BASE, BLANKS, CASES, HEAD, OTHER, line

REAL = {p.name: p.read_bytes() for p in sorted((FIXTURES / "dcgm").glob("*.prom"))}
READS = {"every family": None, "families read": DCGM_FIELDS_READ}


def twice(body: bytes, read: frozenset[str] | None = None,
          max_devices: int = 1024) -> tuple[ParseResult, ParseResult, PagePlan]:
    """The page read on a first scrape (learning its plan) and on a second one."""
    first, plan = parse_page(body, None, max_devices, read)
    second, again = parse_page(body, plan, max_devices, read)
    assert again is plan  # same shape: the plan is kept
    return first, second, plan


def by_plan(body: bytes, read: frozenset[str] | None = None) -> bool:
    """Whether the plan of ``body`` reads it (rather than leaving it to the full parse)."""
    return PagePlan.learn(split_page(body), 1024, read).read(split_page(body)) is not None


@pytest.mark.parametrize("read", READS.values(), ids=READS)
@pytest.mark.parametrize("name", REAL)
def test_real_pages(name: str, read: frozenset[str] | None) -> None:
    body = REAL[name]
    first, second, _ = twice(body, read)
    assert first == second == parse_dcgm_text(body.decode(), read=read)


def test_a_real_page_is_read_by_plan() -> None:
    assert by_plan(REAL["dcgm-exporter_L4_kops_driver580.prom"], DCGM_FIELDS_READ)


def test_mig_gpus_printed_beside_their_instances_have_no_plan() -> None:
    """dcgm-exporter 2.4.0-rc.2 prints a partitioned GPU's own series: folding them into
    its instances weighs the values (a fatal XID), so the full parse reads such pages."""
    assert not by_plan(REAL["dcgm-exporter_A100_mig_gpu_and_instance_2.4.0-rc.2.prom"])


@pytest.mark.parametrize("read", READS.values(), ids=READS)
def test_simulated_fleet_pages_step_after_step(make_scenario: object,
                                               read: frozenset[str] | None) -> None:
    """Pages of every pool, time-shared and MIG included, over steps where pods come and
    go: each is read as the full parse reads it, by plan while the shape holds."""
    assert callable(make_scenario)
    scenario: Scenario = make_scenario()
    cluster = Cluster(scenario)
    plans: dict[str, PagePlan] = {}
    read_by_plan = 0
    for _ in range(12):
        cluster.advance(600)
        for node in cluster.live_nodes():
            body = render_node(cluster, node).encode()
            old = plans.get(node.name)
            result, plans[node.name] = parse_page(body, old, 1024, read)
            assert result == parse_dcgm_text(body.decode(), read=read), node.name
            read_by_plan += plans[node.name] is old
    assert read_by_plan > 0


@pytest.mark.parametrize(("case", "text"), [(c[0], c[1]) for c in CASES],
                         ids=[c[0] for c in CASES])
def test_parser_cases(case: str, text: str) -> None:
    first, second, _ = twice(text.encode())
    assert first == second == parse_dcgm_text(text)


@pytest.mark.parametrize(("case", "sample"), [(c[0], c[1]) for c in BLANKS],
                         ids=[c[0] for c in BLANKS])
def test_every_way_of_writing_a_line(case: str, sample: str) -> None:
    text = HEAD + sample + "\n" + OTHER
    first, second, _ = twice(text.encode())
    assert first == second == parse_dcgm_text(text)


def test_limits_hold_by_plan() -> None:
    many = "".join(line("DCGM_FI_DEV_GPU_UTIL", f'UUID="GPU-{i}"', "1") for i in range(300))
    first, second, _ = twice(many.encode(), max_devices=100)
    assert first == second and second.rejected == {"too_many_series": 200}
    long = line("DCGM_FI_DEV_GPU_UTIL", BASE + ',pod="' + "x" * 70_000 + '"', "1") + \
        line("DCGM_FI_DEV_FB_USED", BASE, "2")
    first, second, _ = twice(long.encode())
    assert first == second == parse_dcgm_text(long) and second.rejected == {"too_long": 1}


@pytest.mark.parametrize("digits", [10, 40_000, 70_000])
def test_a_long_value_on_a_known_shape(digits: int) -> None:
    """A value that makes its line too long is refused by plan as the full parse refuses
    it, however short the values on the page the plan was learnt from were; long values
    that keep their lines within bounds are read by plan."""
    def page(value: str) -> bytes:
        return (line("DCGM_FI_DEV_GPU_UTIL", BASE, value) +
                line("DCGM_FI_DEV_FB_USED", BASE, value)).encode()
    _, plan = parse_page(page("1"), None)
    body = page("0" * digits + "1")
    read, again = parse_page(body, plan)
    assert again is plan and read == parse_dcgm_text(body.decode())
    assert (plan.read(split_page(body), len(body)) is None) == (digits > 60_000)


LINES = [("DCGM_FI_DEV_GPU_UTIL", BASE + ',container="c",namespace="n",pod="a"'),
         ("DCGM_FI_DEV_GPU_UTIL", BASE + ',container="c",namespace="n",pod="b"'),
         ("DCGM_FI_DEV_FB_USED", BASE), ("DCGM_FI_DEV_FB_USED", BASE),
         ("DCGM_FI_DEV_GPU_UTIL", 'gpu="0"')]


def page(values: list[str], lines: list[tuple[str, str]] = LINES, head: str = HEAD) -> bytes:
    return (head + "".join(line(n, labels, v)
                           for (n, labels), v in zip(lines, values, strict=True))).encode()


"""A time-shared GPU printed for two pods, a duplicate series and one without a UUID."""
VALUES = [
    # (case, the values, whether the plan reads them)
    ("plain numbers", ["50", "50", "7", "8", "1"], True),
    ("exponent, sign, fraction", ["5e1", "+50.0", "-0", "1_000", ".5"], True),
    ("blank sentinel", ["50", "50", "9223372036854775794", "8", "1"], False),
    ("NaN on the second pod's line", ["50", "NaN", "7", "8", "1"], False),
    ("infinity on the duplicate", ["50", "50", "7", "+Inf", "1"], False),
    ("not a number on a refused series", ["50", "50", "7", "8", "one"], False),
    ("a value with a tab inside", ["50", "50\t9", "7", "8", "1"], False),
    ("an empty value", ["", "50", "7", "8", "1"], False),
    ("a value of 70,000 digits", ["0." + "0" * 70_000 + "1", "50", "7", "8", "1"], False),
]


@pytest.mark.parametrize(("case", "values", "planned"), VALUES, ids=[c[0] for c in VALUES])
def test_values_the_plan_cannot_vouch_for(case: str, values: list[str], planned: bool) -> None:
    """Rejects that depend on a value (blank, not finite, malformed, too long) are counted
    by the full parse: the plan, learnt on ordinary values, reads only pages it can vouch
    for, and every page reads as the full parse reads it."""
    _, plan = parse_page(page(["1"] * 5), None)
    body = page(values)
    result, kept = parse_page(body, plan)
    assert kept is plan
    assert result == parse_dcgm_text(body.decode())
    assert (plan.read(split_page(body)) is not None) == planned


ONES = ["1"] * 5
SHAPES = [
    # (case, the page changed)
    ("another pod on the GPU", page(ONES, [(n, lb.replace('pod="b"', 'pod="c"'))
                                           for n, lb in LINES])),
    ("a series gone", page(ONES[1:], LINES[1:])),
    ("a line gains a timestamp", page(["1", "1", "1 1700000000000", "1", "1"])),
    ("a help text changes", page(ONES, head=HEAD.replace("GPU utilization", "GPU busy"))),
]


@pytest.mark.parametrize(("case", "body"), SHAPES, ids=[c[0] for c in SHAPES])
def test_a_new_shape_is_learnt(case: str, body: bytes) -> None:
    _, plan = parse_page(page(ONES), None)
    assert not plan.fits(split_page(body))
    result, new = parse_page(body, plan)
    assert new is not plan and result == parse_dcgm_text(body.decode())
