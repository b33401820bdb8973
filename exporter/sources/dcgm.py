"""DCGM readings from dcgm-exporter endpoints.

``parse_dcgm_text`` turns one endpoint's text exposition into one ``DeviceReading`` per
DCGM entity (a GPU, or a MIG instance of it). It accepts what real dcgm-exporters print:

- ``Hostname`` or ``hostname``; ``UUID`` or ``uuid``; pod labels as ``pod``/``namespace``/
  ``container``, ``pod_name``/``pod_namespace``/``container_name`` (``--use-old-namespace``)
  or ``exported_pod``/``exported_namespace``/``exported_container`` (a ServiceMonitor
  without honorLabels);
- MIG instances (``GPU_I_PROFILE``/``GPU_I_ID``) carrying the parent GPU's UUID;
- counters without ``_total``; a time-shared GPU printed once per pod sharing it.

A missing series stays missing (unknown is absent, never zero); DCGM's blank sentinels
(values >= 9.2e18), NaN and infinities are dropped and counted. Malformed lines, duplicate
series, oversized lines and series beyond the per-target cap are rejected and counted,
never fatal: the valid rest is kept.

The parser is the hot path (8,000 GPUs x ~30 fields every interval), so it does plain
string slicing and parses each distinct label set once.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from exporter.errors import SourceDataError, SourceTimeout, SourceUnavailable

BLANK_THRESHOLD = 9.2e18
"""DCGM's blank values (DCGM_INT64_BLANK and friends) start just above this."""
MAX_LINE_BYTES = 64 * 1024
MAX_DEVICES_PER_TARGET = 1024

# exported_* first: when present, the plain labels name the dcgm-exporter pod itself.
_POD_KEYS = (("exported_pod", "exported_namespace", "exported_container"),
             ("pod", "namespace", "container"),
             ("pod_name", "pod_namespace", "container_name"))


@dataclass(frozen=True, slots=True)
class PodOnDevice:
    namespace: str
    pod: str
    container: str


@dataclass(slots=True)
class DeviceReading:
    """One DCGM entity in one scrape: identity, the pods on it, and its field values."""

    uuid: str
    gpu_index: str
    hostname: str
    model_name: str
    mig_profile: str | None
    mig_instance: str | None
    pods: list[PodOnDevice] = field(default_factory=list)
    fields: dict[str, float] = field(default_factory=dict)

    @property
    def device_id(self) -> str:
        return self.uuid if self.mig_instance is None else f"{self.uuid}/{self.mig_instance}"


@dataclass(slots=True)
class ParseResult:
    devices: list[DeviceReading]
    samples: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    """Counts of dropped lines by reason: malformed, no_gpu_uuid, blank, not_finite,
    duplicate, too_long, too_many_series."""

    def reject(self, reason: str, n: int = 1) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + n


def _parse_labels(text: str) -> dict[str, str] | None:
    """``a="x",b="y"`` to a dict; None if malformed. Handles escaped quotes."""
    if "\\" not in text:
        body = text.rstrip(",")
        if not body:
            return {}
        if not body.endswith('"'):
            return None
        out: dict[str, str] = {}
        for part in body[:-1].split('",'):
            eq = part.find('="')
            if eq <= 0:
                return None
            out[part[:eq]] = part[eq + 2:]
        return out
    out = {}
    i, n = 0, len(text)
    while i < n:
        eq = text.find("=", i)
        if eq < 0 or eq + 1 >= n or text[eq + 1] != '"':
            return None
        name = text[i:eq].strip()
        j = eq + 2
        chars = []
        while j < n and text[j] != '"':
            if text[j] == "\\" and j + 1 < n:
                j += 1
                chars.append({"n": "\n", "\\": "\\", '"': '"'}.get(text[j], text[j]))
            else:
                chars.append(text[j])
            j += 1
        if j >= n:
            return None
        out[name] = "".join(chars)
        i = j + 1
        if i < n and text[i] == ",":
            i += 1
    return out


def _identity(labels: dict[str, str]) -> tuple[tuple[str, str], DeviceReading,
                                               PodOnDevice | None] | None:
    uuid = labels.get("UUID") or labels.get("uuid")
    if not uuid:
        return None
    instance = labels.get("GPU_I_ID")
    reading = DeviceReading(
        uuid=uuid, gpu_index=labels.get("gpu", ""),
        hostname=labels.get("Hostname") or labels.get("hostname") or "",
        model_name=labels.get("modelName", ""), mig_profile=labels.get("GPU_I_PROFILE"),
        mig_instance=instance)
    pod = None
    for pk, nk, ck in _POD_KEYS:
        if labels.get(pk):
            pod = PodOnDevice(labels.get(nk, ""), labels[pk], labels.get(ck, ""))
            break
    return (uuid, instance or ""), reading, pod


