"""The Grafana dashboards, generated from code: ``python dashboards/build.py`` writes one
JSON file per dashboard next to this script (``make dashboards``); a test checks the
committed files are what this produces.

Every panel queries the datasource variable, has a unit and a description, and filters by
the cluster variable; rates use ``$__rate_interval``, totals over the time picked
``$__range``, percentiles over time a rolling hour. GPU counts are physical GPUs (a MIG
slice its fraction, a time-shared GPU once), read from the exporter's gauges of GPUs by
state: a rate of the GPU-seconds counters over a few scrapes aliases whenever the counters
move less often than Prometheus scrapes (a 30 s cycle at a 15 s scrape reads 2/3 or 4/3 of
the truth). Energy and CO2e counters move the same way, once a cycle: their totals are
increases over ``$__range`` (exact to a cycle), power a rate over ``$__rate_interval``, as
spend is (it wobbles around the truth where Prometheus scrapes more often than the exporter
cycles). Variables: datasource, cluster, team, namespace; on the per-GPU dashboard pool,
model, node and GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from exporter.config import Sla
from exporter.model.bottleneck import THROTTLED_TEMP_C
from exporter.model.catalog import GPU_MODELS

HERE = Path(__file__).parent
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'cluster=~"$cluster"'
TEAM = 'cluster=~"$cluster", team=~"$team", namespace=~"$namespace"'


def target(expr: str, legend: str = "", instant: bool = False) -> dict[str, Any]:
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": "A",
            "instant": instant, "range": not instant}


def panel(kind: str, title: str, description: str, unit: str, targets: list[dict[str, Any]],
          w: int = 12, h: int = 8, **options: Any) -> dict[str, Any]:
    for i, t in enumerate(targets):
        t["refId"] = chr(ord("A") + i)
    p: dict[str, Any] = {
        "type": kind, "title": title, "description": description, "datasource": DS,
        "targets": targets, "gridPos": {"w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": options}
    return p


def stat(title: str, description: str, unit: str, expr: str, w: int = 6,
         steps: list[tuple[str, float | None]] | None = None) -> dict[str, Any]:
    p = panel("stat", title, description, unit, [target(expr, instant=True)], w=w, h=4,
              reduceOptions={"calcs": ["lastNotNull"]})
    return thresholds(p, steps) if steps else p


def thresholds(p: dict[str, Any], steps: list[tuple[str, float | None]]) -> dict[str, Any]:
    """Colour by value: (colour, from) steps, the first from None (everything below)."""
    p["fieldConfig"]["defaults"]["thresholds"] = {
        "mode": "absolute", "steps": [{"color": c, "value": v} for c, v in steps]}
    if p["type"] == "timeseries":
        p["fieldConfig"]["defaults"]["custom"] = {"thresholdsStyle": {"mode": "line"}}
    return p


def series(title: str, description: str, unit: str, *exprs: tuple[str, str],
           w: int = 12) -> dict[str, Any]:
    return panel("timeseries", title, description, unit, [target(e, legend) for e, legend in exprs],
                 w=w, legend={"displayMode": "table", "placement": "bottom"})


def stacked(p: dict[str, Any]) -> dict[str, Any]:
    """A time series whose series stack up to their total (parts of one whole)."""
    p["fieldConfig"]["defaults"]["custom"] = {"stacking": {"mode": "normal", "group": "A"},
                                              "fillOpacity": 60, "lineWidth": 1}
    return p


def table(title: str, description: str, unit: str, *exprs: str, w: int = 12
          ) -> dict[str, Any]:
    """One row per series, a column per label and the value (Grafana's table format);
    several queries are merged on their labels, a value column each."""
    p = panel("table", title, description, unit,
              [target(e, instant=True) | {"format": "table"} for e in exprs], w=w, h=9)
    if len(exprs) > 1:
        p["transformations"] = [{"id": "merge", "options": {}}]
    return p


def columns(p: dict[str, Any], *named: tuple[str, str]) -> dict[str, Any]:
    """A merged table's value columns (one per query, in order) named, each with its unit."""
    p["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byName", "options": f"Value #{chr(ord('A') + i)}"},
         "properties": [{"id": "displayName", "value": name}, {"id": "unit", "value": unit}]}
        for i, (name, unit) in enumerate(named)]
    return p


def _query_var(name: str, label: str, query: str) -> dict[str, Any]:
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": name}, "refresh": 2, "multi": True,
            "includeAll": True, "allValue": ".*", "current": {}}


def variables(team: bool, gpu: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": "datasource", "label": "Data source", "type": "datasource",
         "query": "prometheus", "current": {}},
        {"name": "cluster", "label": "Cluster", "type": "query", "datasource": DS,
         "query": {"query": "label_values(gke_gpu_sla_target_ratio, cluster)",
                   "refId": "cluster"}, "refresh": 2, "multi": True, "includeAll": True,
         "allValue": ".*", "current": {}},
    ]
    if team:
        for name, label in (("team", "Team"), ("namespace", "Namespace")):
            out.append({"name": name, "label": label, "type": "query", "datasource": DS,
                        "query": {"query": f'label_values(gke_gpu_cost_usd_total{{{SEL}}}, '
                                           f'{name})', "refId": name},
                        "refresh": 2, "multi": True, "includeAll": True, "allValue": ".*",
                        "current": {}})
    if gpu:
        chosen = SEL
        for name, label, of in (("pool", "Node pool", "pool"), ("model", "GPU model", "model"),
                                ("node", "Node", "node"), ("gpu", "GPU", "uuid")):
            out.append(_query_var(name, label,
                                  f"label_values(gke_gpu_available{{{chosen}}}, {of})"))
            chosen += f', {of}=~"${name}"'
    return out


