"""``gke-gpu-exporter simulate``: a scenario chosen on the command line, served until told
to stop."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from simulator.scenario import Scenario, ScenarioError, load_scenario
from simulator.server import SimulatorServer


def load(name: str | None, seed: int | None = None, nodes: int | None = None) -> Scenario:
    """The scenario ``name`` (a YAML file, or an embedded one; default: ``default``), with
    its seed replaced and scaled to about ``nodes`` nodes when given."""
    scenario = load_scenario(name)
    if seed is not None:
        scenario = scenario.model_copy(update={"seed": seed})
    if nodes is not None:
        if nodes < 1:
            raise ScenarioError("--nodes must be at least 1")
        scenario = scenario.scaled(nodes)
    return scenario


def describe(scenario: Scenario) -> str:
    """One line for the scenario, one per pool."""
    nodes = sum(p.nodes for p in scenario.pools)
    gpus = sum(p.nodes * p.gpus_per_node for p in scenario.pools)
    lines = [f"scenario ok: cluster {scenario.cluster}, {len(scenario.pools)} pools, "
             f"{nodes} nodes, {gpus} GPUs, {len(scenario.workloads)} workloads, "
             f"{len(scenario.faults)} faults"]
    for p in scenario.pools:
        extra = " spot" if p.spot else ""
        if p.sharing:
            extra += f" time-shared x{p.sharing.max_shared_clients_per_gpu}"
        if p.mig_partition_size:
            extra += f" MIG {p.mig_partition_size}"
        lines.append(f"  {p.name:<16} {p.nodes:>4} x {p.machine_type:<16} "
                     f"{p.gpus_per_node} x {p.accelerator}{extra}")
    return "\n".join(lines)


async def simulate(scenario: Scenario, *, api_port: int, dcgm_port: int, out: Path,
                   warmup: float, speed: float, until: Callable[[], Awaitable[object]]
                   ) -> int:
    """Serve the cluster (``speed`` simulated seconds per real second; 0: only through
    ``POST /sim/advance``) after ``warmup`` simulated seconds, until ``until`` returns;
    print where everything is."""
    server = SimulatorServer(scenario, api_port=api_port, dcgm_port=dcgm_port, speed=0.0)
    try:
        await server.start()
    except OSError as exc:
        print(f"error: cannot listen: {exc}", file=sys.stderr)
        return 1
    if warmup:
        await server.advance(warmup)
    outputs = server.write_outputs(out)
    server.speed = speed
    if speed > 0:
        server.start_ticking()
    st = server.status()
    print(f"simulating cluster {scenario.cluster}: {st['nodes']} nodes, {st['gpus']} GPUs, "
          f"{st['pods']} pods ({st['pending_pods']} pending) at {st['now']}")
    print(f"  Kubernetes API   {server.api_url}")
    print(f"  kubeconfig       {outputs.kubeconfig}   "
          f"(kubectl --kubeconfig {outputs.kubeconfig} get nodes -o wide)")
    print(f"  dcgm-exporters   {len(server.targets)} endpoints, listed in {outputs.targets}")
    print(f"  dcgm Service     {server.service_url}   (each request answered by the next of "
          f"{len(server.service_nodes())} nodes' dcgm-exporters)")
    print(f"  control          {server.api_url}/sim/status, POST /sim/advance?seconds=N, "
          "GET /sim/truth")
    print("  clock            " + ("manual" if speed == 0 else f"{speed:g}x"))
    print("Ctrl-C to stop.", flush=True)
    await until()
    await server.stop()
    return 0
