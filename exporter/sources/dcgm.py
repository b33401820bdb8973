"""DCGM readings from dcgm-exporter endpoints: ``DcgmSource`` scrapes them.

Each target's page is parsed as it arrives (``_Scrape``), in the transport's thread: read
by the target's learnt plan (``dcgm_plan``) when it is the shape of the last, else parsed in
full (``dcgm_parser``), a piece of whole families at a time when it is long. What the
parses remember from one scrape to the next (each label set's entity) is the source's own
(``ParseCache``), never shared with another source. A target that fails, or whose page
breaks the parser, is its own error, never the round's.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from exporter.errors import SourceDataError, SourceTimeout, SourceUnavailable
from exporter.model.records import ParseResult, PodInfo, TargetScrape
from exporter.model.selectors import label_selector
from exporter.sources import curl_transport as http
from exporter.sources.dcgm_devices import MAX_DEVICES_PER_TARGET
from exporter.sources.dcgm_parser import PIECE_BYTES, ParseCache, StreamParser
from exporter.sources.dcgm_plan import PagePlan, parse_page


class _Scrape:
    """One target's answer, parsed as it arrives (in the transport's thread). A body of
    less than a piece is held as it came and, once whole, read by the target's
    ``PagePlan`` (learnt again when the page's shape changed), or parsed in full where the
    plan gives up; a longer one goes through ``StreamParser.take`` a piece at a time.
    A page that breaks the parser is this target's error (``failure``), never the
    round's. ``cache``: the source's."""

    __slots__ = ("_cache", "_chunks", "_held", "_max_devices", "_parser", "_read", "crc",
                 "ending", "failure", "plan", "result", "url")

    def __init__(self, url: str, max_devices: int, read: Collection[str] | None,
                 plan: PagePlan | None = None, cache: ParseCache | None = None) -> None:
        self.url = url
        self._max_devices, self._read, self._cache = max_devices, read, cache
        self._parser = StreamParser(max_devices, read, cache)
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
                    self.result, self.plan = parse_page(
                        self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks),
                        self.plan, self._max_devices, self._read, self._cache)
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
        self.parse_cache = ParseCache()
        """The label sets' entities and the metric names that every target's pages share,
        from one scrape to the next; this source's alone."""
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
        scrapes = [_Scrape(t, self._max_devices, self._read, plans.get(t), self.parse_cache)
                   for t in targets]
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