def dashboard(uid: str, title: str, description: str, panels: list[dict[str, Any]],
              team: bool = False, gpu: bool = False) -> dict[str, Any]:
    x = y = row_h = 0
    for i, p in enumerate(panels):
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p["gridPos"] |= {"x": x, "y": y}
        p["id"] = i + 1
        x, row_h = x + w, max(row_h, h)
    return {"uid": uid, "title": title, "description": description,
            "tags": ["gke-gpu-exporter", "gpu"], "timezone": "utc", "schemaVersion": 39,
            "editable": True, "graphTooltip": 1, "refresh": "1m",
            "time": {"from": "now-24h", "to": "now"},
            "templating": {"list": variables(team, gpu)}, "panels": panels,
            "annotations": {"list": annotations()},
            "links": [{"title": "GPU dashboards", "type": "dashboards",
                       "tags": ["gke-gpu-exporter"], "asDropdown": True}]}


def _annotation(name: str, expr: str, title: str, text: str, colour: str) -> dict[str, Any]:
    return {"name": name, "datasource": DS, "enable": True, "iconColor": colour,
            "expr": expr, "step": "1m", "titleFormat": title, "textFormat": text,
            "tagKeys": "cluster"}


def annotations() -> list[dict[str, Any]]:
    """What every dashboard marks on its time axis, in the minute it happened: XID errors,
    Spot reclaims, nodes NotReady and failed scale-ups (each can be switched off)."""
    return [
        _annotation("XID errors", f"sum by (cluster, node) (increase("
                    f"gke_gpu_xid_events_total{{{SEL}}}[2m])) > 0", "XID error on {{node}}",
                    "a GPU of {{node}} reported a new XID (the GPU dashboard names it)",
                    "red"),
        _annotation("Spot reclaims", f"sum by (cluster, pool) (increase("
                    f"gke_gpu_spot_interruptions_total{{{SEL}}}[2m])) > 0",
                    "Spot reclaim in {{pool}}", "pods of {{pool}} ended by a Spot "
                    "preemption", "orange"),
        _annotation("Nodes NotReady", f"max by (cluster, node, pool) ("
                    f"gke_gpu_node_ready{{{SEL}}} == 0) + 1", "{{node}} NotReady",
                    "{{node}} of {{pool}} is NotReady: its GPUs are unavailable", "purple"),
        _annotation("Scale-up failures", f"sum by (cluster, pool, reason) (increase("
                    f"gke_gpu_scale_up_failures_total{{{SEL}}}[2m])) > 0",
                    "scale-up of {{pool}} failed ({{reason}})", "the cluster autoscaler "
                    "could not add nodes to {{pool}}: {{reason}}", "yellow"),
    ]


RATE = "$__rate_interval"
RANGE = "$__range"
ROLLING = "1h"
"""The window of percentiles over time: a scheduling interval often has no pod at all."""
GPU_UID = "gke-gpu-gpu"
GPU_LINK = (f"/d/{GPU_UID}?${{__url_time_range}}&var-datasource=${{datasource}}"
            "&var-cluster=${__data.fields.cluster}&var-node=${__data.fields.node}"
            "&var-gpu=${__data.fields.uuid}")
"""The per-GPU dashboard for a table row's GPU."""


def gpus(state: str) -> str:
    """Physical GPUs in a state now, from the gauge of GPUs by state."""
    return f'sum(gke_gpu_state_gpus{{{SEL}, state="{state}"}})'


def power_share(sel: str) -> str:
    """Power draw over the model's power limit (the catalogue's), per GPU."""
    return " or ".join(f'gke_gpu_power_watts{{{sel}, model="{a}"}} / {m.power_limit_watts:g}'
                       for a, m in sorted(GPU_MODELS.items()))


SLA_TARGET = Sla().target


