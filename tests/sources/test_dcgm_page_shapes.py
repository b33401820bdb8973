"""Whatever shape a dcgm-exporter page takes, the live path reads what the full parser reads.

Every real page kept in ``tests/fixtures/dcgm`` -- the captures, and pages of both of
dcgm-exporter's default counter lists (its ``etc/default-counters.csv`` before 4.0 and
now) printed as its template prints them -- is taken apart into families and put together
again in any order, any subset, with families the exporter does not read first, in the
middle, last or interleaved with the others, HELP and TYPE lines present or not, families
twice, a final line end or none; and, scrape after scrape, with other values and in
another shape. Each page goes through ``DcgmSource.fetch`` over HTTP, the plans it learns
carried from scrape to scrape as the service carries them, and must give the devices,
samples and rejects ``parse_dcgm_text`` gives it, with no plan failing on the way.
"""

from __future__ import annotations

import asyncio
import csv
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from exporter.errors import SourceDataError
from exporter.model.records import ParseResult, TargetScrape
from exporter.runtime.service import DCGM_FIELDS_READ
from exporter.sources.dcgm import DcgmSource
from exporter.sources.dcgm_parser import PIECE_BYTES, parse_dcgm_text
from exporter.sources.dcgm_plan import PagePlan, parse_page
from tests.conftest import FIXTURES
from tests.sources.mig_samples import H100_TEXT

DCGM = FIXTURES / "dcgm"
NOT_READ = ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_EXP_XID_ERRORS_COUNT")
"""Fields real pages end with, or carry from custom counter files, that nothing here reads."""


@dataclass(frozen=True)
class Family:
    name: str
    help: str | None
    type: str | None
    samples: tuple[str, ...]

    def lines(self) -> list[str]:
        head = [f"# HELP {self.name} {self.help}"] if self.help is not None else []
        head += [f"# TYPE {self.name} {self.type}"] if self.type is not None else []
        return head + list(self.samples)


def families(page: str) -> list[Family]:
    """A page as dcgm-exporter prints it (HELP, TYPE, samples; or samples alone), family
    by family."""
    out: list[Family] = []
    for line in page.splitlines():
        if line.startswith("# HELP "):
            name, _, text = line[7:].partition(" ")
            out.append(Family(name, text, None, ()))
        elif line.startswith("# TYPE "):
            out[-1] = replace(out[-1], type=line[7:].partition(" ")[2])
        elif line:
            name = line[:line.index("{")]
            if not out or out[-1].name != name:
                out.append(Family(name, None, None, ()))
            out[-1] = replace(out[-1], samples=(*out[-1].samples, line))
    return out


def counters(path: Path) -> list[tuple[str, str, str]]:
    """(field, Prometheus type, help) of a dcgm-exporter counters file, in its order."""
    with path.open() as f:
        rows = [r for r in csv.reader(f) if r and not r[0].lstrip().startswith("#")]
    return [(r[0].strip(), r[1].strip(), ",".join(r[2:]).strip()) for r in rows]


GPUS = [  # (gpu, UUID, pci_bus_id, pod labels)
    ("0", "GPU-5c3a1f3e-7d1e-4a8a-b6a5-0c0f9d1e2b3a", "00000000:00:04.0",
     ',container="trainer",namespace="research",pod="llm-pretrain-0"'),
    ("1", "GPU-9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b", "00000000:00:05.0", ""),
]


def render_counters(path: Path, hostname_label: str, driver: str | None) -> str:
    """A page of an A100 node with the counters of ``path``, as dcgm-exporter's
    ``gpuMetricsFormat`` template prints it (gpu, UUID, pci_bus_id, device, modelName, the
    host, label-type fields, then the pod's attributes), one family per counter in the
    file's order; a ``label`` counter (the driver version) is a label of every series."""
    rng = random.Random(path.name)
    lines = []
    for field, kind, text in counters(path):
        if kind == "label":
            continue
        lines += [f"# HELP {field} {text}", f"# TYPE {field} {kind}"]
        for gpu, uuid, bus, pod in GPUS:
            extra = f',DCGM_FI_DRIVER_VERSION="{driver}"' if driver else ""
            lines.append(f'{field}{{gpu="{gpu}",UUID="{uuid}",pci_bus_id="{bus}",'
                         f'device="nvidia{gpu}",modelName="NVIDIA A100-SXM4-80GB",'
                         f'{hostname_label}="gke-a100-pool-1a2b"{extra}{pod}}} '
                         f"{rng.choice(['0', '1', '35', '210', '1593', '0.25', '81079'])}")
    return "\n".join(lines) + "\n"


