"""Find the fastest configuration that fits: the space and its rules, per-block costs, pricing of
a configuration (one device type, or device groups), placement of the mesh on ranks, the one
top-k / time-limit loop, refinement of the best candidates, and the account of an infeasible
search."""
