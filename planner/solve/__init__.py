"""Pure solvers, plain numbers in and out: the chain split (exact), CP-SAT models for stage
assignment on a DAG and on device groups, and the joint schedule of many jobs; one CP-SAT runner."""