def overview() -> dict[str, Any]:
    return with_gpu_link(dashboard(
        "gke-gpu-overview", "GKE GPUs: overview",
        "How many GPUs there are, how many are held and used, and what they cost now.", [
        stat("Available GPUs", "Allocatable GPUs of Ready nodes minus system-reserved, in "
             "physical GPUs.", "none",
             f"sum(gke_gpu_cluster_available_gpus{{{SEL}}}) or vector(0)", w=4),
        stat("Allocated GPUs", "Physical GPUs pods hold now (MIG slices as their fraction, "
             "a time-shared GPU once).", "none",
             f"{gpus('allocated')} or vector(0)", w=4),
        stat("Utilised GPUs", "How many GPUs' worth of work runs now: utilisation x "
             "fraction, summed.", "none", f"sum(gke_gpu_utilized_gpus{{{SEL}}}) or vector(0)",
             w=4),
        stat("Unavailable GPUs", "Physical GPUs down now (not Ready, missing, fatal XID).",
             "none", f"{gpus('unavailable')} or vector(0)", w=4,
             steps=[("green", None), ("red", 0.001)]),
        stat("Spend now", "Cost per hour of all GPUs, allocated or not, at the last "
             "interval's rate.", "currencyUSD",
             f"sum(rate(gke_gpu_cost_usd_total{{{SEL}}}[{RATE}])) * 3600 or vector(0)", w=4),
        stat("Spend over the range", "Cost of all GPUs over the time picked.", "currencyUSD",
             f"sum(increase(gke_gpu_cost_usd_total{{{SEL}}}[{RANGE}])) or vector(0)", w=4),
        series("GPUs by state", "Physical GPUs allocated, unallocated and unavailable (MIG "
               "slices as their fraction, a time-shared GPU once).", "none",
               (f"sum by (state) (gke_gpu_state_gpus{{{SEL}}})", "{{state}}")),
        series("Cost per hour by state", "Allocated cost is what pods hold; unallocated is "
               "idle capacity.", "currencyUSD",
               (f"sum by (state) (rate(gke_gpu_cost_usd_total{{{SEL}}}[{RATE}])) * 3600",
                "{{state}}")),
        series("Idle and unallocated spend", "Per hour: cost of allocated GPUs' unused share, "
               "and of GPUs no pod holds.", "currencyUSD",
               (f'sum(rate(gke_gpu_cost_usd_total{{{SEL}, state="allocated"}}[{RATE}])) '
                f'* 3600 * (1 - sum(rate(gke_gpu_utilized_gpu_seconds_total{{{SEL}, '
                f'state="allocated"}}[{RATE}])) / sum(rate(gke_gpu_gpu_seconds_total{{{SEL}, '
                f'state="allocated"}}[{RATE}])))', "idle (allocated, unused)"),
               (f'sum(rate(gke_gpu_cost_usd_total{{{SEL}, state="unallocated"}}[{RATE}])) '
                f'* 3600', "unallocated")),
        series("Effective cost per utilised GPU-hour", "Spend / utilised GPU-hours at the "
               "last interval's rates, by GPU model: the price of a useful GPU-hour (the "
               "ratio of the sums over every namespace and state, not the largest of their "
               "ratios). A model whose GPUs did no useful work has no such price: it is "
               "shown by what it costs an hour, named so.", "currencyUSD",
               (f"sum by (model) (rate(gke_gpu_cost_usd_total{{{SEL}}}[{RATE}])) / "
                f"(sum by (model) (rate(gke_gpu_utilized_gpu_seconds_total{{{SEL}}}[{RATE}]))"
                " / 3600 > 0)", "{{model}}"),
               (f"sum by (model) (rate(gke_gpu_cost_usd_total{{{SEL}}}[{RATE}])) * 3600 "
                f"unless on (model) (sum by (model) (rate("
                f"gke_gpu_utilized_gpu_seconds_total{{{SEL}}}[{RATE}])) > 0)",
                "{{model}}: no useful work, cost an hour")),
        gpu_links(table("Hottest GPUs", "The ten hottest GPUs now; a row opens the GPU's "
                        "dashboard.", "celsius",
                        f"topk(10, max by (cluster, pool, node, model, uuid) "
                        f"(gke_gpu_temperature_celsius{{{SEL}}}))", w=24)),
    ]), GPU_UID)


def gpu_links(p: dict[str, Any]) -> dict[str, Any]:
    """Each row of a table of GPUs opens the per-GPU dashboard."""
    p["fieldConfig"]["defaults"]["links"] = [{"title": "GPU details", "url": GPU_LINK}]
    return p


def with_gpu_link(board: dict[str, Any], uid: str) -> dict[str, Any]:
    """The dashboard with a link to the per-GPU one in its header."""
    board["links"].append({"title": "GPU details", "type": "link", "icon": "dashboard",
                           "url": f"/d/{uid}?${{__url_time_range}}&${{cluster:queryparam}}"})
    return board


