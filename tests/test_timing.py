"""The time limits of the suite follow the machine's load (``tests/timing.py``)."""

from __future__ import annotations

import pytest

from tests import timing


def test_a_limit_is_scaled_by_how_much_slower_the_machine_runs_now() -> None:
    assert 1.0 <= timing.scale() <= timing.MOST
    assert timing.limit(10) == pytest.approx(10 * timing.scale())


@pytest.mark.parametrize(("given", "scale"), [("3", 3.0), ("0.5", 1.0)])
def test_the_scale_can_be_set_and_never_shortens_a_limit(
        monkeypatch: pytest.MonkeyPatch, given: str, scale: float) -> None:
    monkeypatch.setenv("GKE_GPU_TEST_TIME_SCALE", given)
    assert timing.limit(10) == pytest.approx(10 * scale)


@pytest.mark.timeout(1)
def test_a_test_s_own_timeout_is_scaled_too(request: pytest.FixtureRequest) -> None:
    """The timeout pytest-timeout reads (the closest mark) is the scaled one, put before
    the test's own."""
    closest = request.node.get_closest_marker("timeout")
    own = [m.args[0] for m in request.node.own_markers if m.name == "timeout"]
    assert closest is not None and own == [closest.args[0], 1]
    assert 1 <= closest.args[0] <= timing.MOST
