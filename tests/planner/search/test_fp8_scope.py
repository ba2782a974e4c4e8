"""FP8 covers the repeated layers' weight GEMMs only: the blocks outside them (embedding, final
norm, output projection) run in bf16, with no casts and no FP8 weight copies, as Megatron-Core
(its output layer is not a Transformer Engine module) and torchtitan (Float8 skips ``output``)
run them."""

import dataclasses

import numpy as np
import pytest

from planner.inputs.clusters import load_cluster
from planner.options import Config, TrainingSpec
from planner.search.costs import ModelArrays, config_costs, stage_memory
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


@pytest.mark.parametrize("pp", [1, 2])
def test_the_stage_split_counts_the_memory_the_pricing_reports(tiny_gpt2, pp):
    """Under fp8 the split's per-stage memory (stage_memory) is the priced one, so a
    configuration whose priced peak fits is not refused by the split (tiny GPT-2 ties its
    embedding and output head: both outside the layers)."""
    cfg = Config(dp=8 // pp, tp=1, pp=pp, micro_batch=1, num_microbatches=4, zero=1)
    ma, cluster, training, costs = _costs(tiny_gpt2, "fp8", cfg)
    assert ma.shared and not any(ma.checkpointed[i] or ma.checkpointed[j]
                                 for i, j, *_ in ma.shared)
    mem = stage_memory(cfg, costs, ma, training, float("inf"))
    part = partition(costs.time_s.tolist(), pp, mem)
    est = price(cfg, part.bounds, ma, costs, cluster, training)
    for r in range(pp):
        rank = [st for st in est.stages if st.rank == r][0]
        assert mem.of(r, part.bounds[r], part.bounds[r + 1]) == pytest.approx(
            rank.memory["total"], rel=1e-12)
    # just above the priced peak, the search prices it rather than calling it out of memory
    tight = dataclasses.replace(mem, capacity=1.0001 * est.peak_memory_bytes)
    assert partition(costs.time_s.tolist(), pp, tight) is not None


def test_a_weight_tied_between_layers_keeps_one_fp8_copy(tiny_llama):
    """Ties between two layers (weights shared across layers) are held once with their FP8
    copy; only ties that involve a block outside the layers lose it."""
    cfg = Config(dp=8, tp=1, pp=1, micro_batch=1, num_microbatches=1, zero=0)
    ma, cluster, training, costs = _costs(tiny_llama, "fp8", cfg)
    layers = np.flatnonzero(ma.checkpointed)
    n = 1000.0
    tied = dataclasses.replace(ma, shared=[(int(layers[0]), int(layers[1]), n, False, False)])
    part = partition(costs.time_s.tolist(), 1, None)
    base = price(cfg, part.bounds, ma, costs, cluster, training).stages[0].memory
    after = price(cfg, part.bounds, tied, costs, cluster, training).stages[0].memory
    assert base["fp8_weights"] - after["fp8_weights"] == pytest.approx(2.0 * n)
    assert base["weights"] - after["weights"] == pytest.approx(2.0 * n)
