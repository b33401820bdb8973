"""DCGM readings from one dcgm-exporter page, parsed in full.

``parse_dcgm_text`` turns one endpoint's text exposition into one ``DeviceReading`` per
DCGM entity (a GPU, or a MIG instance of it: ``dcgm_devices`` says which label sets it
accepts and how MIG GPUs and renamed fields are handed on). It accepts counters without
``_total``, a time-shared GPU printed once per pod sharing it, and every line the text
format allows (what ``promtool check metrics`` accepts): spaces and tabs after ``{``,
around ``=`` and ``,``, before ``}``, around the metric name, before the value and a
timestamp; a line it does not allow is one malformed sample.

A missing series stays missing (unknown is absent, never zero); DCGM's blank sentinels
(values >= 9.2e18), NaN and infinities are dropped and counted. Malformed lines, duplicate
series, oversized lines and series beyond the per-target cap are rejected and counted,
never fatal: the valid rest is kept.

A body is parsed as it arrives (``StreamParser``), a piece of whole families at a time,
so a scrape holds what it keeps and one piece, never the whole body.

The parser is the hot path (8,000 GPUs x ~30 fields every interval), so it does plain
string slicing and parses each distinct label set once (``ParseCache``, which the source
keeps from one scrape to the next); only lines printed otherwise than
``name{labels} value`` go through the full grammar.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Collection

from exporter.model.records import DeviceReading, ParseResult
from exporter.sources.dcgm_devices import (
    BLANK_THRESHOLD,
    MAX_DEVICES_PER_TARGET,
    DcgmEntity,
    add_series,
    current_names,
    entity_of,
    fold_mig_parents,
)

MAX_LINE_BYTES = 64 * 1024


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


def _entity_of_text(raw: str) -> DcgmEntity | str:
    """The entity a label set names, or the reason it is refused."""
    labels = parse_labels(raw)
    if labels is None:
        return "malformed"
    return entity_of(labels)


_NAME = "[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"({_NAME})(?:[ \t]*\{{(.*)\}}[ \t]*|[ \t]+)([^ \t]+)"
                     r"(?:[ \t]+[-+]?[0-9]+)?")
"""A sample line after its leading blanks: name, labels, value, optional timestamp."""

IDENTITY_CACHE_SIZE = 16384
"""Label sets whose parse is remembered across scrapes: one per GPU of the fleet (8,000 at
1,000 nodes), twice over for the pods that replace those running; about 600 bytes each."""
MAX_CACHED_LABELS = 1024
MAX_PLAIN_NAMES = 4096


class ParseCache:
    """What the parses of a source's pages remember from one scrape to the next (each
    ``DcgmSource`` keeps one for its targets, used in its transport's thread alone):

    - the entity of each label set: label sets repeat in every family and every scrape,
      so each is parsed once while it is among the last ``size`` parsed. Only
      ordinary-sized ones (up to ``MAX_CACHED_LABELS`` characters) are kept, so the cache
      stays small;
    - the metric names seen printed right before their ``{``, up to ``MAX_PLAIN_NAMES``:
      those are not matched against the grammar again.

    A parser given none has one of its own, for the pages it parses."""

    __slots__ = ("_entities", "plain_names")

    def __init__(self, size: int = IDENTITY_CACHE_SIZE) -> None:
        self._entities = functools.lru_cache(maxsize=size)(_entity_of_text)
        self.plain_names: set[str] = set()
        """Read by the parser's loop before it calls ``plain_name``."""

    def entity(self, raw: str) -> DcgmEntity | str:
        """The entity label text ``raw`` names, or why it is refused."""
        if len(raw) <= MAX_CACHED_LABELS:
            return self._entities(raw)
        return _entity_of_text(raw)

    def plain_name(self, name: str) -> bool:
        """Whether ``name`` (all before ``{``) is a metric name and nothing else."""
        if re.fullmatch(_NAME, name) is None:
            return False
        if len(self.plain_names) < MAX_PLAIN_NAMES:
            self.plain_names.add(name)
        return True

    @property
    def entities_cached(self) -> int:
        """How many label sets' entities the cache holds."""
        return self._entities.cache_info().currsize


def parse_dcgm_text(text: str, max_devices: int = MAX_DEVICES_PER_TARGET,
                    read: Collection[str] | None = None, cache: ParseCache | None = None
                    ) -> ParseResult:
    """Parse one dcgm-exporter scrape into device readings (see module docstring).

    With ``read``, families not named in it are skipped unparsed (and their lines are not
    checked): dcgm-exporter prints many fields nothing here uses."""
    parser = StreamParser(max_devices, read, cache)
    parser.parse(text)
    return parser.close()


def only_families(text: str, read: Collection[str]) -> str:
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
    rejected (``too_long``) without being kept. ``cache``: what the parses of earlier
    pages remember (a cache of the parser's own when not given)."""

    def __init__(self, max_devices: int = MAX_DEVICES_PER_TARGET,
                 read: Collection[str] | None = None, cache: ParseCache | None = None
                 ) -> None:
        self._max_devices = max_devices
        self._read = read
        self._cache = cache if cache is not None else ParseCache()
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
            text = only_families(text, self._read)
        _parse_lines(text, self._max_devices, self._result, self._devices, self._series,
                     self._cache)

    @property
    def unfolded(self) -> Collection[DeviceReading]:
        """The devices parsed so far, each MIG GPU's own series among them (``close``
        folds those into the GPU's instances)."""
        return self._devices.values()

    def close(self) -> ParseResult:
        """Parse what is left and return the scrape's result."""
        if self._buffer:
            self.parse(bytes(self._buffer))
            self._buffer.clear()
        self._result.devices = fold_mig_parents(current_names(list(self._devices.values())))
        return self._result


def _parse_lines(text: str, max_devices: int, result: ParseResult,
                 devices: dict[tuple[str, str], DeviceReading],
                 series: dict[str, tuple[DeviceReading, bool] | str], cache: ParseCache
                 ) -> None:
    samples = 0
    low, high, max_bytes = -BLANK_THRESHOLD, BLANK_THRESHOLD, MAX_LINE_BYTES
    plain, plain_name, entity = cache.plain_names, cache.plain_name, cache.entity
    for line in text.split("\n"):
        if not line or line[0] == "#":
            continue
        rb = line.rfind("} ")
        lb = line.find("{", 0, rb)
        name = line[:lb]
        rest = line[rb + 2:] if lb > 0 and len(line) <= max_bytes and (
            name in plain or plain_name(name)) else ""
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
            entry = add_series(entity(raw), devices, max_devices)
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
