"""The layout each action of "What to do this week" implies, to replay the week on.

- scale this pool down: the pool autoscaled from 0 to its nodes (the cluster autoscaler
  removes the free nodes no waiting pod could use, and adds them back when pods wait);
- add capacity (max nodes), for ``no_capacity``: the pool's maximum doubled, autoscaled
  from its nodes;
- compact placement, fewer and larger nodes, for ``fragmented``: the pool in the largest
  node shape of its GPU (as many GPUs), else compact placement;
- raise the ClusterQueue quota, for ``quota``: its nominal quota doubled (8 GPUs where it
  had none);
- scale in another zone, region or on spot, for ``stockout``: the pool without its
  stockouts;
- move batch Jobs to spot: the spot candidates' Jobs (by namespace and GPU model) on spot,
  in a spot pool of their GPU (the on-demand pool's twin, autoscaled from 0 to its nodes)
  reclaimed at the layout's rate with its restart cost, the on-demand pool they leave
  autoscaled from 0 to its nodes.

Other actions (fix the manifests, image pulls, restarts on on-demand, sharing, right-
sizing) change the jobs or the manifests, not the layout: they are not replayed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from analytics.figures.actions import SCALE_DOWN, TO_SPOT, pool_of
from analytics.whatif.layout import JobChange, JobMatch, Layout, Move
from exporter.model.catalog import GPU_MODELS
from simulator.scenario import Autoscaling, Pool


@dataclass(frozen=True, slots=True)
class LeverLayout:
    action: str
    where: str
    change: str
    """What the layout replayed changes, in a person's words."""
    layout: Layout


def with_pool(base: Layout, pool: Pool) -> Layout:
    return base.model_copy(update={"pools": [pool if p.name == pool.name else p
                                             for p in base.pools]})


def autoscaled(pool: Pool, least: int, most: int) -> Pool:
    delay = pool.autoscaling.provisioning_delay if pool.autoscaling else 300.0
    return pool.model_copy(update={"nodes": max(least, min(pool.nodes, most)),
                                   "autoscaling": Autoscaling(min_nodes=least, max_nodes=most,
                                                              provisioning_delay=delay)})


def most_nodes(pool: Pool) -> int:
    return max(pool.nodes, pool.autoscaling.max_nodes if pool.autoscaling else 0, 1)


def scale_down(base: Layout, where: str) -> tuple[str, Layout] | None:
    pool = base.pool(pool_of(where))
    if pool is None:
        return None
    most = most_nodes(pool)
    return (f"{pool.name} autoscaled from 0 to {most} nodes",
            with_pool(base, autoscaled(pool, 0, most)))


def add_capacity(base: Layout, where: str) -> tuple[str, Layout] | None:
    pool = base.pool(pool_of(where))
    if pool is None:
        return None
    most = most_nodes(pool)
    least = pool.autoscaling.min_nodes if pool.autoscaling else pool.nodes
    return (f"{pool.name}'s maximum from {most} to {2 * most} nodes",
            with_pool(base, autoscaled(pool, least, 2 * most)))


