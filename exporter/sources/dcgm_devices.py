"""DCGM's label sets made devices, for every reading source (the text parser,
``dcgm_parser``; and the query APIs, ``prometheus_api`` and ``cloud_monitoring``, through
``collect``).

A label set names one DCGM entity (a GPU, or a MIG instance of it) in whatever way a real
dcgm-exporter prints it: ``Hostname`` or ``hostname``; ``UUID`` or ``uuid``; pod labels as
``pod``/``namespace``/``container``, ``pod_name``/``pod_namespace``/``container_name``
(``--use-old-namespace``) or ``exported_pod``/``exported_namespace``/``exported_container``
(a ServiceMonitor without honorLabels); MIG instances (``GPU_I_PROFILE``/``GPU_I_ID``)
carrying the parent GPU's UUID (``entity_of``). Each entity is one ``DeviceReading``
(``add_series``), and every source's devices pass two steps before anything else sees
them:

- fields under a name DCGM has since changed (``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``, now
  ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``) are handed on under the current name
  (``current_names``);
- a MIG-partitioned GPU printed alone (dcgm-exporter 2.4.0-rc.3 and later) or with its own
  series beside its instances (2.4.0-rc.1, -rc.2) is counted once, through its instances
  (``fold_mig_parents``), never a further device.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from exporter.model.catalog import DCGM_RENAMED, FATAL_XIDS
from exporter.model.records import DeviceReading, ParseResult, PodOnDevice

BLANK_THRESHOLD = 9.2e18
"""DCGM's blank values (DCGM_INT64_BLANK and friends) start just above this."""
MAX_DEVICES_PER_TARGET = 1024

# exported_* first: when present, the plain labels name the dcgm-exporter pod itself.
_POD_KEYS = (("exported_pod", "exported_namespace", "exported_container"),
             ("pod", "namespace", "container"),
             ("pod_name", "pod_namespace", "container_name"))


@dataclass(frozen=True, slots=True)
class DcgmEntity:
    """What one label set says: which DCGM entity, and which pod (if any) is on it."""

    key: tuple[str, str]
    uuid: str
    gpu_index: str
    hostname: str
    model_name: str
    mig_profile: str | None
    mig_instance: str | None
    pod: PodOnDevice | None

    def reading(self) -> DeviceReading:
        return DeviceReading(self.uuid, self.gpu_index, self.hostname, self.model_name,
                             self.mig_profile, self.mig_instance)


def entity_of(labels: Mapping[str, str]) -> DcgmEntity | str:
    """The entity parsed labels name (any dcgm-exporter variant), or why they are refused."""
    uuid = labels.get("UUID") or labels.get("uuid")
    if not uuid:
        return "no_gpu_uuid"
    instance = labels.get("GPU_I_ID")
    pod = None
    for pk, nk, ck in _POD_KEYS:
        if labels.get(pk):
            pod = PodOnDevice(labels.get(nk, ""), labels[pk], labels.get(ck, ""))
            break
    return DcgmEntity((uuid, instance or ""), uuid, labels.get("gpu", ""),
                      labels.get("Hostname") or labels.get("hostname") or "",
                      labels.get("modelName", ""), labels.get("GPU_I_PROFILE"), instance, pod)


def add_series(entity: DcgmEntity | str, devices: dict[tuple[str, str], DeviceReading],
               max_devices: int) -> tuple[DeviceReading, bool] | str:
    """The device a series belongs to (created if new), and whether it is the device's
    first label set; or why the series is refused."""
    if isinstance(entity, str):
        return entity
    device = devices.get(entity.key)
    primary = device is None
    if device is None:
        if len(devices) >= max_devices:
            return "too_many_series"
        device = devices[entity.key] = entity.reading()
    if entity.pod is not None and entity.pod not in device.pods:
        device.pods.append(entity.pod)
    return device, primary


def collect(samples: Iterable[tuple[str, Mapping[str, str], float | None]],
            max_devices: int) -> ParseResult:
    """Devices from samples whose labels come parsed (from a query API rather than text):
    (field, labels, value; None when the value was unreadable), rejects counted as the
    text parser counts them."""
    out = ParseResult(devices=[])
    devices: dict[tuple[str, str], DeviceReading] = {}
    for name, labels, value in samples:
        entry = add_series(entity_of(labels), devices, max_devices)
        if isinstance(entry, str):
            out.reject(entry)
            continue
        if value is None:
            out.reject("malformed")
            continue
        if not abs(value) < BLANK_THRESHOLD:
            out.reject("not_finite" if math.isnan(value) or math.isinf(value) else "blank")
            continue
        device, primary = entry
        if name in device.fields:
            if primary:
                out.reject("duplicate")
            continue
        device.fields[name] = value
        out.samples += 1
    out.devices = fold_mig_parents(current_names(list(devices.values())))
    return out


def current_names(devices: list[DeviceReading]) -> list[DeviceReading]:
    """The devices with each field DCGM printed under an older name (``DCGM_RENAMED``)
    under its current one; where a device has both, the current name's reading stands.
    Every source's readings pass here, so that nothing after sees the older names."""
    for d in devices:
        fields = d.fields
        for old, new in DCGM_RENAMED.items():
            if old in fields:
                value = fields.pop(old)
                fields.setdefault(new, value)
    return devices


XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
GPU_WIDE_FIELDS = frozenset({
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION", XID_ERRORS,
})
"""Readings of a physical GPU that hold for each of its MIG instances (dcgm-exporter
2.4.0-rc.3 and later print them on every instance): clocks, temperatures, power, energy,
PCIe retries, clock-event reasons (under their current name: the older one is renamed
before), power and thermal violation time, the last XID. Utilisation, profiling and framebuffer
readings of the whole GPU are not any one instance's."""


def fold_mig_parents(devices: list[DeviceReading]) -> list[DeviceReading]:
    """The devices with each MIG-partitioned GPU counted once, through its instances.

    Where a GPU's instances are reported, the GPU's own series (which dcgm-exporter
    2.4.0-rc.1 and -rc.2 printed beside them) are no further device: their
    ``GPU_WIDE_FIELDS`` go to each instance that lacks them, and a fatal XID of the GPU
    replaces the instance's (the whole GPU is down, every instance with it); their pod
    labels, utilisation and memory are dropped. Readings of unpartitioned GPUs pass
    unchanged."""
    partitioned = {d.uuid for d in devices if d.mig_instance is not None}
    if not partitioned:
        return devices
    gpus = {d.uuid: d for d in devices if d.mig_instance is None and d.uuid in partitioned}
    out = []
    for d in devices:
        if d.mig_instance is None:
            if d.uuid not in partitioned:
                out.append(d)
            continue
        gpu = gpus.get(d.uuid)
        if gpu is not None:
            for name, value in gpu.fields.items():
                if name in GPU_WIDE_FIELDS:
                    own = d.fields.setdefault(name, value)
                    if name == XID_ERRORS and value in FATAL_XIDS and own not in FATAL_XIDS:
                        d.fields[name] = value
        out.append(d)
    return out

