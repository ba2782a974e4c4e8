"""Costs of the runtime's engine that `plan profile` measures: DTensor's host work, FSDP2's buffer
copies, and backends whose reduce-scatter / all-gather run slower than the ring model."""

import dataclasses
import json

import pytest

import planner
from costmodels import comm
from costmodels.compute import block_time, copy_s, optimizer_step_s
from costmodels.engine import EngineSpec, describe, engine_from_mapping
from costmodels.errors import SpecError
from costmodels.workload import SPLIT_K, SPLIT_N, BlockWork, Gemm
from planner import load_cluster
from planner.inputs.calibration import apply_calibration

CALIB = {
    "schema": "planner.calibration/v1", "device_kind": "cpu", "device_name": "test", "threads": 1,
    "device": {"peak_TFLOPs": {"fp32": 0.1}, "hbm_GBps": 10.0, "kernel_overhead_us": 5.0,
               "attention_efficiency": {"fp32": 0.5},
               "gemm_table": {"fp32": [[1e6, 2e10], [1e9, 1e11]]},
               "dtensor": {"linear_fwd_us": 200.0, "linear_bwd_us": 500.0, "param_step_us": 300.0}},
    "intra_node": {"bandwidth_GBps": 0.5, "latency_us": 300.0, "processes": 2, "backend": "gloo",
                   "reduce_scatter_factor": 2.0, "all_gather_factor": 1.5},
}


def test_calibration_carries_dtensor_costs_and_collective_factors():
    c = apply_calibration(load_cluster("cpu"), CALIB)
    assert c.device.dtensor_linear_fwd_s == pytest.approx(2e-4)
    assert c.device.dtensor_linear_bwd_s == pytest.approx(5e-4)
    assert c.device.dtensor_param_s == pytest.approx(3e-4)
    assert c.intra_node.reduce_scatter_factor == 2.0 and c.intra_node.allgather_factor == 1.5
    old = json.loads(json.dumps(CALIB))  # calibrations from before these fields still load
    del old["device"]["dtensor"], old["intra_node"]["reduce_scatter_factor"]
    c0 = apply_calibration(load_cluster("cpu"), old)
    assert c0.device.dtensor_param_s == 0.0 and c0.intra_node.reduce_scatter_factor == 1.0


def test_collective_factors_scale_the_separate_calls_only():
    cal = apply_calibration(load_cluster("cpu", nodes=1, gpus_per_node=2), CALIB)
    plain = dataclasses.replace(cal, intra_node=dataclasses.replace(
        cal.intra_node, reduce_scatter_factor=1.0, allgather_factor=1.0))
    g = comm.GroupShape(size=2, per_node=2)
    nbytes = 1e8
    assert comm.reduce_scatter_s(nbytes, g, cal) == pytest.approx(
        2.0 * comm.reduce_scatter_s(nbytes, g, plain))
    assert comm.allgather_s(nbytes, g, cal) == pytest.approx(1.5 * comm.allgather_s(nbytes, g, plain))
    # an all-reduce's internal halves are not the backend's reduce-scatter call
    assert comm.allreduce_s(nbytes, g, cal) == pytest.approx(comm.allreduce_s(nbytes, g, plain))
    two_nodes = dataclasses.replace(cal, nodes=2)
    two_plain = dataclasses.replace(plain, nodes=2)
    g2 = comm.GroupShape(size=4, per_node=2)
    assert comm.allreduce_s(nbytes, g2, two_nodes) == pytest.approx(
        comm.allreduce_s(nbytes, g2, two_plain))


def _work() -> BlockWork:
    return BlockWork(gemms=(Gemm(batch=1, m=128, n=512, k=128, split=SPLIT_N, linear=True),
                            Gemm(batch=1, m=128, n=128, k=512, split=SPLIT_K, linear=True)),
                     tp_linears=2, param_tensors_tp=4, param_tensors_rep=2,
                     params_tp=2 * 128 * 512, params_rep=256)


