"""Durations in configuration and scenario files: seconds, or strings like ``1d6h30m``."""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator

_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)d)?\s*(?:(\d+(?:\.\d+)?)h)?\s*"
                       r"(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s)?\s*$")


def parse_duration(value: object) -> float:
    """Seconds from a number or a string such as ``90s``, ``30m``, ``1d6h``."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '1d6h30m'")
    if isinstance(value, str) and re.fullmatch(r"\s*\d+(?:\.\d+)?\s*", value):
        value = float(value)  # a bare number is seconds (environment variables are text)
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)) and any(m.groups()):
        d, h, mi, s = (float(g) if g else 0.0 for g in m.groups())
        seconds = d * 86400 + h * 3600 + mi * 60 + s
    else:
        raise ValueError(f"{value!r} is not a duration: use seconds or a string like '1d6h30m'")
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError("a duration must be a finite number of seconds >= 0")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]
