"""``/metrics``'s text is written by each endpoint's own writer: what it keeps from one
cycle to the next (series, devices' lines, label texts) is bounded and shared with no other
endpoint, and the text is the same whatever was kept."""

from __future__ import annotations

import dataclasses
from typing import Any

from exporter.metrics.families import MetricsView
from exporter.model.compute import DeviceState
from exporter.model.totals import Totals
from exporter.sinks.prometheus import ExpositionWriter, MetricsEndpoint
from tests.exporter.views import view_of


def make_device(i: int, **overrides: Any) -> DeviceState:
    fields: dict[str, Any] = dict(
        node=f"node-{i // 8}", pool="a100", accelerator="nvidia-tesla-a100",
        provisioning="on-demand", zone="us-central1-a", gpu_uuid=f"GPU-{i}",
        device_id=f"node-{i // 8}/GPU-{i}", gpu_index=str(i % 8), mig_profile=None,
        fraction=1.0, state="unallocated", reason=None, owners=(), utilization=0.25,
        utilization_source="gpu_util", price_usd_per_hour=2.5, memory_used_bytes=1e9,
        memory_total_bytes=4e10, fields={"DCGM_FI_DEV_GPU_TEMP": 40.0})
    return DeviceState(**(fields | overrides))


def view_with(n: int, cluster: str = "prod", first: int = 0) -> MetricsView:
    return dataclasses.replace(view_of(Totals(), cluster),
                               states=[make_device(i) for i in range(first, first + n)])


def test_two_endpoints_keep_their_own_lines() -> None:
    """An endpoint's render fills its own writer alone; the other's text is its own
    view's, as a fresh writer writes it."""
    a, b = MetricsEndpoint(), MetricsEndpoint()
    assert a.writer is not b.writer
    a.add_cycle(view_with(16, "east"), 0.0)
    text_a = a.text
    assert a.writer.devices_kept == a.writer.labels_cached == 16
    assert b.writer.devices_kept == b.writer.labels_cached == 0
    b.add_cycle(view_with(3, "west"), 0.0)
    text_b = b.text
    assert b.writer.devices_kept == 3 and a.writer.devices_kept == 16
    assert b'cluster="east"' in text_a and b'cluster="west"' not in text_a
    assert b'cluster="west"' in text_b and b'cluster="east"' not in text_b
    assert text_b == ExpositionWriter().render(view_with(3, "west"))


def test_the_label_cache_is_bounded_by_its_size() -> None:
    writer = ExpositionWriter(label_cache_size=10)
    writer.render(view_with(40))
    assert writer.devices_kept == 40 and writer.labels_cached == 10


def test_a_writer_forgets_devices_gone_for_good_and_writes_the_same_text() -> None:
    """Once most of the devices are gone their lines are forgotten; the text of those
    left is what a fresh writer writes."""
    writer = ExpositionWriter()
    writer.render(view_with(2000))
    small = view_with(8)
    text = writer.render(small)
    assert writer.devices_kept == 0, "the devices' lines are let go at the end of the render"
    assert text == writer.render(small) == ExpositionWriter().render(small)
    assert writer.devices_kept == 8


def test_a_value_that_changes_is_written_anew() -> None:
    writer = ExpositionWriter()
    before = view_with(1)
    writer.render(before)
    after = dataclasses.replace(before, states=[make_device(0, utilization=0.75)])
    text = writer.render(after)
    assert b"0.75" in text and text == ExpositionWriter().render(after)
