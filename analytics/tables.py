"""The weekly report's tables and headline, declared once: each table's name, title and
columns (name, unit, meaning), in report order.

The figures (``analytics.figures``) build each table with these columns in this order,
the report (``analytics.report``) shows them under these titles, ``report.json`` and the
CSVs carry them, and ``docs/report.md``'s reference is generated from them
(``python docs/build.py``). ``tests/analytics/test_tables.py`` checks that a built report
has exactly these columns, that the money columns are those ``render.is_money`` rounds to
the cent, and that the declaration changes only with ``render.JSON_SCHEMA_VERSION``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from exporter.model.pending import USES

Unit = Literal["usd", "ratio", "hours", "seconds", "gib", "count", "text", "time", "flag",
               "json", "kwh", "kg", "grams"]
"""What a column holds: US dollars, a ratio (0-1), hours, seconds, GiB, a count, text, a
UTC time, true/false, a JSON object, kilowatt-hours, kilograms or grams (of CO2e)."""


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    unit: Unit
    help: str


@dataclass(frozen=True, slots=True)
class ReportTable:
    name: str
    title: str
    help: str
    columns: tuple[Column, ...]
    more_columns: str = ""
    """What columns follow the declared ones, when their names are values (one per team)."""

    @property
    def names(self) -> list[str]:
        """The column names, in order."""
        return [c.name for c in self.columns]


_c = Column
"""Short, for the declarations below."""

_NAMESPACE = _c("namespace", "text", "Kubernetes namespace.")
_POD = _c("pod", "text", "Pod name.")
_WORKLOAD = _c("workload", "text", "The pod's top-level owner (Job, JobSet, Deployment...), "
               "else the pod.")
_TEAM = _c("team", "text", "The pod's team (its `team` label, else its namespace's).")
_MODEL = _c("gpu_model", "text", "GPU model (GKE accelerator name).")
_POOL = _c("node_pool", "text", "GKE node pool.")
_CLUSTER = _c("cluster", "text", "Cluster (the name its exporter was given: `cluster`).")
_PROVISIONING = _c("provisioning", "text", "`on-demand` or `spot`.")
_GPU_HOURS = _c("gpu_hours", "hours", "GPU-hours this week.")
_COST = _c("cost_usd", "usd", "Cost this week.")
_SAVING = _c("weekly_saving_usd", "usd", "What the change would have saved this week.")
_ADVICE = _c("advice", "text", "What to try for the class.")


def _cost_by(dimension: Column, owned: bool) -> tuple[Column, ...]:
    held = (_c("utilization_of_allocated", "ratio",
               "Utilised share of the GPU time pods held."),
            _c("share", "ratio", "Share of the week's total cost."),
            _c("share_of_allocated", "ratio",
               "Share of the cost of the GPU time pods held (blank for the rows no pod held)."))
    capacity = (_c("utilization_of_capacity", "ratio",
                   "Utilised share of all GPU time, held or not."),
                _c("share", "ratio", "Share of the week's total cost."))
    return (dimension, _COST,
            _c("previous_cost_usd", "usd", "Cost the week before."),
            _c("change_usd", "usd", "This week's cost less the week before's."),
            _c("change", "ratio", "The change as a share of the week before's cost (blank "
               "without one)."),
            _GPU_HOURS, *(held if owned else capacity))


def _energy_by(dimension: Column) -> tuple[Column, ...]:
    return (dimension,
            _c("energy_kwh", "kwh", "Energy this week, where measured."),
            _c("previous_energy_kwh", "kwh", "Energy the week before."),
            _c("change", "ratio", "The change as a share of the week before's energy (blank "
               "without one)."),
            _c("co2e_kg", "kg", "Location-based CO2e: energy x PUE x the region's grid "
               "intensity (the basis is under the headline)."),
            _c("idle_kwh", "kwh", "Of the energy, what GPUs pods held drew while idle (under "
               "5 % busy)."),
            _c("kwh_per_utilized_gpu_hour", "kwh", "Energy per utilised GPU-hour (blank "
               "where none)."),
            _c("co2e_g_per_utilized_gpu_hour", "grams", "CO2e per utilised GPU-hour."),
            _c("cost_usd_per_utilized_hour", "usd", "Cost per utilised GPU-hour: the "
               "effective cost beside its energy."),
            _c("metered_share", "ratio", "Share of the GPU-hours whose energy is known (the "
               "rest: GPUs not read, such as a node NotReady)."),
            _c("estimated_share", "ratio", "Share of the energy from the power integral "
               "rather than the energy counter (a counter reset, a page without it)."),
            _c("share", "ratio", "Share of the week's energy."))


_ROWS_NO_POD_HELD = (" Ends with `(unallocated)` and `(unavailable)`, the GPU time no pod held, "
                     "so that it sums to the headline.")

TABLES: tuple[ReportTable, ...] = (
    ReportTable("actions", "What to do this week",
                "Each action with its dollars and why: a lever for each cause pods waited "
                "for, free capacity matched hour by hour against the demand that waited "
                "for it, the SLA; the problems to fix first, then the savings, largest "
                "first.",
                (_c("action", "text", "What to do."),
                 _c("where", "text", "The pool, GPU model or ClusterQueue it concerns (`all "
                    "pools` for a lever)."),
                 _SAVING,
                 _c("weekly_cost_usd", "usd", "What the action adds to the week's cost, "
                    "from its replay (What the actions do, replayed); blank where it was "
                    "not replayed. Waiting is never priced: its hours are in `why`."),
                 _c("why", "text", "The figures that call for it."),
                 _c("answers", "text", "What it answers: the cause pods waited for "
                    "(`quota`, `fragmented`, ... as in Why jobs waited), the uses of the "
                    "free GPUs a scale-down removes (`mismatch`, `no_demand`), "
                    "`availability`; blank for a lever of the week's cost, and for a "
                    "warehouse that records no causes."))),
    ReportTable("replayed", "What the actions do, replayed",
                "Each action that changes the cluster's layout, replayed: the week's jobs "
                "on the replay engine (the simulated cluster, in event time) on the layout "
                "it implies, measured as the week is, less the week replayed on its own "
                "layout, so that no action trades a dollar for a queue nobody sees. Its "
                "dollars are the action's above. Every action is replayed unless "
                "`report.whatif_budget` limits them (0: none); `gke-gpu-exporter whatif` "
                "replays any layout. Only in the platform report.",
                (_c("action", "text", "The action, as above."),
                 _c("where", "text", "Where, as above."),
                 _c("change", "text", "The layout replayed."),
                 _c("cost_change_usd", "usd", "The week's cost on that layout, less on its "
                    "own."),
                 _c("waited_gpu_hours_change", "hours", "GPU-hours pods waited, likewise."),
                 _c("team", "text", "The team whose queue-wait p90 grew most (or shrank "
                    "least)."),
                 _c("wait_p90_change_seconds", "seconds", "That team's queue-wait p90, "
                    "likewise."),
                 _c("wait_p90_seconds", "seconds", "That team's queue-wait p90 on that "
                    "layout."),
                 _c("stranded_gpu_hours_change", "hours", "Free GPU-hours no waiting pod "
                    "could use, likewise."),
                 _c("min_availability", "ratio", "The least available pool's availability "
                    "on that layout (against `sla.target`)."),
                 _c("reclaims_change", "count", "Spot reclaims, likewise."),
                 _c("tradeoff", "text", "The teams whose queue-wait p90 it pushes past "
                    "their target (`report.wait_target`, `report.wait_targets`): a saving "
                    "with such a cost is a trade-off, not a saving."),
                 _c("note", "text", "Why it was not replayed (the time budget), or how far "
                    "the week's own replay is from the week (its fidelity)."))),
    ReportTable("settings", "One setting per pool, weighed",
                "For each node pool, the settings replayed (the autoscaler's bounds, a larger "
                "node shape) with every other pool as it is: the cheapest that keeps every "
                "team's queue-wait p90 within its target (`report.wait_target`, "
                "`report.wait_targets`) is recommended, else the one that leaves the worst "
                "team least past its target. A pool whose choice is its setting as it is "
                "gets no recommendation. Only in the platform report.",
                (_POOL, _MODEL,
                 _c("setting", "text", "The setting replayed (`as it is`: the pool as it "
                    "was)."),
                 _c("choice", "text", "`as it is` (the pool as the week had it), "
                    "`recommended`, or blank."),
                 _c("cost_change_usd", "usd", "The week's cost with that setting, less with "
                    "the pool as it is."),
                 _c("team", "text", "The team furthest past its target with that setting "
                    "(else the one with the longest p90)."),
                 _c("wait_p90_seconds", "seconds", "That team's queue-wait p90."),
                 _c("past_target_seconds", "seconds", "How far past its target (0: every "
                    "team within its target)."))),
    ReportTable("cost_by_cluster", "Cost by cluster",
                "Per cluster, side by side: only in a report over a warehouse that several "
                "clusters write to (`report weekly --cluster` reports one of them).",
                _cost_by(_CLUSTER, owned=False)),
    ReportTable("cost_by_team", "Cost by team", "Per team." + _ROWS_NO_POD_HELD,
                _cost_by(_TEAM, owned=True)),
    ReportTable("cost_by_namespace", "Cost by namespace", "Per namespace." + _ROWS_NO_POD_HELD,
                _cost_by(_NAMESPACE, owned=True)),
    ReportTable("cost_by_allocation", "Cost by allocation",
                "Per value of the pods' allocation label or annotation (`allocation`: a "
                "cost-center, say; its name in the heading), `(none)` for pods without "
                "one. Only when the week's rows have one." + _ROWS_NO_POD_HELD,
                _cost_by(_c("allocation", "text", "The pods' value of the allocation "
                            "dimension."), owned=True)),
    ReportTable("cost_by_node_pool", "Cost by node pool", "Per node pool.",
                _cost_by(_POOL, owned=False)),
    ReportTable("cost_by_gpu_model", "Cost by GPU model", "Per GPU model.",
                _cost_by(_MODEL, owned=False)),
    ReportTable("cost_by_provisioning", "Cost by provisioning", "On-demand and spot.",
                _cost_by(_PROVISIONING, owned=False)),
    ReportTable("daily_cost_by_team", "Daily cost by team",
                "Each day's cost (UTC), every day of the week present.",
                (_c("day", "time", "The day (UTC)."),),
                more_columns="one per team, and `(unallocated)` and `(unavailable)`: that "
                "day's cost (US dollars)"),
    ReportTable("idle_offenders", "Idle GPUs: top offenders",
                "The pods under 50 % utilisation, the most idle GPU-hours first, then the "
                "most idle cost.",
                (_NAMESPACE, _POD, _WORKLOAD, _TEAM, _MODEL,
                 _c("idle_gpu_hours", "hours", "GPU-hours held and unused: GPU-hours x (1 - "
                    "utilisation)."),
                 _c("idle_cost_usd", "usd", "Their cost."),
                 _c("utilization", "ratio", "The pod's mean utilisation over the week."))),
    ReportTable("unallocated_by_pool", "Unallocated capacity by pool",
                "GPU time no pod held, per pool, model and provisioning.",
                (_POOL, _MODEL, _PROVISIONING, _GPU_HOURS, _COST)),
    ReportTable("energy_by_team", "Energy and carbon by team",
                "Per team, the energy of the GPUs its pods held (DCGM's energy counter, "
                "split as cost is) and its CO2e; beside it the cost of a utilised GPU-hour, "
                "its energy twin." + _ROWS_NO_POD_HELD, _energy_by(_TEAM)),
    ReportTable("energy_by_node_pool", "Energy and carbon by pool",
                "Per pool, all of its GPUs' energy: held, idle or unallocated.",
                _energy_by(_POOL)),
    ReportTable("queue", "Queue wait by team and GPU model",
                "The waits that began in the week: of each pod submitted in it, from its "
                "creation (for a pod of a Job Kueue queued, from the Job's submission: the "
                "wait for admission, then for a node) to its scheduling, or, never "
                "scheduled, to its deletion or the week's end (a lower bound); and of each "
                "Job Kueue never admitted. The console and `whatif` count the same waits.",
                (_TEAM, _MODEL,
                 _c("pods", "count", "Waits that began in the week: pods submitted in it, "
                    "and Jobs Kueue had not admitted by its end (one each)."),
                 _c("p50_seconds", "seconds", "Median wait."),
                 _c("p90_seconds", "seconds", "90th percentile of the wait."),
                 _c("p99_seconds", "seconds", "99th percentile of the wait."),
                 _c("pending_gpu_hours", "hours", "GPU-hours requested while pending in the "
                    "week, by pods and by Jobs Kueue had not admitted yet (no pod: all "
                    "their GPUs, from submission or last requeue)."),
                 _c("admission_share", "ratio", "Share of the wait spent waiting for Kueue's "
                    "admission (quota), the rest for scheduling (capacity); blank without "
                    "Kueue."))),
    ReportTable("kueue", "Kueue queues",
                "Per ClusterQueue, of the pods of the Jobs it admitted that were scheduled "
                "in the week: the wait for admission and the whole wait to the first run, "
                "and the GPU time they held. Only on a cluster with Kueue.",
                (_c("cluster_queue", "text", "Kueue ClusterQueue."),
                 _c("workloads", "count", "Jobs (Workloads) whose pods were scheduled in the "
                    "week."),
                 _c("pods", "count", "Their pods."),
                 _c("admission_p50_seconds", "seconds", "Median wait for admission (from "
                    "the Workload's creation, or its last requeue)."),
                 _c("admission_p90_seconds", "seconds", "90th percentile of it."),
                 _c("p50_seconds", "seconds", "Median wait from submission to scheduling."),
                 _c("p90_seconds", "seconds", "90th percentile of it."),
                 _GPU_HOURS,
                 _c("mean_gpus", "count", "GPUs its pods held on average over the week."),
                 _c("nominal_gpus", "count", "Its nominal quota of nvidia.com/gpu, all "
                    "flavors, as last seen in the week (blank: unknown)."),
                 _c("quota_share", "ratio", "mean_gpus / nominal_gpus: over 100 % is borrowed "
                    "from its cohort (blank without a quota)."),
                 _c("awaiting_workloads", "count", "Jobs still waiting for its admission at "
                    "the week's end (they have no pod yet)."),
                 _c("awaiting_gpus", "count", "The GPUs they ask for."))),
    ReportTable("longest_waits", "Longest waits",
                "The longest waits that ended in the week, or go on at its end.",
                (_NAMESPACE,
                 _c("pod", "text", "Pod name; for a Job still awaiting Kueue's admission "
                    "(it has no pod yet), the Job's."),
                 _TEAM, _MODEL,
                 _c("gpus", "count", "GPUs the pod requests (the Job, all its pods)."),
                 _c("wait_seconds", "seconds", "Creation (for a Job Kueue queued, its "
                    "submission or last requeue) to scheduling, or to the week's end."),
                 _c("state", "text", "`scheduled`, `still pending` or `awaiting admission` "
                    "(by Kueue)."))),
    ReportTable("waits", "Why jobs waited",
                "Per cause, team, pool, GPU model and ClusterQueue, of the pods (and the "
                "Jobs Kueue had not admitted, no pod yet) that waited in the week: each "
                "interval's cause is the first that held of starting, preempted, quota, "
                "unschedulable, stockout, fragmented, scaling_up and no_capacity. Empty "
                "for a warehouse that records no causes.",
                (_c("cause", "text", "Why they waited."),
                 _TEAM,
                 _c("node_pool", "text", "The pool they fit (of several, the one with the "
                    "most free GPUs); `(none)` when none does."),
                 _c("gpu_model", "text", "The GPU model they ask for; `(any)` for none."),
                 _c("cluster_queue", "text", "Kueue ClusterQueue, when Kueue queued them "
                    "(blank: none)."),
                 _c("waiting", "count", "Pods, and Jobs with no pod yet, that waited for "
                    "this cause."),
                 _c("gpu_hours", "hours", "GPU-hours waited for this cause in the week (GPUs "
                    "asked x time)."),
                 _c("p90_seconds", "seconds", "90th percentile of the time each waited for "
                    "this cause in the week."),
                 _c("p90_wait_seconds", "seconds", "90th percentile of each one's whole wait, "
                    "every cause, as long as it got by the week's end."))),
    ReportTable("stuck_workloads", "Stuck workloads",
                "The workloads that waited longest in the week, with the cause that cost "
                "them the most time and the words it was decided on, the cause of their "
                "latest interval waiting and, for those still waiting, when they are "
                "expected to start.",
                (_NAMESPACE,
                 _c("workload", "text", "The pods' top-level owner (for a Job Kueue had not "
                    "admitted, the Job), else the pod."),
                 _TEAM,
                 _c("gpu_model", "text", "The GPU model it asks for; `(any)` for none."),
                 _c("node_pool", "text", "The pool it fits, at its latest interval waiting; "
                    "`(none)` when none does."),
                 _c("waiting", "count", "Its pods (and its Job, before it had any) that "
                    "waited in the week."),
                 _c("gpus", "count", "The most GPUs one of them asks for (a Job with no pod "
                    "yet: all its pods')."),
                 _c("gpu_hours", "hours", "GPU-hours they waited in the week."),
                 _c("wait_seconds", "seconds", "Its longest wait, every cause, by the "
                    "week's end."),
                 _c("cause", "text", "The cause it waited for longest in the week."),
                 _c("latest_cause", "text", "The cause of its latest interval waiting."),
                 _c("source", "text", "Who said why: `default-scheduler`, "
                    "`cluster-autoscaler`, `kueue`, `kubelet`; `exporter` for a cause "
                    "decided from the free GPUs alone."),
                 _c("message", "text", "The words the cause was decided on (at its latest "
                    "interval of that cause), as its source wrote them."),
                 _c("last_waited", "time", "The end of its latest interval waiting in the "
                    "week."),
                 _c("expected_start", "time", "For one still waiting at the data's last "
                    "interval, when the queue forecast then expected it to start (the live "
                    "queue played forward); blank when it no longer waits, or no start was "
                    "found within the forecast's horizon."))),
    ReportTable("stranded", "Stranded GPUs by pool",
                "Per pool, the free GPUs of its Ready nodes by what a waiting pod could "
                "make of them, interval by interval: `usable` (a waiting pod fits the node "
                "and asks no more than it has free), `fragment` (one fits, but asks more), "
                "`quota` (only Jobs Kueue holds back fit), `mismatch` (pods wait, none "
                "fits), `no_demand` (nothing waits). All but usable are stranded. Empty for "
                "a warehouse that records no free GPUs.",
                (_POOL, _MODEL, _PROVISIONING,
                 _c("free_gpu_hours", "hours", "Free physical GPU-hours (a MIG slice its "
                    "fraction, a time-shared GPU once)."),
                 *(_c(f"{use}_gpu_hours", "hours", f"Those of use `{use}`.") for use in USES),
                 _c("stranded_cost_usd", "usd", "The cost of the free GPU-hours but the "
                    "usable ones."),
                 _c("removable_cost_usd", "usd", "The cost of the `mismatch` and "
                    "`no_demand` GPU-hours, free while no waiting pod could use them: what "
                    "an autoscaler could have removed."),
                 _c("hours_with_demand", "count", "Hours of the week demand waited for the "
                    "pool in: its free GPUs usable, a fragment or quota-held, or a pod that "
                    "fits it waiting."),
                 _c("fragmentation_ratio", "ratio", "Of the pool's free GPU-hours while a "
                    "pod that fits it waited, the share stranded as fragments (the pod "
                    "asked more than the node had free); none where no such pod "
                    "waited."))),
    ReportTable("availability", "Availability against the SLA",
                "Per pool and GPU model, against `sla.target`.",
                (_POOL, _MODEL,
                 _c("availability", "ratio", "Share of the GPU time that was not unavailable."),
                 _c("target", "ratio", "The SLA target."),
                 _c("down_hours", "hours", "GPU-hours unavailable."),
                 _c("error_budget_left", "ratio", "What is left of the week's error budget "
                    "((1 - target) x GPU time); below 0 when spent."),
                 _c("meets_target", "flag", "Whether availability ≥ target."))),
    ReportTable("incidents", "Incidents",
                "GPU incidents that ended in the week, one row per event, and spot "
                "preemptions.",
                (_c("kind", "text", "`xid`, `node_not_ready`, `gpu_missing` or "
                    "`spot_preemption`."),
                 _c("where", "text", "`pool/node` and the GPU (or the GPU count); a "
                    "preempted pod's `namespace/pod`."),
                 _c("gpus", "count", "GPUs it took down."),
                 _c("start", "time", "When it began."),
                 _c("end", "time", "When it ended."),
                 _c("duration_seconds", "seconds", "How long it lasted."),
                 _c("gpu_hours_lost", "hours", "GPU-hours unavailable through it."))),
    ReportTable("bottleneck_summary", "Bottlenecks", "Per bottleneck class.",
                (_c("bottleneck", "text", "The class."),
                 _c("workloads", "count", "Workloads of that class."),
                 _c("gpu_hours", "hours", "Their GPU-hours."),
                 _ADVICE)),
    ReportTable("bottlenecks", "Bottlenecks by workload",
                "Per workload: the class of most of its GPU-hours.",
                (_NAMESPACE, _WORKLOAD, _TEAM, _MODEL,
                 _c("bottleneck", "text", "The class."),
                 _c("pods", "count", "Its pods in the week."),
                 _GPU_HOURS,
                 _c("evidence", "json", "The figures the class rests on, GPU-hour-weighted."),
                 _ADVICE)),
    ReportTable("rightsizing", "Right-sizing",
                "Workloads a cheaper GPU model holds (memory and compute).",
                (_NAMESPACE, _WORKLOAD, _TEAM, _MODEL,
                 _c("peak_memory_gib", "gib", "Peak GPU memory used."),
                 _c("gpu_memory_gib", "gib", "The model's GPU memory."),
                 _c("utilization", "ratio", "Mean utilisation over the week."),
                 _c("suggested_model", "text", "The cheapest model that fits."),
                 _SAVING)),
    ReportTable("spot", "Spot candidates", "Batch Jobs on on-demand GPUs.",
                (_NAMESPACE, _WORKLOAD, _TEAM, _MODEL, _COST,
                 _c("spot_cost_usd", "usd", "The same GPU-hours at the spot price."),
                 _SAVING)),
    ReportTable("savings", "Savings this week's data points to",
                "The levers, priced with this week's data (upper bounds).",
                (_c("lever", "text", "Spot, autoscaling, sharing or right-sizing."),
                 _c("how", "text", "What the lever does."),
                 _SAVING)),
    ReportTable("reconciliation", "GPU cost against the bill",
                "Per day and namespace, the GPU cost above beside the GPU lines of the Cloud "
                "Billing export (`report.billing_table`, with GKE cost allocation): only in "
                "the platform report of a cluster whose bill is configured.",
                (_c("day", "text", "The day (UTC), YYYY-MM-DD."),
                 _c("project", "text", "The project the bill's lines are in."),
                 _c("namespace", "text", "Kubernetes namespace; `kube:unallocated` for GPU "
                    "time no pod held, as GKE's cost allocation bills it."),
                 _c("gpu_hours", "hours", "GPU-hours the exporter counted."),
                 _c("billed_gpu_hours", "hours", "GPU-hours the bill charged."),
                 _c("cost_usd", "usd", "The exporter's cost."),
                 _c("billed_cost_usd", "usd", "The bill's cost, before credits."),
                 _c("credits_usd", "usd", "The bill's credits (negative: committed use, "
                    "discounts)."),
                 _c("billed_net_usd", "usd", "The bill's cost after credits."),
                 _c("gap_usd", "usd", "The bill (net) less the exporter's cost."),
                 _c("cause", "text", "`reconciled`, or the gap's likely cause."))),
)

BY_NAME = {t.name: t for t in TABLES}

HEADLINE: tuple[Column, ...] = (
    _c("coverage", "ratio", "Share of the week's hours with any GPU time in the warehouse."),
    _c("previous_coverage", "ratio", "The same, of the week before."),
    _c("cost_usd", "usd", "The week's cost."),
    _c("previous_cost_usd", "usd", "The week before's (blank without data)."),
    _c("cost_change", "ratio", "The change as a share of the week before's."),
    _c("gpu_hours", "hours", "GPU-hours of capacity."),
    _c("allocated_gpu_hours", "hours", "GPU-hours pods held."),
    _c("utilization", "ratio", "Utilised share of the allocated GPU time."),
    _c("fleet_cost_usd_per_utilized_hour", "usd",
       "All spend ÷ utilised GPU-hours (idle and unavailable capacity included)."),
    _c("idle_cost_usd", "usd", "Cost allocated and unused: cost x (1 - utilisation)."),
    _c("idle_share", "ratio", "Its share of the week's cost."),
    _c("unallocated_cost_usd", "usd", "Cost of the GPU time no pod held."),
    _c("unallocated_share", "ratio", "Its share of the week's cost."),
    _c("energy_kwh", "kwh", "The week's GPU energy, where measured."),
    _c("previous_energy_kwh", "kwh", "The week before's (blank without data)."),
    _c("energy_change", "ratio", "The change as a share of the week before's."),
    _c("co2e_kg", "kg", "Its location-based CO2e."),
    _c("idle_energy_kwh", "kwh", "Energy of GPUs pods held while idle."),
    _c("unallocated_energy_kwh", "kwh", "Energy of the GPUs no pod held."),
    _c("kwh_per_utilized_gpu_hour", "kwh", "All energy ÷ utilised GPU-hours (idle and "
       "unallocated GPUs' included), beside the fleet cost per utilised GPU-hour."),
    _c("co2e_g_per_utilized_gpu_hour", "grams", "All CO2e ÷ utilised GPU-hours."),
    _c("metered_share", "ratio", "Share of the GPU-hours whose energy is known."),
)
"""The headline's figures, in order."""