def test_dtensor_host_cost_per_sharded_linear_only_with_tensor_parallelism():
    dev = apply_calibration(load_cluster("cpu"), CALIB).device
    kw = dict(dtype="fp32", micro_batch=1, sp=False, recompute="none")
    bare = dataclasses.replace(dev, dtensor_linear_fwd_s=0.0, dtensor_linear_bwd_s=0.0)
    with_tp = block_time(_work(), dev, tp=2, **kw)
    without = block_time(_work(), bare, tp=2, **kw)
    assert with_tp.fwd_s - without.fwd_s == pytest.approx(2 * 2e-4)
    assert with_tp.bwd_s - without.bwd_s == pytest.approx(2 * 5e-4)
    assert block_time(_work(), dev, tp=1, **kw) == block_time(_work(), bare, tp=1, **kw)
    full = block_time(_work(), dev, tp=2, **{**kw, "recompute": "full"})
    assert full.recompute_s == pytest.approx(with_tp.fwd_s)  # the replayed forward pays it again


def test_optimizer_pays_per_dtensor_parameter():
    dev = apply_calibration(load_cluster("cpu"), CALIB).device
    base = optimizer_step_s(1e6, dev, traffic_bytes_per_param=32)
    assert optimizer_step_s(1e6, dev, traffic_bytes_per_param=32, dtensor_params=10) == \
        pytest.approx(base + 10 * 3e-4)


def test_copy_reads_and_writes_at_the_memory_rate():
    dev = apply_calibration(load_cluster("cpu"), CALIB).device  # 10 GB/s, no table
    assert copy_s(1e9, dev) == pytest.approx(2e9 / 1e10)
    assert copy_s(0, dev) == 0.0


def test_engine_flag_parses_and_rejects_bad_values():
    assert engine_from_mapping("fsdp_copies=true").fsdp_copies is True
    assert EngineSpec().fsdp_copies is False
    with pytest.raises(SpecError, match="engine.fsdp_copies"):
        engine_from_mapping("fsdp_copies=maybe")


def _plan(fp32_llama, fix: str, engine: EngineSpec, calib=CALIB, *, hiding_free=False):
    """The plan on the calibrated CPU (which hides nothing behind compute, or, ``hiding_free``,
    everything, for free: where an engine hides what)."""
    from planner.options import parse_fix

    cluster = apply_calibration(load_cluster("cpu", nodes=1, gpus_per_node=2), calib)
    if hiding_free:
        cluster = _hiding_free(cluster)
    training = planner.TrainingSpec(global_batch=4, seq_len=32, dtype="fp32", optimizer="adamw",
                                    engine=engine)
    return planner.plan_prepared(fp32_llama, cluster, training,
                                 planner.SearchOptions(fix=parse_fix(fix), top_k=0))


def test_fsdp_copies_and_dtensor_parameters_show_in_the_plan(fp32_llama):
    fix = "dp=2,tp=1,pp=1,micro_batch=2,recompute=none,zero=0,offload_optimizer=false"
    eager = EngineSpec(overlap_grad_reduce=False)
    copies = EngineSpec(overlap_grad_reduce=False, fsdp_copies=True)
    a = _plan(fp32_llama, fix, eager).predicted["breakdown"]
    b = _plan(fp32_llama, fix, copies).predicted["breakdown"]
    params = fp32_llama.info["num_params"]
    dev = apply_calibration(load_cluster("cpu"), CALIB).device
    assert b["dp_comm_s"] - a["dp_comm_s"] == pytest.approx(3 * copy_s(4 * params, dev), rel=1e-3)
    # under data parallelism every parameter tensor is a DTensor (FSDP2 / replicate)
    no_host = json.loads(json.dumps(CALIB))
    del no_host["device"]["dtensor"]
    c = _plan(fp32_llama, fix, eager, no_host).predicted["breakdown"]
    tensors = sum(1 for _ in fp32_llama.opgraph.params)
    assert a["optimizer_s"] - c["optimizer_s"] == pytest.approx(tensors * 3e-4, rel=1e-3)


