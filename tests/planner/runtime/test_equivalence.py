"""One optimizer step of a plan on 2 or 4 gloo processes equals the same step in one process.

For a tiny Llama (Hugging Face config) and examples/branched.py's DAG, fp32, SGD: pipeline (GPipe,
1F1B, interleaved 1F1B, ZB-H1), tensor, data (replicate and FSDP2) parallelism and their
combinations, with and without recomputation; a tiny GPT-2, whose tied embeddings sit on the
first and the last stage; a small examples/multitower.py (a wide DAG) in four stages; and
examples/finetune.py's tiny, whose frozen weights must not move. All plans of one process count
run in one torchrun job (tests/planner/runtime/job.py), so processes start twice in all.
"""


import pytest

from equal_steps import assert_equals_single_process
from job import run_cases

from planner.schedule import as_text
from planner.schedule.builders import build
from planner.planfile.document import load_plan

LR = 1.0
"""Large enough that every parameter moves by more than 10x the tolerance in one step."""
TOL = 1e-5

TWO = {
    "pp2-gpipe": "pp=2,tp=1,dp=1,schedule=gpipe,micro_batch=2,recompute=none,zero=0",
    "pp2-1f1b-full": "pp=2,tp=1,dp=1,schedule=1f1b,micro_batch=2,recompute=full,zero=0",
    "pp2-1f1b-every2": "pp=2,tp=1,dp=1,schedule=1f1b,micro_batch=2,recompute=full/2,zero=0",
    "tp2-selective": "pp=1,tp=2,dp=1,schedule=1f1b,micro_batch=2,recompute=selective,zero=0",
    "dp2-replicate": "pp=1,tp=1,dp=2,schedule=gpipe,micro_batch=2,recompute=none,zero=0",
    "dp2-fsdp": "pp=1,tp=1,dp=2,schedule=gpipe,micro_batch=2,recompute=none,zero=1",
    "pp2-interleaved": "pp=2,tp=1,dp=1,schedule=interleaved-1f1b,vpp=2,micro_batch=2,"
                       "recompute=none,zero=0",
    "pp2-zb-h1": "pp=2,tp=1,dp=1,schedule=1f1b,micro_batch=2,recompute=none,zero=0",
    # the first stage on the second rank, as a plan for node groups may put it (Layout.pp_order)
    "pp2-1f1b-swapped": "pp=2,tp=1,dp=1,schedule=1f1b,micro_batch=2,recompute=none,zero=0",
    # checkpointed blocks: torch's split weight pass cannot replay them, so W runs inside B
    "pp2-zb-h1-selective": "pp=2,tp=1,dp=1,schedule=1f1b,micro_batch=2,recompute=selective,"
                           "zero=0",
}
FOUR = {
    "pp2xdp2-gpipe-fsdp": "pp=2,tp=1,dp=2,schedule=gpipe,micro_batch=1,recompute=none,zero=1",
    "pp2xdp2-1f1b-replicate": "pp=2,tp=1,dp=2,schedule=1f1b,micro_batch=1,recompute=none,zero=0",
    "pp2xtp2-gpipe": "pp=2,tp=2,dp=1,schedule=gpipe,micro_batch=2,recompute=none,zero=0",
    "pp2xtp2-1f1b-full": "pp=2,tp=2,dp=1,schedule=1f1b,micro_batch=2,recompute=full,zero=0",
    # data parallel across two sites: FSDP2 as HSDP, sharded inside a site, replicated across
    "dp4-sites-hsdp": "pp=1,tp=1,dp=4,schedule=gpipe,micro_batch=1,recompute=none,zero=1",
}
MODELS = ("llama", "branched")
MORE = {"gpt2": ("pp2-1f1b-full", "pp2xdp2-gpipe-fsdp", "dp2-fsdp"),
        "multitower": ("pp2-interleaved",),
        "finetune": ("pp2-1f1b-full", "pp2xdp2-gpipe-fsdp", "tp2-selective"),
        "vit": ("pp2-1f1b-full", "pp2xdp2-gpipe-fsdp", "tp2-selective"),
        "t5": ("pp2-zb-h1", "pp2xdp2-gpipe-fsdp", "tp2-selective", "pp2-interleaved"),
        "whisper": ("pp2-1f1b-full", "tp2-selective"),
        "masked": ("pp2-gpipe",), "sinks": ("tp2-selective",)}
"""GPT-2's tied wte / lm_head land on the first and last stage (their gradients are summed), or
on one stage sharded by FSDP (one group must own the shared weight);
multitower's five towers all read the embedding, which four stages pass along; finetune's
frozen weights (the first stage's embedding runs no backward) stay as they were, under FSDP2
too, and its adapters split with the projections they sit beside under tensor parallelism; a
Hugging Face ViT reads synthetic pixel values, and its glue reads a weight of another stage; a
T5's decoder ids go down the pipeline to the stage that embeds them, which runs W inside B;
Whisper's and T5's cross-attention read their head count, which tensor parallelism divides
(T5's self-attention, whose relative position bias joins every head's scores, stays whole), and
cut inside T5's stacks its strided position bias goes down the pipeline; a boolean mask reaches
the last stage as booleans; per-head sinks are cut before the head count is divided."""
CASES = [(m, c) for m in MODELS for c in list(TWO) + list(FOUR)] + [
    (m, c) for m, cs in MORE.items() for c in cs]


def _make(make_plan, model: str, case: str) -> str:
    fix = {**TWO, **FOUR}[case]
    path = make_plan(model, fix, f"{model}-{case}", sites=2 if "-sites" in case else 1)
    if case.startswith("pp2-zb-h1"):  # zb-h1 on a pinned split: swap the schedule in
        plan = load_plan(path)
        par = plan.parallel
        plan.schedule = {**plan.schedule, "name": "zb-h1",
                         "actions": as_text(build("zb-h1", par["pp"], par["num_microbatches"]))}
        plan.parallel = {**par, "schedule": "zb-h1"}
        plan.save(path)
    if case.endswith("-swapped"):
        plan = load_plan(path)
        plan.stages[0]["ranks"], plan.stages[1]["ranks"] = (plan.stages[1]["ranks"],
                                                            plan.stages[0]["ranks"])
        plan.save(path)
    return path


@pytest.fixture(scope="module")
def runs(make_plan, tmp_path_factory):
    """Run every case; -> {name: (plan path, result dict, dump folder)}."""
    jobs = [(nproc, {f"{m}-{c}": _make(make_plan, m, c) for m, c in CASES if c in cases})
            for nproc, cases in ((2, TWO), (4, FOUR))]
    return run_cases(tmp_path_factory.mktemp("runtime-runs"), jobs, lr=LR)


@pytest.mark.slow
@pytest.mark.parametrize("model,case", CASES)
def test_one_step_equals_single_process(runs, model, case):
    path, result, dump = runs[f"{model}-{case}"]
    plan = load_plan(path)
    assert_equals_single_process(plan, result, dump, lr=LR, tol=TOL)
    if "-sites" in case:  # one site's replicas sharded, replicated across the two sites
        assert plan.parallel["dp_replicate"] == 2
        assert result["data_parallel"] == "fully_shard (ZeRO-2, HSDP: 2 shards x 2 replicas)"
