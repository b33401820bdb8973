"""Report weeks."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from analytics.week import last_complete_week, parse_week
from tests.analytics.figures.frames import WEEK


def test_weeks() -> None:
    assert (WEEK.start, WEEK.end) == (datetime(2026, 11, 16, tzinfo=UTC),
                                      datetime(2026, 11, 23, tzinfo=UTC))
    assert WEEK.label == "2026-W47" and WEEK.previous.label == "2026-W46"
    assert last_complete_week(datetime(2026, 11, 25, 12, tzinfo=UTC)) == WEEK
    assert last_complete_week(datetime(2026, 11, 23, tzinfo=UTC)) == WEEK
    for bad in ("2026-47", "2026-W54", "W47"):
        with pytest.raises(ValueError, match="week"):
            parse_week(bad)
