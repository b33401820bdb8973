"""The rules of ``rules.yaml`` as Kubernetes manifests: a prometheus-operator
``PrometheusRule`` and a Google Managed Prometheus ``Rules``. ``python alerts/build.py``
(``make alerts``) writes them; a test checks the committed files are what this produces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent
NAME = "gke-gpu-exporter"
NAMESPACE = "gke-gpu-exporter"
GMP_INTERVAL = "30s"
"""GMP's Rules require an evaluation interval per group."""
HEADER = "# Generated from rules.yaml by alerts/build.py (make alerts): do not edit.\n"


def groups() -> list[dict[str, Any]]:
    data: dict[str, Any] = yaml.safe_load((HERE / "rules.yaml").read_text())
    return list(data["groups"])


def manifests() -> dict[str, str]:
    meta = {"name": NAME, "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": NAME}}
    operator = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
                "metadata": meta, "spec": {"groups": groups()}}
    gmp = {"apiVersion": "monitoring.googleapis.com/v1", "kind": "Rules", "metadata": meta,
           "spec": {"groups": [{"interval": GMP_INTERVAL, **g} for g in groups()]}}
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
    for name, text in manifests().items():
        (HERE / name).write_text(text)


if __name__ == "__main__":
    main()
