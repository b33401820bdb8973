"""The GPUs' energy counters from one cycle to the next (``runtime.energy_counters``): what
each interval is given where DCGM collects less often than the exporter cycles, and what
is logged, once per episode, when a GPU's energy stops being its counter's."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import pytest

from exporter.model.compute import DeviceState
from exporter.model.energy import ENERGY, POWER
from exporter.runtime.energy_counters import ESTIMATED, EnergyCounters
from tests.exporter.test_compute import U, node, reading, states

CYCLE = 5.0


def read(counter_mj: float | None, watts: float = 100.0) -> list[DeviceState]:
    """The node's one GPU as a cycle reads it (None: not read)."""
    if counter_mj is None:
        return states([node()], {}, frozenset({"n1"}))
    return states([node()], {"n1": [reading(**{ENERGY: counter_mj, POWER: watts})]})


def run(pages: list[float | None], caplog: pytest.LogCaptureFixture
        ) -> tuple[list[tuple[str, float] | None], list[dict[str, Any]], dict[str, int],
                   EnergyCounters]:
    """Cycles every 5 s over ``pages`` (the counter each reads, mJ): each interval's basis
    and joules (None: unknown), what was logged, and the bases counted."""
    caplog.set_level(logging.INFO, logger="exporter.runtime.energy_counters")
    counters, bases = EnergyCounters(), defaultdict[str, int](int)
    got: list[tuple[str, float] | None] = []
    for k in range(len(pages) - 1):
        energy = counters.interval(read(pages[k]), read(pages[k + 1]), k * CYCLE, CYCLE, bases)
        e = energy.get(U)
        got.append(None if e is None else (e.basis, round(e.joules, 6)))
    logged = [{"event": r.getMessage()} | r.ctx for r in caplog.records]  # type: ignore[attr-defined]
    return got, logged, dict(bases), counters


def every(seconds: float, watts: float, cycles: int, start_mj: float = 0.0,
          reloads: tuple[float, ...] = ()) -> list[float]:
    """The counter as 5-second cycles read it from a DCGM that collects every ``seconds``
    (at 0, ``seconds``, ...) a GPU that draws ``watts``, its driver loaded ``start_mj``
    before 0 and again at each time of ``reloads``."""
    out = []
    for k in range(cycles + 1):
        collected = (k * CYCLE) // seconds * seconds
        loaded = max((r for r in reloads if r <= collected), default=None)
        out.append(watts * (collected - loaded) * 1000 if loaded is not None
                   else start_mj + watts * collected * 1000)
    return out


@pytest.mark.parametrize("collect", [30.0, 300.0])
def test_a_counter_collected_less_often_than_the_cycle_reads_steady_and_unflagged(
        collect: float, caplog: pytest.LogCaptureFixture) -> None:
    """DCGM collects every 30 s or 5 min, the exporter cycles every 5 s: every interval
    reads the GPU's 100 W, none reads 0, none is called a jump."""
    got, logged, bases, _ = run(every(collect, 100.0, round(4 * collect / CYCLE)), caplog)
    assert got == [("counter", 500.0)] * len(got)
    assert logged == []
    assert bases == {"counter": len(got)}


@pytest.mark.parametrize("collect", [30.0, 300.0])
def test_a_driver_reload_is_flagged_once_when_dcgm_collects_it(
        collect: float, caplog: pytest.LogCaptureFixture) -> None:
    """The driver reloads between two collections: until the collection that shows it, the
    page shows the old counter, the intervals read as before and nothing is logged; the
    interval that sees the counter go backwards is the power integral, flagged and logged;
    the next ones are the counter's again, unlogged; a second reload later is a second
    episode."""
    cycles = round(6 * collect / CYCLE)
    reloads = (2 * collect + 15.0, 4 * collect + 20.0)  # 15 s and 20 s after a collection
    pages: list[float | None] = list(every(collect, 100.0, cycles, 5e9, reloads))
    first, second = (round((r // collect + 1) * collect / CYCLE) - 1 for r in reloads)

    during, logged, _, counters = run(pages[:first + 1], caplog)
    assert during == [("counter", 500.0)] * first and logged == []
    assert counters.counters[U].counter_mj == pages[first]
    caplog.clear()

    got, logged, bases, counters = run(pages, caplog)
    assert got[first] == ("reset", 500.0)
    assert got[second] == ("reset", 500.0)
    assert [g for k, g in enumerate(got) if k not in (first, second)] == \
        [("counter", 500.0)] * (len(got) - 2)
    assert [(r["event"], r["node"], r["gpus"], r["gpu"]) for r in logged] == \
        [(ESTIMATED["reset"], "n1", 1, U)] * 2
    assert bases == {"counter": len(got) - 2, "reset": 2}
    assert counters.counters[U].counter_mj == pages[-1]


def test_a_gpu_not_read_starts_again_from_its_next_reading(
        caplog: pytest.LogCaptureFixture) -> None:
    """A cycle that does not read the GPU (its exporter down): that interval is its power
    held, its counter is forgotten, and the next reading is taken as first seen: the
    counter's next step is no jump and nothing is logged."""
    pages: list[float | None] = [*every(300.0, 100.0, 30), None, *every(300.0, 100.0, 70, 4e7)]
    got, logged, bases, counters = run(pages, caplog)
    assert got[30] == ("power", 500.0) and got[31] is None
    assert all(g is not None and g[0] == "counter" and g[1] > 0 for g in got[32:])
    assert logged == [] and bases["power"] == 1
    assert U in counters.counters
