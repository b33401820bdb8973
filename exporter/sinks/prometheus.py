"""``/metrics``: the catalogue (``exporter.metrics.families``) as Prometheus' text exposition
format 0.0.4, rendered once per cycle from the cycle's view.

The text is written directly: at 8,000 GPUs a generic client library spends seconds per
render. What a series' text comes from is kept from one cycle to the next (its line, which
starts with its ``name{labels} `` prefix, and its last value), so a render formats only
the values that changed. The per-device families (``families.DEVICE_FAMILIES``: ~13
samples per GPU, nine tenths of a fleet's exposition) are written column by column in one
pass over the devices that keeps each device's lines together (``_device_lines``): 0.06 s
CPU a render at 8,000 GPUs, where reading their samples family by family took 0.16 s.
Their text is their samples, series for series (``tests/exporter/test_exporter.py``). What
is kept is a writer's (``ExpositionWriter``), one per endpoint: two endpoints share none of
it.
"""

from __future__ import annotations

import functools
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from exporter.metrics.families import (
    DEVICE_FAMILIES,
    DEVICE_LABELS,
    FAMILIES,
    PREFIX,
    READING_LABELS,
    AnyFamily,
    Labels,
    MetricsView,
    SortedTable,
    is_histogram,
)
from exporter.model.compute import DeviceState


def _escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _number(value: float) -> str:
    if value.__class__ is float:  # the common case first, with the same text as below
        if value.is_integer() and -1e15 < value < 1e15:
            return str(int(value))
        return repr(value)
    if value.__class__ is int:
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def label_text(names: Labels, values: Labels) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in zip(names, values, strict=True))


_UNSET: object = object()
"""No value yet: unequal to every value, so the first one always writes its line. Values
that compare equal have the same text (``_number``: 1 and 1.0 both give ``1``)."""


def _series(prefix: str) -> list[Any]:
    """A series as a family keeps it: ``[line, value, cut]``, the line's first ``cut``
    bytes its ``name{labels} `` prefix (built once; the line again only when the value
    changes, from the prefix it starts with: the prefix is not kept twice)."""
    line = prefix.encode()
    return [line, _UNSET, len(line)]


class _Kept:
    """What a family keeps from one cycle to the next: its HELP and TYPE lines, and each
    series (``_series``) by its label values. Lines are bytes, joined once per render
    (86,000 lines of a fleet's size: 2 ms, where joining them as str and encoding the text
    took 21 ms); a family's text is not kept as well, which would hold the exposition
    twice (17 MB at 8,000 GPUs)."""

    __slots__ = ("cluster", "head", "lines", "series", "table")

    def __init__(self, family: AnyFamily) -> None:
        name = family.exposed
        help_text = family.help.replace("\\", "\\\\").replace("\n", "\\n")
        self.head = f"# HELP {name} {help_text}\n# TYPE {name} {family.kind}\n".encode()
        self.series: dict[object, list[Any]] = {}
        # a SortedTable's: a copy of the table, its cluster and the lines it gave
        self.table: dict[Any, float] | None = None
        self.cluster = ""
        self.lines: list[bytes] = []


def _lines(family: AnyFamily, view: MetricsView, kept: _Kept) -> list[bytes]:
    series = kept.series
    names = family.labels
    lines: list[bytes] = []
    append = lines.append
    if is_histogram(family):
        base = PREFIX + family.name
        for values, b in family.samples(view):
            labels = label_text(names, values)
            for part, bound, n in b.parts():
                s = series.get((part, bound, values))
                if s is None:
                    extra = (',' if labels else '') + f'le="{bound}"' if bound else ""
                    s = series[(part, bound, values)] = _series(
                        f"{base}{part}{{{labels}{extra}}} ")
                if s[1] != n:
                    s[1] = n
                    s[0] = s[0][:s[2]] + _number(n).encode() + b"\n"
                append(s[0])
        return lines
    name = family.exposed
    samples = family.samples(view)
    if isinstance(samples, SortedTable):
        if samples.table == kept.table and samples.cluster == kept.cluster:
            return kept.lines
        kept.table, kept.cluster = dict(samples.table), samples.cluster
        kept.lines = lines
    for key, value in samples:
        s = series.get(key)
        if s is None:
            labels = label_text(names, key)
            s = series[key] = _series(f"{name}{{{labels}}} " if labels else f"{name} ")
        if s[1] != value:
            s[1] = value
            s[0] = s[0][:s[2]] + _number(value).encode() + b"\n"
        append(s[0])
    return lines


def _device_label_text(cluster: str, node: str, pool: str, zone: str, model: str,
                   provisioning: str, gpu: str, uuid: str, mig_profile: str,
                   instance: str) -> str:
    return label_text(DEVICE_LABELS, (cluster, node, pool, zone, model, provisioning, gpu,
                                      uuid, mig_profile, instance))


_LabelCache = Callable[[str, str, str, str, str, str, str, str, str, str], str]
"""``_device_label_text``, remembered (``ExpositionWriter``)."""


