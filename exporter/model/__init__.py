"""The model: the records the sources parse into and the definitions computed from
them, pure functions with no I/O and no clock (the GPU catalogue, prices, placement,
compute, bottleneck rules, snapshots and running totals)."""
