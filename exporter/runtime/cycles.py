"""What the cycles have done since start: how many ran (on a listed Kubernetes view), the
last one's time, wall seconds and CPU by stage, and the device states it computed (the
next cycle integrates them over the time between)."""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.model import compute


@dataclass(slots=True)
class CycleRecord:
    cycles: int = 0
    viewed_cycles: int = 0
    """Cycles that ran on a listed Kubernetes view (``readiness.VIEW_KINDS``)."""
    seconds: float = 0.0
    """Wall seconds of the last cycle."""
    stage_cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds of the last cycle by stage: scrape (HTTP and parsing), compute,
    warehouse (every thread of the process, so approximate while other work runs)."""
    last_time: float = 0.0
    """The time of the last cycle (0 before the first)."""
    states: list[compute.DeviceState] = field(default_factory=list)
    state_time: float | None = None
    """The time of ``states``; None before the first cycle."""