def teams() -> dict[str, Any]:
    return dashboard("gke-gpu-teams", "GKE GPUs: teams and cost",
                     "Who spends what, and how well they use it.", [
        series("Cost per hour by team", "Cost of the GPUs each team's pods hold.",
               "currencyUSD",
               (f'sum by (team) (rate(gke_gpu_cost_usd_total{{{TEAM}, state="allocated"}}'
                f'[{RATE}])) * 3600', "{{team}}")),
        series("Utilisation by team", "Utilised / allocated GPU-seconds; a team holding no "
               "GPU has no line.", "percentunit",
               (f'sum by (team) (rate(gke_gpu_utilized_gpu_seconds_total{{{TEAM}, '
                f'state="allocated"}}[{RATE}])) / (sum by (team) (rate('
                f'gke_gpu_gpu_seconds_total{{{TEAM}, state="allocated"}}[{RATE}])) > 0)',
                "{{team}}")),
        table("Cost over the range by namespace", "What each namespace's pods cost over the "
              "time picked.", "currencyUSD",
              f'sum by (team, namespace) (increase(gke_gpu_cost_usd_total{{{TEAM}, '
              f'state="allocated"}}[{RANGE}])) > 0'),
        table("Top pods by GPUs held", "Pods holding the most GPUs now.", "none",
              f"topk(15, count by (namespace, pod, team) (gke_gpu_allocation_info{{{TEAM}}}))"),
        table("Cost over the range by allocation", "By the pods' value of the allocation "
              "label or annotation (config: allocation; a cost-center, say), whatever their "
              "team: empty where no such dimension is configured.", "currencyUSD",
              f"sum by (dimension, allocation) (increase(gke_gpu_allocation_cost_usd_total"
              f"{{{SEL}}}[{RANGE}])) > 0"),
        energy_table("Energy and CO2e over the range by team", "The energy of the GPUs "
                     "each team's pods held over the time picked (kWh at the GPU) and its "
                     "location-based CO2e (energy x PUE x the region's grid intensity); the "
                     "energy dashboard has the rest.", "team", f'{TEAM}, state="allocated"'),
    ], team=True)


KWH = 3.6e6
"""Joules in a kilowatt-hour."""
CO2E_COLUMNS = (("Energy", "kwatth"), ("CO2e", "massg"))


def energy_table(title: str, description: str, by: str, sel: str) -> dict[str, Any]:
    """Energy (kWh) and CO2e (g) over the range by ``by``, of the groups that drew any."""
    energy = f"sum by ({by}) (increase(gke_gpu_energy_joules_total{{{sel}}}[{RANGE}]))"
    co2e = f"sum by ({by}) (increase(gke_gpu_co2e_grams_total{{{sel}}}[{RANGE}]))"
    return columns(table(title, description, "kwatth", f"{energy} / {KWH:g} > 0",
                         f"{co2e} and on ({by}) {energy} > 0"), *CO2E_COLUMNS)


def per_utilized_hour(counter: str, scale: str = "") -> str:
    """A counter's increase over the range per utilised GPU-hour: the ratio of the sums."""
    return (f"sum(increase({counter}{{{TEAM}}}[{RANGE}])){scale} / (sum(increase("
            f"gke_gpu_utilized_gpu_seconds_total{{{TEAM}}}[{RANGE}])) / 3600 > 0)")


GRID = f"max by (cluster, region, basis) (gke_gpu_grid_carbon_intensity_grams_per_kwh{{{SEL}}})"
PUE = f"max by (cluster) (gke_gpu_power_usage_effectiveness{{{SEL}}})"
POD_ENERGY = (f"sum by (namespace, pod, team, workload) (increase("
              f"gke_gpu_pod_energy_joules_total{{{TEAM}}}[{RANGE}]))")
INTERVALS = "gke_gpu_exporter_energy_intervals_total"


