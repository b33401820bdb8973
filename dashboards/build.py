"""The Grafana dashboards, generated from code: ``python dashboards/build.py`` writes one
JSON file per dashboard next to this script (``make dashboards``); a test checks the
committed files are what this produces.

Every panel queries the datasource variable, has a unit and a description, and rates use
``$__rate_interval``. Variables: datasource, cluster, team, namespace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def stat(title: str, description: str, unit: str, expr: str, w: int = 6) -> dict[str, Any]:
    return panel("stat", title, description, unit, [target(expr, instant=True)], w=w, h=4,
                 reduceOptions={"calcs": ["lastNotNull"]})


def series(title: str, description: str, unit: str, *exprs: tuple[str, str],
           w: int = 12) -> dict[str, Any]:
    return panel("timeseries", title, description, unit, [target(e, legend) for e, legend in exprs],
                 w=w, legend={"displayMode": "table", "placement": "bottom"})


def table(title: str, description: str, unit: str, expr: str, w: int = 12) -> dict[str, Any]:
    """One row per series, a column per label and the value (Grafana's table format)."""
    return panel("table", title, description, unit,
                 [target(expr, instant=True) | {"format": "table"}], w=w, h=9)


def variables(team: bool) -> list[dict[str, Any]]:
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
    return out


def dashboard(uid: str, title: str, description: str, panels: list[dict[str, Any]],
              team: bool = False) -> dict[str, Any]:
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
            "templating": {"list": variables(team)}, "panels": panels,
            "links": [{"title": "GPU dashboards", "type": "dashboards",
                       "tags": ["gke-gpu-exporter"], "asDropdown": True}]}


RATE = "$__rate_interval"


def overview() -> dict[str, Any]:
    return dashboard("gke-gpu-overview", "GKE GPUs: overview",
                     "How many GPUs there are, how many are held and used, and what they "
                     "cost now.", [
        stat("Available GPUs", "Allocatable GPUs of Ready nodes minus system-reserved.",
             "none", f"sum(gke_gpu_cluster_available_gpus{{{SEL}}})"),
        stat("Allocated GPUs", "GPUs a pod holds now (MIG slices as fractions).", "none",
             f'sum(gke_gpu_node_allocated_gpus{{{SEL}}})'),
        stat("Utilised GPUs", "Sum of utilisation over GPUs: how many GPUs' worth of work "
             "runs now.", "none", f"sum(gke_gpu_utilization_ratio{{{SEL}}})"),
        stat("Spend now", "Cost per hour of all GPUs, allocated or not, at the last "
             "interval's rate.", "currencyUSD",
             f"sum(rate(gke_gpu_cost_usd_total{{{SEL}}}[{RATE}])) * 3600"),
        series("GPUs by state", "Capacity split into allocated, unallocated and unavailable.",
               "none", (f"sum by (state) (gke_gpu_state{{{SEL}}})", "{{state}}")),
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
               "ratios).", "currencyUSD",
               (f"sum by (model) (rate(gke_gpu_cost_usd_total{{{SEL}}}[{RATE}])) / "
                f"(sum by (model) (rate(gke_gpu_utilized_gpu_seconds_total{{{SEL}}}[{RATE}]))"
                " / 3600 > 0)", "{{model}}")),
    ])


def teams() -> dict[str, Any]:
    return dashboard("gke-gpu-teams", "GKE GPUs: teams and cost",
                     "Who spends what, and how well they use it.", [
        series("Cost per hour by team", "Cost of the GPUs each team's pods hold.",
               "currencyUSD",
               (f'sum by (team) (rate(gke_gpu_cost_usd_total{{{TEAM}, state="allocated"}}'
                f'[{RATE}])) * 3600', "{{team}}")),
        series("Utilisation by team", "Utilised / allocated GPU-seconds.", "percentunit",
               (f'sum by (team) (rate(gke_gpu_utilized_gpu_seconds_total{{{TEAM}, '
                f'state="allocated"}}[{RATE}])) / sum by (team) (rate('
                f'gke_gpu_gpu_seconds_total{{{TEAM}, state="allocated"}}[{RATE}]))',
                "{{team}}")),
        table("Cost since start by namespace", "Counters since the exporter started.",
              "currencyUSD",
              f'sum by (team, namespace) (gke_gpu_cost_usd_total{{{TEAM}, '
              f'state="allocated"}})'),
        table("Top pods by GPUs held", "Pods holding the most GPUs now.", "none",
              f"topk(15, count by (namespace, pod, team) (gke_gpu_allocation_info{{{TEAM}}}))"),
    ], team=True)


def queue() -> dict[str, Any]:
    return dashboard("gke-gpu-queue", "GKE GPUs: queue",
                     "Pods waiting for GPUs, and how long they wait.", [
        series("Pending pods", "GPU pods not yet scheduled.", "none",
               (f"sum by (team, model) (gke_gpu_pending_pods{{{TEAM}}})",
                "{{team}} {{model}}")),
        series("Pending GPUs", "GPUs those pods ask for.", "none",
               (f"sum by (team, model) (gke_gpu_pending_gpus{{{TEAM}}})",
                "{{team}} {{model}}")),
        series("Oldest pending pod", "Age of the longest-waiting pod.", "s",
               (f"max by (team, model) (gke_gpu_oldest_pending_seconds{{{TEAM}}})",
                "{{team}} {{model}}")),
        series("Queue wait p50 / p90", "Of pods scheduled in the window, by team and GPU "
               "model.", "s",
               (f"histogram_quantile(0.5, sum by (team, model, le) (rate("
                f"gke_gpu_queue_wait_seconds_bucket{{{TEAM}}}[{RATE}])))",
                "p50 {{team}} {{model}}"),
               (f"histogram_quantile(0.9, sum by (team, model, le) (rate("
                f"gke_gpu_queue_wait_seconds_bucket{{{TEAM}}}[{RATE}])))",
                "p90 {{team}} {{model}}")),
    ], team=True)


