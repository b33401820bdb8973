"""Real MIG samples in both dcgm-exporter layouts (tests/fixtures/dcgm/README.md): NVIDIA's
documented 2.4.0-rc.2 scrape of an A100 with one 1g.5gb instance, which prints the GPU's own
series beside the instance's; and the collector values of dcgm-exporter's own MIG test, an
8 x H100 node whose GPU 0 is split into two 1g.10gb instances, rendered as its current
template prints them (instances only)."""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import FIXTURES

A100_RC = (FIXTURES / "dcgm" / "dcgm-exporter_A100_mig_gpu_and_instance_2.4.0-rc.2.prom"
           ).read_text()
A100 = "GPU-34319582-d595-d1c7-d1d2-179bcfa61660"
H100_JSON = json.loads((FIXTURES / "dcgm" / "dcgm-exporter_H100_mig_instances_collector.json"
                        ).read_text())
H100_0 = "GPU-be839661-c0f5-7452-284b-b875666df60c"


def render_collector(metrics: dict[str, Any]) -> str:
    """dcgm-exporter's text for collector values (its gpuMetricsFormat template: gpu, the
    UUID label, pci_bus_id, device, modelName, GPU_I_PROFILE/GPU_I_ID on an instance,
    hostname)."""
    lines = []
    for name, series in metrics["metrics"].items():
        lines.append(f"# HELP {name} {series[0]['counter']['help']}")
        lines.append(f"# TYPE {name} {series[0]['counter']['prom_type']}")
        for m in series:
            mig = (f',GPU_I_PROFILE="{m["mig_profile"]}",GPU_I_ID="{m["gpu_instance_id"]}"'
                   if m.get("mig_profile") else "")
            host = f',hostname="{m["hostname"]}"' if m.get("hostname") else ""
            lines.append(f'{name}{{gpu="{m["gpu"]}",{m["uuid"]}="{m["gpu_uuid"]}",'
                         f'pci_bus_id="{m["pci_bus_id"]}",device="{m["gpu_device"]}",'
                         f'modelName="{m["gpu_model"]}"{mig}{host}}} {m["value"]}')
    return "\n".join(lines) + "\n"


H100_TEXT = render_collector(H100_JSON)


def with_gpu_xid(xid: int) -> str:
    """The 2.4.0-rc.2 sample with the GPU's (not the instance's) last XID changed."""
    gpu_line = next(line for line in A100_RC.splitlines()
                    if line.startswith("DCGM_FI_DEV_XID_ERRORS") and "GPU_I_ID" not in line)
    return A100_RC.replace(gpu_line, gpu_line.rsplit(" ", 1)[0] + f" {xid}")