def parse_dcgm_text(text: str, max_devices: int = MAX_DEVICES_PER_TARGET) -> ParseResult:
    """Parse one dcgm-exporter scrape into device readings (see module docstring)."""
    result = ParseResult(devices=[])
    devices: dict[tuple[str, str], DeviceReading] = {}
    # label text -> (its device, whether these labels are the device's first label set)
    # (or, for labels we refuse, the reason for refusing them)
    series: dict[str, tuple[DeviceReading, bool] | str] = {}
    samples = 0
    for line in text.split("\n"):
        if not line or line[0] == "#":
            continue
        rb = line.rfind("} ")
        lb = line.find("{", 0, rb)
        if lb <= 0 or len(line) > MAX_LINE_BYTES:
            result.reject("too_long" if len(line) > MAX_LINE_BYTES else "malformed")
            continue
        try:
            value = float(line[rb + 2:])
        except ValueError:
            try:  # a timestamp after the value
                value = float(line[rb + 2:].split(" ", 1)[0])
            except ValueError:
                result.reject("malformed")
                continue
        raw = line[lb + 1:rb]
        entry = series.get(raw)
        if entry is None:
            entry = series[raw] = _new_series(raw, devices, max_devices)
        if isinstance(entry, str):
            result.reject(entry)
            continue
        if not -BLANK_THRESHOLD < value < BLANK_THRESHOLD:
            result.reject("not_finite" if value != value or math.isinf(value) else "blank")
            continue
        device, primary = entry
        name = line[:lb]
        if name in device.fields:
            if primary:
                result.reject("duplicate")
            # else: a time-shared GPU printed again for another pod, the same reading
            continue
        device.fields[name] = value
        samples += 1
    result.samples = samples
    result.devices = list(devices.values())
    return result


def _new_series(raw: str, devices: dict[tuple[str, str], DeviceReading],
                max_devices: int) -> tuple[DeviceReading, bool] | str:
    labels = _parse_labels(raw)
    if labels is None:
        return "malformed"
    ident = _identity(labels)
    if ident is None:
        return "no_gpu_uuid"
    key, fresh, pod = ident
    device = devices.get(key)
    primary = device is None
    if device is None:
        if len(devices) >= max_devices:
            return "too_many_series"
        device = devices[key] = fresh
    if pod is not None and pod not in device.pods:
        device.pods.append(pod)
    return device, primary


@dataclass(slots=True)
class TargetScrape:
    """What one target gave this cycle."""

    target: str
    result: ParseResult
    duration_seconds: float
    bytes_read: int


class DcgmSource:
    """Scrapes dcgm-exporter endpoints concurrently, each with its own timeout and cap."""

    name = "dcgm"

    def __init__(self, session: aiohttp.ClientSession, timeout_seconds: float,
                 max_body_bytes: int, max_devices: int = MAX_DEVICES_PER_TARGET,
                 concurrency: int = 256) -> None:
        self._session = session
        self._timeout = timeout_seconds
        self._max_body = max_body_bytes
        self._max_devices = max_devices
        self._slots = asyncio.Semaphore(concurrency)
        """Bodies in memory at once: each is read, parsed and dropped while others wait.
        The timeout runs from the start of the round, waiting for a slot included, so a
        round never outlasts it however many targets hang."""

    async def fetch(self, targets: Sequence[str]
                    ) -> list[TargetScrape | SourceUnavailable | SourceTimeout | SourceDataError]:
        """One scrape of every target; a failed target is returned as its error."""
        return await asyncio.gather(*(self._one(t) for t in targets))

    async def _one(self, target: str
                   ) -> TargetScrape | SourceUnavailable | SourceTimeout | SourceDataError:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout), self._slots:
                began = loop.time()
                body = await self._get(target)
        except TimeoutError:
            return SourceTimeout("dcgm", target, f"no complete answer in {self._timeout:g} s")
        except (SourceUnavailable, SourceDataError) as exc:
            return exc
        except aiohttp.ClientError as exc:
            return SourceUnavailable("dcgm", target, f"{type(exc).__name__}: {exc}")
        text = body.decode("utf-8", errors="replace")
        result = await asyncio.to_thread(parse_dcgm_text, text, self._max_devices) \
            if len(body) > 4 * 1024 * 1024 else parse_dcgm_text(text, self._max_devices)
        if not result.devices:
            return SourceDataError("dcgm", target, "no DCGM GPU samples in the answer")
        return TargetScrape(target, result, loop.time() - began, len(body))

    async def _get(self, target: str) -> bytes:
        async with self._session.get(target, headers={"Accept": "text/plain"}) as resp:
            if resp.status != 200:
                raise SourceUnavailable("dcgm", target, f"HTTP {resp.status}")
            if resp.content_length is not None:
                if resp.content_length > self._max_body:
                    raise SourceDataError("dcgm", target,
                                          f"body of {resp.content_length} bytes exceeds the "
                                          f"{self._max_body}-byte cap")
                return await resp.read()  # the length is known and within the cap
            chunks = []
            size = 0
            async for chunk in resp.content.iter_chunked(256 * 1024):
                size += len(chunk)
                if size > self._max_body:
                    raise SourceDataError("dcgm", target,
                                          f"body exceeds the {self._max_body}-byte cap")
                chunks.append(chunk)
            return b"".join(chunks)
