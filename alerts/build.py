"""The rules of ``rules.yaml`` as Kubernetes manifests: a prometheus-operator
``PrometheusRule`` and a Google Managed Prometheus ``Rules``. ``python alerts/build.py``
(``make alerts``) writes them; a test checks the committed files are what this produces.

Built for a site: ``--runbook-base URL`` makes every ``runbook_url`` absolute (where the
runbooks are published) and ``--unallocated-usd-per-hour N`` sets the
``GpuUnallocatedCapacityCost`` threshold (default $50/h); ``--out DIR`` writes them there.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent
NAME = "gke-gpu-exporter"
NAMESPACE = "gke-gpu-exporter"
GMP_INTERVAL = "30s"
"""GMP's Rules require an evaluation interval per group."""
HEADER = "# Generated from rules.yaml by alerts/build.py (make alerts): do not edit.\n"


UNALLOCATED_USD_PER_HOUR = 50.0
"""``GpuUnallocatedCapacityCost``'s threshold in rules.yaml."""


def groups(runbook_base: str = "",
           unallocated_usd_per_hour: float = UNALLOCATED_USD_PER_HOUR) -> list[dict[str, Any]]:
    """The rule groups, with the runbook links under ``runbook_base`` and the unallocated
    cost threshold, when given."""
    data: dict[str, Any] = yaml.safe_load((HERE / "rules.yaml").read_text())
    out = copy.deepcopy(list(data["groups"]))
    for rule in (r for g in out for r in g["rules"]):
        ann = rule.get("annotations", {})
        if runbook_base and "runbook_url" in ann:
            ann["runbook_url"] = runbook_base.rstrip("/") + "/" + ann["runbook_url"]
        if rule.get("alert") == "GpuUnallocatedCapacityCost" and \
                unallocated_usd_per_hour != UNALLOCATED_USD_PER_HOUR:
            old, new = f"{UNALLOCATED_USD_PER_HOUR:g}", f"{unallocated_usd_per_hour:g}"
            assert rule["expr"].endswith(f"> {old}"), rule["expr"]
            rule["expr"] = rule["expr"].removesuffix(old) + new
            ann["description"] = ann["description"].replace(f"${old} ", f"${new} ")
    return out


def manifests(runbook_base: str = "",
              unallocated_usd_per_hour: float = UNALLOCATED_USD_PER_HOUR) -> dict[str, str]:
    rules = groups(runbook_base, unallocated_usd_per_hour)
    meta = {"name": NAME, "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": NAME}}
    operator = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
                "metadata": meta, "spec": {"groups": rules}}
    gmp = {"apiVersion": "monitoring.googleapis.com/v1", "kind": "Rules", "metadata": meta,
           "spec": {"groups": [{"interval": GMP_INTERVAL, **g} for g in rules]}}
    return {"prometheusrule.yaml": _dump(operator), "gmp-rules.yaml": _dump(gmp)}


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
                        help="where docs/runbooks.md is published, e.g. "
                             "https://github.com/ORG/gke-gpu-exporter/blob/main")
    parser.add_argument("--unallocated-usd-per-hour", type=float,
                        default=UNALLOCATED_USD_PER_HOUR, metavar="USD",
                        help="GpuUnallocatedCapacityCost's threshold (default 50)")
    parser.add_argument("--out", type=Path, default=HERE, metavar="DIR")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in manifests(args.runbook_base, args.unallocated_usd_per_hour).items():
        (args.out / name).write_text(text)


if __name__ == "__main__":
    main()
