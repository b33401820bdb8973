"""Retry delays."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with full jitter: 0..min(cap, base * 2**n) seconds."""

    base: float = 0.5
    cap: float = 30.0
    attempts: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def next(self) -> float:
        delay = self.rng.uniform(0, min(self.cap, self.base * 2 ** self.attempts))
        self.attempts += 1
        return delay

    def reset(self) -> None:
        self.attempts = 0
