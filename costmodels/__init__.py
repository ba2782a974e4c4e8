"""Cost models: numbers in, seconds and bytes out. Imports neither torch nor the planner."""

from costmodels.comm import GroupShape, allgather_s, allreduce_s, p2p_s, reduce_scatter_s
from costmodels.compute import BlockTime, block_time, optimizer_step_s
from costmodels.errors import InfeasibleError, PlannerError, SpecError
from costmodels.hardware import DEVICES, DeviceSpec, get_device
from costmodels.memory import activation_bytes, model_state_bytes
from costmodels.topology import CLUSTERS, Cluster, LinkSpec, get_cluster
from costmodels.workload import BlockWork

__all__ = [
    "BlockTime", "BlockWork", "CLUSTERS", "Cluster", "DEVICES", "DeviceSpec", "GroupShape",
    "InfeasibleError", "LinkSpec", "PlannerError", "SpecError", "activation_bytes", "allgather_s",
    "allreduce_s", "block_time", "get_cluster", "get_device", "model_state_bytes",
    "optimizer_step_s", "p2p_s", "reduce_scatter_s",
]