def test_zero1_prices_reduce_scatter_plus_all_gather(fp32_llama):
    fix = "dp=2,tp=1,pp=1,micro_batch=2,recompute=none,offload_optimizer=false"
    eager = EngineSpec(overlap_grad_reduce=False)
    z0 = _plan(fp32_llama, fix + ",zero=0", eager).predicted["breakdown"]["dp_comm_s"]
    z1 = _plan(fp32_llama, fix + ",zero=1", eager).predicted["breakdown"]["dp_comm_s"]
    # gloo-like factors (2x, 1.5x) make the two separate halves dearer than one all-reduce
    assert z1 > 1.5 * z0
    ones = json.loads(json.dumps(CALIB))
    ones["intra_node"].update(reduce_scatter_factor=1.0, all_gather_factor=1.0)
    z0o = _plan(fp32_llama, fix + ",zero=0", eager, ones).predicted["breakdown"]["dp_comm_s"]
    z1o = _plan(fp32_llama, fix + ",zero=1", eager, ones).predicted["breakdown"]["dp_comm_s"]
    assert z1o == pytest.approx(z0o, rel=1e-6)  # same ring volume and steps


def _grid(rate) -> dict:
    """A gemm_grid over sizes 8, 64, 512 whose rate is ``rate(m, k, n)``."""
    sizes = [8, 64, 512]
    return {"sizes": sizes, "tables": {"fp32": [[[rate(m, k, n) for n in sizes] for k in sizes]
                                                for m in sizes]}}


def test_gemms_are_priced_at_the_rate_measured_for_their_shape(caplog):
    from costmodels.compute import gemm_time_s, shaped_rate

    shaped = json.loads(json.dumps(CALIB))
    # a rate falling with a short m or n (the large operand streamed), not with a short k
    shaped["device"]["gemm_grid"] = _grid(lambda m, k, n: 1e9 * min(m, n) ** 0.5)
    dev = apply_calibration(load_cluster("cpu"), shaped).device
    assert shaped_rate(dev, "fp32", 0.0, 64, 512, 8) == pytest.approx(8e9)  # measured shapes
    assert shaped_rate(dev, "fp32", 0.0, 512, 512, 512) == pytest.approx(1e9 * 512 ** 0.5)
    assert shaped_rate(dev, "fp32", 0.0, 64, 64, 8) == pytest.approx(8e9)  # k short: no cost
    # between measured shapes linear in log(rate) over log(size) (exact for this power law)
    m = (8 * 64) ** 0.5
    assert shaped_rate(dev, "fp32", 0.0, m, 512, 512) == pytest.approx(1e9 * m ** 0.5)
    # beyond the grid's largest size the rate held; the FLOPs play no part
    assert shaped_rate(dev, "fp32", 1.0, 4096, 512, 8) == pytest.approx(1e9 * 512 ** 0.5)
    # below its smallest the time held: a GEMM smaller than any measured costs as much
    assert shaped_rate(dev, "fp32", 1.0, 4096, 512, 2) == pytest.approx(1e9 * 512 ** 0.5 / 4)
    assert gemm_time_s(1, 2, 2, 1, dev, "fp32") == pytest.approx(gemm_time_s(1, 8, 8, 8, dev,
                                                                             "fp32"))
    # a batch of GEMMs (grouped experts) at the rate of one GEMM of all their rows
    assert gemm_time_s(8, 64, 512, 512, dev, "fp32") == pytest.approx(
        gemm_time_s(1, 512, 512, 512, dev, "fp32"))
    plain = apply_calibration(load_cluster("cpu"), CALIB).device  # no grid: by FLOPs alone
    assert shaped_rate(plain, "fp32", 1e9, 256, 8192, 256) == pytest.approx(1e11)
    old = json.loads(json.dumps(CALIB))
    old["device"]["gemm_skew"] = {"aspect": 32, "tables": {}}
    with caplog.at_level("WARNING", logger="planner.inputs.calibration"):
        dev = apply_calibration(load_cluster("cpu"), old).device
    assert "re-run `plan profile` to measure them by shape" in caplog.text
    assert not dev.gemm_grid


