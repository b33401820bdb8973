"""The gap between the exporter's cost and the bill, named by the kind of its cause and
totalled by it (``analytics.reconcile``)."""

from __future__ import annotations

import pandas as pd
import pytest

from analytics import reconcile_causes


@pytest.mark.parametrize(("args", "kind"), [
    ((10.0, 10.0, 30.0, 30.0, 0.0), "reconciled"),
    ((10.0, 14.0, 30.0, 42.0, 0.0), "unmonitored GPUs: billed, not seen by the exporter"),
    ((14.0, 10.0, 42.0, 30.0, 0.0), reconcile_causes.COUNTED_NOT_BILLED),
    ((10.0, 10.0, 30.0, 30.0, -9.0), "credits the exporter does not apply"),
    ((10.0, 10.0, 30.0, 36.0, 0.0), "price drift: the bill's price is not the exporter's"),
])
def test_each_cause_has_its_kind(args: tuple[float, ...], kind: str) -> None:
    assert reconcile_causes.kind(reconcile_causes.cause(*args)) == kind


def test_the_gap_is_totalled_by_kind_the_largest_first() -> None:
    table = pd.DataFrame({
        "cause": [reconcile_causes.cause(*args) for args in (
            (10, 10, 30, 36, 0), (10, 10, 30, 30, 0), (10, 10, 20, 23, 0), (10, 14, 30, 42, 0))],
        "gap_usd": [6.0, 0.0, 3.0, 12.0]})
    out = reconcile_causes.by_cause(table)
    assert out.to_dict("records") == [
        {"cause": "unmonitored GPUs: billed, not seen by the exporter", "rows": 1,
         "gap_usd": 12.0},
        {"cause": "price drift: the bill's price is not the exporter's", "rows": 2,
         "gap_usd": 9.0},
        {"cause": "reconciled", "rows": 1, "gap_usd": 0.0}]
