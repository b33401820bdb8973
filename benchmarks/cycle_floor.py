"""The least a cycle's unavoidable work costs on this machine, part by part.

Whatever its design, a cycle at N nodes GETs every dcgm-exporter page, finds each sample's
value in it, checks that the rest of the page (its labels) is still the shape its reading
plan was learnt from, turns the values into floats, works out per GPU and sums per group,
appends a row per GPU to the warehouse and formats each series' value for ``/metrics``.
This script does that and nothing else (nothing is joined, decided, counted or kept), on
the pages of the simulator's ``fleet`` scenario, each part in every way measured; the
cheapest is the part's floor:

- get: the exporter's libcurl transport; libcurl's multi interface driven by
  ``perform`` and ``select`` instead.
- find: the exporter's split of a page around its values (one regular expression);
  ``bytes.split`` on the ``} `` before each value, which leaves each value joined to the
  line after it (less work than finding them, so a floor below the floor).
- check: Python's hash of the page less its values, as the exporter keys a plan.
- convert: ``float`` over the values; numpy's ``fromstring`` over them joined.
- compute: numpy over a matrix of the values (a row per GPU): utilisation, cost, and
  GPU-seconds, utilised seconds and cost summed per group four ways (``bincount``).
- warehouse: a row per GPU, as many columns as ``gpu_usage`` has, all numbers (strings
  as integer codes), in one Parquet file (the exporter's writer) appended to a DuckDB
  table (no key).
- render: ``repr`` of as many values as changed in the exporter's ``/metrics`` from one
  cycle to the next (a series whose value did not change need not be formatted again).

Rounds alternate with the exporter's own cycles (scrape, parse, join, compute, warehouse,
render, as ``exporter_cycle.py`` measures them), so that the two figures come from the same
minutes: this machine's speed moves by half and more within them. Prints each way's median
CPU, the sum of the floors, the exporter's cycle median beside it, and the reference loop
and memory walk of ``exporter_cycle.py``.

    .venv/bin/python benchmarks/cycle_floor.py [--nodes 1000] [--rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable
from itertools import repeat
from pathlib import Path
from typing import Any

import aiohttp
import exporter_cycle
import numpy as np
import pycurl  # type: ignore[import-untyped]

from exporter import duck
from exporter.runtime.app import open_exporter
from exporter.sinks.batch_files import write_parquet
from exporter.sinks.schema import GPU_USAGE
from exporter.sources import curl_transport, dcgm_plan

GROUPINGS = (20, 60, 30, 5)
"""How many node pools, namespaces, teams and GPU models the per-group sums go over."""


class Hold:
    """A receiver that keeps a page's bytes and nothing else."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.chunks: list[bytes] = []

    def body(self, chunk: bytes) -> None:
        self.chunks.append(chunk)

    def end(self, ending: curl_transport.Ending) -> None:
        pass

    def page(self) -> bytes:
        return b"".join(self.chunks)


class Multi:
    """libcurl's multi interface driven by ``perform`` and ``select``, a kept handle per
    target."""

    def __init__(self, urls: list[str]) -> None:
        self.multi = pycurl.CurlMulti()
        self.multi.setopt(pycurl.M_MAX_TOTAL_CONNECTIONS, 256)
        self.handles: list[tuple[Any, list[bytes]]] = []
        for url in urls:
            handle, chunks = pycurl.Curl(), list[bytes]()
            handle.setopt(pycurl.URL, url)
            handle.setopt(pycurl.WRITEFUNCTION, chunks.append)
            handle.setopt(pycurl.HTTPHEADER, ["Accept: text/plain", "Accept-Encoding: identity"])
            self.handles.append((handle, chunks))

    def get(self) -> list[bytes]:
        for handle, chunks in self.handles:
            chunks.clear()
            self.multi.add_handle(handle)
        active = self._perform()
        while active:
            self.multi.select(1.0)
            active = self._perform()
        for handle, _ in self.handles:
            self.multi.remove_handle(handle)
        return [b"".join(chunks) for _, chunks in self.handles]

    def _perform(self) -> int:
        while True:
            ret, active = self.multi.perform()
            if ret != pycurl.E_CALL_MULTI_PERFORM:
                return int(active)


def samples(text: bytes) -> list[bytes]:
    """The sample lines of an exposition."""
    return [line for line in text.split(b"\n") if line and not line.startswith(b"#")]


def cpu(f: Callable[[], Any]) -> tuple[float, Any]:
    start = time.process_time()
    out = f()
    return time.process_time() - start, out


