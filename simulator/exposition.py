"""dcgm-exporter's text exposition for one simulated node, byte for byte in its format.

Families come in dcgm-exporter's order with its HELP texts (``default-counters.csv``);
each GPU (or MIG instance) is one series per family, labelled ``gpu``, ``UUID``,
``pci_bus_id``, ``device``, ``modelName``, (``GPU_I_PROFILE``, ``GPU_I_ID``), ``Hostname``,
``DCGM_FI_DRIVER_VERSION`` and, on a GPU a pod holds, ``container``, ``namespace``, ``pod``.
``Hostname`` is the node's name, or the dcgm-exporter pod's own (``Pool.dcgm_hostname``).
A time-shared GPU is printed once per pod sharing it (dcgm-exporter's per-pod view of
shared GPUs). A GPU that fell off the bus (XID 79) is simply absent. MIG instances have no
``DCGM_FI_DEV_GPU_UTIL`` / ``MEM_COPY_UTIL``, as on real hardware.

A MIG pool prints its partitioned GPUs in one of two layouts (``Pool.dcgm_mig_layout``):
``instances``, every field on every instance (dcgm-exporter 2.4.0-rc.3 and later); or
``gpu_and_instances``, as 2.4.0-rc.1 and -rc.2 did (NVIDIA's documented sample): the GPU's own
series without ``GPU_I_*`` labels (every field but those MIG mode lacks, for the whole GPU)
beside each instance's XID and profiling series (``INSTANCE_FIELDS``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from simulator.cluster import Device
from simulator.profiles import Activity

if TYPE_CHECKING:
    from simulator.cluster import Cluster, Gpu, Node

DRIVER_VERSION = "580.105.08"

ValueFn = Callable[[Activity, "Device", float], str]


def _i(x: float) -> str:
    return str(round(x))


def _f(x: float) -> str:
    return f"{x:f}"


def _power(a: Activity, d: Device, _: float) -> float:
    m = d.gpu.node.model
    return m.idle_power_watts + a.power_ratio * (m.power_limit_watts - m.idle_power_watts)


def _fb_used(a: Activity, d: Device) -> int:
    usable = d.info.memory_mib - (d.gpu.node.model.reserved_mib if d.info.fraction == 1 else 0)
    return int(usable * a.memory_ratio)


def _fb_free(a: Activity, d: Device) -> int:
    usable = d.info.memory_mib - (d.gpu.node.model.reserved_mib if d.info.fraction == 1 else 0)
    return usable - _fb_used(a, d)


def _mem_clock(a: Activity, d: Device) -> int:
    m = d.gpu.node.model
    return m.mem_clock_mhz if a.power_ratio > 0.05 or a.gr_engine_active > 0.02 else 405


def _hbm(d: Device) -> bool:
    return d.gpu.node.model.accelerator not in ("nvidia-l4", "nvidia-tesla-t4", "nvidia-tesla-p4")


# (name, type, help, value, which: "all" | "whole" (not MIG) | option name)
FIELD_FAMILIES: list[tuple[str, str, str, ValueFn, str]] = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).",
     lambda a, d, _: _i(d.gpu.node.model.max_sm_clock_mhz * a.sm_clock_ratio), "all"),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).",
     lambda a, d, _: str(_mem_clock(a, d)), "all"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).",
     lambda a, d, _: _i(a.temp_celsius + 3) if _hbm(d) else "0", "all"),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).",
     lambda a, d, _: _i(a.temp_celsius), "all"),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).",
     lambda a, d, e: _f(_power(a, d, e)), "all"),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
     "Total energy consumption since boot (in mJ).", lambda a, d, e: _i(e), "all"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.",
     lambda a, d, _: "0", "all"),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).",
     lambda a, d, _: _i(a.gpu_util_percent), "whole"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).",
     lambda a, d, _: _i(a.dram_active * 100), "whole"),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", lambda a, d, _: "0", "all"),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", lambda a, d, _: "0", "all"),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.",
     lambda a, d, _: str(d.gpu.xid), "all"),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).",
     lambda a, d, _: str(_fb_free(a, d)), "all"),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).",
     lambda a, d, _: str(_fb_used(a, d)), "all"),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).",
     lambda a, d, _: str(d.gpu.node.model.reserved_mib if d.info.fraction == 1 else 0), "all"),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status",
     lambda a, d, _: "0", "all"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for uncorrectable errors", lambda a, d, _: "0", "all"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
     "Number of remapped rows for correctable errors", lambda a, d, _: "0", "all"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
     lambda a, d, _: "0", "all"),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event reasons (bitmask).",
     lambda a, d, _: str(a.clock_event_reasons), "clock_events"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.",
     lambda a, d, _: _f(a.gr_engine_active), "dcp"),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned.",
     lambda a, d, _: _f(a.sm_active), "sm_fields"),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM.",
     lambda a, d, _: _f(a.sm_occupancy), "sm_fields"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge",
     "Ratio of cycles the tensor (HMMA) pipe is active.",
     lambda a, d, _: _f(a.tensor_active), "dcp"),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
     "Ratio of cycles the device memory interface is active sending or receiving data.",
     lambda a, d, _: _f(a.dram_active), "dcp"),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge",
     "The rate of data transmitted over the PCIe bus - including both protocol headers and "
     "data payloads - in bytes per second.",
     lambda a, d, _: _i(a.pcie_tx_ratio * d.gpu.node.model.pcie_bytes_per_second * d.info.fraction),
     "dcp"),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge",
     "The rate of data received over the PCIe bus - including both protocol headers and "
     "data payloads - in bytes per second.",
     lambda a, d, _: _i(a.pcie_rx_ratio * d.gpu.node.model.pcie_bytes_per_second * d.info.fraction),
     "dcp"),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge",
     "The rate of data transmitted over NVLink, not including protocol headers, in bytes "
     "per second.",
     lambda a, d, _: _i(a.nvlink_ratio * d.gpu.node.model.nvlink_bytes_per_second), "nvlink"),
    ("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge",
     "The rate of data received over NVLink, not including protocol headers, in bytes "
     "per second.",
     lambda a, d, _: _i(a.nvlink_ratio * d.gpu.node.model.nvlink_bytes_per_second), "nvlink"),
]


INSTANCE_FIELDS = frozenset({
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE",
})
"""The fields a MIG instance has in the ``gpu_and_instances`` layout."""


def _enabled(which: str, dcp: bool, sm_fields: bool, nvlink: bool, clock_events: bool,
             mig: bool) -> bool:
    if which == "all":
        return True
    if which == "whole":
        return not mig
    if which == "dcp":
        return dcp
    if which == "sm_fields":
        return dcp and sm_fields
    if which == "nvlink":
        return dcp and nvlink
    if which == "clock_events":
        return clock_events
    raise ValueError(which)


Plan = tuple[tuple[str, str, ValueFn, bool], ...]
"""The families a page prints, in order: their HELP and TYPE lines, the start of a sample
line (``name{``), the value, and whether a ``gpu_and_instances`` instance prints it."""


@functools.cache
def _plan(dcp: bool, sm_fields: bool, nvlink: bool, clock_events: bool, mig: bool) -> Plan:
    """The page's families for one combination of the options (``Profiling``'s,
    NVLink's only where the node has it) and MIG mode."""
    return tuple((f"# HELP {name} {help_text}\n# TYPE {name} {mtype}\n", f"{name}{{", fn,
                  name in INSTANCE_FIELDS)
                 for name, mtype, help_text, fn, which in FIELD_FAMILIES
                 if _enabled(which, dcp, sm_fields, nvlink, clock_events, mig))


def _device_labels(node: Node, device: Device) -> str:
    gpu = device.gpu
    info = device.info
    hostname = node.dcgm_pod_name if node.pool.dcgm_hostname == "pod" else node.name
    mig = ""
    if info.mig_profile is not None:
        mig = f',GPU_I_PROFILE="{info.mig_profile}",GPU_I_ID="{info.instance_id}"'
    return (f'gpu="{gpu.index}",UUID="{gpu.uuid}",pci_bus_id="{gpu.pci_bus_id}",'
            f'device="nvidia{gpu.index}",modelName="{node.model.dcgm_model_name}"{mig},'
            f'Hostname="{hostname}",DCGM_FI_DRIVER_VERSION="{DRIVER_VERSION}"')


def _whole_gpu(gpu: Gpu, acts: list[Activity]) -> tuple[Device, Activity]:
    """The partitioned GPU as one entity: its full framebuffer, and its instances' activity
    averaged by their share of it (flags of any instance set, as the GPU's)."""
    devices = gpu.devices
    info = dataclasses.replace(devices[0].info, mig_profile=None, instance_id=None,
                               fraction=1.0, memory_mib=gpu.node.model.memory_mib)
    total = sum(d.info.fraction for d in devices)
    values = {}
    for f in dataclasses.fields(Activity):
        if f.name == "clock_event_reasons":
            reasons = 0
            for a in acts:
                reasons |= a.clock_event_reasons
            values[f.name] = reasons
        else:
            values[f.name] = sum(getattr(a, f.name) * d.info.fraction
                                 for a, d in zip(acts, devices, strict=True)) / total
    return Device(gpu, info), Activity(**values)


def render_node(cluster: Cluster, node: Node) -> str:
    """The full /metrics body of the dcgm-exporter on ``node`` at the cluster's ``now``."""
    mig = node.pool.mig_partition_size is not None
    split = mig and node.pool.dcgm_mig_layout == "gpu_and_instances"
    # (labels, activity, device, energy, whether only INSTANCE_FIELDS are printed)
    rows: list[tuple[str, Activity, Device, float, bool]] = []
    for gpu in node.gpus:
        if gpu.down_reason == "gpu_missing":
            continue
        energy = cluster.gpu_energy_mj(gpu)
        acts = []
        for device in gpu.devices:
            act = cluster.device_activity(device)
            assert act is not None
            acts.append(act)
            base = _device_labels(node, device)
            if device.occupants:
                for pod in sorted(device.occupants, key=lambda p: (p.namespace, p.name)):
                    container = "jupyter" if pod.workload.kind == "notebook" else "main"
                    labels = (f'{base},container="{container}",namespace="{pod.namespace}",'
                              f'pod="{pod.name}"')
                    rows.append((labels, act, device, energy, split))
            else:
                rows.append((base, act, device, energy, split))
        if split:
            whole, act = _whole_gpu(gpu, acts)
            rows.append((_device_labels(node, whole), act, whole, energy, False))
    p = cluster.scenario.profiling
    out: list[str] = []
    for header, start, fn, on_instances in _plan(p.dcp, p.sm_fields,
                                                 p.nvlink and node.model.has_nvlink,
                                                 p.clock_events, mig):
        out.append(header)
        out += [f"{start}{labels}}} {fn(act, device, energy)}\n"
                for labels, act, device, energy, instance_only in rows
                if on_instances or not instance_only]
    return "".join(out)