def _labels_of(cluster: str, d: DeviceState, label_cache: _LabelCache) -> str:
    """The device's label text; the same GPU gets the same text every cycle (cached)."""
    instance = d.device_id.rsplit("/", 1)[1] if "/" in d.device_id else ""
    return label_cache(cluster, d.node, d.pool, d.zone, d.accelerator, d.provisioning,
                       d.gpu_index, d.gpu_uuid, d.mig_profile or "", instance)


class _Device:
    """One device's lines, kept from one cycle to the next (keyed by everything its labels
    come from): utilisation, memory in use and the readings are rewritten when they change,
    the rest when the device's state, reason, price, owners or memory size change."""

    __slots__ = ("alloc", "available", "labels", "price", "reading_lines", "reading_values",
                 "readings", "settled", "source", "state", "total", "used", "used_line", "util",
                 "util_line")

    def __init__(self, labels: str) -> None:
        self.labels = labels
        self.readings = b""
        """``{labels} `` of the GPU's readings; empty until it has one."""
        self.reading_values: list[float | None] = [None] * len(DEVICE_FAMILIES.readings)
        self.reading_lines = [b""] * len(DEVICE_FAMILIES.readings)
        self.util: object = _UNSET
        self.source: str | None = None
        self.util_line = b""
        self.used: object = _UNSET
        self.used_line = b""
        self.settled: object = _UNSET
        self.total = self.available = self.state = self.price = b""
        self.alloc: list[bytes] = []


def _device_lines(v: MetricsView, devices: dict[tuple[str, ...], _Device],
                  label_cache: _LabelCache) -> Mapping[AnyFamily, list[bytes]]:
    """The per-device families' lines, in one pass over the devices (``devices``: each
    one's lines from the last cycle; ``label_cache``: their label texts)."""
    c = v.cluster
    g = DEVICE_FAMILIES
    out: dict[AnyFamily, list[bytes]] = {f: [] for f in g}
    util, mem_used, mem_total, available, state, price, alloc = (f.exposed for f in (
        g.utilization, g.memory_used, g.memory_total, g.available, g.state, g.price,
        g.allocation))
    add_util, add_used, add_total, add_available, add_state, add_price = (out[f].append for f in (
        g.utilization, g.memory_used, g.memory_total, g.available, g.state, g.price))
    add_alloc = out[g.allocation].extend
    read = [(r.dcgm_field, r.family.exposed.encode(), r.scale, out[r.family].append)
            for r in g.readings]
    read_gpus: set[str] = set()
    for d in v.states:
        key = (c, d.node, d.pool, d.zone, d.accelerator, d.provisioning, d.gpu_index,
               d.gpu_uuid, d.mig_profile or "", d.device_id)
        e = devices.get(key)
        if e is None:
            e = devices[key] = _Device(_labels_of(c, d, label_cache))
        u = d.utilization
        if u is not None:
            if u != e.util or d.utilization_source != e.source:
                e.util, e.source = u, d.utilization_source
                e.util_line = (f'{util}{{{e.labels},source="{d.utilization_source}"}} '
                               f"{_number(u)}\n").encode()
            add_util(e.util_line)
        used, total = d.memory_used_bytes, d.memory_total_bytes
        if used is not None:
            if used != e.used:
                e.used = used
                e.used_line = f"{mem_used}{{{e.labels}}} {_number(used)}\n".encode()
            add_used(e.used_line)
        settled = (d.state, d.reason, d.price_usd_per_hour, d.owners, total)
        if settled != e.settled:
            e.settled = settled
            labels = e.labels
            e.total = b"" if total is None else \
                f"{mem_total}{{{labels}}} {_number(total)}\n".encode()
            e.available = (f"{available}{{{labels}}} "
                           f"{'0' if d.state == 'unavailable' else '1'}\n").encode()
            e.state = (f'{state}{{{labels},state="{d.state}",reason="{d.reason or ""}"}} '
                       "1\n").encode()
            e.price = (b"" if d.price_usd_per_hour is None else
                       f"{price}{{{labels}}} {_number(d.price_usd_per_hour)}\n".encode())
            e.alloc = [f"{alloc}{{{labels},{label_text(
                ('namespace', 'pod', 'team', 'workload'),
                (o.namespace, o.name, o.team, o.workload))}}} 1\n".encode() for o in d.owners]
        if e.total:
            add_total(e.total)
        add_available(e.available)
        add_state(e.state)
        if e.price:
            add_price(e.price)
        if e.alloc:
            add_alloc(e.alloc)
        if d.gpu_uuid in read_gpus:  # another MIG instance of a GPU already read
            continue
        if not e.readings:
            e.readings = ("{" + label_text(READING_LABELS, (
                c, d.node, d.pool, d.accelerator, d.gpu_index, d.gpu_uuid)) + "} ").encode()
        fields = d.fields
        last, lines = e.reading_values, e.reading_lines
        read_any = False
        for i, (name, family, scale, add) in enumerate(read):
            x = fields.get(name)
            if x is not None:
                if x != last[i]:  # most readings hold from one cycle to the next
                    last[i] = x
                    lines[i] = b"%s%s%s\n" % (family, e.readings, _number(x * scale).encode())
                add(lines[i])
                read_any = True
        if read_any:
            read_gpus.add(d.gpu_uuid)
    if len(devices) > 2 * len(v.states) + 1024:  # devices gone for good
        devices.clear()
    return out


