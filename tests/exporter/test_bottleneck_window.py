"""A pod's window, kept by field, gives the signals of its samples exactly."""

from __future__ import annotations

import random

import pytest

from exporter.bottleneck import CLOCK_REASONS, SIGNAL_FIELDS, Window, signals


def _sample(rng: random.Random) -> dict[str, float]:
    """Some signal fields (each may be missing), GR often near the stall threshold."""
    out: dict[str, float] = {}
    for name in SIGNAL_FIELDS:
        if rng.random() < 0.2:
            continue
        if name == CLOCK_REASONS:
            out[name] = float(rng.choice([0, 0x1, 0x4, 0x20, 0x80, 0x10]))
        elif name == "DCGM_FI_PROF_GR_ENGINE_ACTIVE":
            out[name] = rng.choice([0.0, 0.19, 0.2, 0.21, 0.6, rng.random()])
        else:
            out[name] = rng.random() * rng.choice([1.0, 100.0, 1e9])
    return out


@pytest.mark.parametrize("seed", range(20))
def test_a_window_gives_the_signals_of_its_samples(seed: int) -> None:
    rng = random.Random(seed)
    width = rng.choice([30.0, 300.0, 600.0])
    window = Window()
    kept: list[tuple[float, dict[str, float]]] = []
    now = 0.0
    for _ in range(60):
        now += rng.choice([15.0, 30.0, 30.0, 90.0])
        sample = _sample(rng)
        window.add(now, sample)
        kept.append((now, sample))
        window.expire(now - width)
        kept = [(t, s) for t, s in kept if t > now - width]
        assert window.signals() == signals([s for _, s in kept])


def test_an_empty_window_has_no_signal() -> None:
    window = Window()
    window.add(10.0, {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.5, CLOCK_REASONS: 4.0})
    window.expire(10.0)
    assert window.signals() == signals([])
