"""DCGM readings from dcgm-exporter endpoints.

``parse_dcgm_text`` turns one endpoint's text exposition into one ``DeviceReading`` per
DCGM entity (a GPU, or a MIG instance of it). It accepts what real dcgm-exporters print:

- ``Hostname`` or ``hostname``; ``UUID`` or ``uuid``; pod labels as ``pod``/``namespace``/
  ``container``, ``pod_name``/``pod_namespace``/``container_name`` (``--use-old-namespace``)
  or ``exported_pod``/``exported_namespace``/``exported_container`` (a ServiceMonitor
  without honorLabels);
- MIG instances (``GPU_I_PROFILE``/``GPU_I_ID``) carrying the parent GPU's UUID, alone
  (dcgm-exporter 2.4.0-rc.3 and later) or with the GPU's own series (2.4.0-rc.1, -rc.2):
  the GPU's readings are folded into its instances (``fold_mig_parents``), never a
  further device;
- counters without ``_total``; a time-shared GPU printed once per pod sharing it;
- fields under a name DCGM has since changed (``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``, now
  ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``): handed on under the current name
  (``current_names``, which every source's readings pass);
- every line the text format allows (what ``promtool check metrics`` accepts): spaces and
  tabs after ``{``, around ``=`` and ``,``, before ``}``, around the metric name, before
  the value and a timestamp; a line it does not allow is one malformed sample.

A missing series stays missing (unknown is absent, never zero); DCGM's blank sentinels
(values >= 9.2e18), NaN and infinities are dropped and counted. Malformed lines, duplicate
series, oversized lines and series beyond the per-target cap are rejected and counted,
never fatal: the valid rest is kept.

A body is parsed as it arrives (``StreamParser``), a piece of whole families at a time,
so a scrape holds what it keeps and one piece, never the whole body.

The parser is the hot path (8,000 GPUs x ~30 fields every interval), so it does plain
string slicing and parses each distinct label set once; only lines printed otherwise than
``name{labels} value`` go through the full grammar. A dcgm-exporter prints the same lines
scrape after scrape, only the values change: a ``PagePlan`` remembers, for one target, what
the full parse made of each value's position, and reads the next page of the same shape by
position alone (``PagePlan.read``).
"""

from __future__ import annotations

import functools
import math
import operator
import re
import sys
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Any

from exporter.errors import SourceDataError, SourceTimeout, SourceUnavailable
from exporter.model.catalog import DCGM_RENAMED, FATAL_XIDS
from exporter.model.records import (
    DeviceReading,
    PageRead,
    ParseResult,
    PodInfo,
    PodOnDevice,
    TargetScrape,
)
from exporter.model.selectors import label_selector
from exporter.sources import curl_transport as http

BLANK_THRESHOLD = 9.2e18
"""DCGM's blank values (DCGM_INT64_BLANK and friends) start just above this."""
MAX_LINE_BYTES = 64 * 1024
MAX_DEVICES_PER_TARGET = 1024
IDENTITY_CACHE_SIZE = 16384
"""Label sets whose parse is remembered across scrapes: one per GPU of the fleet (8,000 at
1,000 nodes), twice over for the pods that replace those running; about 600 bytes each."""
MAX_CACHED_LABELS = 1024

# exported_* first: when present, the plain labels name the dcgm-exporter pod itself.
_POD_KEYS = (("exported_pod", "exported_namespace", "exported_container"),
             ("pod", "namespace", "container"),
             ("pod_name", "pod_namespace", "container_name"))


def parse_labels(text: str) -> dict[str, str] | None:
    """``a="x",b="y"`` to a dict; None if malformed. Accepts what the text format allows
    (and ``promtool check metrics`` accepts): values with escaped quotes, backslashes and
    newlines; spaces and tabs around names, ``=`` and ``,``; one trailing comma."""
    if "\\" not in text:  # the usual case, no escapes and no blanks outside values
        body = text[:-1] if text.endswith(",") else text
        if not body:
            return {}
        if body.endswith('"'):
            out: dict[str, str] = {}
            for part in body[:-1].split('",'):
                eq = part.find('="')
                name, value = part[:eq], part[eq + 2:]
                if eq <= 0 or not (name.isidentifier() and name.isascii()) or '"' in value \
                        or name in out:
                    break
                out[name] = value
            else:
                return out
    return _parse_labels_fully(text)


