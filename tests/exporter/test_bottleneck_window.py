"""A pod's window, kept by field, gives the signals of its samples exactly."""

from __future__ import annotations

import random

import pytest

from exporter.model.bottleneck import CLOCK_REASONS, SIGNAL_FIELDS, VIOLATIONS, Window, signals


def _sample(rng: random.Random, counters: dict[str, float]) -> dict[str, float]:
    """Some signal fields (each may be missing), GR often near the stall threshold, the
    violation counters rising (by up to the time between samples) or now and then
    restarted."""
    out: dict[str, float] = {}
    for name in SIGNAL_FIELDS:
        if rng.random() < 0.2:
            continue
        if name in VIOLATIONS:
            was = counters.get(name, rng.choice([0.0, 1e12]))
            counters[name] = out[name] = rng.choice([0.0, rng.random() * 1e9]) \
                if rng.random() < 0.1 else was + rng.choice([0.0, 90e9 * rng.random()])
        elif name == CLOCK_REASONS:
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
    counters: dict[str, float] = {}
    now = 0.0
    for _ in range(60):
        now += rng.choice([15.0, 30.0, 30.0, 90.0])
        sample = _sample(rng, counters)
        window.add(now, sample)
        kept.append((now, sample))
        window.expire(now - width)
        kept = [(t, s) for t, s in kept if t > now - width]
        assert window.signals() == signals([s for _, s in kept], [t for t, _ in kept])


def test_an_empty_window_has_no_signal() -> None:
    window = Window()
    window.add(10.0, {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.5, CLOCK_REASONS: 4.0})
    window.expire(10.0)
    assert window.signals() == signals([])


def test_a_violation_counter_reads_only_the_pairs_left_in_the_window() -> None:
    """The counter's increase from a sample that has left the window no longer counts."""
    power = VIOLATIONS[0]
    window = Window()
    for when, value in ((30.0, 0.0), (60.0, 30e9), (90.0, 33e9), (120.0, 36e9)):
        window.add(when, {power: value})
    assert window.signals().throttled_share == (30e9 + 3e9 + 3e9) / 1e9 / 90
    window.expire(30.0)
    assert window.signals().throttled_share == (3e9 + 3e9) / 1e9 / 60
    window.expire(90.0)
    assert window.signals().throttled_share is None
    window.expire(120.0)
    window.add(150.0, {power: 45e9})
    assert window.signals().throttled_share is None  # its previous sample has gone