@pytest.mark.parametrize("grid,match", [
    ({"sizes": [8], "tables": {}}, r"gemm_grid.sizes: expected a list of at least two sizes"),
    ({"sizes": [64, 8], "tables": {}}, r"gemm_grid.sizes: expected increasing sizes"),
    ({"sizes": [8, 64], "tables": {"fp32": [[[1.0, 1.0]] * 2]}},
     r"gemm_grid.tables.fp32: expected a list of 2 entries"),
    ({"sizes": [8, 64], "tables": {"fp32": [[[1.0, 1.0]] * 2, [[1.0, 0.0]] * 2]}},
     r"gemm_grid.tables.fp32\[1\]\[0\]\[1\]: expected a positive number, got 0.0"),
    ({"sizes": [8, 64], "tables": {"bf-16": [[[1.0, 1.0]] * 2] * 2}},
     r"gemm_grid.tables.bf-16: no device.gemm_table.bf-16 beside it"),
])
def test_a_malformed_gemm_grid_is_named(grid, match):
    bad = json.loads(json.dumps(CALIB))
    bad["device"]["gemm_grid"] = grid
    with pytest.raises(SpecError, match=match):
        apply_calibration(load_cluster("cpu"), bad)


def test_eager_gradient_accumulation_is_paid_after_every_micro_batch_but_the_first(
        fp32_llama, monkeypatch):
    """With one kernel per op, autograd adds each micro-batch's weight gradients into the
    accumulated ones (read both, write one); fused engines fold it into the weight-gradient
    GEMM, and a single micro-batch has nothing to add to."""
    import costmodels.compute as compute_mod
    from costmodels.compute import accumulate_s

    fix = "dp=2,tp=1,pp=1,micro_batch=1,recompute=none,zero=0,offload_optimizer=false"
    eager = EngineSpec(overlap_grad_reduce=False, kernels="eager")
    with_acc = _plan(fp32_llama, fix, eager).predicted["breakdown"]["compute_s"]
    dev = apply_calibration(load_cluster("cpu"), CALIB).device
    blocks = [b.work.params_tp + b.work.params_rep for b in fp32_llama.blocks.blocks]
    expected = sum(accumulate_s(4 * n, dev) for n in blocks)  # fp32 gradients, m - 1 = 1 pass
    monkeypatch.setattr(compute_mod, "accumulate_s", lambda nbytes, device: 0.0)
    without = _plan(fp32_llama, fix, eager).predicted["breakdown"]["compute_s"]
    assert with_acc - without == pytest.approx(expected, rel=1e-4)  # plans keep 6 digits
    assert accumulate_s(1e9, dev) == pytest.approx(1.5 * copy_s(1e9, dev))
    monkeypatch.setattr(compute_mod, "accumulate_s", lambda nbytes, device: 1.0)  # unmistakable
    fused = EngineSpec(overlap_grad_reduce=False, kernels="fused")
    assert _plan(fp32_llama, fix, fused).predicted["breakdown"]["compute_s"] < 1.0
    one = fix.replace("micro_batch=1", "micro_batch=2")  # one micro-batch: nothing to add to
    assert _plan(fp32_llama, one, eager).predicted["breakdown"]["compute_s"] < 1.0
    assert _plan(fp32_llama, fix, eager).predicted["breakdown"]["compute_s"] > 1.0


def test_the_stage_split_balances_the_accumulation_pass_it_prices(tmp_path):
    """Eager engines pay a pass over the gradients after every micro-batch but the first; the
    split balances the same per-block seconds the pricing adds up, so no other cut of the chain
    prices faster. A large vocabulary makes the embedding's pass weigh where it has no GEMM."""
    from planner.options import Config
    from planner.search.costs import ModelArrays, config_costs
    from planner.search.pricing import price

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 128,
                                  "intermediate_size": 384, "num_hidden_layers": 12,
                                  "num_attention_heads": 4, "num_key_value_heads": 2,
                                  "vocab_size": 16384, "max_position_embeddings": 128}))
    model = planner.prepare(str(config), seq_len=16, dtype="fp32")  # few tokens: the pass weighs

    slow_memory = {**CALIB, "device": {**CALIB["device"], "hbm_GBps": 0.05}}
    cluster = apply_calibration(load_cluster("cpu", nodes=1, gpus_per_node=2), slow_memory)
    training = planner.TrainingSpec(global_batch=8, seq_len=16, dtype="fp32",
                                    optimizer="adamw", engine=engine_from_mapping("torchtitan"))
    p = planner.plan_prepared(model, cluster, training, planner.SearchOptions(
        fix="pp=2,dp=1,tp=1,micro_batch=1,recompute=none,schedule=gpipe",
        top_k=0))
    ma = ModelArrays.from_blocks(model.blocks)
    par = {k: p.parallel[k] for k in ("dp", "tp", "pp", "micro_batch", "num_microbatches",
                                     "schedule", "recompute", "zero")}
    cfg = Config(**par)
    costs = config_costs(ma, cluster, training, cfg)
    assert costs.accumulate_s.max() > 0  # the pass is priced here
    n = len(ma.names)

    def priced(k: int) -> float:  # the slower stage's compute per micro-batch, cut before block k
        return max(st.compute_s for st in price(cfg, [0, k, n], ma, costs, cluster,
                                                training).stages)

    best = min(priced(k) for k in range(1, n))
    planned = max(st["predicted"]["compute_s"] for st in p.stages)
    assert planned == pytest.approx(best, rel=1e-5)
    t = costs.time_s  # balancing these alone (no accumulation pass) cuts elsewhere, slower
    blind = min(range(1, n), key=lambda k: max(t[:k].sum(), t[k:].sum()))
    assert priced(blind) > best * 1.01