_LABEL_START = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"')
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}


def _skip_blanks(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t":
        i += 1
    return i


def _parse_labels_fully(text: str) -> dict[str, str] | None:
    """``parse_labels`` one character at a time."""
    out: dict[str, str] = {}
    i, n = _skip_blanks(text, 0), len(text)
    while i < n:
        m = _LABEL_START.match(text, i)
        if m is None or m[1] in out:
            return None
        j = m.end()
        chars = []
        while j < n and text[j] != '"':
            if text[j] == "\\":
                j += 1
                if j >= n or text[j] not in _ESCAPES:
                    return None
                chars.append(_ESCAPES[text[j]])
            else:
                chars.append(text[j])
            j += 1
        if j >= n:
            return None  # no closing quote
        out[m[1]] = "".join(chars)
        i = _skip_blanks(text, j + 1)
        if i < n:
            if text[i] != ",":
                return None
            i = _skip_blanks(text, i + 1)
    return out


@dataclass(frozen=True, slots=True)
class _Identity:
    """What one label set says: which DCGM entity, and which pod (if any) is on it."""

    key: tuple[str, str]
    uuid: str
    gpu_index: str
    hostname: str
    model_name: str
    mig_profile: str | None
    mig_instance: str | None
    pod: PodOnDevice | None

    def reading(self) -> DeviceReading:
        return DeviceReading(self.uuid, self.gpu_index, self.hostname, self.model_name,
                             self.mig_profile, self.mig_instance)


def _identity(raw: str) -> _Identity | str:
    """The entity a label set names, or the reason it is refused."""
    labels = parse_labels(raw)
    if labels is None:
        return "malformed"
    return identity_of(labels)


def identity_of(labels: Mapping[str, str]) -> _Identity | str:
    """The entity parsed labels name (any dcgm-exporter variant), or why they are refused."""
    uuid = labels.get("UUID") or labels.get("uuid")
    if not uuid:
        return "no_gpu_uuid"
    instance = labels.get("GPU_I_ID")
    pod = None
    for pk, nk, ck in _POD_KEYS:
        if labels.get(pk):
            pod = PodOnDevice(labels.get(nk, ""), labels[pk], labels.get(ck, ""))
            break
    return _Identity((uuid, instance or ""), uuid, labels.get("gpu", ""),
                     labels.get("Hostname") or labels.get("hostname") or "",
                     labels.get("modelName", ""), labels.get("GPU_I_PROFILE"), instance, pod)


_cached_identity = functools.lru_cache(maxsize=IDENTITY_CACHE_SIZE)(_identity)


def _identity_of(raw: str) -> _Identity | str:
    """Label sets repeat in every family and every scrape: each is parsed once while it
    stays in the cache. Only ordinary-sized ones are kept, so the cache stays small."""
    return _cached_identity(raw) if len(raw) <= MAX_CACHED_LABELS else _identity(raw)


def parse_dcgm_text(text: str, max_devices: int = MAX_DEVICES_PER_TARGET,
                    read: Collection[str] | None = None) -> ParseResult:
    """Parse one dcgm-exporter scrape into device readings (see module docstring).

    With ``read``, families not named in it are skipped unparsed (and their lines are not
    checked): dcgm-exporter prints many fields nothing here uses."""
    parser = StreamParser(max_devices, read)
    parser.parse(text)
    return parser.close()


def _only_families(text: str, read: Collection[str]) -> str:
    """The text without the families not in ``read``. A family is dropped only when its
    block is exactly its HELP line, its TYPE line and its own samples."""
    blocks = ("\n" + text).split("\n# HELP ")
    kept = [blocks[0]] if blocks[0] else []
    dropped = False
    for block in blocks[1:]:
        name = block[:block.find(" ")]
        dropped = False
        if name not in read:
            lines = block.rstrip("\n").count("\n") + 1
            if lines == 2 + block.count("\n" + name + "{") and "\n# TYPE " + name in block:
                dropped = True
                continue
        kept.append("# HELP " + block)
    # Each block but the first lost the line end before it to the split, given back by
    # the join; the line end before a dropped last block is given back here.
    return "\n".join(kept) + ("\n" if dropped and kept else "")


PIECE_BYTES = 1 << 20
"""A body is parsed as it arrives, in pieces of whole families of about this size."""
MAX_REMEMBERED_REFUSALS = 4096
"""Refused label sets remembered within one scrape (each distinct one is parsed once)."""


class StreamParser:
    """One scrape's text parsed piece by piece as it arrives, so that only a piece of the
    body, never all of it, is in memory beside what is kept (the devices, one entry per
    distinct label set). ``take`` buffers received bytes and hands back a piece ready to
    parse: whole families, cut before a ``# HELP`` line once about ``PIECE_BYTES`` have
    come; a family longer than that is cut at a line end and parsed whole, unread or not.
    ``close`` parses what is left and gives the result. A line longer than a piece is
    rejected (``too_long``) without being kept."""

    def __init__(self, max_devices: int = MAX_DEVICES_PER_TARGET,
                 read: Collection[str] | None = None) -> None:
        self._max_devices = max_devices
        self._read = read
        self._result = ParseResult(devices=[])
        self._devices: dict[tuple[str, str], DeviceReading] = {}
        # label text -> (its device, whether these labels are the device's first label set)
        # (or, for labels we refuse, the reason for refusing them)
        self._series: dict[str, tuple[DeviceReading, bool] | str] = {}
        self._buffer = bytearray()
        self._in_long_line = False

    def take(self, chunk: bytes) -> tuple[bytes, bool] | None:
        """Buffer ``chunk``; return a piece ready to parse (and whether it is whole
        families), or None while one is still coming."""
        if self._in_long_line:
            end = chunk.find(b"\n")
            if end < 0:
                return None
            self._in_long_line = False
            chunk = chunk[end + 1:]
        buf = self._buffer
        buf += chunk
        if len(buf) < PIECE_BYTES:
            return None
        cut = buf.rfind(b"\n# HELP ") + 1
        whole = cut > 0
        if not whole:
            cut = buf.rfind(b"\n") + 1
            if cut <= 0:  # one line, longer than any line kept
                buf.clear()
                self._in_long_line = True
                self._result.reject("too_long")
                return None
        piece = bytes(buf[:cut])
        del buf[:cut]
        return piece, whole

    def parse(self, piece: bytes | str, whole: bool = True) -> None:
        """Parse ``piece`` (whole lines); families nothing reads are skipped when
        ``whole`` says it holds whole families."""
        text = piece.decode("utf-8", errors="replace") if isinstance(piece, bytes) else piece
        if self._read is not None and whole:
            text = _only_families(text, self._read)
        _parse_lines(text, self._max_devices, self._result, self._devices, self._series)

    def close(self) -> ParseResult:
        """Parse what is left and return the scrape's result."""
        if self._buffer:
            self.parse(bytes(self._buffer))
            self._buffer.clear()
        self._result.devices = fold_mig_parents(current_names(list(self._devices.values())))
        return self._result


def _parse_lines(text: str, max_devices: int, result: ParseResult,
                 devices: dict[tuple[str, str], DeviceReading],
                 series: dict[str, tuple[DeviceReading, bool] | str]) -> None:
    samples = 0
    low, high, max_bytes = -BLANK_THRESHOLD, BLANK_THRESHOLD, MAX_LINE_BYTES
    for line in text.split("\n"):
        if not line or line[0] == "#":
            continue
        rb = line.rfind("} ")
        lb = line.find("{", 0, rb)
        name = line[:lb]
        rest = line[rb + 2:] if lb > 0 and len(line) <= max_bytes and (
            name in _PLAIN_NAMES or _plain_name(name)) else ""
        try:  # name{labels} value, as exporters print it
            value = float(rest)
            raw = line[lb + 1:rb]
        except ValueError:  # else the whole grammar: blanks, a timestamp, or a reject
            sample = _sample(line)
            if sample is None:
                continue
            if isinstance(sample, str):
                result.reject(sample)
                continue
            name, raw, value = sample
        entry = series.get(raw)
        if entry is None:
            entry = _new_series(raw, devices, max_devices)
            if not isinstance(entry, str) or len(series) < MAX_REMEMBERED_REFUSALS:
                series[raw] = entry
        if isinstance(entry, str):
            result.reject(entry)
            continue
        if not low < value < high:
            result.reject("not_finite" if value != value or math.isinf(value) else "blank")
            continue
        device, primary = entry
        if name in device.fields:
            if primary:
                result.reject("duplicate")
            # else: a time-shared GPU printed again for another pod, the same reading
            continue
        device.fields[name] = value
        samples += 1
    result.samples += samples


_NAME = "[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"({_NAME})(?:[ \t]*\{{(.*)\}}[ \t]*|[ \t]+)([^ \t]+)"
                     r"(?:[ \t]+[-+]?[0-9]+)?")
