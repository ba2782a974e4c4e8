"""FP8 covers the repeated layers' weight GEMMs only: the blocks outside them (embedding, final
norm, output projection) run in bf16, with no casts and no FP8 weight copies, as Megatron-Core
(its output layer is not a Transformer Engine module) and torchtitan (Float8 skips ``output``)
run them."""

import numpy as np

from planner.inputs.clusters import load_cluster
from planner.options import Config, TrainingSpec
from planner.search.costs import ModelArrays, config_costs
from planner.search.pricing import price
from planner.solve.chain import partition


def _costs(prepared, dtype, cfg):
    cluster = load_cluster("dgx-h100", nodes=1)
    training = TrainingSpec(global_batch=8, seq_len=prepared.seq_len, dtype=dtype)
    ma = ModelArrays.from_blocks(prepared.blocks)
    return ma, cluster, training, config_costs(ma, cluster, training, cfg)


def test_blocks_outside_the_layers_run_in_bf16_under_fp8(tiny_llama):
    cfg = Config(dp=8, tp=1, pp=1, micro_batch=1, num_microbatches=1)
    ma, _, _, fp8 = _costs(tiny_llama, "fp8", cfg)
    _, _, _, bf16 = _costs(tiny_llama, "bf16", cfg)
    outer = ~ma.checkpointed
    assert outer.any() and ma.checkpointed.any()
    assert np.array_equal(fp8.fwd_s[outer], bf16.fwd_s[outer])
    assert np.array_equal(fp8.compute_s[outer], bf16.compute_s[outer])
    assert np.array_equal(fp8.act_bytes[outer], bf16.act_bytes[outer])
    assert not np.array_equal(fp8.compute_s[ma.checkpointed], bf16.compute_s[ma.checkpointed])


def test_fp8_weight_copies_are_the_layers_weights_only(tiny_llama):
    cfg = Config(dp=8, tp=1, pp=1, micro_batch=1, num_microbatches=1, zero=0)
    ma, cluster, training, costs = _costs(tiny_llama, "fp8", cfg)
    part = partition(costs.time_s.tolist(), 1, None)
    est = price(cfg, part.bounds, ma, costs, cluster, training)
    layers = float(costs.params_local[ma.checkpointed].sum())
    assert layers < float(costs.params_local.sum())  # the embedding and head hold parameters
    assert est.stages[0].memory["fp8_weights"] == 2.0 * layers
