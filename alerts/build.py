"""The rules of ``rules.yaml`` as Kubernetes manifests, each in its kustomize component:
a prometheus-operator ``PrometheusRule`` (``deploy/components/prometheus-rules``) and a
Google Managed Prometheus ``ClusterRules`` (``deploy/components/gmp-rules``). ``python
alerts/build.py`` (``make alerts``) writes them; a test checks the committed files are what
this produces.

GMP scopes a namespaced ``Rules`` to its own namespace (every selector gets
``namespace="<its namespace>"``), while the exporter's series carry the namespaces of the
GPU workloads: only a ``ClusterRules`` (scoped to the cluster: ``project_id``,
``location``, ``cluster``) sees them.

Every ``runbook_url`` in ``rules.yaml`` is absolute, under ``RUNBOOK_BASE``. Built for a
site: ``--runbook-base URL`` puts them under another base (where the runbooks are
published), ``--unallocated-usd-per-hour N`` sets the ``GpuUnallocatedCapacityCost``
threshold (default $50/h), ``--quota-wait-hours N`` the ``GpuQuotaWaitLong`` one (default
2 h); ``--out DIR`` writes ``rules.yaml`` and both manifests there.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any, NamedTuple

import yaml

HERE = Path(__file__).parent
COMPONENTS = HERE.parent / "deploy" / "components"
NAME = "gke-gpu-exporter"
NAMESPACE = "gke-gpu-exporter"
GMP_INTERVAL = "30s"
"""GMP's rule groups take an evaluation interval each."""
HEADER = "# Generated from alerts/rules.yaml by alerts/build.py (make alerts): do not edit.\n"
RUNBOOK_BASE = "https://github.com/gke-gpu-exporter/gke-gpu-exporter/blob/main"
"""Where the project's docs are published: ``rules.yaml``'s runbook links are under it."""
RUNBOOKS = "docs/runbooks.md"
MANIFESTS = {"prometheusrule.yaml": COMPONENTS / "prometheus-rules" / "prometheusrule.yaml",
             "clusterrules.yaml": COMPONENTS / "gmp-rules" / "clusterrules.yaml"}
"""Each manifest and where the build writes it."""


UNALLOCATED_USD_PER_HOUR = 50.0
"""``GpuUnallocatedCapacityCost``'s threshold in rules.yaml."""
QUOTA_WAIT_HOURS = 2.0
"""``GpuQuotaWaitLong``'s threshold in rules.yaml: how long a team's oldest job may wait
for Kueue's quota."""


class Threshold(NamedTuple):
    """An alert's threshold as rules.yaml has it, and where it is written: the end of its
    expression and a phrase of its description, each a format of the value."""

    default: float
    expr_end: str
    said: str


THRESHOLDS = {
    "GpuUnallocatedCapacityCost": Threshold(UNALLOCATED_USD_PER_HOUR, "> {:g}", "${:g} "),
    "GpuQuotaWaitLong": Threshold(QUOTA_WAIT_HOURS, "> {:g} * 3600", "{:g} h:")}
"""The thresholds a site sets, by alert."""


def _retune(rule: dict[str, Any], where: Threshold, new: float) -> None:
    """Set the rule's threshold to ``new``, in its expression and its description."""
    old = where.default
    before, after = where.expr_end.format(old), where.expr_end.format(new)
    assert rule["expr"].endswith(before), rule["expr"]
    rule["expr"] = rule["expr"].removesuffix(before) + after
    ann = rule["annotations"]
    assert where.said.format(old) in ann["description"], ann["description"]
    ann["description"] = ann["description"].replace(where.said.format(old),
                                                    where.said.format(new))


def groups(runbook_base: str = "",
           unallocated_usd_per_hour: float = UNALLOCATED_USD_PER_HOUR,
           quota_wait_hours: float = QUOTA_WAIT_HOURS) -> list[dict[str, Any]]:
    """The rule groups, with the runbook links under ``runbook_base`` and the unallocated
    cost and quota wait thresholds, when given."""
    data: dict[str, Any] = yaml.safe_load((HERE / "rules.yaml").read_text())
    out = copy.deepcopy(list(data["groups"]))
    chosen = {"GpuUnallocatedCapacityCost": unallocated_usd_per_hour,
              "GpuQuotaWaitLong": quota_wait_hours}
    for rule in (r for g in out for r in g["rules"]):
        ann = rule.get("annotations", {})
        if runbook_base and "runbook_url" in ann:
            url = ann["runbook_url"]
            assert url.startswith(f"{RUNBOOK_BASE}/{RUNBOOKS}#"), url
            ann["runbook_url"] = runbook_base.rstrip("/") + url.removeprefix(RUNBOOK_BASE)
        where = THRESHOLDS.get(rule.get("alert", ""))
        if where is not None and chosen[rule["alert"]] != where.default:
            _retune(rule, where, chosen[rule["alert"]])
    return out


def manifests(runbook_base: str = "",
              unallocated_usd_per_hour: float = UNALLOCATED_USD_PER_HOUR,
              quota_wait_hours: float = QUOTA_WAIT_HOURS) -> dict[str, str]:
    """File name -> text of the two manifests (``MANIFESTS`` says where each goes)."""
    rules = groups(runbook_base, unallocated_usd_per_hour, quota_wait_hours)
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": NAME}
    operator = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
                "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels},
                "spec": {"groups": rules}}
    gmp = {"apiVersion": "monitoring.googleapis.com/v1", "kind": "ClusterRules",
           "metadata": {"name": NAME, "labels": labels},
           "spec": {"groups": [{"interval": GMP_INTERVAL, **g} for g in rules]}}
    return {"prometheusrule.yaml": _dump(operator), "clusterrules.yaml": _dump(gmp)}


class _Dumper(yaml.SafeDumper):
    """Multi-line expressions as literal blocks, as they are written in rules.yaml."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _dump(doc: dict[str, Any]) -> str:
    return HEADER + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runbook-base", default="", metavar="URL",
                        help="where docs/runbooks.md is published (default "
                             f"{RUNBOOK_BASE}), e.g. https://git.example.com/gpu/blob/main")
    parser.add_argument("--unallocated-usd-per-hour", type=float,
                        default=UNALLOCATED_USD_PER_HOUR, metavar="USD",
                        help="GpuUnallocatedCapacityCost's threshold (default 50)")
    parser.add_argument("--quota-wait-hours", type=float, default=QUOTA_WAIT_HOURS,
                        metavar="HOURS",
                        help="GpuQuotaWaitLong's threshold (default 2)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="write rules.yaml and the manifests there (default: the "
                             "manifests into their components)")
    args = parser.parse_args()
    texts = manifests(args.runbook_base, args.unallocated_usd_per_hour, args.quota_wait_hours)
    if args.out is None:
        for name, text in texts.items():
            MANIFESTS[name].write_text(text)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (args.out / name).write_text(text)
    rules = groups(args.runbook_base, args.unallocated_usd_per_hour, args.quota_wait_hours)
    (args.out / "rules.yaml").write_text(HEADER + yaml.dump(
        {"groups": rules}, Dumper=_Dumper, sort_keys=False, width=100))


if __name__ == "__main__":
    main()