def energy() -> dict[str, Any]:
    return dashboard("gke-gpu-energy", "GKE GPUs: energy and carbon",
                     "What the GPUs draw, who draws it, and its location-based CO2e.", [
        stat("Energy over the range", "Energy of the GPUs chosen over the time picked, "
             "at the GPU (before PUE): DCGM's energy counter, the power integral where it "
             "restarted or is not collected. Unallocated and unavailable GPUs' energy has "
             "no team: choosing a team leaves it out.", "kwatth",
             f"sum(increase(gke_gpu_energy_joules_total{{{TEAM}}}[{RANGE}])) / {KWH:g} "
             "or vector(0)", w=4),
        stat("CO2e over the range", "Location-based CO2e of that energy: energy x PUE x the "
             "grid carbon intensity of the GPU's region (the table below has the figures in "
             "force).", "massg",
             f"sum(increase(gke_gpu_co2e_grams_total{{{TEAM}}}[{RANGE}])) or vector(0)", w=4),
        stat("Power draw now", "Energy per second at the last interval's rate: the counters "
             "move once a cycle, so where Prometheus scrapes more often than the exporter "
             "cycles this wobbles around the truth (the per-GPU dashboard has DCGM's power "
             "gauge against each GPU's limit).", "watt",
             f"sum(rate(gke_gpu_energy_joules_total{{{TEAM}}}[{RATE}])) or vector(0)", w=4),
        stat("Energy per utilised GPU-hour", "Energy over the range / utilised GPU-hours "
             "over the range (the ratio of the sums): what a useful GPU-hour draws, idle and "
             "unallocated GPUs' energy included unless a team is chosen.", "kwatth",
             per_utilized_hour("gke_gpu_energy_joules_total", f" / {KWH:g}"), w=4),
        stat("CO2e per utilised GPU-hour", "CO2e over the range / utilised GPU-hours over "
             "the range (the ratio of the sums).", "massg",
             per_utilized_hour("gke_gpu_co2e_grams_total"), w=4),
        stat("Estimated energy share", "GPU-intervals over the range whose energy is the "
             "power integral rather than DCGM's energy counter: reset (the counter went "
             "backwards or jumped) or power (no counter collected); the whole cluster's, "
             "whatever team is chosen. Yellow from 5 %.",
             "percentunit",
             f'sum(increase({INTERVALS}{{{SEL}, basis=~"reset|power"}}[{RANGE}])) / '
             f"(sum(increase({INTERVALS}{{{SEL}}}[{RANGE}])) > 0)", w=4,
             steps=[("green", None), ("yellow", 0.05)]),
        stacked(series("Power by state", "Power drawn by GPUs allocated, unallocated and "
                       "unavailable, stacked to the fleet's draw (energy per second over "
                       "each interval).", "watt",
                       (f"sum by (state) (rate(gke_gpu_energy_joules_total{{{TEAM}}}"
                        f"[{RATE}]))", "{{state}}"), w=8)),
        series("Power by team", "Power drawn by the GPUs each team's pods hold.", "watt",
               (f'sum by (team) (rate(gke_gpu_energy_joules_total{{{TEAM}, '
                f'state="allocated"}}[{RATE}]))', "{{team}}"), w=8),
        series("CO2e per hour by team", "Location-based CO2e per hour of the GPUs each "
               "team's pods hold.", "si:g/h",
               (f'sum by (team) (rate(gke_gpu_co2e_grams_total{{{TEAM}, '
                f'state="allocated"}}[{RATE}])) * 3600', "{{team}}"), w=8),
        energy_table("Energy and CO2e over the range by team", "Energy (at the GPU) and "
                     "CO2e of the GPUs each team's pods held over the time picked.", "team",
                     f'{TEAM}, state="allocated"'),
        energy_table("Energy and CO2e over the range by pool", "Energy (at the GPU) and "
                     "CO2e of each node pool's GPUs over the time picked, allocated or "
                     "not.", "pool, model", TEAM),
        columns(table("Top pods by energy over the range", "The 15 pods in the cluster now "
                      "whose GPUs drew the most over the time picked (their share where "
                      "shared), and its CO2e.", "kwatth",
                      f"topk(15, {POD_ENERGY}) / {KWH:g}",
                      f"sum by (namespace, pod, team, workload) (increase("
                      f"gke_gpu_pod_co2e_grams_total{{{TEAM}}}[{RANGE}])) and on (namespace, "
                      f"pod) topk(15, {POD_ENERGY})"), *CO2E_COLUMNS),
        columns(table("Carbon intensity and PUE in force", "Per region of the cluster's GPU "
                      "nodes: the grid's carbon intensity (gCO2e per kWh, before PUE) and "
                      "its basis (the data and year, or the site's own factor), the PUE, "
                      "and their product, the CO2e of a kWh at the GPU.",
                      "suffix:gCO2e/kWh", GRID,
                      f"{GRID} * 0 + on (cluster) group_left {PUE}",
                      f"{GRID} * on (cluster) group_left {PUE}"),
                ("Grid intensity", "suffix:gCO2e/kWh"), ("PUE", "none"),
                ("Per kWh at the GPU", "suffix:gCO2e/kWh")),
    ], team=True)


