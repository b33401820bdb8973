"""The catalogue (``exporter.metrics.families``): its names say their units, as Prometheus names
them, and its per-device families are one group."""

from __future__ import annotations

import re
from typing import get_args

import pytest

from exporter.metrics.families import (
    DEVICE_FAMILIES,
    DEVICE_READINGS,
    FAMILIES,
    AnyFamily,
    Unit,
    is_histogram,
)

UNITS = tuple(u for u in get_args(Unit) if u)


def named_after(name: str, unit: str) -> bool:
    """Whether ``name`` ends in ``unit``; a rate's denominator may be qualified."""
    if name.endswith(f"_{unit}"):
        return True
    numerator, per, denominator = unit.partition("_per_")
    return bool(per) and re.search(rf"_{numerator}_per_[a-z]+_{denominator}$",
                                   name) is not None


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.unit], ids=lambda f: f.name)
def test_a_family_with_a_unit_ends_in_it(family: AnyFamily) -> None:
    """Prometheus naming, as the catalogue follows it: a family's name ends in its base
    unit (``_seconds``, ``_bytes``, ``_ratio``, ``_celsius``, ``_watts``, ``_hertz``; a
    count of things in what it counts, ``_gpus``, ``_pods``; money in ``_usd``, a price in
    ``_usd_per_hour``, whose hour may say which, ``_usd_per_utilized_hour``); a counter's
    exposed name has ``_total`` after the unit (``cost_usd_total``)."""
    assert named_after(family.name, family.unit)


@pytest.mark.parametrize("family", [f for f in FAMILIES if not f.unit], ids=lambda f: f.name)
def test_a_family_without_a_unit_is_not_named_after_one(family: AnyFamily) -> None:
    """A family of no unit ("") is a flag, a state, an info family's 1, a code or a count
    its name says (``exporter_errors_total``): its name ends in no unit."""
    assert not any(named_after(family.name, unit) for unit in UNITS)


def test_every_unit_is_used() -> None:
    assert {f.unit for f in FAMILIES} == set(get_args(Unit))


def test_the_device_families_are_a_group_of_the_catalogue() -> None:
    """The per-device families, the readings among them, each once, of the catalogue's
    kind of gauges."""
    group = tuple(DEVICE_FAMILIES)
    assert len(set(group)) == len(group) == 7 + len(DEVICE_READINGS)
    assert {r.family for r in DEVICE_READINGS} <= set(group) <= set(FAMILIES)
    assert all(f.kind == "gauge" and not is_histogram(f) for f in group)
