"""``recompute="moe_act"``: Megatron-Core's ``--recompute-modules moe_act layernorm``. The routed
experts' activation function and the norm before the experts are recomputed in backward; what
they saved is freed, for the memory-bound work of running them again."""

import dataclasses
import json

import pytest

import planner
from costmodels import memory
from costmodels.precision import FP8_SAVED_INPUT_SHARE
from planner.options import parse_fix
from tests.conftest import TINY_MIXTRAL

MIXTRAL = {**TINY_MIXTRAL, "num_hidden_layers": 3}
SEQ = 256


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    path = tmp_path_factory.mktemp("moe-act-mixtral") / "config.json"
    path.write_text(json.dumps(MIXTRAL))
    return planner.prepare(str(path), seq_len=SEQ)


def _moe_layers(prepared):
    return [b.work for b in prepared.blocks.blocks if b.work.num_experts]


def test_the_trace_finds_the_experts_activation_and_the_norm_before_them(mixtral):
    layers = _moe_layers(mixtral)
    assert len(layers) == 3
    w = layers[0]
    copies, ffn, hidden, word = SEQ * 2, MIXTRAL["intermediate_size"], MIXTRAL["hidden_size"], 2
    # SiLU's output (kept for the up projection's multiply) and the product, the down
    # projection's input: one ffn-wide tensor of each per token copy; the gate-and-up GEMM's
    # output, what they are recomputed from, is kept
    assert w.act_moe_act_routed == pytest.approx(2 * copies * ffn * word)
    assert w.act_moe_act_routed_linear_in == pytest.approx(copies * ffn * word)
    assert w.act_moe_act_routed_fused_away == pytest.approx(copies * ffn * word)
    # the post-attention norm's output, which the router's GEMM keeps; its fp32 upcasts, its
    # reciprocal root; not the norm before attention (attention reads it)
    assert w.act_moe_act_norm_linear_in == pytest.approx(SEQ * hidden * word)
    assert w.act_moe_act_norm > w.act_moe_act_norm_linear_in
    assert w.act_moe_act_norm < 2 * SEQ * hidden * 4 + w.act_moe_act_norm_linear_in
    assert 0 < w.moe_act_mem_bytes < w.mem_bytes_rep and w.moe_act_kernels > 0


