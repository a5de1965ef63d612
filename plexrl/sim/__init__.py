"""Virtual-clock driver of the core: workload models, deployment modes, a fake cluster,
accounting, reports and sweeps (``plexrl sim``)."""
