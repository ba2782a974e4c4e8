"""Expert and context parallelism: one optimizer step on 2 or 4 gloo processes equals the same step
in one process, for a tiny Mixtral (four routed experts, grouped-query attention, rotary
positions) and the tiny Llama, fp32, SGD.

Expert parallelism (ep=2: each rank keeps two of the four experts, tokens go there and back by
all-to-all), alone, over the tensor-parallel ranks (tokens split over tp), over the
context-parallel ranks with full recomputation, with pipelining, and ep=4 folded over dp x cp with
FSDP; context parallelism (cp=2: the ring attention, load-balanced chunks, position ids that follow
them) alone, with tensor parallelism (the Llama: the search gives experts with tp > 1 sequence
parallelism, which `--target torch` does not run), and cp=4 (three ring steps) with ep=4 over it.
All plans of one process count run in one torchrun job (tests/planner/runtime/job.py). Refusals
of what the runtime does not run are checked without starting processes.
"""

import json

import pytest
import torch

from equal_steps import assert_equals_single_process
from job import run_cases
from planner.cli.main import main
from planner.options import parse_fix
from planner.planfile.document import load_plan
from planner.runtime import experts as moe
from planner.runtime import model as mdl

LR = 10.0
"""One step of the tiny Mixtral moves its query/key weights by ~1e-4 per unit of learning rate
(attention starts almost uniform); at 10 every parameter moves by more than 10x the tolerance."""
TOL = 1e-5
NO_SP = "sequence_parallel=false,recompute=none,zero=0"

TWO = {
    "ep2": f"dp=2,tp=1,pp=1,ep=2,micro_batch=2,{NO_SP}",
    "cp2": f"dp=1,tp=1,pp=1,cp=2,micro_batch=2,{NO_SP}",
    # the search puts experts with tp > 1 under sequence parallelism (Megatron-Core requires it);
    # the runtime runs plain tensor parallelism and splits the MoE layer's tokens over tp itself
    "tp2-ep2": "dp=1,tp=2,pp=1,ep=2,micro_batch=2,sequence_parallel=true,recompute=none,zero=0",
    "cp2-ep2-full": "dp=1,tp=1,pp=1,cp=2,ep=2,micro_batch=2,sequence_parallel=false,"
                    "recompute=full,zero=0",
}
FOUR = {
    # (with selective recomputation: torch's pipelining recomputes a layer in its shape
    # inference, which the routing record must leave alone; a new-user check saw it crash)
    "ep2xpp2": "dp=2,tp=1,pp=2,ep=2,micro_batch=2,schedule=1f1b,sequence_parallel=false,"
               "recompute=selective,zero=0",
    "llama-cp2xtp2": f"dp=1,tp=2,pp=1,cp=2,micro_batch=2,{NO_SP}",
    "dp2xcp2-ep4-fsdp": "dp=2,tp=1,pp=1,cp=2,ep=4,micro_batch=2,sequence_parallel=false,"
                        "recompute=none,zero=1",
    "cp4-ep4-fsdp": "dp=1,tp=1,pp=1,cp=4,ep=4,micro_batch=2,sequence_parallel=false,"
                    "recompute=none,zero=1",
}
EXPERT_PARAMS = 4 * (4 * 128 * 32 + 4 * 32 * 64)
"""Elements of the tiny Mixtral's routed experts (four layers of gate_up_proj and down_proj)."""


def _make(make_plan, name: str, fix: str) -> str:
    model = "llama" if name.startswith("llama-") else "mixtral"
    return make_plan(model, fix, f"{model}-{name.removeprefix('llama-')}")


@pytest.fixture(scope="module")
def runs(make_plan, tmp_path_factory):
    """Run every case; -> {name: (plan path, result dict, dump folder)}."""
    jobs = [(nproc, {name: _make(make_plan, name, fix) for name, fix in cases.items()})
            for nproc, cases in ((2, TWO), (4, FOUR))]
    return run_cases(tmp_path_factory.mktemp("moe-cp-runs"), jobs, lr=LR)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(TWO) + list(FOUR))
