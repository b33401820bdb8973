"""Who a GPU's time and cost go to: the owner, team and allocation of a pod in the view,
the owners remembered for pods gone from it (a GPU DCGM still shows with such a pod is
theirs), and GPUs whose pods are of no known team."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from exporter.config import Config
from exporter.logs import Episodes
from exporter.model import compute
from exporter.model.records import PodInfo
from exporter.sources import ClusterSource

REMEMBERED_OWNERS = 20_000
"""GPU pods whose owner is remembered after they leave the view (by namespace and name,
the most recently seen kept): a GPU DCGM still shows with such a pod is theirs."""
REMEMBERED_SECONDS = 3600.0
"""And for how long after they were last in the view (memory stays flat under churn)."""


def owner_of(pod: PodInfo, namespace_labels: Mapping[str, Mapping[str, str]],
             namespaces_listed: bool, config: Config) -> compute.Owner:
    """A pod's owner: its team (``compute.team_of``; ``namespaces_listed``: whether
    ``namespace_labels`` are the cluster's) and its allocation, when one is configured."""
    team = compute.team_of(pod.labels, pod.namespace, namespace_labels, config.team_label,
                           namespaces_listed)
    a = config.allocation
    allocation = compute.allocation_of(pod.labels, pod.annotations, pod.namespace,
                                       namespace_labels, a.label, a.annotation
                                       ) if a.enabled else ""
    return compute.Owner(pod.uid, pod.namespace, pod.name, team, pod.workload, allocation)


@dataclass(frozen=True, slots=True)
class OwnerOf:
    """Pods' owners from the namespaces' labels as they stood when it was made; called
    with a pod."""

    namespace_labels: Mapping[str, Mapping[str, str]]
    namespaces_listed: bool
    config: Config

    def __call__(self, pod: PodInfo) -> compute.Owner:
        return owner_of(pod, self.namespace_labels, self.namespaces_listed, self.config)


class Owners:
    """The owners of the cluster's pods, and of pods gone from the view."""

    def __init__(self, config: Config, kube: ClusterSource, episodes: Episodes) -> None:
        self.config = config
        self.kube = kube
        self._known: dict[tuple[str, str], tuple[compute.Owner, float]] = {}
        """(namespace, pod) -> the owner last seen and when it was last in the view."""
        self._episodes = episodes

    def frozen(self) -> OwnerOf:
        """Pods' owners as the namespaces stand now, whatever they become."""
        return OwnerOf(dict(self.kube.namespace_labels),
                       self.kube.synced["namespaces"].is_set(), self.config)

    def owner(self, pod: PodInfo) -> compute.Owner:
        return owner_of(pod, self.kube.namespace_labels,
                        self.kube.synced["namespaces"].is_set(), self.config)

    def team(self, pod: PodInfo) -> str:
        return self.owner(pod).team

    def allocation(self, pod: PodInfo) -> str:
        return self.owner(pod).allocation

    def of_gpu_pods(self) -> dict[tuple[str, str], compute.Owner]:
        """(namespace, pod) -> owner of each GPU pod in the view."""
        return {(p.namespace, p.name): self.owner(p) for p in self.kube.pods.values()
                if p.gpus > 0}

    def remember(self, owners: Mapping[tuple[str, str], compute.Owner], now: float) -> None:
        """Keep the owners whose team is known, the most recently seen last: at most
        ``REMEMBERED_OWNERS``, none last seen over ``REMEMBERED_SECONDS`` ago."""
        known = self._known
        for key, owner in owners.items():
            if owner.team != compute.UNKNOWN_TEAM:
                known.pop(key, None)
                known[key] = (owner, now)
        while known:
            oldest = next(iter(known))
            if len(known) <= REMEMBERED_OWNERS and known[oldest][1] >= now - REMEMBERED_SECONDS:
                break
            del known[oldest]

    def unviewed_owner(self, namespace: str, pod: str) -> compute.Owner:
        """The owner of a GPU's pod not in the view: as last seen, else by its namespace
        (``compute.unviewed_owner``), else ``compute.UNKNOWN_TEAM``'s."""
        if (known := self._known.get((namespace, pod))) is not None:
            return known[0]
        return compute.unviewed_owner(namespace, pod, self.kube.namespace_labels,
                                      self.config.team_label)

    def unowned(self, states: Sequence[compute.DeviceState], now: float) -> None:
        """Log once per episode that allocated GPUs have pods of an unknown team."""
        pods = sorted({f"{o.namespace}/{o.name}" for d in states for o in d.owners
                       if o.team == compute.UNKNOWN_TEAM})
        if pods:
            missing = [k for k in ("pods", "namespaces") if not self.kube.up.get(k)]
            self._episodes.failed(("owners", "unknown"), now, "gpu owners unknown",
                                  team=compute.UNKNOWN_TEAM, pods=len(pods), first=pods[:5],
                                  kubernetes_down=missing)
        else:
            self._episodes.recovered(("owners", "unknown"), now, "gpu owners known again")