def test_fusion_scoped_to_layers_prices_embedding_and_loss_eagerly(tiny_llama):
    """torchtitan compiles each transformer block: with fused_scope=layers the repeated layers
    cost what fused kernels cost, the blocks outside them what eager kernels cost."""
    from planner.options import Config
    from planner.search.costs import ModelArrays, config_costs
    cluster = load_cluster("dgx-h100")
    ma = ModelArrays.from_blocks(tiny_llama.blocks)
    cfg = Config(dp=8, tp=1, pp=1, micro_batch=2, num_microbatches=1, schedule="1f1b",
                 recompute="none", zero=3)

    def costs(engine: str):
        training = planner.TrainingSpec(global_batch=16, seq_len=tiny_llama.seq_len,
                                        dtype="bf16", optimizer="adamw",
                                        engine=engine_from_mapping(engine))
        return config_costs(ma, cluster, training, cfg)

    scoped = costs("torchtitan-compile")
    whole = costs("torchtitan-compile,fused_scope=model")
    eager = costs("torchtitan")
    layer, outer = ma.checkpointed, ~ma.checkpointed
    assert layer.any() and outer.any()
    assert scoped.compute_s[layer] == pytest.approx(whole.compute_s[layer])
    assert scoped.compute_s[outer] == pytest.approx(eager.compute_s[outer])
    assert (scoped.compute_s[outer] > whole.compute_s[outer]).all()
    assert scoped.act_bytes[outer] == pytest.approx(eager.act_bytes[outer])
    # a block of a layer's work outside the layers is priced apart from them
    extra = dataclasses.replace(tiny_llama.blocks.blocks[1], name="extra", recompute=False)
    graph = dataclasses.replace(tiny_llama.blocks, blocks=[extra] + tiny_llama.blocks.blocks)
    ma2 = ModelArrays.from_blocks(graph)
    training = planner.TrainingSpec(global_batch=16, seq_len=tiny_llama.seq_len, dtype="bf16",
                                    optimizer="adamw",
                                    engine=engine_from_mapping("torchtitan-compile"))
    both = config_costs(ma2, cluster, training, cfg)
    assert both.compute_s[2] == pytest.approx(scoped.compute_s[1])  # its layer: fused
    assert both.compute_s[0] == pytest.approx(
        config_costs(ma2, cluster, dataclasses.replace(
            training, engine=engine_from_mapping("torchtitan")), cfg).compute_s[0])
    # torch.compile leaves gradient accumulation to autograd; Megatron's fused kernels do not
    two = dataclasses.replace(cfg, num_microbatches=2, micro_batch=1)
    assert (config_costs(ma, cluster, training, two).accumulate_s > 0).all()
    megatron = dataclasses.replace(training, engine=engine_from_mapping("megatron-core"))
    assert not config_costs(ma, cluster, megatron, two).accumulate_s.any()
    assert "in the repeated layers" in describe(engine_from_mapping("torchtitan-compile"))
    with pytest.raises(SpecError, match="engine.fused_scope: expected one of model, layers"):
        engine_from_mapping("fused_scope=blocks")