DEVICE_LABEL_CACHE_SIZE = 65536
"""Devices whose label text a writer remembers, those gone included."""


class ExpositionWriter:
    """Writes each cycle's view as text from what it keeps from one cycle to the next:
    each family's HELP and TYPE lines and series (``_Kept``), each device's lines
    (``_Device``: all forgotten at once when most devices are gone for good), and each
    device's label text (a cache of at most ``label_cache_size``: it outlives a
    forgetting of the devices' lines, so the devices still there keep their text). Each
    ``MetricsEndpoint`` has its own; what it keeps is shared by no other writer, and a
    lock keeps its renders one at a time."""

    __slots__ = ("_devices", "_kept", "_labels", "_lock")

    def __init__(self, label_cache_size: int = DEVICE_LABEL_CACHE_SIZE) -> None:
        self._kept = {family: _Kept(family) for family in FAMILIES}
        self._devices: dict[tuple[str, ...], _Device] = {}
        self._labels = functools.lru_cache(maxsize=label_cache_size)(_device_label_text)
        self._lock = threading.Lock()

    def parts(self, view: MetricsView) -> list[bytes]:
        """The full exposition for one cycle, as the pieces it is made of (the lines the
        families keep from cycle to cycle), in order: ``render`` without joining them. The
        series gone for good are forgotten."""
        parts: list[bytes] = []
        with self._lock:
            devices = _device_lines(view, self._devices, self._labels)
            for family in FAMILIES:
                if not family.present(view):
                    continue
                kept = self._kept[family]
                lines = devices.get(family)
                if lines is None:
                    lines = _lines(family, view, kept)
                    if len(kept.series) > 2 * len(lines) + 1024:
                        kept.series.clear()
                parts.append(kept.head)
                parts += lines
        return parts

    def render(self, view: MetricsView) -> bytes:
        """The full exposition for one cycle."""
        return b"".join(self.parts(view))

    @property
    def devices_kept(self) -> int:
        """How many devices' lines the writer keeps."""
        return len(self._devices)

    @property
    def labels_cached(self) -> int:
        """How many devices' label texts the writer remembers."""
        return self._labels.cache_info().currsize


@dataclass(frozen=True, slots=True)
class Exposition:
    """One cycle's exposition as ``ExpositionWriter.parts`` gives it, and its size in
    bytes."""

    parts: list[bytes]
    size: int

    def chunks(self, lines: int = 4096) -> Iterator[bytes]:
        """The text in order, ``lines`` pieces at a time (about 1 MB at fleet scale)."""
        parts = self.parts
        for i in range(0, len(parts), lines):
            yield b"".join(parts[i:i + lines])

    def gzip(self, level: int) -> bytes:
        """The text gzip-compressed (a header without time or name, as
        ``gzip.compress(text, level, mtime=0)`` writes one)."""
        z = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        out = [z.compress(chunk) for chunk in self.chunks()]
        out.append(z.flush())
        return b"".join(out)


GZIP_LEVEL = 1
"""The fastest: 20 MB of exposition in about 0.04 s CPU, at most a third larger than at
level 6 (three times the CPU)."""


class MetricsEndpoint:
    """The sink behind ``/metrics``: it keeps the last cycle's view and renders it at most
    once, on the first scrape after the cycle, and gzip-compresses it at most once, for the
    first scraper that accepts gzip; every scrape until the next cycle is served the same
    exposition."""

    def __init__(self) -> None:
        self.writer = ExpositionWriter()
        """What the text is written from: the endpoint's own."""
        self._view: MetricsView | None = None
        self._rendered: Exposition | None = None
        self._gzipped: tuple[Exposition, bytes] | None = None
        """The exposition it compressed, and the result."""
        self.render_cpu_seconds: float | None = None
        """CPU seconds of the last render (every thread of the process); None until the
        first."""

    def add_cycle(self, view: MetricsView, now: float) -> None:
        self._view, self._rendered = view, None

    @property
    def parts(self) -> Exposition:
        """The exposition of the last cycle, kept as the pieces it is made of (lines that
        live from cycle to cycle anyway), never joined: at 8,000 GPUs the joined text would
        hold 17 MB more between cycles. Empty before the first cycle."""
        if self._rendered is None:
            cpu = time.process_time()
            parts = self.writer.parts(self._view) if self._view is not None else []
            self._rendered = Exposition(parts, sum(map(len, parts)))
            self.render_cpu_seconds = time.process_time() - cpu
        return self._rendered

    @property
    def text(self) -> bytes:
        """The exposition as one text, joined anew on each call (the HTTP server sends
        ``parts`` as they are)."""
        return b"".join(self.parts.parts)

    @property
    def gzip(self) -> bytes:
        """The exposition gzip-compressed (a fleet's shrinks about tenfold)."""
        exposition = self.parts
        if self._gzipped is None or self._gzipped[0] is not exposition:
            self._gzipped = (exposition, exposition.gzip(GZIP_LEVEL))
        return self._gzipped[1]
