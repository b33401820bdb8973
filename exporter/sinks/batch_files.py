"""How rows reach DuckDB in the exporter: as SQL literals, or as a file a statement reads
(CSV for the few rows of pods, events and state; Parquet for each cycle's usage rows).

DuckDB's Python client imports pandas and pyarrow (some 100 MiB of the exporter's memory)
as soon as a statement binds parameters or scans Python data, so the exporter does neither.
Measured at 8,000 usage rows of 37 columns per cycle, CPU per batch (median / p95):
pyarrow and ``register`` 66 / 161 ms (and pandas loaded); one ``INSERT ... VALUES`` of
literals 1,428 / 1,579 ms; ``UNNEST`` of list literals 906 / 1,046 ms; CSV and
``read_csv`` 104 / 201 ms (most of it formatting doubles as text); the Parquet file written
here and ``read_parquet`` about 45 ms, and about 16 ms writing it where most string columns
are the last batch's (``kept``) and the numeric ones have no NULL. The writer covers what
a batch needs and no more: one row group, no compression, plain-encoded numbers (their
bytes as ``array`` holds them), strings plain or by dictionary, optional columns.
"""

from __future__ import annotations

import csv
import functools
import struct
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import chain, compress, repeat
from operator import is_not
from typing import Any

from exporter import duck


def literal(value: object) -> str:
    """``value`` as a DuckDB literal of its type: NULL, a number (a float as the text that
    reads back as the same double), a string or a time (TIMESTAMPTZ)."""
    match value:
        case None:
            return "NULL"
        case bool():
            return "TRUE" if value else "FALSE"
        case int():
            return str(value)
        case float():
            return f"'{value!r}'::DOUBLE"
        case datetime():
            return f"TIMESTAMPTZ '{value.isoformat()}'"
        case _:
            return duck.quote(str(value))


def at(t: float) -> str:
    """The time ``t`` (seconds since the epoch) in SQL."""
    return f"to_timestamp({literal(float(t))})"


def read_csv(path: str, types: Mapping[str, str]) -> str:
    """A relation of the CSV file ``path`` (no header) written by ``write_csv``: strings
    quoted, NULL an empty unquoted field."""
    columns = ", ".join(f"{literal(n)}: {literal(t)}" for n, t in types.items())
    return (f"read_csv({duck.quote(path)}, header = false, auto_detect = false, "
            "delim = ',', quote = '\"', escape = '\"', new_line = '\\n', comment = '', "
            "allow_quoted_nulls = false, "
            f"parallel = false, columns = {{{columns}}})")


