"""parse_dcgm_text reads what real dcgm-exporters print, and rejects the rest by count."""

from __future__ import annotations

import subprocess

import pytest

from exporter.model.records import PodOnDevice
from exporter.sources.dcgm_parser import (
    MAX_CACHED_LABELS,
    PIECE_BYTES,
    ParseCache,
    StreamParser,
    parse_dcgm_text,
)
from tests.conftest import FIXTURES
from tests.timing import limit

REAL_L4 = (FIXTURES / "dcgm" / "dcgm-exporter_L4_kops_driver580.prom").read_text()
U = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"


def test_real_l4_scrape() -> None:
    r = parse_dcgm_text(REAL_L4)
    (d,) = r.devices
    assert (d.uuid, d.gpu_index, d.hostname, d.model_name) == (
        U, "0", "i-030791dc5a37cd257", "NVIDIA L4")
    assert d.pods == [] and d.mig_profile is None
    assert d.fields["DCGM_FI_DEV_FB_FREE"] == 22563
    assert d.fields["DCGM_FI_DEV_POWER_USAGE"] == 16.365
    assert d.fields["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 4742776  # counter, no _total
    assert "DCGM_FI_DEV_XID_ERRORS" not in d.fields  # absent stays absent
    assert r.samples == 23 and r.rejected == {}


def line(name: str, labels: str, value: str) -> str:
    return f"{name}{{{labels}}} {value}\n"


BASE = f'gpu="0",UUID="{U}",device="nvidia0",modelName="NVIDIA L4",Hostname="node-a"'

CASES = [
    # (case, text, device id -> expected fields, expected pods, rejected)
    ("lower-case hostname and uuid",
     line("DCGM_FI_DEV_GPU_UTIL", f'gpu="0",uuid="{U}",hostname="node-b"', "42"),
     {U: {"DCGM_FI_DEV_GPU_UTIL": 42.0}}, [], {}),
    ("pod labels",
     line("DCGM_FI_DEV_GPU_UTIL", BASE + ',container="c",namespace="ns",pod="p"', "1"),
     {U: {"DCGM_FI_DEV_GPU_UTIL": 1.0}}, [PodOnDevice("ns", "p", "c")], {}),
    ("old namespace labels",
     line("DCGM_FI_DEV_GPU_UTIL",
          BASE + ',container_name="c",pod_namespace="ns",pod_name="p"', "1"),
     {U: {"DCGM_FI_DEV_GPU_UTIL": 1.0}}, [PodOnDevice("ns", "p", "c")], {}),
    ("exported_ labels",
     line("DCGM_FI_DEV_GPU_UTIL", BASE + ',exported_container="c",exported_namespace="ns",'
          'exported_pod="p",namespace="gke-managed-system",pod="dcgm-exporter-x"', "1"),
     {U: {"DCGM_FI_DEV_GPU_UTIL": 1.0}}, [PodOnDevice("ns", "p", "c")], {}),
    ("blank sentinel is missing, not a value",
     line("DCGM_FI_PROF_SM_ACTIVE", BASE, "9223372036854775794")
     + line("DCGM_FI_DEV_GPU_UTIL", BASE, "3"),
     {U: {"DCGM_FI_DEV_GPU_UTIL": 3.0}}, [], {"blank": 1}),
    ("NaN and Inf are dropped",
     line("DCGM_FI_DEV_GPU_UTIL", BASE, "NaN") + line("DCGM_FI_DEV_FB_USED", BASE, "+Inf")
     + line("DCGM_FI_DEV_FB_FREE", BASE, "7"),
     {U: {"DCGM_FI_DEV_FB_FREE": 7.0}}, [], {"not_finite": 2}),
    ("duplicate series keeps the first",
     line("DCGM_FI_DEV_GPU_UTIL", BASE, "5") + line("DCGM_FI_DEV_GPU_UTIL", BASE, "6"),
     {U: {"DCGM_FI_DEV_GPU_UTIL": 5.0}}, [], {"duplicate": 1}),
    ("garbage lines are rejected, the rest kept",
     "\x00\xff garbage\n{}\nNAME{UUID=\"x 1\n" + line("DCGM_FI_DEV_GPU_UTIL", BASE, "9")
     + line("DCGM_FI_DEV_FB_USED", BASE, "twelve"),
     {U: {"DCGM_FI_DEV_GPU_UTIL": 9.0}}, [], {"malformed": 4}),
    ("series without a GPU UUID",
     line("DCGM_FI_DEV_GPU_UTIL", 'gpu="0"', "1") + line("DCGM_FI_DEV_GPU_UTIL", BASE, "2"),
     {U: {"DCGM_FI_DEV_GPU_UTIL": 2.0}}, [], {"no_gpu_uuid": 1}),
    ("escaped label values and a timestamp",
     line("DCGM_FI_DEV_GPU_UTIL", BASE + r',pod="we\"ird\\name",namespace="n",container="c"',
          "4 1700000000000"),
     {U: {"DCGM_FI_DEV_GPU_UTIL": 4.0}}, [PodOnDevice("n", 'we"ird\\name', "c")], {}),
]


@pytest.mark.parametrize(("case", "text", "fields", "pods", "rejected"), CASES,
                         ids=[c[0] for c in CASES])
def test_cases(case: str, text: str, fields: dict[str, dict[str, float]],
               pods: list[PodOnDevice], rejected: dict[str, int]) -> None:
    r = parse_dcgm_text(text)
    assert {d.device_id: d.fields for d in r.devices} == fields
    assert r.devices[0].pods == pods
    assert r.rejected == rejected


UTIL = "DCGM_FI_DEV_GPU_UTIL"
HEAD = f"# HELP {UTIL} GPU utilization (in %).\n# TYPE {UTIL} gauge\n"
BLANKS = [
    # (case, the GPU_UTIL sample line, whether the text format allows it)
    ("space after a comma", f'{UTIL}{{gpu="0", UUID="{U}"}} 5', True),
    ("tabs and spaces around a comma", f'{UTIL}{{gpu="0" \t,\t UUID="{U}"}} 5', True),
    ("blank after { and before }", f'{UTIL}{{ gpu="0",UUID="{U}" }} 5', True),
    ("blanks around =", f'{UTIL}{{gpu = "0",UUID=\t"{U}"}} 5', True),
    ("trailing comma and blank", f'{UTIL}{{gpu="0",UUID="{U}", }} 5', True),
    ("blank between name and {", f'{UTIL} {{gpu="0",UUID="{U}"}} 5', True),
    ("indented sample and comment", f'  {UTIL}{{gpu="0",UUID="{U}"}} 5\n\t# a note', True),
    ("tab before the value", f'{UTIL}{{gpu="0",UUID="{U}"}}\t5', True),
    ("no blank before the value", f'{UTIL}{{gpu="0",UUID="{U}"}}5', True),
    ("blanks around a timestamp", f'{UTIL}{{gpu="0",UUID="{U}"}}  5 \t1700000000000', True),
    ("blank instead of a comma", f'{UTIL}{{gpu="0" UUID="{U}"}} 5', False),
    ("two commas", f'{UTIL}{{gpu="0",,UUID="{U}"}} 5', False),
    ("comma first", f'{UTIL}{{,gpu="0",UUID="{U}"}} 5', False),
    ("blank inside a label name", f'{UTIL}{{g pu="0",UUID="{U}"}} 5', False),
    ("blank inside the metric name", f'DCGM_FI_DEV GPU_UTIL{{UUID="{U}"}} 5', False),
    ("a label twice", f'{UTIL}{{gpu="0",gpu="1",UUID="{U}"}} 5', False),
    ("unknown escape", f'{UTIL}{{gpu="\\x",UUID="{U}"}} 5', False),
    ("timestamp not an integer", f'{UTIL}{{gpu="0",UUID="{U}"}} 5 1.5', False),
]
OTHER = line("DCGM_FI_DEV_FB_USED", f'gpu="0",UUID="{U}"', "3")


@pytest.mark.parametrize(("case", "sample", "allowed"), BLANKS, ids=[c[0] for c in BLANKS])
def test_blanks_the_text_format_allows(case: str, sample: str, allowed: bool) -> None:
    """A line written as the format allows is read; any other is one malformed sample, and
    the other lines of the scrape are kept."""
    r = parse_dcgm_text(HEAD + sample + "\n" + OTHER)
    (d,) = r.devices
    assert d.uuid == U
    if allowed:
        assert d.fields == {UTIL: 5.0, "DCGM_FI_DEV_FB_USED": 3.0}
        assert r.rejected == {}
    else:
        assert d.fields == {"DCGM_FI_DEV_FB_USED": 3.0}
        assert r.rejected == {"malformed": 1}


@pytest.mark.parametrize(("case", "sample", "allowed"), BLANKS, ids=[c[0] for c in BLANKS])
def test_promtool_agrees(case: str, sample: str, allowed: bool) -> None:
    """The table above is what ``promtool check metrics`` accepts and rejects."""
    proc = subprocess.run(["promtool", "check", "metrics"], input=HEAD + sample + "\n",
                          capture_output=True, text=True, timeout=limit(60), check=False)
    assert (proc.returncode == 0) == allowed, proc.stderr


def test_mig_instances_are_separate_devices_of_one_gpu() -> None:
    text = "".join(
        line("DCGM_FI_PROF_GR_ENGINE_ACTIVE",
             f'gpu="0",UUID="{U}",device="nvidia0",modelName="NVIDIA A100-SXM4-40GB",'
             f'GPU_I_PROFILE="1g.5gb",GPU_I_ID="{i}",Hostname="n"', f"0.{i}")
        for i in (7, 8))
    r = parse_dcgm_text(text)
    assert [(d.uuid, d.mig_profile, d.mig_instance) for d in r.devices] == [
        (U, "1g.5gb", "7"), (U, "1g.5gb", "8")]
    assert [d.device_id for d in r.devices] == [f"{U}/7", f"{U}/8"]


def test_time_shared_gpu_lists_every_pod_once() -> None:
    text = (line("DCGM_FI_DEV_GPU_UTIL", BASE + ',container="c",namespace="n",pod="a"', "50")
            + line("DCGM_FI_DEV_GPU_UTIL", BASE + ',container="c",namespace="n",pod="b"', "50"))
    (d,) = parse_dcgm_text(text).devices
    assert [p.pod for p in d.pods] == ["a", "b"] and d.fields == {"DCGM_FI_DEV_GPU_UTIL": 50.0}


def test_series_cap_bounds_memory() -> None:
    text = "".join(line("DCGM_FI_DEV_GPU_UTIL", f'UUID="GPU-{i}"', "1") for i in range(5000))
    r = parse_dcgm_text(text, max_devices=100)
    assert len(r.devices) == 100 and r.rejected == {"too_many_series": 4900}


def test_huge_line_is_rejected() -> None:
    text = line("DCGM_FI_DEV_GPU_UTIL", BASE + ',pod="' + "x" * 1_000_000 + '"', "1") + \
        line("DCGM_FI_DEV_FB_USED", BASE, "2")
    r = parse_dcgm_text(text)
    assert r.rejected == {"too_long": 1} and r.devices[0].fields == {"DCGM_FI_DEV_FB_USED": 2.0}


def test_unread_families_are_skipped_whole() -> None:
    r = parse_dcgm_text(REAL_L4, read={"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_POWER_USAGE"})
    (d,) = r.devices
    assert d.fields == {"DCGM_FI_DEV_FB_FREE": 22563, "DCGM_FI_DEV_POWER_USAGE": 16.365}
    assert r.samples == 2


def test_a_block_holding_other_series_is_not_skipped() -> None:
    # a family's block that also carries another family's lines is parsed, not dropped
    text = ("# HELP DCGM_FI_DEV_SM_CLOCK SM clock.\n# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n"
            + line("DCGM_FI_DEV_SM_CLOCK", BASE, "1") + line("DCGM_FI_DEV_GPU_UTIL", BASE, "7")
            + "# HELP DCGM_FI_DEV_FB_USED Used.\n# TYPE DCGM_FI_DEV_FB_USED gauge\n"
            + line("DCGM_FI_DEV_FB_USED", BASE, "3"))
    (d,) = parse_dcgm_text(text, read={"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"}).devices
    assert d.fields == {"DCGM_FI_DEV_SM_CLOCK": 1.0, "DCGM_FI_DEV_GPU_UTIL": 7.0,
                        "DCGM_FI_DEV_FB_USED": 3.0}


def streamed(text: bytes, read: set[str] | None = None, chunk: int = 65536) -> StreamParser:
    """``text`` through a StreamParser in ``chunk``-byte chunks, as a body arrives."""
    parser = StreamParser(read=read)
    for at in range(0, len(text), chunk):
        piece = parser.take(text[at:at + chunk])
        if piece is not None:
            parser.parse(*piece)
    return parser


def test_a_body_parsed_as_it_arrives_reads_as_the_whole_text() -> None:
    # ~3 MiB: several pieces, each cut where a family begins
    gpus = [REAL_L4.replace(U, f"GPU-{i:04d}").replace('gpu="0"', f'gpu="{i}"')
            for i in range(400)]
    text = "".join(gpus)
    read = {"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_UTIL"}
    whole = parse_dcgm_text(text, read=read)
    got = streamed(text.encode(), read).close()
    assert len(text) > 2 * PIECE_BYTES
    assert [(d.uuid, d.fields) for d in got.devices] == \
        [(d.uuid, d.fields) for d in whole.devices]
    assert (got.samples, got.rejected) == (whole.samples, whole.rejected) == (800, {})


def test_a_family_longer_than_a_piece_is_parsed_whole() -> None:
    lines = "".join(line("DCGM_FI_DEV_SM_CLOCK", BASE.replace(U, f"GPU-{i}"), "1")
                    for i in range(PIECE_BYTES // 100))
    text = "# HELP DCGM_FI_DEV_SM_CLOCK SM clock.\n# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n" + lines
    r = streamed(text.encode(), read={"DCGM_FI_DEV_GPU_UTIL"}).close()
    assert len(r.devices) == 1024 and r.rejected == {
        "too_many_series": PIECE_BYTES // 100 - 1024}


def test_a_line_longer_than_a_piece_is_rejected_without_being_kept() -> None:
    text = ('DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a",pod="' + "x" * (3 * PIECE_BYTES) + '"} 1\n'
            + line("DCGM_FI_DEV_GPU_UTIL", BASE, "7"))
    parser = streamed(text.encode())
    assert len(parser._buffer) < PIECE_BYTES
    r = parser.close()
    assert r.rejected == {"too_long": 1} and [d.fields for d in r.devices] == [
        {"DCGM_FI_DEV_GPU_UTIL": 7.0}]


def gpus(n: int, first: int = 0) -> str:
    """A page of ``n`` GPUs, one utilisation line each."""
    return "".join(line("DCGM_FI_DEV_GPU_UTIL", f'gpu="{i}",UUID="GPU-{i}",Hostname="n"', "1")
                   for i in range(first, first + n))


def test_a_parse_cache_remembers_each_label_set_up_to_its_size() -> None:
    cache = ParseCache(size=3)
    first = parse_dcgm_text(gpus(5), cache=cache)
    assert cache.entities_cached == 3, "the last three label sets, no more"
    again = parse_dcgm_text(gpus(5), cache=cache)
    assert [d.uuid for d in again.devices] == [d.uuid for d in first.devices]
    assert again.devices == first.devices and again.samples == first.samples == 5


def test_a_label_set_longer_than_ordinary_is_parsed_but_not_cached() -> None:
    cache = ParseCache()
    long_value = "x" * MAX_CACHED_LABELS
    r = parse_dcgm_text(line("DCGM_FI_DEV_GPU_UTIL", f'UUID="GPU-0",extra="{long_value}"', "2"),
                        cache=cache)
    assert [d.fields for d in r.devices] == [{"DCGM_FI_DEV_GPU_UTIL": 2.0}]
    assert cache.entities_cached == 0


def test_a_parse_given_no_cache_leaves_every_other_cache_alone() -> None:
    """A parse without a source's cache has one of its own, for its page alone."""
    cache = ParseCache()
    assert parse_dcgm_text(gpus(2)).samples == 2
    assert cache.entities_cached == 0 and cache.plain_names == set()


def test_a_shared_cache_serves_every_parser_given_it() -> None:
    cache = ParseCache()
    for first in (0, 2):
        parser = StreamParser(cache=cache)
        parser.parse(gpus(2, first))
        parser.close()
    assert cache.entities_cached == 4 and cache.plain_names == {"DCGM_FI_DEV_GPU_UTIL"}