PAGES = {
    **{p.name: p.read_text() for p in sorted(DCGM.glob("*.prom"))},
    "default counters, dcgm-exporter 4.x": render_counters(
        DCGM / "dcgm-exporter_default-counters.csv", "hostname", None),
    "default counters, dcgm-exporter 3.x": render_counters(
        DCGM / "dcgm-exporter_default-counters_3.x.csv", "Hostname", "535.129.03"),
    "H100 MIG instances (dcgm-exporter's own test)": H100_TEXT,
}
BASES = {name: families(page) for name, page in PAGES.items()}


def unread_family(name: str, like: Family) -> Family:
    """A family nothing here reads, for the GPUs ``like`` names."""
    samples = tuple(s[:s.index("{")].replace(like.name, name) + s[s.index("{"):]
                    for s in like.samples)
    return Family(name, "A field of a custom counters file.", "counter", samples)


ODD_VALUES = ("0", "-0", "1e3", "+12.5", "9223372036854775794", "NaN", "+Inf", "x")


@st.composite
def shapes(draw: st.DrawFn, base: list[Family]) -> str:
    """``base`` in any order and subset, with unread families anywhere, HELP/TYPE lines
    dropped, families printed twice or interleaved, and new values."""
    fams = draw(st.permutations(base))
    fams = [f for f in fams if draw(st.booleans()) or draw(st.booleans())]  # ~3/4 kept
    for name in draw(st.lists(st.sampled_from(NOT_READ), max_size=3, unique=True)):
        like = draw(st.sampled_from(base))
        fams.insert(draw(st.integers(0, len(fams))), unread_family(name, like))
    if fams and draw(st.booleans()):
        fams.insert(draw(st.integers(0, len(fams))), draw(st.sampled_from(fams)))  # twice
    fams = [replace(f, help=f.help if draw(st.booleans()) or draw(st.booleans()) else None,
                    type=f.type if draw(st.booleans()) or draw(st.booleans()) else None)
            for f in fams]
    blocks = [f.lines() for f in fams]
    if len(blocks) > 1 and draw(st.booleans()):  # two families' samples interleaved
        i = draw(st.integers(0, len(blocks) - 2))
        a, b = fams[i], fams[i + 1]
        mixed = [s for pair in zip(a.samples, b.samples, strict=False) for s in pair]
        mixed += list(a.samples[len(b.samples):] + b.samples[len(a.samples):])
        blocks[i:i + 2] = [replace(a, samples=()).lines() + replace(b, samples=()).lines()
                           + mixed]
    page = "\n".join(line for block in blocks for line in block)
    page = revalue(page, draw(st.randoms(use_true_random=False)))
    return page + ("\n" if draw(st.booleans()) or draw(st.booleans()) else "")


def revalue(page: str, rng: random.Random) -> str:
    """The page with about a third of its values changed, some to values a plan cannot
    vouch for (blank sentinels, NaN, infinities, not numbers)."""
    return "\n".join(
        line if not line or line.startswith("#") or rng.random() > 0.3
        else f"{line[:line.rindex(' ')]} {rng.choice(ODD_VALUES)}"
        for line in page.split("\n"))


@st.composite
def scrapes(draw: st.DrawFn) -> list[str]:
    """A target's pages scrape after scrape: a shape, the same shape with other values,
    another shape likewise, the first again."""
    base = BASES[draw(st.sampled_from(sorted(BASES)))]
    first, second = draw(shapes(base)), draw(shapes(base))
    rng = draw(st.randoms(use_true_random=False))
    return [first, revalue(first, rng), second, revalue(second, rng), first]


class Pages:
    """One loopback dcgm-exporter whose page the test sets before each scrape."""

    def __init__(self) -> None:
        self.body = b""
        pages = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(pages.body)))
                self.end_headers()
                self.wfile.write(pages.body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[Pages, DcgmSource, asyncio.AbstractEventLoop]]:
    pages = Pages()
    loop = asyncio.new_event_loop()
    source = DcgmSource(timeout_seconds=10.0, max_body_bytes=8 * 1024 * 1024,
                        read=DCGM_FIELDS_READ)
    yield pages, source, loop
    source.close()
    loop.close()
    pages.close()