def queue() -> dict[str, Any]:
    return dashboard("gke-gpu-queue", "GKE GPUs: queue",
                     "Pods waiting for GPUs, how long and why they wait, and the free GPUs "
                     "no waiting pod can use.", [
        series("Pending pods", "GPU pods not yet scheduled.", "none",
               (f"sum by (team, model) (gke_gpu_pending_pods{{{TEAM}}})",
                "{{team}} {{model}}")),
        series("Pending GPUs", "GPUs those pods ask for.", "none",
               (f"sum by (team, model) (gke_gpu_pending_gpus{{{TEAM}}})",
                "{{team}} {{model}}")),
        series("Oldest pending pod", "Age of the longest-waiting pod.", "s",
               (f"max by (team, model) (gke_gpu_oldest_pending_seconds{{{TEAM}}})",
                "{{team}} {{model}}")),
        series("Queue wait p50 / p90 (rolling hour)", "Of pods scheduled in the hour before "
               "each point, by team and GPU model; a gap where none was.", "s",
               *[(f"histogram_quantile({q}, sum by (team, model, le) (increase("
                  f"gke_gpu_queue_wait_seconds_bucket{{{TEAM}}}[{ROLLING}]))) and on (team, "
                  f"model) sum by (team, model) (increase(gke_gpu_queue_wait_seconds_count"
                  f"{{{TEAM}}}[{ROLLING}])) > 0", f"p{q * 100:g} {{{{team}}}} {{{{model}}}}")
                 for q in (0.5, 0.9)]),
        table("Queue wait over the range", "p50 and p90 wait and pods scheduled over the time "
              "picked, by team and GPU model (groups that scheduled a pod).", "s",
              *[f"histogram_quantile({q}, sum by (team, model, le) (increase("
                f"gke_gpu_queue_wait_seconds_bucket{{{TEAM}}}[{RANGE}]))) and on (team, model) "
                f"sum by (team, model) (increase(gke_gpu_queue_wait_seconds_count{{{TEAM}}}"
                f"[{RANGE}])) > 0" for q in (0.5, 0.9)],
              f"sum by (team, model) (increase(gke_gpu_queue_wait_seconds_count{{{TEAM}}}"
              f"[{RANGE}])) > 0", w=24),
        # why they wait: one cause per waiting pod or Workload, the first that holds, and a
        # use per free GPU (docs/exporter.md, "Why a pod waits")
        stacked(series("Pending GPUs by cause", "GPUs waiting now, stacked by why: starting "
                       "(scheduled, pulling or initialising), preempted (evicted or "
                       "reclaimed, waiting again), quota (Kueue holds it), unschedulable (no "
                       "pool could run it), stockout (the scale-up failed), fragmented (free "
                       "GPUs, none of its size on one node), scaling_up, no_capacity (its "
                       "pools are full).", "none",
                       (f"sum by (cause) (gke_gpu_pending_cause_gpus{{{TEAM}}})",
                        "{{cause}}"))),
        columns(table("When will it start", "Each waiting pod or Kueue Workload (the longest "
                      "waiting first, as many as queue_forecast.max_series): when the last "
                      "queue forecast expects it to start, from "
                      "now (the live queue played forward: running pods' remaining time "
                      "from the run times of pods like them, the pools' maxima and "
                      "scale-up delays, Kueue quotas, priorities). Work not submitted yet "
                      "and preemption are left out: a start can come later than shown.",
                      "s",
                      f"clamp_min(max by (namespace, team, kind, name, pool, basis) ("
                      f"gke_gpu_expected_start_timestamp_seconds{{{TEAM}}}) - time(), 0)",
                      w=24), ("Starts in", "s")),
        series("Oldest wait by cause", "Wait so far of the longest-waiting pod or Workload, "
               "by cause.", "s",
               (f"max by (cause) (gke_gpu_pending_cause_oldest_seconds{{{TEAM}}})",
                "{{cause}}")),
        table("GPU-hours waited over the range by team and cause", "GPU-hours waited "
              "(GPUs asked x hours) over the time picked, by team and cause, from the "
              "GPU-seconds-waited counter.", "none",
              f"sum by (team, cause) (increase(gke_gpu_pending_gpu_seconds_total{{{TEAM}}}"
              f"[{RANGE}])) / 3600 > 0"),
        series("Scale-up failures by pool and reason", "The cluster autoscaler's failed "
               "scale-ups over each interval: out_of_resources (the zone has no such GPU "
               "to give), quota_exceeded (the project's GPU quota), other.", "none",
               (f"sum by (pool, reason) (increase(gke_gpu_scale_up_failures_total{{{SEL}}}"
                f"[{RATE}]))", "{{pool}} {{reason}}")),
        stacked(series("Stranded GPUs by pool and use", "Free GPUs of Ready nodes that no "
                       "waiting pod can use, in physical GPUs: fragment (a pod fits the node "
                       "but asks more than it has free), quota (Kueue holds the Workloads "
                       "that would), mismatch (something waits, nothing fits the node), "
                       "no_demand (nothing waits).", "none",
                       (f"sum by (pool, use) (gke_gpu_stranded_gpus{{{SEL}}})",
                        "{{pool}} {{use}}"), w=8)),
        stacked(series("Stranded GPUs: cost per hour", "What the stranded GPUs of each pool "
                       "cost an hour.", "currencyUSD",
                       (f"sum by (pool) (gke_gpu_stranded_cost_usd_per_hour{{{SEL}}})",
                        "{{pool}}"), w=8)),
        series("Pool fragmentation", "Of the pool's free GPUs, the share on nodes where a "
               "waiting pod that fits the pool asks more than the node has free: 0 when "
               "every waiting pod could start, 1 when none could. No line while no pod that "
               "fits the pool waits: its free GPUs are idle, not fragmented.", "percentunit",
               (f"max by (pool) (gke_gpu_pool_fragmentation_ratio{{{SEL}}})", "{{pool}}"),
               w=8),
        # Kueue: the wait before a Job has pods (empty on a cluster without Kueue)
        series("Kueue: Workloads waiting for admission", "Jobs Kueue holds (no pod exists for "
               "them yet) and the GPUs they ask for, by ClusterQueue.", "none",
               (f"sum by (cluster_queue) (gke_gpu_kueue_pending_workloads{{{SEL}}})",
                "{{cluster_queue}} workloads"),
               (f"sum by (cluster_queue) (gke_gpu_kueue_pending_gpus{{{SEL}}})",
                "{{cluster_queue}} GPUs")),
        series("Kueue: quota in use", "GPUs the ClusterQueue's admitted Workloads hold, "
               "against its nominal quota, by flavor (above the quota: borrowed from its "
               "cohort).", "none",
               (f"sum by (cluster_queue, flavor) (gke_gpu_kueue_used_gpus{{{SEL}}})",
                "{{cluster_queue}} {{flavor}} used"),
               (f"sum by (cluster_queue, flavor) (gke_gpu_kueue_quota_gpus{{{SEL}}})",
                "{{cluster_queue}} {{flavor}} quota")),
        series("Kueue: admission wait p90 (rolling hour)", "Of the Workloads admitted in the "
               "hour before each point, by ClusterQueue (Kueue's own measure).", "s",
               (f"histogram_quantile(0.9, sum by (cluster_queue, le) (increase("
                f"gke_gpu_kueue_admission_wait_seconds_bucket{{{SEL}}}[{ROLLING}]))) and on "
                f"(cluster_queue) sum by (cluster_queue) (increase("
                f"gke_gpu_kueue_admission_wait_seconds_count{{{SEL}}}[{ROLLING}])) > 0",
                "{{cluster_queue}}")),
    ], team=True)


