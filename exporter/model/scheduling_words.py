"""What the scheduler, the cluster autoscaler and Kueue say about a pod that waits, read
from their own words: pure functions from a message to a record, never raising, None (or
empty) for a message they do not recognise. ``scale_up_word`` sums the autoscaler's up in
the word the causes of a wait read (``pending.ScaleUp``).

The formats, as their sources write them (samples and provenance in
``tests/fixtures/scheduling/``):

- kube-scheduler (``pkg/scheduler/framework/types.go``, ``FitError.Error``): ``0/N nodes
  are available:`` then the PreFilter message, or the filter reasons as ``count reason``
  sorted and joined by ``", "``, each part ended by ``"."``; then the PostFilter's
  (``preemption: 0/N nodes are available: ...``). ``no nodes available to schedule pods``
  when the cluster has none. The scheduler cuts a message at 1,024 characters with
  ``" ..."``. Read by ``node_counts``.
- cluster-autoscaler (``processors/status/eventing_scale_up_processor.go``):
  ``TriggeredScaleUp`` ``pod triggered scale-up: [{GROUP FROM->TO (max: MAX)} ...]`` (the
  group a GCE managed instance group's URL on GKE); ``NotTriggerScaleUp`` ``pod didn't
  trigger scale-up: `` and ``count reason`` joined by ``", "`` in no order (before 1.27
  ``pod didn't trigger scale-up (it wouldn't fit if a new node is added): ...``; GKE's
  writes ``Pod``), the reasons being the scheduler's predicate failures on a node of the
  group (a mismatch: a new node of it would not take the pod) or why a group was skipped
  (``orchestrator/skippedreasons.go``: ``max node group size reached``, ``in backoff after
  failed scale-up``, ``not ready for scale-up``, ``max cluster cpu, memory limit
  reached``), or ``max total nodes in cluster reached`` alone. Read by
  ``autoscaler_words``.
- GKE's cluster autoscaler, ``FailedScaleUp``: ``Node scale up in zones ZONES associated
  with this pod failed: GCE out of resources. Pod is at risk of not being scheduled.``
  (also ``GCE quota exceeded``, ``IP space exhausted``...). Read by ``autoscaler_words``.
- Kueue (``pkg/scheduler/flavorassigner/flavorassigner.go``): a Workload's
  ``QuotaReserved=False`` message ``couldn't assign flavors to pod set NAME: REASONS``
  (pod sets joined by ``"; "``, reasons sorted, joined by ``", "``), a reason
  ``insufficient unused quota for RESOURCE in flavor FLAVOR, AMOUNT more needed`` or
  ``insufficient quota for RESOURCE in flavor FLAVOR, previously considered podsets
  requests (A) + current podset request (B) > maximum capacity (C)``. Read by
  ``quota_shortfalls``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from exporter.model.pending import ScaleUp
from exporter.model.quantities import quantity_value

GPU = "nvidia.com/gpu"

# ------------------------------------------------------------------- the scheduler

NodeReasonKind = Literal["insufficient_gpu", "insufficient", "selector", "taint", "cordoned",
                         "not_ready", "other"]
"""What a scheduler's (or a node group's) reason says of a node: too few GPUs free (or, on
an autoscaler's template node, at all); too little of something else (``Too many pods``
too); its labels do not meet the pod's node selector or required node affinity; a taint
the pod does not tolerate; cordoned; not ready or unreachable; anything else (volumes,
ports, pod affinity...)."""
TRANSIENT_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
"""The taints the node lifecycle controller puts on a node that stopped answering."""
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
"""The taint of a cordoned node."""

_AVAILABLE = re.compile(r"\b0/(\d{1,9}) nodes are available(?::\s*(.*))?", re.S)
_COUNTED = re.compile(r"(\d{1,9})\s+(\S.*)", re.S)
_PARTS = re.compile(r",\s+(?=\d+\s)")


@dataclass(frozen=True, slots=True)
class NodeCounts:
    """A scheduler's ``FailedScheduling`` (or ``PodScheduled=False``) message: how many
    nodes it tried and how many it turned down for each reason (one node may count under
    several)."""

    nodes: int
    reasons: tuple[tuple[str, int], ...]
    """(reason, nodes) in the message's order; a reason given without a count (a
    PreFilter's: ``pod has unbound immediate PersistentVolumeClaims``) counts every node."""
    preemption: str = ""
    """What preemption found (``preemption: 0/15 nodes are available: 15 No preemption
    victims found for incoming pod.``), if it ran."""

    def by_kind(self) -> dict[NodeReasonKind, int]:
        """Nodes turned down by each kind of reason (``node_reason_kind``)."""
        out: dict[NodeReasonKind, int] = {}
        for reason, n in self.reasons:
            kind = node_reason_kind(reason)
            out[kind] = out.get(kind, 0) + n
        return out


