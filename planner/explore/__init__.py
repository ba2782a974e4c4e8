"""Offline what-if exploration: sweeps of one model over grids of clusters, batches and pinned
knobs (traced once), their cost in dollars, and why-not answers for a plan's variants."""
