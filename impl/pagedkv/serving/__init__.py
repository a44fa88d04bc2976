"""Serving on top of the block layer: the scheduler, the simulator (scheduler +
manager + KV engine + toy model), workloads, run reports and the command line."""
