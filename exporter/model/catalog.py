"""The GPU models GKE offers, as the product needs to know them.

Keyed by the value of the node label ``cloud.google.com/gke-accelerator``. The
``dcgm_model_name`` is what dcgm-exporter prints in its ``modelName`` label; memory is
the framebuffer size DCGM reports (used + free + reserved, MiB). Figures are NVIDIA's
published specifications; MIG profiles are NVIDIA's for each part.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

FATAL_XIDS = frozenset({48, 64, 74, 79, 95})
"""XIDs after which a GPU needs a reset to be usable again (double-bit ECC, row-remap
failure, NVLink error, fallen off the bus, uncontained ECC)."""

DCGM_RENAMED = MappingProxyType({
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
})
"""DCGM fields printed under an older name -> their current name (the same field id: 112,
the clock-event bitmask, renamed in DCGM 3.x). The sources read both and hand on the
current one."""


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG partition size: how many of the parent's seven compute slices it takes."""

    name: str
    compute_slices: int
    memory_mib: int

    @property
    def fraction(self) -> float:
        """Share of the parent GPU this instance is (compute slices out of seven)."""
        return self.compute_slices / 7


@dataclass(frozen=True, slots=True)
class GpuModel:
    accelerator: str
    dcgm_model_name: str
    memory_mib: int
    reserved_mib: int
    power_limit_watts: float
    idle_power_watts: float
    max_sm_clock_mhz: int
    mem_clock_mhz: int
    pcie_bytes_per_second: float
    nvlink_bytes_per_second: float
    tensor_tflops: float
    """Dense FP16/BF16 tensor throughput (NVIDIA's datasheet, without sparsity); for the
    Pascal parts, which have no tensor cores, their FP16 rate (P100) or FP32 rate (P4,
    whose FP16 is not a fast path)."""
    machine_types: MappingProxyType[int, str]
    mig_profiles: MappingProxyType[str, MigProfile] = field(
        default_factory=lambda: MappingProxyType({})
    )

    @property
    def has_nvlink(self) -> bool:
        return self.nvlink_bytes_per_second > 0


def _mig(*profiles: MigProfile) -> MappingProxyType[str, MigProfile]:
    return MappingProxyType({p.name: p for p in profiles})