def node_reason_kind(reason: str) -> NodeReasonKind:
    """The kind of one scheduler predicate's reason (``Insufficient nvidia.com/gpu``,
    ``node(s) didn't match Pod's node affinity/selector``, ``node(s) had untolerated
    taint {nvidia.com/gpu: present}``, ``node(s) were unschedulable``...)."""
    text = reason.lower()
    if text.startswith("insufficient "):
        return "insufficient_gpu" if text.split()[1:2] == [GPU] else "insufficient"
    if text.startswith("too many pods"):
        return "insufficient"
    if "volume" in text:  # a volume's zone (``volume node affinity conflict``)
        return "other"
    if "taint" in text:
        if any(t in text for t in TRANSIENT_TAINTS):
            return "not_ready"
        return "cordoned" if UNSCHEDULABLE_TAINT in text else "taint"
    if "node affinity" in text or "node selector" in text or "affinity/selector" in text:
        return "selector"
    if "were unschedulable" in text:
        return "cordoned"
    if "not ready" in text or "not-ready" in text or "unreachable" in text:
        return "not_ready"
    return "other"


def node_counts(message: str) -> NodeCounts | None:
    """The counts of a scheduler's message; None if it is none."""
    m = _AVAILABLE.search(message)
    if m is None:
        return NodeCounts(0, ()) if "no nodes available to schedule pods" in message else None
    nodes = int(m.group(1))
    body, preemption = m.group(2) or "", ""
    cut = body.find("preemption: ")
    if cut >= 0:
        body, preemption = body[:cut], _ended(body[cut:])
    return NodeCounts(nodes, _counted(_ended(body), nodes), preemption)


def _ended(text: str) -> str:
    """``text`` without its closing period, or the ``" ..."`` of a message cut short."""
    text = text.strip()
    if text.endswith("..."):
        text = text[:-3].rstrip()
    return text.rstrip(".").strip()


def _counted(body: str, whole: int) -> tuple[tuple[str, int], ...]:
    """``count reason`` parts joined by commas, summed by reason; a part without a count
    counts ``whole``."""
    totals: dict[str, int] = {}
    for part in _PARTS.split(body) if body else ():
        part = _ended(part)
        if not part:
            continue
        m = _COUNTED.fullmatch(part)
        reason, n = (m.group(2).strip(), int(m.group(1))) if m else (part, whole)
        totals[reason] = totals.get(reason, 0) + n
    return tuple(totals.items())


# -------------------------------------------------------------- the cluster autoscaler

ScaleUpFailure = Literal["out_of_resources", "quota_exceeded", "other"]
"""Why a scale-up failed: the zone had no machine of the shape (a stockout), the
project's quota was spent, or anything else (IP space, a timeout...)."""
SCALE_UP_FAILURES: tuple[ScaleUpFailure, ...] = ("out_of_resources", "quota_exceeded", "other")
GroupReasonKind = Literal["max_size", "limit", "backoff", "not_ready", "mismatch", "other"]
"""Why the autoscaler did not scale a node group up for a pod: the group is at its
maximum; a cluster-wide limit (total nodes, CPU, memory) is reached; the group is backing
off a failed scale-up; it is not ready; a new node of it would not take the pod (a
scheduler predicate fails on it); anything else (all-or-nothing, vertical headroom)."""

_TRIGGERED = re.compile(r"triggered scale-up:\s*\[(.*)\]", re.S | re.I)
_OLD_TRIGGERED = re.compile(r"triggered scale-up, group: (\S+), sizes \(current/new\): "
                            r"(\d{1,9})/(\d{1,9})", re.I)
_GROUP = re.compile(r"\{(\S+) (\d{1,9})->(\d{1,9})(?: \(max: (\d{1,9})\))?\}")
_NOT_TRIGGERED = re.compile(
    r"didn't trigger scale-up(?: \(it wouldn't fit if a new node is added\))?:?(.*)",
    re.S | re.I)
_FAILED = re.compile(r"scale up in zones? (.*?) (?:associated with this pod )?failed: (.*)",
                     re.S | re.I)
_AT_RISK = re.compile(r"\.?\s*Pod is at risk of not being scheduled\.?\s*$", re.I)
_ZONE = re.compile(r"/zones/([^/\s]+)/")