def test_fsdp_copies_move_weights_and_gradients_at_their_own_bytes():
    """FSDP2's buffer copies: parameters at the bytes they are gathered in, gradients at the bytes
    they are reduced in (torchtitan: bf16 and fp32)."""
    from planner.options import Config
    from planner.search.dp_traffic import DataParallelBytes, fsdp_copies_s

    device = load_cluster("dgx-h100").device
    n = 1e9
    copy = {b: copy_s(n * b, device) for b in (2, 4)}
    per = DataParallelBytes(grads=4, weights=2)
    z3 = Config(dp=8, tp=1, pp=1, micro_batch=1, num_microbatches=2, schedule="1f1b",
                recompute="none", zero=3)
    assert fsdp_copies_s(z3, n, per, device) == pytest.approx(
        2 * 2 * (1 + 1 / 8) * copy[2] + 2 * (1 + 1 / 8) * copy[4])
    z0 = dataclasses.replace(z3, zero=0)
    assert fsdp_copies_s(z0, n, per, device) == pytest.approx(3 * copy[4])
    assert fsdp_copies_s(dataclasses.replace(z3, dp=1), n, per, device) == 0.0
    assert fsdp_copies_s(z3, n, per, device, replicas=1) == 0.0  # experts with edp 1
    assert fsdp_copies_s(z3, n, per, device, replicas=2) == pytest.approx(  # experts over edp 2
        2 * 2 * (1 + 1 / 2) * copy[2] + 2 * (1 + 1 / 2) * copy[4])
    # under torch's pipelining schedules: three all-gathers over two micro-batches, one reduction
    assert fsdp_copies_s(z3, n, per, device, pipelined=True) == pytest.approx(
        3 * (1 + 1 / 8) * copy[2] + (1 + 1 / 8) * copy[4])
    # ZeRO-2 copies its gradients out for every reduce-scatter: one per micro-batch, or one per
    # step under pipelining schedules (ZeRO-1's one either way)
    z2, z1 = (dataclasses.replace(z3, zero=z) for z in (2, 1))
    once = (1 + 1 / 8) * copy[2] + (1 + 1 / 8) * copy[4]
    assert fsdp_copies_s(z2, n, per, device) == pytest.approx(
        (1 + 1 / 8) * copy[2] + 2 * (1 + 1 / 8) * copy[4])
    for c, piped in ((z2, True), (z1, False), (z1, True)):
        assert fsdp_copies_s(c, n, per, device, pipelined=piped) == pytest.approx(once)


def _hiding_free(cluster):
    """``cluster`` with communication hidden behind compute priced free (overlap_slowdown 0):
    what hides where, apart from what hiding costs the compute."""
    return dataclasses.replace(cluster, device=dataclasses.replace(cluster.device,
                                                                   overlap_slowdown=0.0))


