"""The rows of ``gpu_pending`` and ``gpu_free``: each cycle's waits and free GPUs summed per
warehouse interval (a stretch of time across an interval's end split at it), held until
the interval has ended and ``flush`` takes them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from exporter.model.pending import FreeRow, PendingRow
from exporter.sinks.warehouse.changes import _ts, row_id


def _pieces(start: float, seconds: float, interval: float) -> list[tuple[float, float]]:
    """(interval start, seconds in it) of a stretch of time."""
    out = []
    t, end = start, start + seconds
    while t < end - 1e-9:
        bucket = t - t % interval
        upto = min(end, bucket + interval)
        out.append((bucket, upto - t))
        t = upto
    return out


@dataclass(slots=True)
class _Free:
    seconds: float = 0.0
    gpu_seconds: float = 0.0
    cost: float = 0.0
    fragmentation_seconds: float = 0.0
    asked_seconds: float = 0.0
    """Of ``seconds``, those while a pod that fits the pool waited (its fragmentation has
    a figure)."""
    """Fragmentation ratio x seconds, for its mean."""
    largest: int = 0
    info: dict[str, Any] = field(default_factory=dict)


class WaitRows:
    """The cluster's waits and free GPUs of the intervals not written yet."""

    def __init__(self, cluster: str, interval: float) -> None:
        self.cluster = cluster
        self.interval = interval
        self._pending: dict[tuple[float, str, str], dict[str, Any]] = {}
        """(interval, uid, cause) -> its row."""
        self._free: dict[tuple[float, str, str], _Free] = {}
        """(interval, pool, use) -> its sums."""

    def add(self, pending: list[PendingRow], free: list[FreeRow]) -> None:
        for r in pending:
            w, v = r.waiting, r.waiting.verdict
            for bucket, seconds in _pieces(r.start, r.seconds, self.interval):
                key = (bucket, w.uid, v.cause)
                row = self._pending.get(key)
                if row is None:
                    row = self._pending[key] = {
                        "id": row_id(self.cluster, bucket, w.kind, w.uid, v.cause),
                        "time": _ts(bucket), "interval_seconds": self.interval,
                        "cluster": self.cluster, "namespace": w.namespace, "team": w.team,
                        "workload": w.workload, "kind": w.kind, "uid": w.uid,
                        "name": w.name, "gpus": w.gpus, "gpus_per_pod": w.gpus_per_pod,
                        "gpu_model": w.model, "node_pool": v.pool, "cause": v.cause,
                        "seconds": 0.0, "gpu_seconds": 0.0, "wait_seconds": 0.0,
                        "evidence": None, "evidence_source": None,
                        "cluster_queue": w.cluster_queue or None, "expected_start": None}
                row["seconds"] += seconds
                row["gpu_seconds"] += w.gpus * seconds
                row["wait_seconds"] = w.wait_seconds + r.seconds
                if v.said is not None:
                    row["evidence"], row["evidence_source"] = v.said.words, v.said.source
                row["expected_start"] = None if r.expected_start is None else \
                    _ts(r.expected_start)  # the interval's last forecast, if one found
        for f in free:
            pf = f.pool
            gpus = pf.gpus.get(f.use, 0.0)
            cost = pf.cost_usd_per_hour.get(f.use, 0.0)
            for bucket, seconds in _pieces(f.start, f.seconds, self.interval):
                s = self._free.get((bucket, pf.pool, f.use))
                if s is None:
                    s = self._free[bucket, pf.pool, f.use] = _Free(info={
                        "gpu_model": pf.model, "provisioning": pf.provisioning,
                        "zone": pf.zone})
                s.seconds += seconds
                s.gpu_seconds += gpus * seconds
                s.cost += cost * seconds / 3600.0
                if (ratio := pf.fragmentation) is not None:
                    s.fragmentation_seconds += ratio * seconds
                    s.asked_seconds += seconds
                s.largest = max(s.largest, pf.largest)

    def ready(self, now: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The rows of the intervals ended by ``now`` (``math.inf``: all); ``drop`` takes
        them out once they are written."""
        pending = [self._pending[k] for k in sorted(self._pending) if self._ended(k, now)]
        free = []
        for key in sorted(k for k in self._free if self._ended(k, now)):
            s = self._free[key]
            bucket, pool, use = key
            free.append({
                "id": row_id(self.cluster, bucket, pool, use), "time": _ts(bucket),
                "interval_seconds": self.interval, "cluster": self.cluster,
                "node_pool": pool, **s.info, "use": use, "gpu_seconds": s.gpu_seconds,
                "cost_usd": s.cost,
                "fragmentation_ratio": s.fragmentation_seconds / s.asked_seconds
                if s.asked_seconds else None, "largest_free_gpus": s.largest})
        return pending, free

    def drop(self, now: float) -> None:
        """Forget the rows ``ready(now)`` gave."""
        for table in (self._pending, self._free):
            for key in [k for k in table if self._ended(k, now)]:
                del table[key]

    def _ended(self, key: tuple[float, str, str], now: float) -> bool:
        return now == math.inf or key[0] + self.interval <= now + 1e-9

    def __len__(self) -> int:
        return len(self._pending) + len(self._free)