_MODELS = (
    GpuModel(
        accelerator="nvidia-h100-80gb",
        dcgm_model_name="NVIDIA H100 80GB HBM3",
        memory_mib=81559,
        reserved_mib=530,
        power_limit_watts=700.0,
        idle_power_watts=70.0,
        max_sm_clock_mhz=1980,
        mem_clock_mhz=2619,
        pcie_bytes_per_second=64e9,
        nvlink_bytes_per_second=450e9,
        tensor_tflops=989.0,
        machine_types=MappingProxyType({8: "a3-highgpu-8g"}),
        mig_profiles=_mig(
            MigProfile("1g.10gb", 1, 9984),
            MigProfile("2g.20gb", 2, 20096),
            MigProfile("3g.40gb", 3, 40320),
            MigProfile("7g.80gb", 7, 80896),
        ),
    ),
    GpuModel(
        accelerator="nvidia-a100-80gb",
        dcgm_model_name="NVIDIA A100-SXM4-80GB",
        memory_mib=81920,
        reserved_mib=512,
        power_limit_watts=400.0,
        idle_power_watts=60.0,
        max_sm_clock_mhz=1410,
        mem_clock_mhz=1593,
        pcie_bytes_per_second=32e9,
        nvlink_bytes_per_second=300e9,
        tensor_tflops=312.0,
        machine_types=MappingProxyType({8: "a2-ultragpu-8g", 4: "a2-ultragpu-4g",
                                        2: "a2-ultragpu-2g", 1: "a2-ultragpu-1g"}),
        mig_profiles=_mig(
            MigProfile("1g.10gb", 1, 9728),
            MigProfile("2g.20gb", 2, 19968),
            MigProfile("3g.40gb", 3, 40192),
            MigProfile("7g.80gb", 7, 80384),
        ),
    ),
    GpuModel(
        accelerator="nvidia-tesla-a100",
        dcgm_model_name="NVIDIA A100-SXM4-40GB",
        memory_mib=40960,
        reserved_mib=512,
        power_limit_watts=400.0,
        idle_power_watts=55.0,
        max_sm_clock_mhz=1410,
        mem_clock_mhz=1215,
        pcie_bytes_per_second=32e9,
        nvlink_bytes_per_second=300e9,
        tensor_tflops=312.0,
        machine_types=MappingProxyType({16: "a2-megagpu-16g", 8: "a2-highgpu-8g",
                                        4: "a2-highgpu-4g", 2: "a2-highgpu-2g",
                                        1: "a2-highgpu-1g"}),
        mig_profiles=_mig(
            MigProfile("1g.5gb", 1, 4864),
            MigProfile("2g.10gb", 2, 9856),
            MigProfile("3g.20gb", 3, 19968),
            MigProfile("7g.40gb", 7, 40192),
        ),
    ),
    GpuModel(
        accelerator="nvidia-h200-141gb",
        dcgm_model_name="NVIDIA H200",
        memory_mib=143771,
        reserved_mib=530,
        power_limit_watts=700.0,
        idle_power_watts=75.0,
        max_sm_clock_mhz=1980,
        mem_clock_mhz=3201,
        pcie_bytes_per_second=64e9,
        nvlink_bytes_per_second=450e9,
        tensor_tflops=989.0,
        machine_types=MappingProxyType({8: "a3-ultragpu-8g"}),
    ),
    GpuModel(
        accelerator="nvidia-l4",
        dcgm_model_name="NVIDIA L4",
        memory_mib=23033,
        reserved_mib=470,
        power_limit_watts=72.0,
        idle_power_watts=16.0,
        max_sm_clock_mhz=2040,
        mem_clock_mhz=6251,
        pcie_bytes_per_second=32e9,
        nvlink_bytes_per_second=0.0,
        tensor_tflops=121.0,
        machine_types=MappingProxyType({8: "g2-standard-96", 4: "g2-standard-48",
                                        2: "g2-standard-24", 1: "g2-standard-8"}),
    ),
    GpuModel(
        accelerator="nvidia-tesla-t4",
        dcgm_model_name="Tesla T4",
        memory_mib=15360,
        reserved_mib=250,
        power_limit_watts=70.0,
        idle_power_watts=10.0,
        max_sm_clock_mhz=1590,
        mem_clock_mhz=5000,
        pcie_bytes_per_second=16e9,
        nvlink_bytes_per_second=0.0,
        tensor_tflops=65.0,
        machine_types=MappingProxyType({4: "n1-standard-32", 2: "n1-standard-16",
                                        1: "n1-standard-8"}),
    ),
    GpuModel(
        accelerator="nvidia-tesla-v100",
        dcgm_model_name="Tesla V100-SXM2-16GB",
        memory_mib=16384,
        reserved_mib=300,
        power_limit_watts=300.0,
        idle_power_watts=40.0,
        max_sm_clock_mhz=1530,
        mem_clock_mhz=877,
        pcie_bytes_per_second=16e9,
        nvlink_bytes_per_second=150e9,
        tensor_tflops=125.0,
        machine_types=MappingProxyType({8: "n1-standard-64", 4: "n1-standard-32",
                                        2: "n1-standard-16", 1: "n1-standard-8"}),
    ),
    GpuModel(
        accelerator="nvidia-tesla-p100",
        dcgm_model_name="Tesla P100-PCIE-16GB",
        memory_mib=16384,
        reserved_mib=115,
        power_limit_watts=250.0,
        idle_power_watts=26.0,
        max_sm_clock_mhz=1328,
        mem_clock_mhz=715,
        pcie_bytes_per_second=16e9,
        nvlink_bytes_per_second=0.0,
        tensor_tflops=18.7,
        machine_types=MappingProxyType({4: "n1-standard-32", 2: "n1-standard-16",
                                        1: "n1-standard-8"}),
    ),
    GpuModel(
        accelerator="nvidia-tesla-p4",
        dcgm_model_name="Tesla P4",
        memory_mib=7680,
        reserved_mib=69,
        power_limit_watts=75.0,
        idle_power_watts=7.0,
        max_sm_clock_mhz=1531,
        mem_clock_mhz=3003,
        pcie_bytes_per_second=16e9,
        nvlink_bytes_per_second=0.0,
        tensor_tflops=5.5,
        machine_types=MappingProxyType({4: "n1-standard-32", 2: "n1-standard-16",
                                        1: "n1-standard-8"}),
    ),
)

GPU_MODELS: MappingProxyType[str, GpuModel] = MappingProxyType(
    {m.accelerator: m for m in _MODELS}
)
"""Every GPU model the product knows, by GKE accelerator label."""

GPUS_OF_MACHINE: MappingProxyType[tuple[str, str], int] = MappingProxyType(
    {(m.accelerator, t): n for m in _MODELS for n, t in m.machine_types.items()})
"""(GPU model, machine type) -> the GPUs that machine type holds."""
MACHINE_FAMILIES: MappingProxyType[str, tuple[str, ...]] = MappingProxyType({
    family: tuple(m.accelerator for m in _MODELS
                  if any(t.split("-", 1)[0] == family for t in m.machine_types.values()))
    for family in sorted({t.split("-", 1)[0] for m in _MODELS
                          for t in m.machine_types.values()})})
"""Machine family (``a3``, ``g2``, ``n1``, ...) -> the GPU models sold in it."""