@dataclass(frozen=True, slots=True)
class GroupScaleUp:
    """One node group a ``TriggeredScaleUp`` grows."""

    group: str
    """As the autoscaler names it: on GKE the managed instance group's URL
    (``https://www.googleapis.com/compute/v1/projects/P/zones/Z/instanceGroups/gke-C-POOL-HASH-grp``)."""
    from_nodes: int
    to_nodes: int
    max_nodes: int | None

    @property
    def name(self) -> str:
        """The group's own name: its URL's last part."""
        return self.group.rstrip("/").rsplit("/", 1)[-1]

    @property
    def zone(self) -> str | None:
        """The zone its URL names, if it does."""
        m = _ZONE.search(self.group)
        return m.group(1) if m else None


@dataclass(frozen=True, slots=True)
class Triggered:
    """``TriggeredScaleUp``: the autoscaler is adding nodes for the pod."""

    groups: tuple[GroupScaleUp, ...]


@dataclass(frozen=True, slots=True)
class NotTriggered:
    """``NotTriggerScaleUp``: no node group was grown for the pod, and why (each reason
    with the number of groups it held back; one given without a count counts once)."""

    reasons: tuple[tuple[str, int], ...]

    def kinds(self) -> dict[GroupReasonKind, int]:
        out: dict[GroupReasonKind, int] = {}
        for reason, n in self.reasons:
            kind = group_reason_kind(reason)
            out[kind] = out.get(kind, 0) + n
        return out

    @property
    def max_size(self) -> bool:
        """Some group it fits is at its maximum size, or a cluster-wide limit is reached."""
        kinds = self.kinds()
        return "max_size" in kinds or "limit" in kinds

    @property
    def backoff(self) -> bool:
        """Some group is backing off a scale-up that failed."""
        return "backoff" in self.kinds()

    @property
    def no_matching_group(self) -> bool:
        """Every group the autoscaler considered is a mismatch: no new node of any would
        take the pod. False when it names no group at all (none is autoscaled)."""
        kinds = self.kinds()
        return bool(kinds) and set(kinds) == {"mismatch"}


@dataclass(frozen=True, slots=True)
class ScaleUpFailed:
    """GKE's ``FailedScaleUp``: a scale-up for the pod failed, in these zones."""

    zones: tuple[str, ...]
    reason: ScaleUpFailure
    detail: str
    """The autoscaler's words for it: ``GCE out of resources``."""


AutoscalerWords = Triggered | NotTriggered | ScaleUpFailed


def group_reason_kind(reason: str) -> GroupReasonKind:
    """The kind of one reason a ``NotTriggerScaleUp`` gives."""
    text = reason.lower()
    if "max node group size reached" in text:
        return "max_size"
    if text.startswith("max ") and ("limit reached" in text or "nodes in cluster" in text):
        return "limit"
    if "backoff" in text:
        return "backoff"
    if "not ready for scale-up" in text:
        return "not_ready"
    if "all-or-nothing" in text or "vertically scaled" in text:
        return "other"
    return "mismatch"


def scale_up_failure(detail: str) -> ScaleUpFailure:
    """The kind of a failed scale-up's error (``GCE out of resources``, ``GCE quota
    exceeded``, ``ZONE_RESOURCE_POOL_EXHAUSTED``...)."""
    text = detail.lower()
    if "out of resources" in text or "stockout" in text or "resource_pool_exhausted" in text \
            or "resource pool exhausted" in text:
        return "out_of_resources"
    if "quota" in text:
        return "quota_exceeded"
    return "other"


def autoscaler_words(reason: str, message: str) -> AutoscalerWords | None:
    """What an autoscaler event of ``reason`` says; None for another reason or a message
    of another shape."""
    if reason == "TriggeredScaleUp":
        m = _TRIGGERED.search(message)
        if m is None:
            old = _OLD_TRIGGERED.search(message)  # cluster-autoscaler before 1.0
            return Triggered((GroupScaleUp(old.group(1), int(old.group(2)),
                                           int(old.group(3)), None),)) if old else None
        groups = tuple(GroupScaleUp(g, int(a), int(b), int(c) if c else None)
                       for g, a, b, c in _GROUP.findall(m.group(1)))
        return Triggered(groups) if groups else None
    if reason == "NotTriggerScaleUp":
        m = _NOT_TRIGGERED.search(message)
        if m is None:
            return None
        return NotTriggered(_counted(_ended(m.group(1)), 1))
    if reason in ("FailedScaleUp", "ScaleUpTimedOut"):
        body = _AT_RISK.sub("", message.strip())
        m = _FAILED.search(body)
        zones = tuple(z for z in re.split(r"[\s,]+", m.group(1)) if z) if m else ()
        detail = _ended(m.group(2) if m else body)
        return ScaleUpFailed(zones, scale_up_failure(detail) if reason == "FailedScaleUp"
                             else "other", detail)
    return None


