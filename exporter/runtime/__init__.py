"""The running service: the loop, what wires it, and the parts of its state.

The wiring and the loop:

- ``app``: ``run``'s wiring: the sources and sinks built from the configuration, the HTTP
  endpoints (``/metrics``, ``/healthz``, ``/readyz``), the service loop, the shutdown.
- ``service``: ``Exporter``, one cycle: sources -> snapshot -> compute -> sinks, over the
  parts below, in order.
- ``scheduled_report``: the weekly report on ``report.schedule``, made by the running
  exporter in a child process.
- ``preflight``: start-up checks of the host (``--check-config``).
- ``lifecycle``: Unix signals, handled from the first instruction.
- ``memory``: glibc's allocator, tuned so that what a cycle frees goes back to the system.
- ``egress``: where a configuration connects (what its NetworkPolicy must let out).

The exporter's state between cycles, each part owning one thing:

- ``scrapes``: the reading source's targets, each one's health and what its last answer
  covered.
- ``inventory``: the devices admitted, remembered and retired.
- ``incidents``: GPUs unavailable now, XID events and spot preemptions.
- ``queues``: Kueue's Workloads by the object they were made for, admission, queue waits.
- ``owners``: the owner, team and allocation of a pod, owners remembered for pods gone from
  the view, GPUs of unknown owners.
- ``bottlenecks``: each allocated pod's window of samples and its diagnosis.
- ``price_state``: the list prices in use and where each comes from (the book, or the price
  catalogue's latest read, taken by the next cycle), commitments.
- ``recording``: the warehouse (opened late, written in its own thread) and BigQuery.
- ``readiness``: why ``/readyz`` answers 503.
- ``cycles``: what the cycles have done: how many ran, the last one's time, duration, CPU
  by stage and device states.
- ``publishing``: the view each cycle publishes, holding copies of what it shows, and the
  sinks it is handed to.
"""