def larger_nodes(base: Layout, where: str) -> tuple[str, Layout] | None:
    pool = base.pool(pool_of(where))
    if pool is None:
        return None
    shapes = GPU_MODELS[pool.accelerator].machine_types
    biggest = max(shapes)
    if biggest > pool.gpus_per_node and pool.mig_partition_size is None:
        nodes = -(-pool.nodes * pool.gpus_per_node // biggest)
        update: dict[str, object] = {"gpus_per_node": biggest, "nodes": nodes}
        if pool.autoscaling is not None:
            update["autoscaling"] = pool.autoscaling.model_copy(update={
                "min_nodes": -(-pool.autoscaling.min_nodes * pool.gpus_per_node // biggest),
                "max_nodes": max(1, -(-pool.autoscaling.max_nodes * pool.gpus_per_node
                                      // biggest))})
        return (f"{pool.name} in {shapes[biggest]} nodes ({biggest} GPUs each, {nodes} "
                f"nodes)", with_pool(base, pool.model_copy(update=update)))
    if base.placement != "compact":
        return "compact placement", base.model_copy(update={"placement": "compact"})
    return None


def raise_quota(base: Layout, where: str) -> tuple[str, Layout] | None:
    if base.kueue is None:
        return None
    queue = next((q for q in base.kueue.cluster_queues if q.name == where), None)
    if queue is None:
        return None
    flavors = [f.model_copy(update={"nominal_gpus": max(8, 2 * f.nominal_gpus)})
               for f in queue.flavors]
    raised = queue.model_copy(update={"flavors": flavors})
    kueue = base.kueue.model_copy(update={"cluster_queues": [
        raised if q.name == where else q for q in base.kueue.cluster_queues]})
    told = ", ".join(f"{f.accelerator} {f.nominal_gpus}" for f in flavors)
    return f"ClusterQueue {where}'s quota to {told} GPUs", \
        base.model_copy(update={"kueue": kueue})


def no_stockouts(base: Layout, where: str) -> tuple[str, Layout] | None:
    name = pool_of(where)
    kept = [s for s in base.stockouts if s.pool != name]
    if len(kept) == len(base.stockouts):
        return None
    return f"{name} without its stockouts (capacity in another zone)", \
        base.model_copy(update={"stockouts": kept})


def spot_for(base: Layout, candidates: Sequence[tuple[str, str]]) -> tuple[str, Layout] | None:
    """The candidates' Jobs (namespace, GPU model) moved to spot, on spot twins of the
    on-demand pools they leave, which autoscale from 0."""
    pools = {p.name: p for p in base.pools}
    moves = list(base.moves)
    moved = []
    for namespace, model in candidates:
        twin = next((p for p in base.pools if p.accelerator == model and not p.spot
                     and p.sharing is None and p.mig_partition_size is None), None)
        if twin is None:
            continue
        if not any(p.accelerator == model and p.spot and p.sharing is None
                   and p.mig_partition_size is None for p in pools.values()):
            name = f"{twin.name}-spot"[:40]
            pools[name] = twin.model_copy(update={
                "name": name, "spot": True, "nodes": 0,
                "autoscaling": Autoscaling(min_nodes=0, max_nodes=most_nodes(twin))})
        pools[twin.name] = autoscaled(twin, 0, most_nodes(twin))
        moves.append(Move(match=JobMatch(namespace=namespace, spot=False,
                                         gpu_model=model),  # type: ignore[arg-type]
                          to=JobChange(spot=True)))
        moved.append(f"{namespace}'s {model}")
    if not moved:
        return None
    return (f"{', '.join(moved)} Jobs on spot (reclaimed {base.spot.per_node_day:g} times a "
            f"node-day, {base.spot.restart_cost / 60:g} min lost each), the on-demand pools "
            "they leave autoscaled from 0",
            base.model_copy(update={"pools": list(pools.values()), "moves": moves}))


BY_CAUSE: dict[str, Callable[[Layout, str], tuple[str, Layout] | None]] = {
    "no_capacity": add_capacity, "fragmented": larger_nodes, "quota": raise_quota,
    "stockout": no_stockouts}
"""The layout that answers each cause, from the action's ``where``."""


def layouts(actions: pd.DataFrame, base: Layout,
            spot_candidates: Sequence[tuple[str, str]]) -> list[LeverLayout]:
    """The layout each action implies, in the actions' order; actions that change no
    layout left out. ``spot_candidates``: the namespaces and GPU models of the report's
    spot candidates, largest saving first."""
    out = []
    for r in actions.itertuples(index=False):
        action, where = str(r.action), str(r.where)
        answers = r.answers if isinstance(r.answers, str) else ""
        found: tuple[str, Layout] | None = None
        if action == SCALE_DOWN:
            found = scale_down(base, where)
        elif answers in BY_CAUSE:
            found = BY_CAUSE[answers](base, where)
        elif action == TO_SPOT:
            found = spot_for(base, spot_candidates)
        if found is not None:
            out.append(LeverLayout(action, where, found[0], found[1]))
    return out
