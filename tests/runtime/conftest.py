"""Plans for the runtime tests, made by the planner itself on the `cpu` preset (fp32, SGD).

Each model is traced once per session; every plan pins its knobs with ``fix``.
"""

import os

import pytest

import planner
from planner.options import parse_fix
from runtime_models import SPEC as BRANCHED_SPEC

GLOBAL_BATCH = 8
SEQ_LEN = 16


class PlanMaker:
    """make(model, fix, name) -> path of a saved plan; models: "llama" (tiny Llama from a Hugging
    Face config) and "branched" (examples/branched.py's TwoTower, small)."""

    def __init__(self, folder, specs: dict):
        self.folder = folder
        self.specs = specs
        self.prepared = {}

    def __call__(self, model: str, fix: str, name: str | None = None, *, nodes: int = 1,
                 global_batch: int = GLOBAL_BATCH) -> str:
        if model not in self.prepared:
            self.prepared[model] = planner.prepare(self.specs[model], seq_len=SEQ_LEN,
                                                   dtype="fp32")
        pinned = parse_fix(fix)
        gpus = pinned["dp"] * pinned["tp"] * pinned["pp"] // nodes
        cluster = planner.load_cluster("cpu", nodes=nodes, gpus_per_node=gpus)
        training = planner.TrainingSpec(global_batch=global_batch, seq_len=SEQ_LEN, dtype="fp32",
                                        optimizer="sgd")
        plan = planner.plan_prepared(self.prepared[model], cluster, training,
                                     planner.SearchOptions(fix=pinned, top_k=0))
        path = os.path.join(self.folder, f"{name or model + '-' + fix.replace(',', '-')}.json")
        plan.save(path)
        return path


@pytest.fixture(scope="session")
def make_plan(tmp_path_factory, tiny_llama_config):
    return PlanMaker(str(tmp_path_factory.mktemp("runtime-plans")),
                     {"llama": tiny_llama_config, "branched": BRANCHED_SPEC})
