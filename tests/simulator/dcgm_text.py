"""Parse dcgm-exporter text in tests (prometheus_client's reference parser)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def samples(text: str) -> list[Sample]:
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            # The reference parser appends _total to counters; dcgm-exporter does not.
            name = family.name if family.type == "counter" else s.name
            out.append(Sample(name, dict(s.labels), s.value))
    return out


def by_gpu(text: str, **match: str) -> dict[str, dict[str, float]]:
    """``{UUID[/GPU_I_ID]: {field: value}}`` for samples whose labels include ``match``."""
    out: dict[str, dict[str, float]] = {}
    for s in samples(text):
        if all(s.labels.get(k) == v for k, v in match.items()):
            key = s.labels["UUID"] + (f"/{s.labels['GPU_I_ID']}" if "GPU_I_ID" in s.labels
                                      else "")
            out.setdefault(key, {})[s.name] = s.value
    return out