def test_with_latent_attention_the_norm_before_it_is_recomputed_too(tmp_path, tiny_deepseek_v3):
    """Megatron-Core's MLA layers keep ``input_layernorm`` a norm of its own (Transformer Engine
    fuses it into the next Linear elsewhere), which its ``layernorm`` module recomputes, in the
    dense layers too; MLA's own q/kv norms stay (a review found DeepSeek-V3's MoE layers freed
    184 MiB per sample at 4k tokens where Megatron frees 240)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny_deepseek_v3))
    layers = {b.name: b.work for b in planner.prepare(str(path), seq_len=64,
                                                      cache_dir=None).blocks.blocks}
    dense, moe = layers["model.layers.0"], layers["model.layers.1"]
    tokens, hidden, word = 64, 64, 2
    assert dense.act_moe_act_routed == 0 and dense.act_moe_act_norm_linear_in == pytest.approx(
        tokens * hidden * word)  # the input norm's output, which the down projections keep
    # the MoE layer: that one and the norm before the experts (router, shared expert)
    assert moe.act_moe_act_norm_linear_in == pytest.approx(2 * tokens * hidden * word)
    assert moe.act_moe_act_routed_linear_in == pytest.approx(tokens * 2 * 32 * word)


def test_a_dense_model_has_nothing_for_it_and_a_pin_is_refused(tiny_llama):
    for b in tiny_llama.blocks.blocks:
        assert b.work.act_moe_act_routed == b.work.act_moe_act_norm == 0
        assert b.work.moe_act_mem_bytes == 0
    training = planner.TrainingSpec(global_batch=8, seq_len=tiny_llama.seq_len)
    cluster = planner.load_cluster("dgx-h100", nodes=1)
    with pytest.raises(planner.SpecError, match=r"^fix.recompute: moe_act recomputes .* pin none"):
        planner.plan_prepared(tiny_llama, cluster, training,
                              planner.SearchOptions(fix=parse_fix("recompute=moe_act")))
    free = planner.plan_prepared(tiny_llama, cluster, training, planner.SearchOptions(top_k=0))
    assert free.parallel["recompute"] != "moe_act"
    # not a choice the search had to rule out, nor an overlap it did not run (a new-user check
    # saw both in a dense model's report)
    from planner.search.space import MOE_ACT_NONE
    assert MOE_ACT_NONE not in free.search["rejected"]
    # nor on a cluster of device groups, whose search takes no pin_problem check first
    groups = planner.load_cluster("examples/hetero_a100_v100.yaml")
    with pytest.raises(planner.SpecError, match=r"^fix.recompute: moe_act recomputes .* pin none"):
        planner.plan_prepared(tiny_llama, groups, planner.TrainingSpec(
            global_batch=8, seq_len=tiny_llama.seq_len, dtype="fp16"),
            planner.SearchOptions(fix=parse_fix("recompute=moe_act")))
    with pytest.raises(planner.SpecError, match=r"^recompute: moe_act is the only policy to try"):
        planner.plan_prepared(tiny_llama, cluster, training,
                              planner.SearchOptions(recompute=("moe_act",)))


@pytest.mark.parametrize("fused,fp8,load", [(False, False, 1.0), (True, False, 1.0),
                                            (False, True, 1.0), (True, True, 1.7)])
def test_it_frees_what_it_recomputes_and_nothing_else(mixtral, fused, fp8, load):
    w = _moe_layers(mixtral)[0]
    kw = dict(micro_batch=2, tp=2, sp=True, fused=fused, fp8=fp8, routed_load=load)
    none = memory.activation_bytes(w, recompute="none", **kw)
    act = memory.activation_bytes(w, recompute="moe_act", **kw)

    def part(total, away, linear_in):
        return total - (away if fused else 0) - (FP8_SAVED_INPUT_SHARE * linear_in if fp8 else 0)
    freed = (load * part(w.act_moe_act_routed, w.act_moe_act_routed_fused_away,
                         w.act_moe_act_routed_linear_in)
             + part(w.act_moe_act_norm, w.act_moe_act_norm_fused_away,
                    w.act_moe_act_norm_linear_in))
    assert none - act == pytest.approx(2 * freed / 2)  # two samples, sequence-parallel over two
    assert memory.activation_bytes(w, recompute="full", **kw) < act < none
    # while a layer's backward runs, its freed tensors exist again
    assert memory.recompute_working_bytes(w, recompute="moe_act", **kw) == pytest.approx(none - act)


def _plan(prepared, fix, *, memory_gb=None, engine=None, target="any"):
    cluster = planner.load_cluster("dgx-h100", nodes=1)
    if memory_gb is not None:
        cluster = dataclasses.replace(cluster, device=dataclasses.replace(
            cluster.device, memory_bytes=memory_gb * 1e9))
    training = planner.TrainingSpec(global_batch=64, seq_len=prepared.seq_len,
                                    **({"engine": engine} if engine else {}))
    return planner.plan_prepared(prepared, cluster, training, planner.SearchOptions(
        fix=parse_fix(fix), top_k=0, target=target))


def test_it_costs_memory_bound_time_and_the_search_takes_it_where_memory_is_short():
    """Mixtral 8x7B on 8 H100 at 4k tokens: moe_act frees gigabytes of a stage's activations for
    about a percent of its time, far less than full recomputation costs."""
    prepared = planner.prepare("mixtral-8x7b", seq_len=4096)
    pins = "tp=1,pp=1,dp=8,ep=8,micro_batch=2,zero=3"
    steps, peaks = {}, {}
    for rc in ("none", "moe_act", "full"):
        p = _plan(prepared, f"{pins},recompute={rc}", memory_gb=1000)
        steps[rc], peaks[rc] = p.predicted["step_time_s"], p.predicted["peak_memory_bytes"]
    assert peaks["full"] < peaks["moe_act"] < peaks["none"] - 5e9
    assert steps["none"] < steps["moe_act"] < 1.05 * steps["none"]
    assert steps["moe_act"] < steps["full"] - 0.1 * steps["none"]
    # with room for moe_act but not for none, the search runs it rather than full
    options = planner.SearchOptions()
    usable = (peaks["moe_act"] + peaks["none"]) / 2
    device = (usable + options.memory_reserve_bytes) / (1 - options.memory_reserve_fraction)
    chosen = _plan(prepared, pins, memory_gb=device / 1e9)
    assert chosen.parallel["recompute"] == "moe_act"
    # it recomputes no FLOPs, and the report says why its TFLOP/s count equals the model's
    from planner.report.summary import summary
    assert chosen.predicted["hardware_flops_per_step"] == chosen.predicted["model_flops_per_step"]
    assert "(the same: moe_act recomputes memory-bound ops only)" in summary(chosen)
    # torchtitan does not run it: pricing the plan as torchtitan runs it takes its nearest (per-op
    # recomputation), and a re-plan where that does not fit leaves it to the search
    from planner.export.replan import resolve_hint
    pinned = _plan(prepared, f"{pins},recompute=moe_act", memory_gb=1000)
    assert "recompute=op" in resolve_hint(pinned, "torchtitan")
    hint = resolve_hint(pinned, "torchtitan", nearest=False)
    assert "--target torchtitan" in hint and "recompute" not in hint


def test_megatron_refuses_it_without_grouped_gemms_and_torchs_runtime_never_runs_it(mixtral):
    from costmodels.engine import engine_from_mapping
    from planner.runtime.build import check_knobs

    ungrouped = engine_from_mapping("megatron-core,moe_grouped_gemm=false")
    with pytest.raises(planner.SpecError, match=r"^fix.recompute: megatron does not run moe_act "
                                                r"recomputation with ungrouped expert GEMMs"):
        _plan(mixtral, "recompute=moe_act", engine=ungrouped, target="megatron")
    p = _plan(mixtral, "ep=2", engine=ungrouped, target="megatron")
    assert p.parallel["recompute"] != "moe_act"
    pinned = _plan(mixtral, "ep=2,recompute=moe_act")
    with pytest.raises(planner.SpecError, match=r"^parallel.recompute: the runtime does not run "
                                                r"moe_act recomputation"):
        check_knobs(pinned)
