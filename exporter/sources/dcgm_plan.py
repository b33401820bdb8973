"""Learnt page plans: a dcgm-exporter's page read by the position of its values.

A dcgm-exporter prints the same lines scrape after scrape, only the values change: a
``PagePlan`` remembers, for one target, what the full parse (``dcgm_parser``) made of each
value's position, and reads the next page of the same shape by position alone
(``PagePlan.read``); ``parse_page`` reads a whole page either way.
"""

from __future__ import annotations

import operator
import re
import sys
from collections.abc import Callable, Collection, Sequence
from itertools import compress
from typing import Any

from exporter.model.records import DeviceReading, PageRead, ParseResult, PodOnDevice
from exporter.sources.dcgm_devices import BLANK_THRESHOLD, MAX_DEVICES_PER_TARGET
from exporter.sources.dcgm_parser import MAX_LINE_BYTES, ParseCache, StreamParser, only_families

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
    def learn(cls, parts: list[bytes], max_devices: int, read: Collection[str] | None,
              cache: ParseCache | None = None) -> PagePlan:
        """The plan of a page's shape (``parts`` from ``split_page``); an unusable one if
        it cannot have one, so that the shape is not learnt again. ``cache``: the
        source's, whose label sets the page's are."""
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
        kept = only_families(text, read) if read is not None else text
        kept_parts = _VALUE.split(kept.encode())
        checked = [int(v) - 1 for head, v in zip(kept_parts[0:-1:2], kept_parts[1::2],
                                                  strict=True) if not _is_comment(head)]
        parser = StreamParser(max_devices, cache=cache)
        parser.parse(kept)
        devices = parser.unfolded
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
               read: Collection[str] | None = None, cache: ParseCache | None = None
               ) -> tuple[ParseResult, PagePlan]:
    """One whole page's devices, as ``parse_dcgm_text`` gives them, read by ``plan`` where
    it can be (the plan learnt again if the page's shape changed); and the plan for the
    target's next page. ``read_by`` of the result says how the page was read. A plan
    that fails on a page (it never should) leaves that page, and the later ones of its
    shape, to the full parse: the error is in ``plan_error``, never raised. ``cache``:
    the source's (``StreamParser``)."""
    parts = split_page(body)
    how: PageRead = "plan"
    error = None
    try:
        if plan is None or not plan.fits(parts):
            how = "new_plan"
            plan = PagePlan.learn(parts, max_devices, read, cache)
        result = plan.read(parts, len(body))
    except Exception as exc:
        how, error = "plan_failed", f"{type(exc).__name__}: {exc}"
        plan, result = PagePlan(parts), None  # a shape with no plan
    if result is None:
        parser = StreamParser(max_devices, read, cache)
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
