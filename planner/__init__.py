"""Parallelization-plan auto-planner for PyTorch training.

    import planner
    p = planner.plan("gpt3-175b", cluster="dgx-a100-80g", nodes=128, global_batch=1536, seq_len=2048)
    p.save("plan.json")

The names below load on first use (PEP 562), so that ``import planner.<phase>`` and the ``plan``
command's light subcommands (``show``, ``diff``, ``--help``) do not pay for torch.
"""

import importlib

_PUBLIC = {
    "Cluster": "costmodels.topology", "EngineSpec": "costmodels.engine",
    "Prepared": "planner.traced", "plan": "planner.api",
    "plan_prepared": "planner.api", "prepare": "planner.api", "InfeasibleError": "planner.errors",
    "PlannerError": "planner.errors", "SpecError": "planner.errors", "TraceError": "planner.errors",
    "InternalError": "planner.errors", "whatif": "planner.explore.sweep",
    "load_cluster": "planner.inputs.clusters", "Config": "planner.options",
    "SearchOptions": "planner.options", "TrainingSpec": "planner.options",
    "Plan": "planner.planfile.document", "load_plan": "planner.planfile.document",
}
"""Public name -> the module defining it."""

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'planner' has no attribute '{name}'")
    return getattr(importlib.import_module(_PUBLIC[name]), name)


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