def full(page: str) -> ParseResult:
    return parse_dcgm_text(page, read=DCGM_FIELDS_READ)


MINIMAL = ("# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.\n"
           "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge\n"
           'DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="0",UUID="GPU-a",modelName="NVIDIA L4",'
           'Hostname="n"} 0.5\n'
           "# HELP DCGM_FI_DEV_FB_TOTAL Framebuffer memory total (in MiB).\n"
           "# TYPE DCGM_FI_DEV_FB_TOTAL gauge\n"
           'DCGM_FI_DEV_FB_TOTAL{gpu="0",UUID="GPU-a",modelName="NVIDIA L4",Hostname="n"} 23034\n')
"""The smallest page whose last family is unread."""


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(scrapes())
@example([MINIMAL, MINIMAL, MINIMAL, MINIMAL])
def test_every_shape_of_every_real_page_is_read_as_the_full_parser_reads_it(
        live: tuple[Pages, DcgmSource, asyncio.AbstractEventLoop], pages_: list[str]) -> None:
    server, source, loop = live
    for page in pages_:
        server.body = page.encode()
        (got,) = loop.run_until_complete(source.fetch([server.url]))
        want = full(page)
        if not want.devices:
            assert isinstance(got, SourceDataError), page
            continue
        assert isinstance(got, TargetScrape), (got, page)
        assert got.result == want, page
        assert got.result.read_by != "plan_failed", got.result.plan_error


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(BASES)).flatmap(lambda n: st.tuples(shapes(BASES[n]),
                                                                   shapes(BASES[n]))),
       st.sampled_from([None, DCGM_FIELDS_READ]))
def test_a_plan_reads_a_page_as_the_full_parser_whatever_it_learnt_from(
        pair: tuple[str, str], read: frozenset[str] | None) -> None:
    """Without HTTP, and with every family read as well: the plan learnt from one shape,
    then a page of the same shape and one of another."""
    first, other = pair
    plan: PagePlan | None = None
    for page in (first, first, other, revalue(other, random.Random(len(other))), first):
        result, plan = parse_page(page.encode(), plan, read=read)
        assert result == parse_dcgm_text(page, read=read)
        assert result.read_by != "plan_failed", result.plan_error


def test_the_page_whose_last_family_is_unread_is_read_by_plan() -> None:
    first, plan = parse_page(MINIMAL.encode(), None, read=DCGM_FIELDS_READ)
    second, _ = parse_page(MINIMAL.encode(), plan, read=DCGM_FIELDS_READ)
    assert (first.read_by, second.read_by) == ("new_plan", "plan")
    assert first == second == full(MINIMAL)
    assert [d.fields for d in second.devices] == [{"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.5}]


class Broken(PagePlan):
    """A plan that cannot read what it is given."""

    def read(self, parts: list[bytes], size: int | None = None) -> ParseResult | None:
        raise KeyError(0)


def test_a_plan_that_fails_leaves_the_page_to_the_full_parser() -> None:
    body = PAGES["dcgm-exporter_L4_kops_driver580.prom"].encode()
    _, learnt = parse_page(body, None)
    broken = Broken.__new__(Broken)
    for name in PagePlan.__slots__:
        setattr(broken, name, getattr(learnt, name))
    result, plan = parse_page(body, broken)
    assert result == parse_dcgm_text(body.decode())
    assert (result.read_by, result.plan_error) == ("plan_failed", "KeyError: 0")
    again, _ = parse_page(body, plan)  # that shape is read in full from then on
    assert (again, again.read_by) == (result, "full")


def test_a_page_of_more_than_a_piece_is_read_in_full_as_it_comes(
        live: tuple[Pages, DcgmSource, asyncio.AbstractEventLoop]) -> None:
    """A page longer than a piece is parsed piece by piece, never by plan, and counted so."""
    server, source, loop = live
    page = PAGES["dcgm-exporter_L4_kops_driver580.prom"]
    many = "".join(page.replace("GPU-c2f76b33", f"GPU-{i:08x}") for i in range(600))
    assert len(many) > PIECE_BYTES
    server.body = many.encode()
    (got,) = loop.run_until_complete(source.fetch([server.url]))
    assert isinstance(got, TargetScrape)
    assert got.result == full(many) and len(got.result.devices) == 600
    assert got.result.read_by == "full"