def availability() -> dict[str, Any]:
    return dashboard("gke-gpu-availability", "GKE GPUs: availability and SLA",
                     "Whether the GPUs are up, against the objective.", [
        stat("Availability (1 d)", "Up / (up + down) GPU-seconds over a day; red below "
             f"the default objective ({SLA_TARGET:.1%}).", "percentunit",
             f"1 - max(gke_gpu:availability_errors:ratio_rate1d{{{SEL}}})",
             steps=[("red", None), ("green", SLA_TARGET)]),
        stat("Objective", "sla.target of the exporter's config.", "percentunit",
             f"max(gke_gpu_sla_target_ratio{{{SEL}}})"),
        stat("Error budget left (1 d)", "1 - errors / budget over a day.", "percentunit",
             f"1 - max(gke_gpu:availability_errors:ratio_rate1d{{{SEL}}}) / "
             f"max(gke_gpu:availability_error_budget:ratio{{{SEL}}})",
             steps=[("red", None), ("yellow", 0.0), ("green", 0.25)]),
        stat("Unavailable GPUs", "Physical GPUs down now (not Ready, missing, fatal XID).",
             "none", f"{gpus('unavailable')} or vector(0)",
             steps=[("green", None), ("red", 0.001)]),
        thresholds(series("Burn rate", "Error ratio / budget over 1 h and 6 h: above 14.4 "
               "(1 h) or 6 (6 h) pages.", "none",
               (f"max by (cluster) (gke_gpu:availability_errors:ratio_rate1h{{{SEL}}}) / "
                f"max by (cluster) (gke_gpu:availability_error_budget:ratio{{{SEL}}})",
                "1h {{cluster}}"),
               (f"max by (cluster) (gke_gpu:availability_errors:ratio_rate6h{{{SEL}}}) / "
                f"max by (cluster) (gke_gpu:availability_error_budget:ratio{{{SEL}}})",
                "6h {{cluster}}")), [("green", None), ("orange", 6.0), ("red", 14.4)]),
        series("Downtime by reason", "GPU-seconds down per second, by reason.", "none",
               (f"sum by (reason) (rate(gke_gpu_down_seconds_total{{{SEL}}}[{RATE}]))",
                "{{reason}}")),
        series("Incidents", "XID events and spot interruptions.", "none",
               (f"sum(increase(gke_gpu_xid_events_total{{{SEL}}}[{RATE}]))", "XID events"),
               (f"sum(increase(gke_gpu_spot_interruptions_total{{{SEL}}}[{RATE}]))",
                "spot interruptions")),
        gpu_links(table("GPUs down now", "Unavailable GPUs and why; a row opens the GPU's "
                        "dashboard.", "none",
                        f'max by (cluster, pool, node, model, uuid, reason) '
                        f'(gke_gpu_state{{{SEL}, state="unavailable"}})', w=24)),
    ])


def bottlenecks() -> dict[str, Any]:
    return dashboard("gke-gpu-bottlenecks", "GKE GPUs: bottlenecks",
                     "Why pods' GPUs are not doing more, with the DCGM signals.", [
        series("Pods by bottleneck class", "Count of pods in each class over the window.",
               "none", (f"count by (class) (gke_gpu_pod_bottleneck{{{TEAM}}})", "{{class}}")),
        table("Pods and their class", "The live class per pod (exporter/model/bottleneck.py has "
              "the rules).", "none",
              f"max by (namespace, pod, team, class) (gke_gpu_pod_bottleneck{{{TEAM}}})"),
        series("GPU utilisation by model", "Mean utilisation of GPUs by model.", "percentunit",
               (f"avg by (model) (gke_gpu_utilization_ratio{{{SEL}}})", "{{model}}")),
        series("Memory in use by model", "Framebuffer in use / size.", "percentunit",
               (f"sum by (model) (gke_gpu_memory_used_bytes{{{SEL}}}) / sum by (model) "
                f"(gke_gpu_memory_total_bytes{{{SEL}}})", "{{model}}")),
    ], team=True)


