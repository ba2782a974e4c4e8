"""First-stage memory at the four configurations of Korthikanti et al.'s Table 3 equals their
closed forms (benchmarks/memory.py), and the configurations that trained there fit here."""

import importlib.util
import os
import sys

import pytest

import planner
from planner.options import parse_fix

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "..", "benchmarks", "memory.py")
sys.path.insert(0, os.path.dirname(SCRIPT))  # its `tables` helper
spec = importlib.util.spec_from_file_location("memory_benchmark", SCRIPT)
bench = importlib.util.module_from_spec(spec)
sys.modules["memory_benchmark"] = bench
spec.loader.exec_module(bench)


@pytest.fixture(scope="module")
def prepared():
    return {c.name: bench.prepare(c) for c in bench.TABLE3}


@pytest.mark.parametrize("mode", bench.MODES)
@pytest.mark.parametrize("name", [c.name for c in bench.TABLE3])
def test_first_stage_memory_equals_the_closed_forms(prepared, name, mode):
    c = next(c for c in bench.TABLE3 if c.name == name)
    got, plan = bench.predicted(prepared[name], c, mode)
    assert got, plan
    ref = bench.closed_form(c, mode)
    for part in ("activations", "states"):
        assert got[part] == pytest.approx(ref[part], rel=0.05), part


def test_the_530b_interleaved_selective_run_fits_an_a100_80gb(prepared):
    """Tensor parallel 8 with sequence parallelism, 35 stages of 3 chunks, selective recompute,
    on 280 A100-80GB, with the planner's default memory reserve."""
    c = next(c for c in bench.TABLE3 if c.name == "530b")
    fix = parse_fix("tp=8,pp=35,dp=1,vpp=3,micro_batch=1,schedule=interleaved-1f1b,"
                    "recompute=selective,sequence_parallel=true,zero=0,offload_optimizer=false")
    plan = planner.plan_prepared(prepared["530b"], planner.load_cluster("dgx-a100-80g", nodes=35),
                                 planner.TrainingSpec(global_batch=c.global_batch, seq_len=2048),
                                 planner.SearchOptions(fix=fix, top_k=0))
    assert plan.predicted["peak_memory_bytes"] < 0.95 * 80e9 - 1e9