def test_fsdp2_under_pipelining_schedules_reduces_once_per_step():
    """torch.distributed.pipelining turns FSDP2's gradient sync (and its reshard after backward)
    off for every micro-batch but the last: ZeRO-2 reduce-scatters once per step, not once per
    micro-batch, and ZeRO-3 gathers about once per micro-batch instead of twice."""
    from planner.options import Config
    from planner.search.dp_traffic import DataParallelBytes, exposed_dp_s
    from planner.search import placement
    from costmodels import comm

    cluster = _hiding_free(load_cluster("dgx-h100", nodes=2))
    per = DataParallelBytes(grads=4, weights=2)
    n, m = 1e9, 8
    cfg = Config(dp=16, tp=1, pp=1, micro_batch=1, num_microbatches=m, schedule="1f1b",
                 recompute="none", zero=2)
    group = placement.dp_group(cfg, cluster)
    scatter = comm.reduce_scatter_s(n * 4, group, cluster)
    gather = comm.allgather_s(n * 2, group, cluster)

    def exposed(c, pipelined):
        return float(exposed_dp_s(c, n, per, group, cluster, 0.0, 0.0, False,
                                  pipelined=pipelined))

    assert exposed(cfg, False) == pytest.approx(gather + m * scatter)
    assert exposed(cfg, True) == pytest.approx(gather + scatter)
    z3 = dataclasses.replace(cfg, zero=3)
    assert exposed(z3, False) == pytest.approx(2 * m * gather + m * scatter)
    assert exposed(z3, True) == pytest.approx((m + 1) * gather + scatter)
    one = dataclasses.replace(z3, num_microbatches=1)  # one micro-batch: nothing to skip
    assert exposed(one, True) == pytest.approx(exposed(one, False))
    # and after every backward pass: nothing hides the reduction, however long the backward
    def hidden(c, pipelined):
        return float(exposed_dp_s(c, n, per, group, cluster, 100.0, 100.0, True,
                                  pipelined=pipelined))

    assert hidden(cfg, False) == pytest.approx(gather)
    assert hidden(cfg, True) == pytest.approx(gather + scatter)
    assert hidden(z3, True) == pytest.approx(scatter)  # the gathers run behind compute
    # ... and slow it, on a GPU, by the device's overlap_slowdown while they run
    gpu = load_cluster("dgx-h100", nodes=2)
    slow = gpu.device.overlap_slowdown
    assert float(exposed_dp_s(z3, n, per, group, gpu, 100.0, 100.0, True, pipelined=True)) == \
        pytest.approx(scatter + (m + 1) * gather * slow / (1 + slow))


def test_fsdp2_with_deferred_sync_keeps_gradients_unsharded_and_zero3_weights_gathered():
    from costmodels import memory

    for layout, grad in (("megatron", 4.0), ("zero", 2.0), ("fsdp2", 4.0)):
        kw = dict(dtype="bf16", optimizer="adam", dp=8, layout=layout)
        for zero in (1, 2, 3):
            plain = memory.model_state_bytes(1.0, zero=zero, **kw)
            deferred = memory.model_state_bytes(1.0, zero=zero, deferred=4, **kw)
            # whole, in the layout's gradient width, until the reduction: never below the
            # gradients the same layout keeps without deferring
            assert deferred["grads"] == grad >= plain["grads"]
            assert deferred["optimizer"] == plain["optimizer"]
            assert deferred["weights"] == plain["weights"] + (2.0 if zero == 3 else 0.0)
        replicate = memory.model_state_bytes(1.0, zero=0, deferred=4, **kw)
        assert replicate["grads"] == memory.model_state_bytes(1.0, zero=0, **kw)["grads"] + grad
        assert memory.model_state_bytes(1.0, zero=0, deferred=1, **kw) == \
            memory.model_state_bytes(1.0, zero=0, **kw)


def test_the_updated_weights_are_gathered_behind_a_forward_never_a_backward():
    """ZeRO-1/2 all-gather the weights after the optimizer step: no backward is left to hide
    them; Megatron-Core's --overlap-param-gather (and FSDP2's prefetch) run them behind the next
    step's first forward, DeepSpeed's optimizer inside its step (overlap_param_gather=false)."""
    from planner.options import Config
    from planner.search.dp_traffic import DataParallelBytes, exposed_dp_s
    from planner.search import placement
    from costmodels import comm

    cluster = _hiding_free(load_cluster("dgx-h100", nodes=2))
    per = DataParallelBytes(grads=4, weights=2)
    n = 1e9
    cfg = Config(dp=16, tp=1, pp=1, micro_batch=1, num_microbatches=4, schedule="1f1b",
                 recompute="none", zero=1)
    group = placement.dp_group(cfg, cluster)
    scatter = comm.reduce_scatter_s(n * 4, group, cluster)
    gather = comm.allgather_s(n * 2, group, cluster)

    def exposed(c, compute, backward, gathers=True):
        return float(exposed_dp_s(c, n, per, group, cluster, compute, backward, True,
                                  gather_overlap=gathers))

    long = 10 * (scatter + gather)
    for c in (cfg, dataclasses.replace(cfg, zero=2)):
        assert exposed(c, long, long) == pytest.approx(gather)  # backward only: gather exposed
        assert exposed(c, 2 * long, long) == 0.0  # a forward as long hides it
        assert exposed(c, 2 * long, long, gathers=False) == pytest.approx(gather)
    half = 0.5 * gather  # a forward half as long as the gather hides half of it
    assert exposed(cfg, long + half, long) == pytest.approx(gather - half)
    # the experts' traffic gets what the dense traffic leaves of each window: a forward the
    # dense gather overran leaves none (not less), and the backward keeps its own rest
    from planner.search.dp_traffic import windows_left
    assert windows_left(3.0, 2.0, (1.5, 0.5)) == (1.5, 1.5)
    assert windows_left(3.0, 2.0, (0.5, 3.0)) == (0.5, 0.0)
    left = windows_left(long + half, long, (gather, 0.0))
    assert exposed(cfg, *left) == pytest.approx(gather)  # nothing left hides the next gather