def exporter_health() -> dict[str, Any]:
    return dashboard("gke-gpu-exporter-health", "GKE GPUs: exporter health",
                     "Whether the exporter sees everything and keeps up.", [
        stat("Targets up", "dcgm-exporters, watches and sinks that answered.", "none",
             f"sum(gke_gpu_exporter_source_up{{{SEL}}}) or vector(0)"),
        stat("Targets down", "Sources that did not answer in the last cycle.", "none",
             f"count(gke_gpu_exporter_source_up{{{SEL}}} == 0) or vector(0)",
             steps=[("green", None), ("red", 1.0)]),
        stat("Cycle duration", "Wall time of the last cycle; yellow past half the default "
             "interval, red past all of it.", "s",
             f"max(gke_gpu_exporter_cycle_duration_seconds{{{SEL}}})",
             steps=[("green", None), ("yellow", 30.0), ("red", 60.0)]),
        stat("Cycles in the last 5 minutes", "Cycles completed (the exporter's own clock, "
             "so a simulated one counts too); 0 is stale, as the GkeGpuExporterStale alert "
             "says.", "none",
             f"max(changes(gke_gpu_exporter_last_cycle_timestamp_seconds{{{SEL}}}[5m])) "
             "or vector(0)", steps=[("red", None), ("green", 1.0)]),
        series("Scrape duration", "Slowest dcgm-exporter scrapes.", "s",
               (f'topk(5, gke_gpu_exporter_scrape_duration_seconds{{{SEL}, source="dcgm"}})',
                "{{target}}")),
        series("Errors", "Failed scrapes, watches and sink writes per second.", "none",
               (f"sum by (source) (rate(gke_gpu_exporter_errors_total{{{SEL}}}[{RATE}]))",
                "{{source}}")),
        series("Rows written", "Rows per second into the warehouse, by sink and table.",
               "none",
               (f"sum by (sink, table) (rate(gke_gpu_exporter_rows_written_total{{{SEL}}}"
                f"[{RATE}]))", "{{sink}} {{table}}")),
        series("Rejected DCGM samples", "Lines dropped, by reason.", "none",
               (f"sum by (reason) (rate(gke_gpu_exporter_rejected_samples_total{{{SEL}}}"
                f"[{RATE}]))", "{{reason}}")),
    ])


GPU = (f'{SEL}, pool=~"$pool", model=~"$model", node=~"$node", uuid=~"$gpu"')
"""The GPUs the per-GPU dashboard's variables choose."""
GPU_LEGEND = "{{node}} {{gpu}} {{mig_profile}}"


def gpu() -> dict[str, Any]:
    return dashboard(GPU_UID, "GKE GPUs: per GPU",
                     "One GPU (or a node's, a pool's) in detail: what runs on it, how busy, "
                     "hot and power-hungry it is, its clocks and its XIDs.", [
        table("Who holds it", "Pods on the GPUs chosen now.", "none",
              f"max by (node, gpu, uuid, mig_profile, namespace, pod, team) "
              f"(gke_gpu_allocation_info{{{GPU}}})"),
        table("State", "Allocation state now and, when down, why.", "none",
              f"max by (node, gpu, uuid, mig_profile, state, reason) (gke_gpu_state{{{GPU}}})"),
        series("Utilisation", "DCGM GR engine active (GPU_UTIL where profiling is off).",
               "percentunit", (f"max by (node, gpu, mig_profile) "
                               f"(gke_gpu_utilization_ratio{{{GPU}}})", GPU_LEGEND)),
        series("Memory in use", "Framebuffer in use / size.", "percentunit",
               (f"max by (node, gpu, mig_profile) (gke_gpu_memory_used_bytes{{{GPU}}}) / "
                f"max by (node, gpu, mig_profile) (gke_gpu_memory_total_bytes{{{GPU}}})",
                GPU_LEGEND)),
        thresholds(series("Temperature", f"GPU temperature; red from {THROTTLED_TEMP_C:g} C, "
                          "where the bottleneck classifier calls a GPU throttled.", "celsius",
                          (f"max by (node, gpu) (gke_gpu_temperature_celsius{{{GPU}}})",
                           "{{node}} {{gpu}}")),
                   [("green", None), ("yellow", THROTTLED_TEMP_C - 5), ("red", THROTTLED_TEMP_C)]),
        thresholds(series("Power / limit", "Power draw over the model's power limit: at 1 the "
                          "GPU is at its cap and its clocks come down.", "percentunit",
                          (f"max by (node, gpu) ({power_share(GPU)})", "{{node}} {{gpu}}")),
                   [("green", None), ("yellow", 0.9), ("red", 0.98)]),
        series("SM clock", "The SM clock: below the model's maximum under load means power "
               "or thermal limits.", "hertz",
               (f"max by (node, gpu) (gke_gpu_sm_clock_hertz{{{GPU}}})", "{{node}} {{gpu}}")),
        series("XIDs", "XID errors over each interval, and the last code seen.", "none",
               (f'sum by (node, uuid) (increase(gke_gpu_xid_events_total{{{SEL}, '
                f'node=~"$node", uuid=~"$gpu"}}[{RATE}]))', "XID events {{node}} {{uuid}}"),
               (f'max by (node, uuid) (gke_gpu_last_xid{{{SEL}, node=~"$node", '
                f'uuid=~"$gpu"}})', "last XID {{node}} {{uuid}}")),
    ], gpu=True)


DASHBOARDS = {"overview": overview, "teams": teams, "energy": energy, "queue": queue,
              "availability": availability, "bottlenecks": bottlenecks,
              "exporter-health": exporter_health, "gpu": gpu}


def render() -> dict[str, str]:
    """File name -> content."""
    return {f"{name}.json": json.dumps(build(), indent=2, sort_keys=True) + "\n"
            for name, build in DASHBOARDS.items()}


def main() -> None:
    for name, text in render().items():
        (HERE / name).write_text(text)


if __name__ == "__main__":
    main()
