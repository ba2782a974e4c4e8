"""Parallelization-plan auto-planner for PyTorch training.

    import planner
    p = planner.plan("gpt3-175b", cluster="dgx-a100-80g", nodes=128, global_batch=1536, seq_len=2048)
    p.save("plan.json")
"""

from costmodels.topology import Cluster
from planner.api import Prepared, plan, plan_prepared, prepare
from planner.errors import InfeasibleError, PlannerError, SpecError, TraceError
from planner.explore.sweep import whatif
from planner.inputs.clusters import load_cluster
from planner.options import Config, SearchOptions, TrainingSpec
from planner.planfile.document import Plan, load_plan

__all__ = [
    "Cluster", "Config", "InfeasibleError", "Plan", "PlannerError", "Prepared", "SearchOptions",
    "SpecError", "TraceError", "TrainingSpec", "load_cluster", "load_plan", "plan", "plan_prepared",
    "prepare", "whatif",
]