"""A sample line after its leading blanks: name, labels, value, optional timestamp."""
_PLAIN_NAMES: set[str] = set()
"""Metric names seen printed right before their ``{``, up to ``MAX_PLAIN_NAMES``."""
MAX_PLAIN_NAMES = 4096


def _plain_name(name: str) -> bool:
    """Whether ``name`` (all before ``{``) is a metric name and nothing else."""
    if re.fullmatch(_NAME, name) is None:
        return False
    if len(_PLAIN_NAMES) < MAX_PLAIN_NAMES:
        _PLAIN_NAMES.add(name)
    return True


def _sample(line: str) -> tuple[str, str, float] | str | None:
    """A sample line with the blanks the text format allows anywhere it allows them:
    (name, label text, value); None for a comment or a blank line; else why it is
    rejected."""
    if len(line) > MAX_LINE_BYTES:
        return "too_long"
    line = line.lstrip(" \t")
    if not line or line[0] == "#":
        return None
    m = _SAMPLE.fullmatch(line)
    if m is None:
        return "malformed"
    try:
        return m[1], m[2] or "", float(m[3])
    except ValueError:
        return "malformed"


def _new_series(raw: str, devices: dict[tuple[str, str], DeviceReading],
                max_devices: int) -> tuple[DeviceReading, bool] | str:
    return add_series(_identity_of(raw), devices, max_devices)


