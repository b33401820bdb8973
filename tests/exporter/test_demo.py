"""The demo off a terminal: a plain line of progress every tenth of the run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.demo import progress_line
from tests.timing import limit

ROOT = Path(__file__).parent.parent.parent


@pytest.mark.parametrize(("done", "steps", "step", "elapsed", "line"), [
    (202, 2016, 300.0, 4.4, "simulated day 0.7 of 7 (10%), 4 s"),
    (2016, 2016, 300.0, 41.0, "simulated day 7.0 of 7 (100%), 41 s"),
    (144, 288, 300.0, 9.6, "simulated day 0.5 of 1 (50%), 10 s"),
    (6, 24, 300.0, 0.2, "simulated hour 0.5 of 2 (25%), 0 s"),
    (60, 120, 30.0, 1.0, "simulated hour 0.5 of 1 (50%), 1 s"),
])
def test_progress_line(done: int, steps: int, step: float, elapsed: float,
                       line: str) -> None:
    assert progress_line(done, steps, step, elapsed) == line


def test_the_demo_off_a_terminal_prints_its_progress(tmp_path: Path) -> None:
    """With its output captured (no terminal, so no progress bar), the demo prints a line
    per tenth of the run on stderr, in order, up to 100 %, and its summary on stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "exporter", "demo", "--duration", "2h", "--out",
         str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=limit(300),
        check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("simulated ")]
    shares = [int(m[1]) for line in lines
              if (m := re.fullmatch(r"simulated hour [\d.]+ of 2 \((\d+)%\), \d+ s", line))]
    assert len(shares) == len(lines) == 10, done.stderr[-2000:]
    assert shares == sorted(shares) and shares[-1] == 100
    assert "\r" not in done.stderr                      # no progress bar
    assert "Simulated 0.0833333 days of cluster 'demo'" in done.stdout
    assert "Weekly report 2026-W47 of 1% of the week (below report.min_coverage, 50%: " \
        "written for the demo; report weekly would refuse it)" in done.stdout
