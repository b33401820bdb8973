"""The report's charts read as a person reads them (``analytics.charts``)."""

from __future__ import annotations

import pytest

from analytics import charts
from exporter.model.pending import CAUSES


@pytest.mark.parametrize(("longest", "unit"), [
    (0.0, "minutes"), (600.0, "minutes"), (7199.0, "minutes"), (7200.0, "hours"),
    (33 * 3600.0, "hours")])
def test_waits_read_in_hours_where_they_are_hours(longest: float, unit: str) -> None:
    assert charts.wait_unit(longest)[0] == unit


def test_every_cause_has_words() -> None:
    assert set(charts.CAUSE_LABELS) == set(CAUSES)
    assert all("_" not in words for words in charts.CAUSE_LABELS.values())
