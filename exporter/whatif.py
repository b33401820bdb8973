"""``gke-gpu-exporter whatif``: last week's jobs replayed on a cluster layout, and measured.

Each replay is the demo's machinery on the replay's scenario (``analytics.whatif.scenario``):
the simulator serves the layout's cluster on loopback and submits the trace's jobs at their
times; the exporter watches its Kubernetes API and scrapes its dcgm-exporters over real
HTTP, a cycle per step in virtual time, and writes a warehouse of its own, which
``analytics.whatif.measure`` reads as it reads the week's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from analytics.store import DuckDBStore
from analytics.week import Week
from analytics.whatif.measure import Measured, measure
from analytics.whatif.scenario import Built
from exporter.demo import Progress, demo_config, run_steps
from exporter.runtime.app import open_exporter
from simulator.server import SimulatorServer

WAREHOUSE = "warehouse.duckdb"


@dataclass(frozen=True, slots=True)
class Replayed:
    name: str
    built: Built
    warehouse: Path
    measured: Measured
    seconds: float
    """Wall time the replay took."""


async def replay(built: Built, week: Week, out: Path, progress: Progress,
                 prices: dict[str, object] | None = None) -> Path:
    """Run ``built``'s scenario over ``week`` with the exporter measuring it; the path of
    the warehouse it wrote."""
    out.mkdir(parents=True, exist_ok=True)
    (out / WAREHOUSE).unlink(missing_ok=True)
    scenario = built.scenario
    async with SimulatorServer(scenario) as sim:
        outputs = sim.write_outputs(out)
        cfg = demo_config(scenario, outputs.kubeconfig, out, prices=prices)
        async with open_exporter(cfg) as exporter:
            async with asyncio.timeout(30):
                await exporter.kube.wait_synced()
            await exporter.cycle(sim.cluster.now)
            steps = round((week.end - week.start).total_seconds() / scenario.step)
            await run_steps(sim, exporter, steps, progress)
            wh = exporter.warehouse
            assert wh is not None
            wh.flush(exporter.last_cycle_time, partial=True)
            wh.checkpoint()
    return out / WAREHOUSE


def replay_all(runs: Sequence[tuple[str, Built]], week: Week, out: Path,
               prices: dict[str, object] | None = None, quiet: bool = True
               ) -> list[Replayed]:
    """Each named scenario replayed in turn under one progress bar, then measured."""
    step = runs[0][1].scenario.step
    steps = round((week.end - week.start).total_seconds() / step) * len(runs)
    service = logging.getLogger("exporter")
    level = service.level
    if quiet:  # a replay's faults are the week's, logged when they happened
        service.setLevel(logging.ERROR)
    done = []
    try:
        with Progress(steps, step, desc="replaying") as progress:
            for name, built in runs:
                began = time.monotonic()
                path = asyncio.run(replay(built, week, out / name, progress, prices))
                store = DuckDBStore(path)
                try:
                    measured = measure(store, week)
                finally:
                    store.close()
                done.append(Replayed(name, built, path, measured, time.monotonic() - began))
    finally:
        service.setLevel(level)
    return done