PRICE_BASIS: tuple[Column, ...] = (
    _c("basis", "text", "What a GPU's price covers (the book's `basis`): `gpu-component`, the "
       "GPU alone, its machine excluded."),
    _c("region", "text", "The region whose list prices apply (config: `prices.region`)."),
    _c("as_of", "text", "The dates (YYYY-MM-DD) of the list prices the week's GPU-hours used, "
       "oldest first (a list; empty: undated)."),
    _c("estimated", "text", "Those of them that are estimates, not prices Google published "
       "(a list of `model provisioning`)."),
    _c("catalog", "flag", "The exporter refreshes list prices from the Cloud Billing catalogue "
       "(`prices.catalog`): some may be the catalogue's, the warehouse does not say which."),
    _c("discounts", "text", "What the configuration takes off the list prices: `negotiated`, "
       "`committed-use`, `node-pool` (a list; empty: none)."),
    _c("cost_usd", "usd", "The week's cost."),
    _c("list_cost_usd", "usd", "The week's priced GPU-hours at the list prices (those the "
       "book prices)."),
    _c("off_list_usd", "usd", "`list_cost_usd` less what those GPU-hours cost, to the cent: "
       "what discounts took off, or, with none configured, what other list prices made of "
       "them."),
    _c("off_list_share", "ratio", "The same as a share of `list_cost_usd`."),
    _c("machine_usd", "usd", "What the machines the GPUs ran in add at list price, the least "
       "and the most over the machine types of the book ([least, most]; the GPU models where a "
       "machine type fixes the GPU count)."),
    _c("machine_share", "ratio", "Their share of the total (their GPUs' cost plus theirs), "
       "[least, most]."),
    _c("machine_models", "text", "The GPU models `machine_usd` covers (a list)."),
    _c("machine_unknown", "text", "The GPU models the book gives no machine share for (N1's: "
       "their machine types fix no GPU count)."),
    _c("machine_unknown_hour_share", "ratio", "Their share of the week's GPU-hours."),
    _c("spot_hour_share", "ratio", "Spot GPUs' share of the week's GPU-hours."),
    _c("spot_cost_share", "ratio", "Their share of the week's cost."),
    _c("unpriced_gpu_hours", "hours", "GPU-hours no price covered: not in the cost."),
    _c("line", "text", "The line under the headline that says all this."),
)
"""What the week's costs are priced on: ``report.json``'s ``price_basis``
(``figures.headline.PriceBasis`` and the line rendered from it)."""


def columns(name: str) -> list[str]:
    """The column names of the table ``name``, in order."""
    return BY_NAME[name].names
