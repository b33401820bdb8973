"""The exporter's state between cycles, in parts that each own one thing; the service
(``exporter.service.Exporter``) is the loop that runs them in order.

- ``scrapes``: the reading source's targets, each one's health and what its last answer
  covered.
- ``inventory``: the devices admitted, remembered and retired.
- ``incidents``: GPUs unavailable now, XID events and spot preemptions.
- ``queues``: Kueue's Workloads by the object they were made for, admission, queue waits.
- ``owners``: the owner, team and allocation of a pod, owners remembered for pods gone from
  the view, GPUs of unknown owners.
- ``bottlenecks``: each allocated pod's window of samples and its diagnosis.
- ``pricing``: the list prices in use and where each comes from (the book, or the price
  catalogue's latest read, taken by the next cycle), commitments.
- ``recording``: the warehouse (opened late, written in its own thread) and BigQuery.
- ``readiness``: why ``/readyz`` answers 503.
- ``cycles``: what the cycles have done: how many ran, the last one's time, duration, CPU
  by stage and device states.
- ``publishing``: the view each cycle publishes, holding copies of what it shows, and the
  sinks it is handed to.
"""
