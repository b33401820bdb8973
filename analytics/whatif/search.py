"""One setting per node pool, found by replaying a few: the autoscaler's bounds (or a node
count), the node shape.

For each pool, the candidates (``settings``) are its setting as it is and, where the week's
own replay gives a reason for them (``Evidence``: pods waited for its nodes; its GPUs sat
idle):

- autoscaled from 0 to the most nodes it had (its free nodes go when nothing waits);
- autoscaled from 0, and from its present minimum, to twice that (room for what waited);
- autoscaled from 0 to one node more than it had;
- its GPU's largest node shape, as many GPUs (fewer, larger nodes: fewer fragments).

Each is replayed on the engine with every other pool as it is, and ``choose`` keeps, of
the setting as it is and the candidates, the cheapest whose every team's queue-wait p90 is
within its target; where none is, the one that leaves the worst team least past its
target, then the cheapest. A pool whose choice is its setting as it is gets no
recommendation: nothing to change.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from analytics import format as fmt
from analytics.whatif.layout import Layout
from analytics.whatif.levers import autoscaled, most_nodes, with_pool
from analytics.whatif.measure import Measured
from analytics.whatif.priced import AS_IT_IS
from exporter.model.catalog import GPU_MODELS
from simulator.scenario import Pool

TIE_SECONDS = 60.0
"""Two waits past their targets by less than this apart (or 1 %) are the same."""


@dataclass(frozen=True, slots=True)
class Setting:
    pool: str
    label: str
    """The setting in a person's words (``autoscale 0-4 nodes``)."""
    layout: Layout


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def describe(pool: Pool) -> str:
    """A pool's setting in a person's words."""
    shape = f" of {_count(pool.gpus_per_node, 'GPU')}"
    if pool.autoscaling is not None:
        return f"autoscale {pool.autoscaling.min_nodes}-{pool.autoscaling.max_nodes} " \
               f"nodes{shape}"
    return f"{_count(pool.nodes, 'node')}{shape}"


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the week's own replay says of a pool: what a setting could change."""

    waited_for_nodes: bool = True
    """Pods that fit it waited for capacity (no_capacity, scaling_up, stockout,
    fragmented): more nodes, or larger ones, could start them sooner."""
    fragmented: bool = True
    """Pods waited on its fragments: larger nodes could hold them."""
    idle: bool = True
    """GPUs of it sat free that no waiting pod could use: fewer nodes could save them."""


NODE_WAITS = ("no_capacity", "scaling_up", "stockout", "fragmented")


def evidence(measured: Measured, pool: Pool) -> Evidence:
    """What ``measured`` (the week's own replay) says of ``pool``: the waits of pods that
    fit it, or, where the pool they fit is not recorded, of pods of its GPU model; where no
    cause is recorded, every candidate is weighed."""
    causes = measured.pool_causes
    if causes is None:
        return Evidence()
    ours = (causes.node_pool == pool.name) | (
        causes.node_pool.fillna("").eq("") & (causes.gpu_model == pool.accelerator))
    waits = causes[ours & (causes.gpu_hours > 0)]
    row = measured.pools[measured.pools.node_pool == pool.name]
    idle = bool(len(row)) and float(row.stranded_gpu_hours.sum()) > 0
    return Evidence(bool(waits.cause.isin(NODE_WAITS).any()),
                    bool((waits.cause == "fragmented").any()), idle)


def settings(base: Layout, pool: Pool, seen_in: Evidence = Evidence()) -> list[Setting]:
    """The candidates for ``pool``, its setting as it is first; none that is the same, and
    none the week's replay gives no reason for (``Evidence``): no more nodes where nothing
    waited for nodes, no fewer where nothing sat idle, no larger ones where nothing waited
    on fragments or for nodes."""
    most = most_nodes(pool)
    least = pool.autoscaling.min_nodes if pool.autoscaling else pool.nodes
    out = [Setting(pool.name, f"{AS_IT_IS} ({describe(pool)})", base)]
    seen = {describe(pool)}
    bounds = [(0, most)] if seen_in.idle else []
    if seen_in.waited_for_nodes:
        bounds += [(0, 2 * most), (min(least, 2 * most), 2 * most), (0, most + 1)]
    for lo, hi in bounds:
        changed = autoscaled(pool, lo, hi)
        label = describe(changed)
        if label not in seen:
            seen.add(label)
            out.append(Setting(pool.name, label, with_pool(base, changed)))
    shapes = GPU_MODELS[pool.accelerator].machine_types
    biggest = max(shapes)
    if biggest > pool.gpus_per_node and pool.mig_partition_size is None and \
            pool.sharing is None and (seen_in.fragmented or seen_in.waited_for_nodes):
        ratio = biggest / pool.gpus_per_node
        update: dict[str, object] = {"gpus_per_node": biggest,
                                     "nodes": math.ceil(pool.nodes / ratio)}
        if pool.autoscaling is not None:
            update["autoscaling"] = pool.autoscaling.model_copy(update={
                "min_nodes": math.ceil(pool.autoscaling.min_nodes / ratio),
                "max_nodes": max(1, math.ceil(pool.autoscaling.max_nodes / ratio))})
        larger = pool.model_copy(update=update)
        label = f"{describe(larger)} ({shapes[biggest]})"
        out.append(Setting(pool.name, label, with_pool(base, larger)))
    return out


@dataclass(frozen=True, slots=True)
class Weighed:
    """A setting replayed: its cost, and its worst team's wait against that team's target."""

    setting: Setting
    cost_usd: float
    team: str | None
    """The team furthest past its target (else the one with the longest p90)."""
    wait_p90_seconds: float | None
    over_seconds: float
    """How far past its target that team's p90 is (0: every team within its target)."""


def weigh(setting: Setting, measured: Measured, target: Callable[[str], float]) -> Weighed:
    teams = measured.teams.dropna(subset=["wait_p90_seconds"])
    worst: tuple[float, float, str] | None = None
    for t in teams.itertuples():
        p90 = float(t.wait_p90_seconds)
        key = (max(0.0, p90 - target(str(t.team))), p90, str(t.team))
        if worst is None or key[:2] > worst[:2]:
            worst = key
    cost = float(measured.headline.get("cost_usd") or 0.0)
    if worst is None:
        return Weighed(setting, cost, None, None, 0.0)
    return Weighed(setting, cost, worst[2], worst[1], worst[0])


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= max(TIE_SECONDS, 0.01 * max(a, b))


def choose(weighed: list[Weighed]) -> Weighed:
    """The cheapest setting within every target; else the least past them, then the
    cheapest. Of settings that cost the same to the cent, the first: the pool as it is
    before any change that moves nothing."""
    fit = [w for w in weighed if w.over_seconds == 0]
    if not fit:
        least = min(w.over_seconds for w in weighed)
        fit = [w for w in weighed if _same(w.over_seconds, least)]
    return min(fit, key=lambda w: round(w.cost_usd, 2))


def told(w: Weighed, base: Weighed) -> str:
    """A setting beside the pool as it is, in a person's words."""
    change = w.cost_usd - base.cost_usd
    money = "the same cost" if abs(change) < 0.005 else \
        f"{'+' if change > 0 else '-'}${abs(change):,.2f} a week"
    wait = "" if w.team is None else \
        f", {w.team} p90 {fmt.duration(base.wait_p90_seconds)} → " \
        f"{fmt.duration(w.wait_p90_seconds)}" if w.team == base.team else \
        f", worst {w.team} p90 {fmt.duration(w.wait_p90_seconds)}"
    return f"{w.setting.label}: {money}{wait}"