def write_csv(path: str, rows: Iterable[Sequence[object]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f, quoting=csv.QUOTE_STRINGS, lineterminator="\n").writerows(rows)


_U32 = struct.Struct("<I")
_AS_DIGITS = bytes.maketrans(b"\x00\x01", b"01")


_BYTES = [bytes((i,)) for i in range(256)]


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _BYTES[n]
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _zigzag(n: int) -> bytes:
    return _varint((n << 1) ^ (n >> 63))


class _Thrift:
    """A struct in Thrift's compact protocol (Parquet's metadata), fields added in
    increasing id order."""

    def __init__(self, head: bytes = b"", last: int = 0) -> None:
        """A new struct; or one whose fields up to id ``last`` are ``head`` (as ``end``
        wrote them, less the stop byte)."""
        self._out = bytearray(head)
        self._last = last

    def _field(self, fid: int, kind: int) -> None:
        delta = fid - self._last
        self._out += _BYTES[delta << 4 | kind] if 0 < delta <= 15 else \
            _BYTES[kind] + _zigzag(fid)
        self._last = fid

    def number(self, fid: int, value: int, kind: int = 5) -> _Thrift:
        """An i32 (an i64 with ``kind`` 6)."""
        self._field(fid, kind)
        self._out += _zigzag(value)
        return self

    def text(self, fid: int, value: str) -> _Thrift:
        self._field(fid, 8)
        data = value.encode()
        self._out += _varint(len(data)) + data
        return self

    def struct(self, fid: int, value: _Thrift) -> _Thrift:
        self._field(fid, 12)
        self._out += value.end()
        return self

    def items(self, fid: int, kind: int, items: Sequence[bytes]) -> _Thrift:
        self._field(fid, 9)
        n = len(items)
        self._out += bytes([n << 4 | kind]) if n < 15 else bytes([0xF0 | kind]) + _varint(n)
        self._out += b"".join(items)
        return self

    def end(self) -> bytes:
        return bytes(self._out) + b"\x00"


_PARQUET_TYPE = {"DOUBLE": 5, "BIGINT": 2, "VARCHAR": 6}
"""Parquet's physical types: DOUBLE, INT64, BYTE_ARRAY (read as UTF-8)."""
_PLAIN, _RLE, _RLE_DICTIONARY = 0, 3, 8


def _levels(present: bytes) -> bytes:
    """Definition levels of a column (1 a value, 0 NULL, one byte each in ``present``):
    the RLE/bit-packed hybrid of bit width 1, after its length."""
    n = len(present)
    if n == 0:
        body = b""
    elif b"\x00" not in present or b"\x01" not in present:  # one run
        body = _varint(n << 1) + present[:1]
    else:
        groups = (n + 7) // 8
        body = _varint(groups << 1 | 1) + int(present.translate(_AS_DIGITS)[::-1], 2) \
            .to_bytes(groups, "little")
    return _U32.pack(len(body)) + body


def _page(kind: int, number_of: int, encoding: int, data: bytes) -> bytes:
    """A page after its header: a data page (``kind`` 0) of ``number_of`` values, NULLs
    included, or a dictionary page (2) of ``number_of`` entries."""
    header = _Thrift().number(1, kind).number(2, len(data)).number(3, len(data))
    if kind == 0:
        header.struct(5, _Thrift().number(1, number_of).number(2, encoding)
                      .number(3, _RLE).number(4, _RLE))
    else:
        header.struct(7, _Thrift().number(1, number_of).number(2, encoding))
    return header.end() + data


def _plain_strings(values: Iterable[str]) -> bytes:
    """Strings as Parquet's plain encoding has them: each one's length, then its bytes."""
    data = list(map(str.encode, values))
    return b"".join(chain.from_iterable(zip(map(_U32.pack, map(len, data)), data,
                                            strict=True)))


def _numbers(kind: str, column: Sequence[Any]) -> array[Any] | None:
    """A numeric column's values as an array of its type; None when it has a NULL."""
    try:
        return array("d" if kind == "DOUBLE" else "q", column)
    except TypeError:
        return None


def _chunk(name: str, kind: str, n: int, start: int, offset: int, end: int, encoding: int,
           dictionary: int | None) -> bytes:
    """The metadata of a column chunk at ``start`` (its dictionary page at ``dictionary``,
    if any; its data page at ``offset``) that ends at ``end``."""
    meta = (_Thrift(_chunk_head(name, kind, encoding), 4)
            .number(5, n, 6).number(6, end - start, 6)
            .number(7, end - start, 6).number(9, offset, 6))
    if dictionary is not None:
        meta.number(11, dictionary, 6)
    return _Thrift().number(2, start, 6).struct(3, meta).end()


@functools.cache
def _chunk_head(name: str, kind: str, encoding: int) -> bytes:
    """The fields of a column chunk's metadata that its data does not change: type,
    encodings, path and codec."""
    key = name.encode()
    return bytes(_Thrift().number(1, _PARQUET_TYPE[kind])
                 .items(2, 5, [_zigzag(e) for e in dict.fromkeys((_PLAIN, _RLE, encoding))])
                 .items(3, 8, [_varint(len(key)) + key]).number(4, 0)  # uncompressed
                 ._out)


@functools.cache
def _element(name: str, kind: str) -> bytes:
    """A column's schema element: optional, UTF-8 for strings."""
    element = _Thrift().number(1, _PARQUET_TYPE[kind]).number(3, 1).text(4, name)
    return (element.number(6, 0) if kind == "VARCHAR" else element).end()


@dataclass(slots=True)
class _Encoded:
    """A string column as one batch wrote it: its values and their pages."""

    values: list[Any]
    pages: bytes
    """Its dictionary page, if it has one, then its data page."""
    data_at: int
    """Where in ``pages`` its data page starts."""
    encoding: int


Encoded = dict[str, _Encoded]
"""The string columns of the last batch written, by name (``write_parquet``'s ``kept``)."""


def write_parquet(path: str, columns: Mapping[str, Sequence[Any]],
                  types: Mapping[str, str], kept: Encoded | None = None) -> None:
    """``columns`` (None a NULL) as a Parquet file of one row group, uncompressed: numbers
    plainly encoded (their bytes, as ``array`` holds them), strings too where most are
    distinct, else by a dictionary of the distinct ones and a code per value
    (bit-packed, 32 bits each). With ``kept``, a string column equal to the one of the last
    batch is not encoded again: its pages are (a cycle's nodes, pools, GPUs and pods are
    mostly the last cycle's, row for row)."""
    n = len(columns[next(iter(types))])
    out = bytearray(b"PAR1")
    schema = [_Thrift().text(4, "schema").number(5, len(types)).end()]
    chunks = []
    for name, kind in types.items():
        column = columns[name]
        start, dictionary = len(out), None
        if kind != "VARCHAR" and (numbers := _numbers(kind, column)) is not None:
            offset = len(out)  # no NULL, as most numeric columns: their bytes as they are
            out += _page(0, n, _PLAIN, _levels(b"\x01" * n) + numbers.tobytes())
            chunks.append(_chunk(name, kind, n, start, offset, len(out), _PLAIN, None))
            schema.append(_element(name, kind))
            continue
        if kind == "VARCHAR" and kept is not None and (same := kept.get(name)) is not None \
                and same.values == column:
            out += same.pages
            chunks.append(_chunk(name, kind, n, start, start + same.data_at, len(out),
                                 same.encoding, start if same.data_at else None))
            schema.append(_element(name, kind))
            continue
        present = bytes(map(is_not, column, repeat(None)))
        values = list(compress(column, present))
        if kind == "VARCHAR" and len(words := dict.fromkeys(values)) * 2 > len(values):
            encoding, body = _PLAIN, _plain_strings(values)  # mostly distinct
        elif kind == "VARCHAR":
            index = dict(zip(words, range(len(words)), strict=True))
            dictionary = start
            out += _page(2, len(words), _PLAIN, _plain_strings(words))
            codes = array("I", map(index.__getitem__, values))
            codes.extend(repeat(0, -len(codes) % 8))  # whole groups of 8
            encoding = _RLE_DICTIONARY
            body = b"\x20" + (_varint(len(codes) // 8 << 1 | 1) + codes.tobytes()
                              if codes else b"")
        else:
            encoding = _PLAIN
            body = array("d" if kind == "DOUBLE" else "q", values).tobytes()
        offset = len(out)
        out += _page(0, n, encoding, _levels(present) + body)
        chunks.append(_chunk(name, kind, n, start, offset, len(out), encoding, dictionary))
        schema.append(_element(name, kind))
        if kind == "VARCHAR" and kept is not None:
            kept[name] = _Encoded(list(column), bytes(out[start:]), offset - start, encoding)
    group = _Thrift().items(1, 12, chunks).number(2, len(out) - 4, 6).number(3, n, 6).end()
    footer = (_Thrift().number(1, 1).items(2, 12, schema).number(3, n, 6)
              .items(4, 12, [group]).end())
    out += footer + _U32.pack(len(footer)) + b"PAR1"
    with open(path, "wb") as f:
        f.write(out)
