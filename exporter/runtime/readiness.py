"""Why ``/readyz`` answers 503: the Kubernetes kinds the figures need not listed, denied
or stale, Kueue's API group not discovered, no full cycle yet, the warehouse failing."""

from __future__ import annotations

from collections.abc import Callable

from exporter.config import Config
from exporter.runtime.recording import Recording
from exporter.sources import ClusterSource
from exporter.sources.kube import KUEUE_KINDS
from exporter.sources.kueue import GROUP as KUEUE_GROUP

VIEW_KINDS = ("nodes", "pods", "namespaces")
"""The Kubernetes kinds the figures stand on (a pod's team may be its namespace's label):
not ready before all are listed. Kueue's kinds too where the cluster serves Kueue."""


class Readiness:
    """The readiness checks; ``viewed_cycles`` gives the cycles that ran on a listed
    view."""

    def __init__(self, config: Config, kube: ClusterSource, recording: Recording,
                 viewed_cycles: Callable[[], int]) -> None:
        self.config = config
        self.kube = kube
        self.recording = recording
        self.viewed_cycles = viewed_cycles

    def unready(self) -> list[str]:
        """Why ``/readyz`` answers 503, one line each; empty when ready. Every readiness
        check is in ``checks``."""
        return [reason for check in self.checks if (reason := check())]

    @property
    def checks(self) -> tuple[Callable[[], str | None], ...]:
        """Each returns why the exporter is not ready, or None."""
        return (self._kubernetes_listed, self._kubernetes_allowed, self._kueue_discovered,
                self._kubernetes_fresh, self._warehouse_writing)

    def needed_kinds(self) -> tuple[str, ...]:
        """The Kubernetes kinds the figures need: ``VIEW_KINDS``, and Kueue's where the
        cluster serves it (queue wait's admission comes from its Workloads)."""
        return VIEW_KINDS + (KUEUE_KINDS if self.kube.kueue else ())

    def _kueue_discovered(self) -> str | None:
        if error := self.kube.discovery_error.get(KUEUE_GROUP):
            return (f"whether the cluster runs Kueue is unknown: its API group "
                    f"{KUEUE_GROUP} cannot be discovered ({error})")
        return None

    def _kubernetes_listed(self) -> str | None:
        missing = [k for k in self.needed_kinds() if not self.kube.synced[k].is_set()]
        if missing:
            errors = [e for k in missing if (e := self.kube.stats[k].last_error)]
            kinds = ", ".join(missing[:-1]) + " and " + missing[-1] if len(missing) > 1 \
                else missing[0]
            return (f"no list of {kinds} from the Kubernetes API yet"
                    + (f" (last error: {' '.join(errors[0].splitlines()[:2])})"
                       if errors else ""))
        if not self.viewed_cycles():
            return "waiting for the first full cycle"
        return None

    def _kubernetes_allowed(self) -> str | None:
        denied = [k for k in self.needed_kinds() if k in self.kube.denied]
        if denied:
            return (f"the Kubernetes API forbids {', '.join(denied)} to the exporter (HTTP "
                    f"403): {self.kube.denied[denied[0]]}")
        return None

    def _kubernetes_fresh(self) -> str | None:
        ages = [a for k in self.needed_kinds() if (a := self.kube.age(k)) is not None]
        bound = self.config.kubernetes.max_staleness
        if ages and max(ages) > bound:
            return (f"the Kubernetes view is {max(ages):.0f} s old (kubernetes.max_staleness "
                    f"{bound:g} s): the API does not answer")
        return None

    def _warehouse_writing(self) -> str | None:
        recording = self.recording
        if recording.ok:
            return None
        why = ' '.join(str(recording.error).split())[:300]
        if (opening := recording.opening) is not None:
            return (f"the warehouse cannot be opened, /metrics is served without history "
                    f"(tried again every {opening.retry_seconds:g} s): {why}")
        return f"the warehouse fails: {why}"
