"""Scrape dcgm-exporter targets once in a fresh process; print the peak RSS it took.

Run as ``python -m tests.exporter.dcgm_memory_probe URL...``: prints one JSON object,
the resident set before and at the peak of the scrape (KiB) and what was kept."""

from __future__ import annotations

import asyncio
import json
import resource
import sys

from exporter.model.records import TargetScrape
from exporter.runtime.service import DCGM_FIELDS_READ
from exporter.sources.dcgm import DcgmSource


async def main(urls: list[str]) -> dict[str, object]:
    source = DcgmSource(timeout_seconds=120, max_body_bytes=32 * 1024 * 1024,
                        read=DCGM_FIELDS_READ)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    results = await source.fetch(urls)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    source.close()
    scrapes = [r for r in results if isinstance(r, TargetScrape)]
    return {"before_kib": before, "peak_kib": peak, "answered": len(scrapes),
            "bytes_read": [s.bytes_read for s in scrapes],
            "devices": [len(s.result.devices) for s in scrapes],
            "errors": [str(r) for r in results if not isinstance(r, TargetScrape)]}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1:]))))