def add_series(ident: _Identity | str, devices: dict[tuple[str, str], DeviceReading],
               max_devices: int) -> tuple[DeviceReading, bool] | str:
    """The device a series belongs to (created if new), and whether it is the device's
    first label set; or why the series is refused."""
    if isinstance(ident, str):
        return ident
    device = devices.get(ident.key)
    primary = device is None
    if device is None:
        if len(devices) >= max_devices:
            return "too_many_series"
        device = devices[ident.key] = ident.reading()
    if ident.pod is not None and ident.pod not in device.pods:
        device.pods.append(ident.pod)
    return device, primary


def collect(samples: Iterable[tuple[str, Mapping[str, str], float | None]],
            max_devices: int) -> ParseResult:
    """Devices from samples whose labels come parsed (from a query API rather than text):
    (field, labels, value; None when the value was unreadable), rejects counted as the
    text parser counts them."""
    out = ParseResult(devices=[])
    devices: dict[tuple[str, str], DeviceReading] = {}
    for name, labels, value in samples:
        entry = add_series(identity_of(labels), devices, max_devices)
        if isinstance(entry, str):
            out.reject(entry)
            continue
        if value is None:
            out.reject("malformed")
            continue
        if not abs(value) < BLANK_THRESHOLD:
            out.reject("not_finite" if math.isnan(value) or math.isinf(value) else "blank")
            continue
        device, primary = entry
        if name in device.fields:
            if primary:
                out.reject("duplicate")
            continue
        device.fields[name] = value
        out.samples += 1
    out.devices = fold_mig_parents(current_names(list(devices.values())))
    return out


