"""Memory a scrape takes is bounded by what it keeps, not by what targets send."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator

from aiohttp import web

from tests.conftest import FIXTURES

REAL = (FIXTURES / "dcgm" / "dcgm-exporter_L4_kops_driver580.prom").read_text()
UUID = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"
BODY_BYTES = 30 * 1000 * 1000
"""Just under the default per-target cap (``dcgm.max_body_bytes``, 32 MiB)."""
PER_BODY_MIB, SHARED_MIB = 10, 24
"""What docs/deploying.md promises (section "Memory"): a scrape round grows the process by at
most about 10 MiB per body in flight beside 24 MiB of caches, whatever the bodies' size."""


def family_blocks(gpus: int) -> list[bytes]:
    """The real dcgm-exporter page's families, each printed for ``gpus`` GPUs."""
    blocks = []
    for block in REAL.split("# HELP ")[1:]:
        head, sample = block.split("\n", 2)[:2], block.split("\n", 2)[2].rstrip("\n")
        lines = [("# HELP " + head[0] + "\n" + head[1] + "\n").encode()]
        for i in range(gpus):
            lines.append((sample.replace(UUID, f"GPU-{i:08x}-7953-256e-8f33-1343419b1a1c")
                          .replace('gpu="0"', f'gpu="{i}"') + "\n").encode())
        blocks.append(b"".join(lines))
    return blocks


@contextlib.asynccontextmanager
async def maximal_targets(n: int) -> AsyncIterator[list[str]]:
    """``n`` dcgm-exporters on loopback, each streaming ~30 MB of plausible lines (a page
    of ~5,000 GPUs) with its Content-Length."""
    per_gpu = sum(len(b) for b in family_blocks(1)) - sum(
        len(b.split(b"\n", 2)[0]) + len(b.split(b"\n", 2)[1]) + 2 for b in family_blocks(1))
    blocks = family_blocks(BODY_BYTES // per_gpu)
    size = sum(len(b) for b in blocks)

    async def page(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        resp.content_length = size
        await resp.prepare(request)
        for block in blocks:
            for at in range(0, len(block), 1 << 16):
                await resp.write(block[at:at + (1 << 16)])
        return resp

    runners = []
    for _ in range(n):
        app = web.Application()
        app.router.add_get("/metrics", page)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
    try:
        yield [f"http://127.0.0.1:{r.addresses[0][1]}/metrics" for r in runners]
    finally:
        for r in runners:
            await r.cleanup()


async def test_six_maximal_bodies_at_once_stay_within_the_documented_bound() -> None:
    async with maximal_targets(6) as urls:
        probe = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.exporter.dcgm_memory_probe", *urls,
            stdout=subprocess.PIPE)
        out, _ = await probe.communicate()
    got = json.loads(out)
    assert got["errors"] == [] and got["answered"] == 6
    assert all(29_000_000 < b <= 32 * 1024 * 1024 for b in got["bytes_read"])
    assert got["devices"] == [1024] * 6, "each keeps what the per-target cap allows"
    grown_mib = (got["peak_kib"] - got["before_kib"]) / 1024
    assert grown_mib < SHARED_MIB + 6 * PER_BODY_MIB, f"the scrape took {grown_mib:.0f} MiB"