class Floor:
    """One round of each way of doing each part, on the pages of one GET round."""

    def __init__(self, urls: list[str], series: int, gpus: int, table: Path) -> None:
        self.transport = curl_transport.CurlTransport(
            max_body_bytes=1 << 24, concurrency=256,
            headers=["Accept: text/plain", "Accept-Encoding: identity"])
        self.urls, self.multi, self.gpus = urls, Multi(urls), gpus
        rng = np.random.default_rng(0)
        self.codes = [rng.integers(0, n, gpus) for n in GROUPINGS]
        self.price = rng.random(gpus) * 10
        self.values = rng.random(series).tolist()
        self.types = types = {name: "BIGINT" if kind in ("VARCHAR", "TIMESTAMPTZ") else kind
                              for name, kind in GPU_USAGE.duckdb_types.items()}
        self.folder = table.parent
        self.con = duck.connect(str(table), memory_limit="64MB", threads=1)
        self.con.execute(f"CREATE TABLE usage ({', '.join(f'{n} {t}' for n, t in types.items())})")
        self.round = 0

    async def run(self) -> dict[str, float]:
        took: dict[str, float] = {}
        start = time.process_time()
        holds = [Hold(u) for u in self.urls]
        await self.transport.get(holds, within=30)
        pages = [h.page() for h in holds]
        took["get: the exporter's transport"] = time.process_time() - start
        took["get: perform and select"], again = cpu(self.multi.get)
        assert list(map(len, again)) == list(map(len, pages))  # the same pages, both ways
        del again
        took["find: regular-expression split"], parts = cpu(
            lambda: list(map(dcgm_plan.split_page, pages)))
        took["find: bytes.split (values left on their lines)"], _ = cpu(
            lambda: list(map(bytes.split, pages, repeat(b"} "))))
        took["check: hash of the page less its values"], _ = cpu(
            lambda: [hash(tuple(p[0::2])) for p in parts])
        took["convert: float"], floats = cpu(lambda: [list(map(float, p[1::2])) for p in parts])
        took["convert: numpy.fromstring"], arrays = cpu(
            lambda: [np.fromstring(b" ".join(p[1::2]), sep=" ") for p in parts])
        assert sum(map(len, floats)) == sum(map(len, arrays))
        took["compute: numpy over a row per GPU"], matrix = cpu(lambda: self.compute(arrays))
        took["warehouse: one Parquet file appended"], _ = cpu(lambda: self.append(matrix))
        took["render: repr of each series' value"], _ = cpu(
            lambda: "\n".join(map(repr, self.values)).encode().split(b"\n"))
        took["render: bytes formatting"], _ = cpu(lambda: [b"%r\n" % v for v in self.values])
        self.values = [v + 1.0 for v in self.values]
        self.round += 1
        return took

    def compute(self, arrays: list[np.ndarray]) -> np.ndarray:
        values = np.concatenate(arrays)
        fields = max(1, len(values) // self.gpus)
        matrix = values[:self.gpus * fields].reshape(self.gpus, fields)
        util = np.clip(matrix[:, 0] / 100.0, 0.0, 1.0)
        cost = self.price * 30 / 3600
        used = util * 30
        for codes in self.codes:
            np.bincount(codes, cost)
            np.bincount(codes, used)
            np.bincount(codes)
        return np.column_stack([util, cost, used, matrix])

    def append(self, matrix: np.ndarray) -> None:
        columns: dict[str, list[Any]] = {}
        numbers = iter(range(matrix.shape[1]))
        for i, (name, kind) in enumerate(self.types.items()):
            if kind == "BIGINT":
                columns[name] = self.codes[i % len(self.codes)].tolist()
            else:
                columns[name] = matrix[:, next(numbers, 0)].tolist()
        path = self.folder / f"batch-{self.round}.parquet"
        write_parquet(str(path), columns, self.types)
        self.con.execute(f"INSERT INTO usage SELECT * FROM read_parquet('{path}')")
        os.unlink(path)

    def close(self) -> None:
        self.transport.close()
        self.con.close()


async def main(nodes: int, rounds: int) -> None:
    proc, api, cfg, out = await exporter_cycle.simulate(nodes, "cycle-floor-")
    cycles: list[float] = []
    floors: list[dict[str, float]] = []
    async with open_exporter(cfg) as exporter, aiohttp.ClientSession() as s:
        await exporter.kube.wait_synced()

        async def cycle() -> float:
            async with s.post(f"{api}/sim/advance?seconds=30") as resp:
                now = (await resp.json())["now_unix"]
            await asyncio.sleep(0.2)  # let the watches deliver the step's changes
            start = time.process_time()
            await exporter.cycle(now)
            exporter.metrics.parts  # noqa: B018 (rendered once per cycle, when first asked)
            return time.process_time() - start

        for _ in range(3):  # the first cycles fill caches and learn the pages' plans
            await cycle()
        before = set(samples(exporter.metrics.text))
        await cycle()
        after = samples(exporter.metrics.text)
        changed = sum(line not in before for line in after)
        gpus = len(exporter.states)
        floor = Floor(list(exporter.targets()), changed, gpus, out / "floor.duckdb")
        print(f"{nodes} nodes: {len(floor.urls)} pages, {gpus} GPUs; /metrics has "
              f"{len(after)} series, {changed} of them with a new value after a cycle")
        try:
            await floor.run()  # connections opened, pages' shapes taken
            for _ in range(rounds):
                floors.append(await floor.run())
                cycles.append(await cycle())
        finally:
            floor.close()
    proc.terminate()
    await proc.wait()
    ways = {way: statistics.median(r[way] for r in floors) for way in floors[0]}
    least: dict[str, float] = {}
    print(f"CPU s, median of {rounds} rounds")
    for way, took in ways.items():
        part = way.split(":")[0]
        least[part] = min(least.get(part, took), took)
        print(f"  {way:48} {took:6.3f}")
    total = sum(least.values())
    print("floor: " + ", ".join(f"{p} {t:.3f}" for p, t in least.items()) + f"; sum {total:.3f}")
    cycle_median = statistics.median(cycles)
    print(f"the exporter's cycle in the same minutes: median {cycle_median:.3f} s, "
          f"{cycle_median / total:.1f} times the floor")
    print(f"reference loop {exporter_cycle.machine_reference():.2f} s, memory walk "
          f"{exporter_cycle.memory_reference():.2f} s")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    exporter_cycle.allow_open_files()
    asyncio.run(main(args.nodes, args.rounds))


if __name__ == "__main__":
    cli()