def current_names(devices: list[DeviceReading]) -> list[DeviceReading]:
    """The devices with each field DCGM printed under an older name (``DCGM_RENAMED``)
    under its current one; where a device has both, the current name's reading stands.
    Every source's readings pass here, so that nothing after sees the older names."""
    for d in devices:
        fields = d.fields
        for old, new in DCGM_RENAMED.items():
            if old in fields:
                value = fields.pop(old)
                fields.setdefault(new, value)
    return devices


XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
GPU_WIDE_FIELDS = frozenset({
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION", XID_ERRORS,
})
"""Readings of a physical GPU that hold for each of its MIG instances (dcgm-exporter
2.4.0-rc.3 and later print them on every instance): clocks, temperatures, power, energy,
PCIe retries, clock-event reasons (under their current name: the older one is renamed
before), power and thermal violation time, the last XID. Utilisation, profiling and framebuffer
readings of the whole GPU are not any one instance's."""


def fold_mig_parents(devices: list[DeviceReading]) -> list[DeviceReading]:
    """The devices with each MIG-partitioned GPU counted once, through its instances.

    Where a GPU's instances are reported, the GPU's own series (which dcgm-exporter
    2.4.0-rc.1 and -rc.2 printed beside them) are no further device: their
    ``GPU_WIDE_FIELDS`` go to each instance that lacks them, and a fatal XID of the GPU
    replaces the instance's (the whole GPU is down, every instance with it); their pod
    labels, utilisation and memory are dropped. Readings of unpartitioned GPUs pass
    unchanged."""
    partitioned = {d.uuid for d in devices if d.mig_instance is not None}
    if not partitioned:
        return devices
    gpus = {d.uuid: d for d in devices if d.mig_instance is None and d.uuid in partitioned}
    out = []
    for d in devices:
        if d.mig_instance is None:
            if d.uuid not in partitioned:
                out.append(d)
            continue
        gpu = gpus.get(d.uuid)
        if gpu is not None:
            for name, value in gpu.fields.items():
                if name in GPU_WIDE_FIELDS:
                    own = d.fields.setdefault(name, value)
                    if name == XID_ERRORS and value in FATAL_XIDS and own not in FATAL_XIDS:
                        d.fields[name] = value
        out.append(d)
    return out


_VALUE = re.compile(rb"\} ([^ \n]*)\n")
"""The end of a ``name{labels} value`` line: a page splits on it into its shape (all but
the values) and its values."""


