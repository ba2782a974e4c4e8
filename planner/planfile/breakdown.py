"""The parts a predicted step time is made of (``predicted.breakdown`` in a plan), in words."""

BREAKDOWN_WORDS = {
    "compute_s": "compute", "bubble_s": "pipeline bubble", "tp_comm_s": "tensor-parallel all-reduce",
    "pp_comm_s": "pipeline send/recv", "cp_comm_s": "context-parallel exchange",
    "ep_comm_s": "expert dispatch/combine", "dp_comm_s": "data-parallel gradient sync",
    "optimizer_s": "optimizer step", "straggler_s": "waiting for the slowest process",
    "embedding_lookup_s": "embedding lookups", "embedding_comm_s": "embedding all-to-all",
    "host_wait_s": "waiting for the host",
    "sites_dp_s": "gradient all-reduce across sites",
}
"""Breakdown key -> what a person reads; the keys' order is the order plans list them."""