def test_deepspeed_hides_the_reduction_only_with_zero_and_without_a_pipeline(fp32_llama):
    """DeepSpeed all-reduces ZeRO-0's gradients after the backward and turns overlap_comm off
    under its pipeline engine (overlap_scope=sharded); ZeRO-1 without a pipeline hides it."""
    ds = engine_from_mapping("deepspeed")
    assert ds.overlaps_reduction(zero=1, pp=1)
    assert not ds.overlaps_reduction(zero=0, pp=1) and not ds.overlaps_reduction(zero=1, pp=2)
    assert EngineSpec().overlaps_reduction(zero=0, pp=4)  # Megatron-Core's DDP overlaps anyway
    assert not EngineSpec(overlap_grad_reduce=False).overlaps_reduction(zero=1, pp=1)
    fix = "dp=2,tp=1,pp=1,micro_batch=1,recompute=none,offload_optimizer=false"
    everywhere = dataclasses.replace(ds, overlap_scope="all")
    serial = dataclasses.replace(ds, overlap_grad_reduce=False)
    for zero, hidden in ((0, False), (1, True)):
        def dp_comm(engine):
            return _plan(fp32_llama, f"{fix},zero={zero}", engine,
                         hiding_free=True).predicted["breakdown"]["dp_comm_s"]
        priced = dp_comm(ds)
        assert priced == dp_comm(everywhere if hidden else serial)
        if not hidden:  # the backward would have hidden some of it
            assert priced > dp_comm(everywhere)
    with pytest.raises(SpecError, match="engine.overlap_scope: expected one of all, sharded"):
        engine_from_mapping("overlap_scope=some")


def test_engine_names_read_in_any_case():
    """A setting that takes one of a few names is read in lower case (DeepEP as deepep); a name
    that is not one of them is still refused, naming the choices."""
    engine = engine_from_mapping("megatron-core,moe_dispatcher=DeepEP,attention=Flash")
    assert (engine.moe_dispatcher, engine.attention) == ("deepep", "flash")
    with pytest.raises(SpecError, match="engine.moe_dispatcher: expected one of alltoall, "
                                        "allgather, deepep, got 'nccl'"):
        engine_from_mapping("moe_dispatcher=NCCL")


def test_torchtitans_ddp_all_reduces_after_every_micro_batch(fp32_llama):
    """A new-user check read torchtitan 0.2.2's train loop: each micro-batch's backward runs
    under replicate() with no no_sync, so ZeRO-0 all-reduces every micro-batch (the pricing had
    one all-reduce a step, as DDP with no_sync and Megatron-Core run it)."""
    once = EngineSpec(overlap_grad_reduce=False)
    every = EngineSpec(overlap_grad_reduce=False, ddp_accumulates=False)
    assert engine_from_mapping("torchtitan").ddp_accumulates is False
    assert engine_from_mapping("megatron-core").ddp_accumulates is True

    def sync(engine, micro_batch):
        fix = (f"dp=2,tp=1,pp=1,micro_batch={micro_batch},recompute=none,zero=0,"
               "offload_optimizer=false")
        return _plan(fp32_llama, fix, engine).predicted["breakdown"]["dp_comm_s"]

    assert sync(once, 1) == pytest.approx(sync(once, 2), rel=1e-5)  # 2 or 1 micro-batches
    assert sync(every, 1) == pytest.approx(2 * sync(every, 2), rel=1e-5)
    assert sync(every, 2) == pytest.approx(sync(once, 2), rel=1e-5)  # one micro-batch: alike
