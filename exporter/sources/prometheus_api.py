"""DCGM readings from a Prometheus HTTP API: a cluster's Prometheus that already scrapes
dcgm-exporter, or Google Managed Prometheus' Prometheus-compatible endpoint.

One instant query per interval asks for the DCGM fields the exporter uses. A
ServiceMonitor without ``honorLabels`` renames dcgm-exporter's ``pod``/``namespace``/
``container`` to ``exported_pod``/``exported_namespace``/``exported_container`` (the plain
ones then name the dcgm-exporter pod): the exported ones win, as in the scrape parser.
Prometheus drops dcgm-exporter's empty ``pod=""`` on a GPU no pod holds, so there the
target's own ``pod``/``namespace`` labels remain, naming the dcgm-exporter pod: labels in
the dcgm-exporters' namespace are not a workload's and are ignored. The whole cluster
comes from one target, so when it fails every node is unknown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import aiohttp

from exporter.errors import SourceDataError, SourceTimeout, SourceUnavailable
from exporter.model.records import ParseResult, PodInfo, TargetScrape
from exporter.sources.dcgm_devices import collect

_Failure = SourceUnavailable | SourceTimeout | SourceDataError
MAX_DEVICES = 1_000_000
"""Bound on the devices one answer may create (memory stays bounded)."""


_POD_LABELS = ("pod", "namespace", "container")


def readings(result: Sequence[dict[str, Any]], max_devices: int,
             exporter_namespace: str = "") -> ParseResult:
    """Devices from an instant query's vector result, rejects counted as the parser does.
    ``exporter_namespace``: where the dcgm-exporters run (their pods hold no GPU)."""
    return collect((_sample(s, exporter_namespace) for s in result), max_devices)


def _sample(sample: dict[str, Any], exporter_namespace: str
            ) -> tuple[str, dict[str, str], float | None]:
    labels = sample.get("metric") or {}
    if exporter_namespace and labels.get("namespace") == exporter_namespace:
        labels = {k: v for k, v in labels.items() if k not in _POD_LABELS}
    try:
        value: float | None = float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        value = None
    return labels.get("__name__", ""), labels, value


class PrometheusApiSource:
    """``fetch`` as ``DcgmSource`` has it, over one Prometheus query."""

    name = "dcgm"
    whole_cluster = True
    """One target stands for every node."""

    def __init__(self, session: aiohttp.ClientSession, url: str, fields: Collection[str],
                 selector: str, timeout_seconds: float, exporter_namespace: str = "",
                 max_devices: int = MAX_DEVICES) -> None:
        self._session = session
        self._exporter_namespace = exporter_namespace
        self.url = url.rstrip("/")
        names = "|".join(sorted(fields))
        extra = f",{selector}" if selector else ""
        self.query = f'{{__name__=~"{names}"{extra}}}'
        self._timeout = timeout_seconds
        self._max_devices = max_devices

    def targets(self, pods: Iterable[PodInfo]) -> dict[str, str | None]:
        """The one target, for every node."""
        return {self.url: None}

    def close(self) -> None:
        """Nothing to let go of: the client is the caller's."""

    async def fetch(self, targets: Sequence[str]) -> list[TargetScrape | _Failure]:
        return [await self._one(t) for t in targets]

    async def _one(self, target: str) -> TargetScrape | _Failure:
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            async with asyncio.timeout(self._timeout), self._session.post(
                    f"{target}/api/v1/query", data={"query": self.query}) as resp:
                if resp.status != 200:
                    return SourceUnavailable("dcgm", target, f"HTTP {resp.status}")
                body = await resp.json(content_type=None)
        except TimeoutError:
            return SourceTimeout("dcgm", target, f"no answer in {self._timeout:g} s")
        except aiohttp.ClientError as exc:
            return SourceUnavailable("dcgm", target, f"{type(exc).__name__}: {exc}")
        except ValueError as exc:
            return SourceDataError("dcgm", target, f"not JSON: {exc}")
        data = body.get("data") if isinstance(body, dict) else None
        if body.get("status") != "success" or not isinstance(data, dict) or \
                data.get("resultType") != "vector":
            return SourceDataError("dcgm", target, f"query failed: {str(body)[:200]}")
        result = readings(data.get("result") or [], self._max_devices,
                          self._exporter_namespace)
        if not result.devices:
            return SourceDataError("dcgm", target, "no DCGM GPU series in the answer")
        return TargetScrape(target, result, loop.time() - began, 0)
