"""Each allocated pod's bottleneck: one sample a cycle (the mean over its GPUs of the
fields that count) in a window of ``bottleneck_window`` seconds, and what the window
says (``bottleneck.decide``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from exporter.model import compute
from exporter.model.bottleneck import CLOCK_REASONS, SIGNAL_FIELDS, Diagnosis, Window, decide


def mean_fields(samples: Sequence[Mapping[str, float]]) -> Mapping[str, float]:
    """One sample of a pod's GPUs: the mean of each signal field over them (of the
    clock-event reasons, every GPU's bits)."""
    if len(samples) == 1:  # most pods have one GPU: its values are the means
        return samples[0]
    out = {}
    for name in SIGNAL_FIELDS:
        values = [s[name] for s in samples if name in s]
        if values:
            if name == CLOCK_REASONS:  # a bitmask: any GPU's reasons count
                bits = 0
                for v in values:
                    bits |= int(v)
                out[name] = float(bits)
            else:
                out[name] = sum(values) / len(values)
    return out


class Bottlenecks:
    """The windows of the pods allocated now, and the last cycle's diagnoses."""

    def __init__(self, window_seconds: float) -> None:
        self.window_seconds = window_seconds
        self._windows: dict[str, Window] = {}
        """Each allocated pod's samples over ``window_seconds``."""
        self.diagnoses: Mapping[str, tuple[compute.Owner, Diagnosis]] = {}
        """Pod uid -> its owner and diagnosis, of the last cycle: a new mapping each
        cycle, never changed after."""

    def update(self, now: float, states: Sequence[compute.DeviceState]) -> None:
        live: dict[str, tuple[compute.Owner, str, bool]] = {}
        per_pod: dict[str, list[Mapping[str, float]]] = defaultdict(list)
        for d in states:
            if d.state != "allocated":
                continue
            for o in d.owners:
                if o.uid:
                    per_pod[o.uid].append(d.fields)
                    live[o.uid] = (o, d.accelerator, d.mig_profile is not None)
        for uid, fields in per_pod.items():
            w = self._windows.get(uid)
            if w is None:
                w = self._windows[uid] = Window()
            w.add(now, mean_fields(fields))
        diagnoses = {}
        for uid, (owner, accel, mig) in live.items():
            w = self._windows[uid]
            w.expire(now - self.window_seconds)
            diagnoses[uid] = (owner, decide(w.signals(), accel, mig=mig))
        self.diagnoses = diagnoses
        for uid in [u for u in self._windows if u not in live]:
            del self._windows[uid]

    def pod_gone(self, uid: str) -> None:
        self._windows.pop(uid, None)