class PagePlan:
    """Where each value of one target's page goes, learnt from a full parse of that page.

    ``learn`` splits a page (``split_page``) into its shape and its values, replaces each
    value by its position and parses the result in full: each device's fields then hold
    the positions of their values, and the rejects counted are those the labels cause.
    ``read`` takes a later page of the same shape (``fits``: the page less its values
    hashes the same, with Python's keyed 64-bit hash) and builds the devices straight from
    the values at those positions. It gives up, leaving the page to the full parse, when a
    value would be refused (not a number, blank, not finite, too long): those rejects
    depend on the values, not the shape. A shape has no usable plan when a line holds a
    sample the split does not see (a timestamp, blanks after the value) or when its MIG
    GPUs print their own series beside their instances (folding them weighs the values).

    Reading by plan gives the devices, samples and rejects the full parse gives, field for
    field (``tests/sources/test_dcgm_plan.py``), at about 60 % of its cost."""

    __slots__ = ("_checked", "_devices", "_longest_value", "_parts", "_rejected", "_samples",
                 "_shape", "_shape_bytes")
    _checked: bytes
    """Which of the page's values are read: one byte per value, 1 for those read (kept as
    positions, they were an int object per value read: some 2 MiB across a fleet's
    plans)."""

    def __init__(self, parts: list[bytes]) -> None:
        self._parts = len(parts)
        self._shape = hash(tuple(parts[0::2]))
        self._shape_bytes = sum(map(len, parts[0::2])) + 3 * (len(parts) // 2)
        """A page's bytes less its values (each value's ``} `` and newline included)."""
        self._checked = b""
        self._devices: list[tuple[str, str, str, str, str | None, str | None,
                                  tuple[PodOnDevice, ...], tuple[str, ...],
                                  Callable[[Sequence[Any]], tuple[Any, ...]]]] | None = None
        self._samples = 0
        self._rejected: dict[str, int] = {}
        self._longest_value = 0

    @classmethod
    def learn(cls, parts: list[bytes], max_devices: int, read: Collection[str] | None
              ) -> PagePlan:
        """The plan of a page's shape (``parts`` from ``split_page``); an unusable one if
        it cannot have one, so that the shape is not learnt again."""
        plan = cls(parts)
        n = len(parts) // 2
        marked = bytearray()
        for i in range(n):
            marked += parts[2 * i]
            marked += b"} %d\n" % (i + 1)
        marked += parts[-1]
        text = marked.decode("utf-8", errors="replace")
        lines = text.split("\n")
        sample_lines = sum(1 for line in lines if line.lstrip(" \t")[:1] not in ("", "#"))
        if sample_lines != sum(1 for i in range(n) if not _is_comment(parts[2 * i])):
            return plan  # a sample line the split does not see
        kept = _only_families(text, read) if read is not None else text
        kept_parts = _VALUE.split(kept.encode())
        checked = [int(v) - 1 for head, v in zip(kept_parts[0:-1:2], kept_parts[1::2],
                                                  strict=True) if not _is_comment(head)]
        parser = StreamParser(max_devices)
        parser.parse(kept)
        devices = parser._devices.values()
        partitioned = {d.uuid for d in devices if d.mig_instance is not None}
        if any(d.mig_instance is None and d.uuid in partitioned for d in devices):
            return plan  # folding a GPU into its instances weighs its values
        result = parser.close()
        where = {p: k for k, p in enumerate(checked)}
        mask = bytearray(n)
        for p in checked:
            mask[p] = 1
        plan._checked = bytes(mask)
        plan._devices = [
            (d.uuid, d.gpu_index, d.hostname, d.model_name, d.mig_profile, d.mig_instance,
             tuple(d.pods), tuple(map(sys.intern, d.fields)),  # a name once, not per GPU
             _getter([where[int(v) - 1] for v in d.fields.values()]))
            for d in result.devices]
        plan._samples = result.samples
        plan._rejected = result.rejected
        plan._longest_value = MAX_LINE_BYTES - max(map(len, lines))
        return plan

    def fits(self, parts: list[bytes]) -> bool:
        """Whether a page (``parts`` from ``split_page``) has this plan's shape."""
        return len(parts) == self._parts and hash(tuple(parts[0::2])) == self._shape

    def read(self, parts: list[bytes], size: int | None = None) -> ParseResult | None:
        """The devices of a page that ``fits`` (of ``size`` bytes, when known), if every
        value it checks is accepted; else None."""
        if self._devices is None:
            return None
        raw = list(compress(parts[1::2], self._checked))
        try:
            values = list(map(float, raw))
        except ValueError:
            return None
        if not sum(map(abs, values)) < BLANK_THRESHOLD:
            return None
        if (size is None or size - self._shape_bytes > self._longest_value) \
                and max(map(len, raw), default=0) > self._longest_value:
            return None  # (no value is longer than all of them together)
        return ParseResult(
            [DeviceReading(uuid, index, host, model, profile, instance, list(pods),
                           dict(zip(names, pick(values), strict=True)))
             for uuid, index, host, model, profile, instance, pods, names, pick
             in self._devices],
            self._samples, dict(self._rejected))


def parse_page(body: bytes, plan: PagePlan | None, max_devices: int = MAX_DEVICES_PER_TARGET,
               read: Collection[str] | None = None) -> tuple[ParseResult, PagePlan]:
    """One whole page's devices, as ``parse_dcgm_text`` gives them, read by ``plan`` where
    it can be (the plan learnt again if the page's shape changed); and the plan for the
    target's next page. ``read_by`` of the result says how the page was read. A plan
    that fails on a page (it never should) leaves that page, and the later ones of its
    shape, to the full parse: the error is in ``plan_error``, never raised."""
    parts = split_page(body)
    how: PageRead = "plan"
    error = None
    try:
        if plan is None or not plan.fits(parts):
            how = "new_plan"
            plan = PagePlan.learn(parts, max_devices, read)
        result = plan.read(parts, len(body))
    except Exception as exc:
        how, error = "plan_failed", f"{type(exc).__name__}: {exc}"
        plan, result = PagePlan(parts), None  # a shape with no plan
    if result is None:
        parser = StreamParser(max_devices, read)
        parser.parse(body)
        result = parser.close()
        how = "full" if error is None else how
    result.read_by, result.plan_error = how, error
    return result, plan


def split_page(body: bytes) -> list[bytes]:
    """A page split around its values: shape, value, shape, ..., value, shape."""
    return _VALUE.split(body)


def _getter(positions: list[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """``operator.itemgetter`` that gives a tuple whatever the number of positions."""
    if len(positions) > 1:
        return operator.itemgetter(*positions)
    if positions:
        one = positions[0]
        return lambda seq: (seq[one],)
    return lambda seq: ()


def _is_comment(head: bytes) -> bool:
    """Whether the line a value ends (the tail of ``head``) is a comment."""
    return head[head.rfind(b"\n") + 1:].lstrip(b" \t").startswith(b"#")


class _Scrape:
    """One target's answer, parsed as it arrives (in the transport's thread). A body of
    less than a piece is held as it came and, once whole, read by the target's
    ``PagePlan`` (learnt again when the page's shape changed), or parsed in full where the
    plan gives up; a longer one goes through ``StreamParser.take`` a piece at a time.
    A page that breaks the parser is this target's error (``failure``), never the
    round's."""

    __slots__ = ("_chunks", "_held", "_parser", "crc", "ending", "failure", "plan", "result",
                 "url")

    def __init__(self, url: str, max_devices: int, read: Collection[str] | None,
                 plan: PagePlan | None = None) -> None:
        self.url = url
        self._parser = StreamParser(max_devices, read)
        self._chunks: list[bytes] | None = []
        self._held = 0
        self.ending: http.Ending | None = None
        self.result: ParseResult | None = None
        self.failure: Exception | None = None
        self.plan = plan
        """The plan of the target's last page held whole; None after a longer one."""
        self.crc = 0
        """The CRC-32 of the body so far (a page the same as the last: a stuck exporter)."""

    def body(self, chunk: bytes) -> None:
        if self.failure is not None:
            return
        self.crc = zlib.crc32(chunk, self.crc)
        chunks: Sequence[bytes] = (chunk,)
        if self._chunks is not None:
            self._chunks.append(chunk)
            self._held += len(chunk)
            if self._held < PIECE_BYTES:
                return
            chunks, self._chunks, self.plan = self._chunks, None, None
        parser = self._parser
        try:
            for c in chunks:
                piece = parser.take(c)
                if piece is not None:
                    parser.parse(*piece)
        except Exception as exc:
            self._fail(exc)

    def end(self, ending: http.Ending) -> None:
        self.ending = ending
        if ending.kind == http.OK and self.failure is None:
            try:
                if self._chunks:
                    p = self._parser
                    self.result, self.plan = parse_page(
                        self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks),
                        self.plan, p._max_devices, p._read)
                else:  # a page of more than a piece, parsed in full as it came
                    self.result = self._parser.close()
                    self.result.read_by = "full"
            except Exception as exc:
                self._fail(exc)
        self._chunks = None

    def _fail(self, exc: Exception) -> None:
        self.failure, self.result, self.plan, self._chunks = exc, None, None, None


@dataclass(frozen=True, slots=True)
class Discovery:
    """Which pods are dcgm-exporters (``dcgm.discovery`` of the configuration)."""

    namespace: str
    label_selector: str
    port: int | None
    """Default: the pod's container port named ``metrics``, else 9400."""
    path: str


class DcgmSource:
    """Scrapes dcgm-exporter endpoints concurrently within one timeout and a body cap each.

    The GETs go through ``CurlTransport``: libcurl's multi interface in one worker thread,
    connections kept open between rounds. A round of 1,000 targets costs it 0.06-0.07 s
    of CPU where aiohttp took 0.15-0.17 s, and the whole round, parsing included, 0.37-0.40 s
    where it took 0.54-0.72 s (``curl_transport`` says how this was measured). Bodies are
    parsed in that thread as they arrive, at most ``concurrency`` of them in flight at
    once; the time spent parsing moves the round's end, as it is no target's. ``close``
    ends the worker.

    The targets are the URLs given, else the running pods ``discovery`` selects (each
    with the node it runs on)."""

    name = "dcgm"
    whole_cluster = False
    """Each target is one node."""

    def __init__(self, timeout_seconds: float, max_body_bytes: int,
                 max_devices: int = MAX_DEVICES_PER_TARGET, concurrency: int = 256,
                 read: Collection[str] | None = None, keepalive_seconds: float = 118.0,
                 static_targets: Sequence[str] = (),
                 discovery: Discovery | None = None) -> None:
        self._static = list(static_targets)
        self._discovery = discovery
        self._selects = label_selector(discovery.label_selector if discovery else "")
        self._read = read
        self._timeout = timeout_seconds
        self._max_body = max_body_bytes
        self._max_devices = max_devices
        self._plans: dict[str, PagePlan] = {}
        """Each target's ``PagePlan``, from its last scrape."""
        self._transport = http.CurlTransport(
            max_body_bytes=max_body_bytes, concurrency=concurrency,
            headers=["Accept: text/plain", "Accept-Encoding: identity"],
            keepalive_seconds=keepalive_seconds, name="dcgm-scrapes")
        """The timeout runs from the start of the round, waiting for a free transfer
        included, so a round never outlasts it however many targets hang."""

    def targets(self, pods: Iterable[PodInfo]) -> dict[str, str | None]:
        """Target URL -> the node of the dcgm-exporter pod it reaches (None for a URL
        given: each answer says its nodes)."""
        d = self._discovery
        if self._static or d is None:
            return dict.fromkeys(self._static)
        out: dict[str, str | None] = {}
        for pod in pods:
            if pod.namespace != d.namespace or pod.phase != "Running" or not pod.ip:
                continue
            if not self._selects({"metadata": {"labels": pod.labels}}):
                continue
            port = d.port or pod.container_ports.get("metrics", 9400)
            out[f"http://{pod.ip}:{port}{d.path}"] = pod.node
        return out

    async def fetch(self, targets: Sequence[str]
                    ) -> list[TargetScrape | SourceUnavailable | SourceTimeout | SourceDataError]:
        """One scrape of every target; a failed target is returned as its error."""
        plans = self._plans
        scrapes = [_Scrape(t, self._max_devices, self._read, plans.get(t)) for t in targets]
        await self._transport.get(scrapes, within=self._timeout)
        self._plans = {s.url: s.plan for s in scrapes if s.plan is not None}
        return [self._outcome(s) for s in scrapes]

    def close(self) -> None:
        """End the worker thread and close the connections."""
        self._transport.close()

    def _outcome(self, scrape: _Scrape
                 ) -> TargetScrape | SourceUnavailable | SourceTimeout | SourceDataError:
        target, end = scrape.url, scrape.ending
        if scrape.failure is not None:
            exc = scrape.failure
            return SourceDataError("dcgm", target, "page could not be parsed: "
                                   f"{type(exc).__name__}: {exc}")
        if end is None or end.kind == http.TIMEOUT:
            return SourceTimeout("dcgm", target, f"no complete answer in {self._timeout:g} s")
        if end.kind == http.STATUS:
            return SourceUnavailable("dcgm", target, f"HTTP {end.status}", status=end.status)
        if end.kind == http.TOO_BIG:
            if end.content_length is not None and end.content_length > self._max_body:
                return SourceDataError("dcgm", target, f"body of {end.content_length} bytes "
                                       f"exceeds the {self._max_body}-byte cap")
            return SourceDataError("dcgm", target, f"body exceeds the {self._max_body}-byte cap")
        if end.kind != http.OK or scrape.result is None:
            return SourceUnavailable("dcgm", target, end.message,
                                     label="refused" if end.kind == http.REFUSED else None)
        if not scrape.result.devices:
            return SourceDataError("dcgm", target, "no DCGM GPU samples in the answer",
                                   rejected=scrape.result.rejected)
        return TargetScrape(target, scrape.result, end.seconds, end.size,
                            page_crc=scrape.crc)
