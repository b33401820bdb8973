"""The view a cycle publishes shares no table with the running figures."""

from __future__ import annotations

from exporter.metrics.health import SourceHealth, SourceTarget
from exporter.model.totals import Totals, WaitHistogram
from exporter.runtime.publishing import copy_of


def test_a_copy_of_the_sources_health_keeps_its_counts_by_reason() -> None:
    health = SourceHealth()
    key = SourceTarget("dcgm", "http://n1:9400/metrics")
    health.up[key] = False
    health.errors[key] += 1
    health.error_reasons[key]["timeout"] += 1
    shown = copy_of(health)
    health.up[key] = True
    health.errors[key] += 1
    health.error_reasons[key]["timeout"] += 1
    health.error_reasons[key]["http_500"] += 1
    assert shown.up == {key: False} and shown.errors == {key: 1}
    assert shown.error_reasons == {key: {"timeout": 1}}


def test_a_copy_of_the_totals_keeps_its_histograms_and_sets() -> None:
    totals = Totals()
    totals.queue_hist["a", "b", "c"] = WaitHistogram([1, 0], 1, 10.0)
    totals.waited.add("u1")
    shown = copy_of(totals)
    totals.queue_hist["a", "b", "c"].buckets[1] += 1
    totals.waited.add("u2")
    assert shown.queue_hist["a", "b", "c"].buckets == [1, 0] and shown.waited == {"u1"}