def availability() -> dict[str, Any]:
    return dashboard("gke-gpu-availability", "GKE GPUs: availability and SLA",
                     "Whether the GPUs are up, against the objective.", [
        stat("Availability (1 d)", "Up / (up + down) GPU-seconds over a day.", "percentunit",
             f"1 - max(gke_gpu:availability_errors:ratio_rate1d{{{SEL}}})"),
        stat("Objective", "sla.target of the exporter's config.", "percentunit",
             f"max(gke_gpu_sla_target_ratio{{{SEL}}})"),
        stat("Error budget left (1 d)", "1 - errors / budget over a day.", "percentunit",
             f"1 - max(gke_gpu:availability_errors:ratio_rate1d{{{SEL}}}) / "
             f"max(gke_gpu:availability_error_budget:ratio{{{SEL}}})"),
        stat("Unavailable GPUs", "GPUs down now (not Ready, missing, fatal XID).", "none",
             f'sum(gke_gpu_state{{{SEL}, state="unavailable"}}) or vector(0)'),
        series("Burn rate", "Error ratio / budget over 1 h and 6 h: above 14.4 (1 h) or 6 "
               "(6 h) pages.", "none",
               (f"max by (cluster) (gke_gpu:availability_errors:ratio_rate1h{{{SEL}}}) / "
                f"max by (cluster) (gke_gpu:availability_error_budget:ratio{{{SEL}}})",
                "1h {{cluster}}"),
               (f"max by (cluster) (gke_gpu:availability_errors:ratio_rate6h{{{SEL}}}) / "
                f"max by (cluster) (gke_gpu:availability_error_budget:ratio{{{SEL}}})",
                "6h {{cluster}}")),
        series("Downtime by reason", "GPU-seconds down per second, by reason.", "none",
               (f"sum by (reason) (rate(gke_gpu_down_seconds_total{{{SEL}}}[{RATE}]))",
                "{{reason}}")),
        series("Incidents", "XID events and spot interruptions.", "none",
               (f"sum(increase(gke_gpu_xid_events_total{{{SEL}}}[{RATE}]))", "XID events"),
               (f"sum(increase(gke_gpu_spot_interruptions_total{{{SEL}}}[{RATE}]))",
                "spot interruptions")),
    ])


def bottlenecks() -> dict[str, Any]:
    return dashboard("gke-gpu-bottlenecks", "GKE GPUs: bottlenecks",
                     "Why pods' GPUs are not doing more, with the DCGM signals.", [
        series("Pods by bottleneck class", "Count of pods in each class over the window.",
               "none", (f"count by (class) (gke_gpu_pod_bottleneck{{{TEAM}}})", "{{class}}")),
        table("Pods and their class", "The live class per pod (exporter/bottleneck.py has "
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
             "sum(gke_gpu_exporter_source_up)"),
        stat("Targets down", "Sources that did not answer in the last cycle.", "none",
             "count(gke_gpu_exporter_source_up == 0) or vector(0)"),
        stat("Cycle duration", "Wall time of the last cycle.", "s",
             "max(gke_gpu_exporter_cycle_duration_seconds)"),
        stat("Last cycle age", "Seconds since the last completed cycle.", "s",
             "time() - max(gke_gpu_exporter_last_cycle_timestamp_seconds)"),
        series("Scrape duration", "Slowest dcgm-exporter scrapes.", "s",
               ('topk(5, gke_gpu_exporter_scrape_duration_seconds{source="dcgm"})',
                "{{target}}")),
        series("Errors", "Failed scrapes, watches and sink writes per second.", "none",
               (f"sum by (source) (rate(gke_gpu_exporter_errors_total[{RATE}]))",
                "{{source}}")),
        series("Rows written", "Rows per second into the warehouse, by sink and table.",
               "none",
               (f"sum by (sink, table) (rate(gke_gpu_exporter_rows_written_total[{RATE}]))",
                "{{sink}} {{table}}")),
        series("Rejected DCGM samples", "Lines dropped, by reason.", "none",
               (f"sum by (reason) (rate(gke_gpu_exporter_rejected_samples_total[{RATE}]))",
                "{{reason}}")),
    ])


DASHBOARDS = {"overview": overview, "teams": teams, "queue": queue,
              "availability": availability, "bottlenecks": bottlenecks,
              "exporter-health": exporter_health}


def render() -> dict[str, str]:
    """File name -> content."""
    return {f"{name}.json": json.dumps(build(), indent=2, sort_keys=True) + "\n"
            for name, build in DASHBOARDS.items()}


def main() -> None:
    for name, text in render().items():
        (HERE / name).write_text(text)


if __name__ == "__main__":
    main()
