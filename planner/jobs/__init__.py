"""Many training jobs on one cluster: the jobs file, per-job tables of plans by GPU count, the
joint schedule against two baselines, and re-planning as jobs finish."""
