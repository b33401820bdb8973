"""The clock-event bitmask under either of the names DCGM has given it reaches the
classifier under its current name, whichever source read it."""

from __future__ import annotations

from typing import Any

import pytest

from exporter.model.bottleneck import CLOCK_REASONS, VIOLATIONS, classify
from exporter.model.catalog import DCGM_RENAMED
from exporter.runtime.service import DCGM_FIELDS_READ
from exporter.sources.cloud_monitoring import dcgm_type
from exporter.sources.dcgm_parser import parse_dcgm_text
from exporter.sources.dcgm_plan import parse_page
from exporter.sources.prometheus_api import readings

OLD = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
U = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"
LABELS = (f'gpu="0",UUID="{U}",device="nvidia0",modelName="NVIDIA L4",Hostname="node-a",'
          'container="main",namespace="ml",pod="train-0"')


def page(**values: float) -> str:
    """A dcgm-exporter page of one GPU, with HELP and TYPE lines."""
    out = []
    for name, value in values.items():
        out += [f"# HELP {name} help", f"# TYPE {name} gauge", f"{name}{{{LABELS}}} {value}"]
    return "\n".join(out) + "\n"


def test_the_older_name_is_the_same_field() -> None:
    assert DCGM_RENAMED == {OLD: CLOCK_REASONS}
    assert {OLD, CLOCK_REASONS} <= DCGM_FIELDS_READ  # neither is skipped unparsed


@pytest.mark.parametrize(("values", "reasons"), [
    ({OLD: 0x20}, 0x20),
    ({CLOCK_REASONS: 0x20}, 0x20),
    ({CLOCK_REASONS: 0x4, OLD: 0x20}, 0x4),   # both printed: the current name stands
    ({OLD: 0x20, CLOCK_REASONS: 0x4}, 0x4),
])
def test_a_page_gives_the_current_name(values: dict[str, float], reasons: int) -> None:
    text = page(DCGM_FI_PROF_GR_ENGINE_ACTIVE=0.9, **values)
    (d,) = parse_dcgm_text(text, read=DCGM_FIELDS_READ).devices
    assert d.fields[CLOCK_REASONS] == reasons and OLD not in d.fields
    plan = None
    for _ in range(2):  # learnt, then read by position
        result, plan = parse_page(text.encode(), plan, read=DCGM_FIELDS_READ)
        (by_page,) = result.devices
        assert by_page.fields == d.fields


def test_the_prometheus_api_gives_the_current_name() -> None:
    def sample(name: str, value: str) -> dict[str, Any]:
        return {"metric": {"__name__": name, "UUID": U, "gpu": "0", "Hostname": "node-a"},
                "value": [1700000000.0, value]}

    (d,) = readings([sample(OLD, "64"), sample("DCGM_FI_DEV_GPU_TEMP", "70")], 16).devices
    assert d.fields == {CLOCK_REASONS: 64.0, "DCGM_FI_DEV_GPU_TEMP": 70.0}


def test_an_older_dcgm_exporters_thermal_reason_is_throttling() -> None:
    """A GPU held by thermal slowdown at 70 C, on a dcgm-exporter that prints the older
    name: throttled (it read as healthy while only the current name was read)."""
    text = page(DCGM_FI_PROF_GR_ENGINE_ACTIVE=0.95, DCGM_FI_PROF_SM_ACTIVE=0.9,
                DCGM_FI_PROF_PIPE_TENSOR_ACTIVE=0.3, DCGM_FI_PROF_DRAM_ACTIVE=0.4,
                DCGM_FI_DEV_GPU_TEMP=70, **{OLD: 0x20})
    (d,) = parse_dcgm_text(text, read=DCGM_FIELDS_READ).devices
    assert classify([d.fields] * 10, "nvidia-l4").bottleneck == "throttled"
    d.fields[CLOCK_REASONS] = 0
    assert classify([d.fields] * 10, "nvidia-l4").bottleneck == "healthy"


def test_the_violation_counters_are_read_as_counters_from_cloud_monitoring() -> None:
    assert {dcgm_type(f) for f in VIOLATIONS} == {
        f"prometheus.googleapis.com/{f}/counter" for f in VIOLATIONS}
    assert dcgm_type(CLOCK_REASONS) == f"prometheus.googleapis.com/{CLOCK_REASONS}/gauge"
    assert set(VIOLATIONS) <= DCGM_FIELDS_READ
