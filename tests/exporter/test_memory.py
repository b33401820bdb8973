"""The process's memory tuning: the allocator's calls it makes, and the garbage collector
set while the exporter runs and put back when it closes."""

from __future__ import annotations

import asyncio
import gc
import platform
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.demo import demo_config
from exporter.runtime.app import open_exporter
from exporter.runtime.memory import M_MMAP_THRESHOLD, MemoryTuning, glibc
from simulator.scenario import Scenario
from simulator.server import SimulatorServer
from tests.timing import limit


class Recorded:
    """An allocator that records the calls made to it."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def mallopt(self, param: int, value: int, /) -> int:
        self.calls.append(("mallopt", param, value))
        return 1

    def malloc_trim(self, pad: int, /) -> int:
        self.calls.append(("malloc_trim", pad))
        return 1


@pytest.fixture
def collector() -> Iterator[None]:
    """The collector as the test found it, whatever the test leaves."""
    thresholds = gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)


def test_the_allocator_gets_the_mmap_threshold_and_each_trim() -> None:
    allocator = Recorded()
    memory = MemoryTuning(allocator, mmap_threshold_bytes=4096)
    memory.tune_allocator()
    memory.give_back()
    memory.give_back()
    assert allocator.calls == [("mallopt", M_MMAP_THRESHOLD, 4096), ("malloc_trim", 0),
                               ("malloc_trim", 0)]


@pytest.mark.usefixtures("collector")
def test_without_glibc_the_allocator_is_left_alone_and_the_collector_still_tuned() -> None:
    memory = MemoryTuning(None, gc_thresholds=(50_000, 20, 30))
    memory.tune_allocator()
    memory.give_back()
    memory.tune_collector()
    assert gc.get_threshold() == (50_000, 20, 30)


def test_this_process_has_glibc_where_it_runs_on_linux() -> None:
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    allocator = glibc()
    assert allocator is not None
    assert allocator.malloc_trim(0) in (0, 1)  # 1: memory was given back


@pytest.mark.usefixtures("collector")
def test_the_collector_keeps_its_thresholds_until_close() -> None:
    gc.set_threshold(700, 10, 10)
    memory = MemoryTuning(None, gc_thresholds=(50_000, 20, 30))
    memory.tune_collector()
    assert gc.get_threshold() == (50_000, 20, 30)
    memory.tune_collector()  # again: what close restores is still the first
    memory.close()
    assert gc.get_threshold() == (700, 10, 10)
    memory.close()
    assert gc.get_threshold() == (700, 10, 10), "a second close changes nothing"


@pytest.mark.usefixtures("collector")
def test_what_is_frozen_is_let_go_on_close() -> None:
    memory = MemoryTuning(None)
    memory.freeze()
    assert gc.get_freeze_count() > 0
    memory.close()
    assert gc.get_freeze_count() == 0


@pytest.mark.usefixtures("collector")
def test_a_tuning_never_tuned_leaves_the_collector_alone() -> None:
    gc.set_threshold(900, 9, 9)
    MemoryTuning(None).close()
    assert gc.get_threshold() == (900, 9, 9)


@pytest.mark.usefixtures("collector")
async def test_the_service_runs_at_its_tuning_and_puts_the_collector_back_on_exit(
        make_server: Callable[..., Any], make_scenario: Callable[..., Scenario],
        tmp_path: Path) -> None:
    sim: SimulatorServer = await make_server(make_scenario())
    cfg = demo_config(sim.scenario, sim.write_outputs(tmp_path).kubeconfig, tmp_path)
    gc.set_threshold(800, 8, 8)
    async with open_exporter(cfg) as exporter:
        assert gc.get_threshold() == exporter.memory.gc_thresholds != (800, 8, 8)
        async with asyncio.timeout(limit(10)):
            await exporter.kube.wait_synced()
        await exporter.cycle(sim.cluster.now)
        assert gc.get_freeze_count() > 0, "what start-up built is set aside"
    assert gc.get_threshold() == (800, 8, 8)
    assert gc.get_freeze_count() == 0
