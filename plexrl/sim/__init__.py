"""Virtual-clock driver of the core: workload models, trace replay, fake cluster, metrics."""