def test_one_step_equals_single_process(runs, case):
    path, result, dump = runs[case]
    plan = load_plan(path)
    pinned = parse_fix({**TWO, **FOUR}[case])
    cp, ep = pinned.get("cp", 1), pinned.get("ep", 1)
    assert (plan.parallel["cp"], plan.parallel["ep"]) == (cp, ep)
    assert sorted(r["cp"] for r in result["ranks"]) == sorted(
        c for c in range(cp) for _ in range(len(result["ranks"]) // cp))
    ranks = result["ranks"]
    if ep > 1:  # each rank holds 1/ep of its stages' experts: every expert on edp ranks
        edp = len(ranks) // pinned["pp"] // ep
        assert sum(r["expert_params"] for r in ranks) == EXPERT_PARAMS * edp
        assert all(r["expert_params"] > 0 for r in ranks)
    else:
        assert all(r["expert_params"] == 0 for r in ranks)
    if pinned["tp"] > 1 and ep > 1:
        assert any("sequence_parallel not applied" in n for n in result["notes"])
    assert_equals_single_process(plan, result, dump, lr=LR, tol=TOL)


@pytest.mark.slow
def test_expert_parallel_run_reports_the_routing_of_its_step(runs):
    """ep=2 over dp=2: each layer call of the group routes micro-batch c of both dp ranks; the
    run's routing figures equal those of the same tokens routed in one process."""
    path, result, _ = runs["ep2"]
    plan = load_plan(path)
    spec = plan.model_spec()
    real = mdl.build_real(plan, spec, mdl.resolve_meta(plan, spec), seed=0)
    batch, mb = plan.training["global_batch"], plan.parallel["micro_batch"]
    inputs = mdl.synthetic_batch(real, batch, seed=0)
    calls = moe.routed_experts(real.module, *inputs, **real.kwargs)  # per layer: [tokens, k]
    seq = plan.training["seq_len"]
    share = batch // 2  # samples per dp rank
    expert, rank = [], []
    for c in range(share // mb):
        samples = [d * share + c * mb + j for d in range(2) for j in range(mb)]
        rows = torch.cat([torch.arange(s * seq, (s + 1) * seq) for s in samples])
        for idx in calls:
            e, r = moe.load_ratios(idx[rows], num_experts=4, ep=2)
            expert.append(e)
            rank.append(r)
    routing = result["measured"]["routing"]
    assert routing["calls_per_rank"] == len(expert) == 4 * share // mb
    assert routing["busiest_expert"] == pytest.approx(sum(expert) / len(expert), rel=1e-9)
    assert routing["busiest_rank"] == pytest.approx(sum(rank) / len(rank), rel=1e-9)
    assert 1.0 < routing["busiest_rank"] < routing["busiest_expert"]
    assert routing["planned_moe_imbalance"] == 1.0
    assert routing["expert_parallel"]
    # without expert parallelism each rank counts its own calls (its cp half of each sequence)
    alone = runs["cp2"][1]["measured"]["routing"]
    assert alone["busiest_rank"] == 1.0 and not alone["expert_parallel"]
    assert alone["calls_per_rank"] == 4 * 8 // 2  # layers x micro-batches (dp=1)
    assert 1.0 < alone["busiest_expert"] <= 4.0


def _refused(capsys, path, *words):
    capsys.readouterr()
    code = main(["run", path, "--device", "cpu"])
    _, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.startswith("plan: error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], lines[0]


def test_a_dry_run_says_which_moe_settings_the_runtime_does_not_run(capsys, make_plan, tmp_path):
    """deepep (or allgather, a capacity factor, the overlap) was priced but the runtime's experts
    exchange tokens by all-to-all: the dry run says so, with the whole fix."""
    plan = load_plan(make_plan("mixtral", f"dp=2,tp=1,pp=1,ep=2,micro_batch=2,{NO_SP}",
                               "mixtral-ep2-for-deepep"))
    plan.training = {**plan.training, "engine": {**plan.training.get("engine", {}),
                                                 "moe_dispatcher": "deepep"}}
    plan.parallel = {**plan.parallel, "offload_optimizer": True}
    path = str(tmp_path / "mixtral-ep2-deepep.json")
    plan.save(path)
    capsys.readouterr()
    assert main(["run", path, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# note: engine.moe_dispatcher: planner's runtime (plan run) dispatches tokens by " \
        "alltoall, not deepep, so the prediction is not comparable; re-plan with --target " \
        "torch and set moe_dispatcher=alltoall" in out
    # and the rest a run would note afterwards (a new-user check missed them before the run)
    assert "# note: offload_optimizer not applied" in out
    # the tensor-parallel overlap the plan priced, which the runtime does not run
    tp = load_plan(make_plan("llama", "dp=1,tp=2,pp=1,micro_batch=2,sequence_parallel=true"))
    tp.training = {**tp.training, "engine": {**tp.training.get("engine", {}),
                                             "tp_overlap": True}}
    tp.save(str(tmp_path / "tp-overlap.json"))
    assert main(["run", str(tmp_path / "tp-overlap.json"), "--dry-run"]) == 0
    assert "# note: tp_overlap not applied" in capsys.readouterr().out


def test_recomputation_the_runtime_does_not_run_is_refused(capsys, make_plan, tmp_path):
    plan = load_plan(make_plan("mixtral", f"dp=2,tp=1,pp=1,ep=2,micro_batch=2,{NO_SP}",
                               "mixtral-ep2-for-moe-act"))
    plan.parallel = {**plan.parallel, "recompute": "moe_act"}
    path = str(tmp_path / "mixtral-ep2-moe-act.json")
    plan.save(path)
    _refused(capsys, path, "parallel.recompute", "moe_act", "recompute=full")


def test_cp_comm_other_than_the_ring_is_refused(capsys, make_plan):
    path = make_plan("mixtral", f"dp=1,tp=1,pp=1,cp=2,cp_comm=allgather,micro_batch=2,{NO_SP}",
                     "mixtral-cp2-allgather")
    _refused(capsys, path, "parallel.cp_comm", "allgather", "cp_comm=p2p")


def test_expert_tensor_parallelism_is_refused(capsys, make_plan):
    path = make_plan("mixtral", "dp=1,tp=2,pp=1,ep=1,etp=2,micro_batch=2,sequence_parallel=true,"
                     "recompute=none,zero=0", "mixtral-tp2-etp2")
    _refused(capsys, path, "parallel.etp", "etp=1")


def test_expert_parallelism_without_experts_is_refused(capsys, make_plan, tmp_path):
    plan = load_plan(make_plan("llama", "dp=2,tp=1,pp=1,micro_batch=2", "llama-dp2-for-ep"))
    plan.parallel = {**plan.parallel, "ep": 2, "etp": 1}
    path = tmp_path / "llama-ep2.json"
    path.write_text(json.dumps(plan.to_dict()))  # (Plan.save refuses to write it)
    _refused(capsys, str(path), "parallel.ep = 2", "no routed experts")


def test_context_parallelism_on_a_model_without_position_ids_is_refused(capsys, make_plan,
                                                                        tmp_path):
    plan = load_plan(make_plan("branched", "dp=2,tp=1,pp=1,micro_batch=2", "branched-dp2-for-cp"))
    plan.parallel = {**plan.parallel, "dp": 1, "cp": 2, "cp_comm": "p2p",  # the same batch
                     "num_microbatches": 2 * plan.parallel["num_microbatches"]}
    n = plan.parallel["num_microbatches"]  # (one stage's actions: every micro-batch's F and B)
    plan.schedule["actions"] = [[a for i in range(n) for a in (f"0F{i}", f"0B{i}")]]
    path = str(tmp_path / "branched-cp2.json")
    plan.save(path)
    _refused(capsys, path, "parallel.cp", "cp=1")


def test_context_parallelism_over_attention_sinks_is_refused_before_launch():
    """gpt-oss's sinks (a logit per head the softmax normalizes over) are not in the ring
    attention: refused up front, even where its window is as long as the sequence."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from planner.errors import SpecError
    from planner.runtime.context import check_model

    config = AutoConfig.for_model("gpt_oss", num_hidden_layers=2, hidden_size=32,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                  intermediate_size=32, num_local_experts=4,
                                  num_experts_per_tok=2, vocab_size=256, sliding_window=64,
                                  layer_types=["sliding_attention", "full_attention"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(SpecError, match="parallel.cp: the ring attention has no logit "
                                        "soft-capping or attention sinks"):
        check_model(model, seq_len=16, cp=2)


def test_context_parallelism_over_attention_dropout_is_refused_before_launch():
    """A new-user check ran a GPT-2 cp=2 plan: the check before launch read attention_dropout
    only, so GPT-2's attn_pdrop failed in every worker 20 s later; named up front, by its key."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from planner.errors import SpecError
    from planner.runtime.context import check_model
    from tests.conftest import TINY_GPT2

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY_GPT2))
    with pytest.raises(SpecError, match=r"^parallel.cp: the ring attention has no attention "
                                        r"dropout \(this model's attn_pdrop is 0.1\); plan with "
                                        r"--fix cp=1, or a config.json with attn_pdrop: 0$"):
        check_model(model, seq_len=16, cp=2)
    model.config.attn_pdrop = 0.0
    check_model(model, seq_len=16, cp=2)


def test_context_parallelism_over_latent_attention_is_refused_before_launch():
    """DeepSeek-V3's values are narrower than its queries and keys (128 against 192): the ring
    stacks keys with values and the CPU kernel takes one head size; refused by name, not by a
    shape error inside the first step."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from planner.errors import SpecError
    from planner.runtime.context import check_model
    from tests.conftest import TINY_DEEPSEEK_V3

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY_DEEPSEEK_V3))
    with pytest.raises(SpecError, match=r"parallel.cp: the ring attention needs values as wide "
                                        r"as keys \(this model's are 16 and 24 wide"):
        check_model(model, seq_len=16, cp=2)


def test_routing_of_a_rank_holding_every_expert_is_counted_by_hooks():
    """Without expert parallelism the runtime counts each MoE call's routing with a forward
    pre-hook: the figures equal the router's choices seen by routed_experts, and recording
    stops while torch's pipelining infers shapes (recording False)."""
    from transformers import AutoConfig, MixtralForCausalLM

    from conftest import TINY_MIXTRAL

    torch.manual_seed(0)
    model = MixtralForCausalLM(AutoConfig.for_model(**TINY_MIXTRAL)).float()
    tokens = torch.randint(0, TINY_MIXTRAL["vocab_size"], (4, 16),
                           generator=torch.Generator().manual_seed(1))
    calls = moe.routed_experts(model, tokens)
    record = moe.RoutingRecord()
    moe.record_routing(model, record)
    with torch.no_grad():
        model(tokens)
        record.recording = False
        model(tokens)
    summary = moe.routing_summary(record)
    assert summary["calls"] == len(calls) == TINY_MIXTRAL["num_hidden_layers"]
    expected = [moe.load_ratios(idx, TINY_MIXTRAL["num_local_experts"], ep=1)[0]
                for idx in calls]
    assert summary["busiest_expert"] == pytest.approx(sum(expected) / len(expected), rel=1e-12)
    assert summary["busiest_rank"] == 1.0