def scale_up_word(reason: str, message: str) -> ScaleUp | None:
    """What an autoscaler event says of a pod, in a word: ``TriggeredScaleUp``: triggered;
    ``FailedScaleUp`` (or ``ScaleUpTimedOut``): failed; ``NotTriggerScaleUp``: failed while
    a group it fits backs off a failed scale-up, max_size when one is at its maximum (or a
    cluster-wide limit is reached), else no_group (a message not read included); None for
    another reason."""
    if reason == "TriggeredScaleUp":
        return "triggered"
    if reason in ("FailedScaleUp", "ScaleUpTimedOut"):
        return "failed"
    if reason != "NotTriggerScaleUp":
        return None
    words = autoscaler_words(reason, message)
    if isinstance(words, NotTriggered) and words.backoff:
        return "failed"
    if isinstance(words, NotTriggered) and words.max_size:
        return "max_size"
    return "no_group"


def mig_pool(group: str, pools: Iterable[str]) -> str | None:
    """The GKE node pool of a managed instance group among ``pools``: its name (or URL's
    last part) is ``gke-CLUSTER-POOL-HASH-grp``, the cluster's and the pool's names cut
    short when long, so the pool is the one the name ends with, else the one whose
    beginning it ends with (at least four characters), the longest; None if none fits
    (another cloud's group)."""
    name = group.rstrip("/").rsplit("/", 1)[-1]
    m = re.fullmatch(r"gk[e3]-(.+)-[0-9a-f]{8}-grp", name)
    if m is None:
        return None
    stem = m.group(1)
    tails = [stem[i + 1:] for i, c in enumerate(stem) if c == "-"]
    best: tuple[int, str] | None = None
    for pool in pools:
        if not pool:
            continue
        for tail in tails:
            score = 2 * len(pool) + 1 if tail == pool else \
                2 * len(tail) if len(tail) >= 4 and pool.startswith(tail) else 0
            if score and (best is None or (score, pool) > best):
                best = (score, pool)
    return best[1] if best else None


# --------------------------------------------------------------------------- Kueue

_POD_SET = re.compile(r"couldn't assign flavors to pod set (\S+?):\s")
_UNUSED = re.compile(r"insufficient unused quota for (\S+) in flavor (\S+?), (\S+) more needed")
_UNSAID = re.compile(r"insufficient quota for (\S+) in flavor (\S+?) in ClusterQueue")
_OVER_MAX = re.compile(
    r"insufficient quota for (\S+) in flavor (\S+?), previously considered podsets requests "
    r"\(([^)]*)\) \+ current podset request \(([^)]*)\) > maximum capacity \(([^)]*)\)")


@dataclass(frozen=True, slots=True)
class QuotaShortfall:
    """One resource a Workload's pod set lacks quota of, in one flavor."""

    pod_set: str
    """"" when the message names none."""
    resource: str
    flavor: str
    more_needed: float | None
    """In the resource's units (GPUs for ``nvidia.com/gpu``); None where the message does
    not say (older Kueue's ``insufficient quota for cpu in flavor F in ClusterQueue``,
    as its troubleshooting page still shows it)."""
    over_max: bool = False
    """More than the flavor could ever give it (its quota with all it may borrow)."""


def quota_shortfalls(message: str, resource: str | None = None) -> tuple[QuotaShortfall, ...]:
    """The quota a Kueue pending message says a Workload lacks (of ``resource`` only, if
    given), in the message's order."""
    out: list[QuotaShortfall] = []
    starts = [(m.start(), m.end(), m.group(1)) for m in _POD_SET.finditer(message)]
    spans = [(end, starts[i + 1][0] if i + 1 < len(starts) else len(message), name)
             for i, (_, end, name) in enumerate(starts)] or [(0, len(message), "")]
    for begin, end, pod_set in spans:
        text = message[begin:end]
        found: list[tuple[int, QuotaShortfall]] = []
        for m in _UNUSED.finditer(text):
            if (amount := _amount(m.group(3))) is not None:
                found.append((m.start(), QuotaShortfall(pod_set, m.group(1), m.group(2),
                                                        amount)))
        for m in _UNSAID.finditer(text):
            found.append((m.start(), QuotaShortfall(pod_set, m.group(1), m.group(2), None)))
        for m in _OVER_MAX.finditer(text):
            a, b, c = (_amount(m.group(i)) for i in (3, 4, 5))
            if a is not None and b is not None and c is not None:
                found.append((m.start(), QuotaShortfall(pod_set, m.group(1), m.group(2),
                                                        a + b - c, over_max=True)))
        out += [s for _, s in sorted(found, key=lambda f: f[0])
                if resource is None or s.resource == resource]
    return tuple(out)


def _amount(text: str) -> float | None:
    try:
        return quantity_value(text.strip())
    except ValueError:
        return None
