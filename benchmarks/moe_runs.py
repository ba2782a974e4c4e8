"""Mixture-of-Experts runs with expert parallelism: predicted vs published throughput.

Rows: benchmarks/data/moe_runs.csv (a copy of the project's reference data), Megatron-Core runs
published by NVIDIA-NeMo/Megatron-Bridge (docs/performance-summary.md, 25.09 and 25.11 containers):
DeepSeek-V3, Qwen3-30B-A3B, Qwen3-235B-A22B and GPT-OSS-120B on H100, B200, GB200 and GB300, with
their tp / pp / vp / cp / ep, micro and global batch and precision.

Each row is priced at its published configuration: every published knob pinned (tp, pp, vpp and
the interleaved schedule when vp > 1, cp, ep, micro-batch, data parallelism from the GPU count),
sequence parallelism with tp > 1 (Megatron-Core requires it with experts), the distributed
optimizer (ZeRO-1) on the GPUs (no optimizer offload), and the recomputation the release's performance configuration for that model
and GPU sets (RECOMPUTE; the table does not publish it). The
engine is Megatron-Core's (`--engine megatron-core`) with routing balanced (moe_imbalance 1.0,
which the source forces: "force-balanced routing, token-dropless"; gradients kept and reduced
in bf16, as every Megatron-Bridge performance configuration sets), dropless except the rows
marked tokendrop (capacity factor 1.0, which under balanced routing drops nothing: those
rows are priced as their dropless twins are); the expert all-to-alls overlapped with another
micro-batch's compute where the release's configuration for that model and GPU sets it
(A2A_OVERLAP). Precision: BF16, FP8-CS (current scaling), FP8-MX (block
scaling, Blackwell). Device memory is not checked here (the time of the published configuration
is what is compared); whether the planner thinks it fits is printed ("rc=...": only with
that recomputation instead of the release's).

Clusters: H100 rows on DGX H100 nodes (8 GPUs), B200 on DGX B200, GB200/GB300 on NVL72 racks of
which each run uses 64 GPUs per NVLink domain (256 GPUs = 4 domains; 8 GPUs = one tray group).

One constant is fitted, on half of the rows (the others are held out and their error printed
apart; published.split_by_configuration: configurations alternate between the halves, and a
row's near twins, the same model, GPU, layout and micro-batch in another precision or release, go
with it): the engine's host time per op of an MoE layer (EngineSpec.moe_host_op_s): a
layer takes at least its ops' issue time, and dropless dispatch keeps the host from running ahead
across layers (it waits for the device's token counts in every layer). Every other constant is
the cost model's (data sheets, documented efficiencies; the share of the FP8 peak that FP8 GEMMs
sustain was fitted on dense runs, benchmarks/dense_fp8_runs.py, so these rows are held out for
it).
DeepSeek-V3 rows are priced with the multi-token-prediction depth its recipes train by default
(zoo model deepseek-v3-mtp: one more MoE layer, a projection and a second pass of the output
head, on the last stage with the loss), except the rows published "w/o MTP" (deepseek-v3). A row
runs on the pipeline layout its configuration pins where it is known (LAYOUTS, DSV3_MAP:
DeepSeek-V3's), or that its recipe's split rule makes (ACCOUNTED: Qwen3-235B-A22B's layers split
evenly with the embedding and the loss counted as one each; Megatron-Core's default otherwise, the
layers split evenly, the embedding on the first stage and the head on the last), else (a
DeepSeek-V3 layout not published, which no even split makes) on the search's balanced split.

Rows from 100 on (benchmarks/data/moe_more_runs.csv: the 25.09 table's GB200 and B200 token-drop
runs) are not in the project's reference data; they are priced the same way, never fitted on, and
summarized apart ("not in data"). Rows from 200 on (benchmarks/data/moe_newer_runs.csv: the same
summary's later releases, 26.04.01, 26.06 and 26.08) are not in it either and never fitted on
("newer"): each priced with its release's configuration as the others are (RECOMPUTE, A2A_OVERLAP,
FLEX), and where that configuration captures the whole forward and backward in one CUDA graph
(FULL_ITERATION) with no host time per op, since a graph's replay issues none of its kernels from
the host. Those releases change the software on the same layouts (Qwen3-30B on 8 GB200, MXFP8,
four samples per micro-batch: 26,112 tokens/s per GPU in 26.04.01, 40,706 in the 26.06 table, whose
GB200 rows are left out here as 26.08 repeats them, once the whole iteration runs as one graph);
the one constant fitted on 25.09 and 25.11 is checked on releases it was not fitted on, and the
graph's effect is priced, not fitted. Rows from 300 on (benchmarks/data/moe_report_runs.csv:
Table 11 of NVIDIA's Megatron-Core MoE report, arXiv 2603.07685, DeepSeek-V3 and Qwen3-235B-A22B
on GB300, GB200 and H100, one at 131,072 tokens) are another set never fitted on ("report"),
configured as its Table 20 and Appendix B.2 give (REPORT_RELEASE in the tables below; its
Megatron-Core keeps its own default gradients, not Megatron-Bridge's bf16 ones, since the report
names the Megatron-LM dev branch; its partial CUDA graphs priced with the fitted host time, as
25.11's).

Also: the free search (same model, cluster, batch, precision; nothing pinned) against the published
configuration under the planner's own model, with the knobs that changed.

Usage:  python benchmarks/moe_runs.py [--rows N,M,...] [--no-search] [--markdown]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from costmodels.engine import engine_from_mapping  # noqa: E402
from planner import (InfeasibleError, SearchOptions, TrainingSpec, plan_prepared,  # noqa: E402
                     prepare)
from planner.options import parse_fix  # noqa: E402
from published import (BIG, nvidia_cluster, read_rows, software,  # noqa: E402
                       split_by_configuration)
from tables import SEARCH_HEAD, print_errors, print_table, search_cells  # noqa: E402

DATA = os.path.join(HERE, "data", "moe_runs.csv")
MORE = os.path.join(HERE, "data", "moe_more_runs.csv")
"""Published rows not in the project's reference data, priced the same way and never fitted on:
the 25.09 table's GB200 and B200 token-drop runs (benchmarks/data/README.md)."""
MORE_INDEX = 100
"""Row numbers of MORE start here."""
NEWER = os.path.join(HERE, "data", "moe_newer_runs.csv")
"""Published rows of later releases (26.04.01, 26.06, 26.08), not in the project's reference data,
priced the same way and never fitted on (benchmarks/data/README.md)."""
NEWER_INDEX = 200
"""Row numbers of NEWER start here."""
REPORT = os.path.join(HERE, "data", "moe_report_runs.csv")
"""The runs of NVIDIA's Megatron-Core MoE report (arXiv 2603.07685, Table 11, configured as its
Table 20 and Appendix B.2 give), not in the project's reference data, priced the same way and
never fitted on (benchmarks/data/README.md)."""
REPORT_INDEX = 300
"""Row numbers of REPORT start here."""
REPORT_RELEASE = "arXiv-2603.07685"
"""The release name REPORT's rows carry (Megatron-Core v0.16's dev branch, the report's 8.1)."""
MODELS = {"DeepSeekV3": "deepseek-v3", "GPT OSS 120B": "gpt-oss-120b",
          "Qwen3_30B_a3B": "qwen3-30b-a3b", "Qwen3_235B_a22B": "qwen3-235b-a22b"}
PRECISION = {"BF16": ("bf16", "current"), "FP8-CS": ("fp8", "current"),
             "FP8-MX": ("fp8", "block"), "FP8 (per-tensor current scaling)": ("fp8", "current"),
             "FP8": ("fp8", "current"), "MXFP8": ("fp8", "block"), "FP8-BLK": ("fp8", "current")}
"""Precision column -> (dtype, FP8 recipe). FP8-BLK (Hopper's software block scaling, 128-element
blocks) is not a recipe of the planner's: priced as per-tensor current scaling, whose casts read
and write the same bytes once more."""
A2A_OVERLAP = {"25.11": {("Qwen3_30B_a3B", "H100"), ("Qwen3_235B_a22B", "H100"),
                         ("Qwen3_235B_a22B", "B200"), ("DeepSeekV3", "H100")},
               "25.09": {("DeepSeekV3", "H100")},
               "26.04.01": {("DeepSeekV3", "B200"), ("GPT OSS 120B", "GB200"),
                            ("Qwen3_235B_a22B", "H100")},
               "26.06": {("Qwen3_30B_a3B", "B300")},
               "26.08": {(m, g) for m in ("DeepSeekV3", "GPT OSS 120B", "Qwen3_30B_a3B",
                                          "Qwen3_235B_a22B") for g in ("GB200", "GB300")},
               REPORT_RELEASE: {("DeepSeekV3", "GB300"), ("DeepSeekV3", "H100"),
                                ("Qwen3_235B_a22B", "GB200"), ("Qwen3_235B_a22B", "H100")}}
"""Per release, the (model, GPU) whose Megatron-Bridge performance configuration runs the expert
all-to-alls behind another micro-batch's compute (overlap_moe_expert_parallel_comm). 25.11:
``moe_a2a_overlap=True`` in scripts/performance/configs/{qwen,deepseek}/*_workload_base_configs.py
at the table's revision (1804c076f, 2025-12-09); 25.09: scripts/performance/run_script.py at
cac49dcd7 (2025-09-27) sets it for DeepSeek-V3 on H100 only, and there also turns off the
overlapped gradient reduction (``overlap_grad_reduce = False``); its Qwen3 runs drop tokens and do
not overlap. 26.04.01: scripts/performance/configs/*/*_workload_base_configs.py at 17a381f95
(2026-05-16), moe_a2a_overlap in the presets the table's rows use (DeepSeek-V3 on B200 and
Qwen3-235B on H100) and GPT-OSS-120B's GB200 function (a CommOverlapConfig with the overlap);
26.06 (63b08b397, and 8f341b04f for the B300 rows): Qwen3-30B on B300 (set_full_iter_cg_configs);
26.08 (src/megatron/bridge/perf_recipes at 4ab94dfad, 2026-08-11): every row (the full-iteration
helpers of each model family set overlap_moe_expert_parallel_comm). The Megatron-Core MoE report
(REPORT_RELEASE): its Appendix B.2, "1F1B overlap", DeepSeek-V3 on GB300 and H100, Qwen3-235B on
GB200 and H100."""

FLEX = {"26.04.01": {("DeepSeekV3", g) for g in ("GB300", "GB200", "B300", "B200")}
        | {("Qwen3_30B_a3B", g) for g in ("GB300", "GB200", "B300", "B200", "H100")}
        | {("Qwen3_235B_a22B", g) for g in ("GB300", "GB200", "B300")}
        | {("GPT OSS 120B", "B300")},
        "26.06": {("DeepSeekV3", "B300"), ("GPT OSS 120B", "B300"), ("Qwen3_30B_a3B", "B300"),
                  ("Qwen3_30B_a3B", "H100")},
        "26.08": A2A_OVERLAP["26.08"],
        REPORT_RELEASE: {(m, g) for m in ("DeepSeekV3", "Qwen3_235B_a22B")
                         for g in ("GB300", "GB200", "H100")}}
"""Per release, the (model, GPU) whose configuration dispatches tokens with Megatron-Core's flex
dispatcher (HybridEP, or DeepEP for DeepSeek-V3 on B200 in 26.04.01), priced as the planner's
``deepep`` dispatcher: a token crosses between nodes once per node it goes to, not once per copy
(HybridEP's intra-domain NVLink and inter-domain RDMA stages do the same deduplication); the
others run the alltoall dispatcher. Read where A2A_OVERLAP was; 25.09 and 25.11 rows all run
alltoall. The report's runs: HybridEP on GB300 and GB200, DeepEP on H100 (Appendix B.2)."""

FULL_ITERATION = {"26.06": {("Qwen3_30B_a3B", "B300")}, "26.08": A2A_OVERLAP["26.08"]}
"""Per release, the (model, GPU) whose configuration captures the whole forward and backward in one
CUDA graph (``cuda_graph_impl="full_iteration"``; dropless routing kept sync-free by a fixed
per-rank token budget, moe_expert_rank_capacity_factor 1.5, with paged stashing, which balanced
routing never overflows): no host time per op (moe_host_op_s 0), since replaying a graph issues
none of its kernels from the host. The rows of other releases and the others of these releases
capture at most parts of a layer (Transformer Engine graphs of attention, router and token
preprocessing), priced with the fitted host time as every 25.09 and 25.11 row is. The same
configurations also run fused grouped expert MLPs (CuTeDSL) and, on some rows, FP8 attention, which
the planner does not price apart, except that gpt-oss's expert biases are added inside the fused
MLP there, not one local expert at a time (moe_bias_loop=false: Megatron-Core's eager per-expert
path splits by token counts on the host, which a captured iteration cannot)."""


TP_OVERLAP = {"25.09": {("Qwen3_235B_a22B", "H100"), ("Qwen3_235B_a22B", "GB200")}}
"""Per release, the (model, GPU) of rows with tensor parallelism whose configuration pipelines its
collectives with the GEMMs (``tp_comm_overlap``, the engine's tp_overlap). 25.09
(scripts/performance/run_script.py at cac49dcd7): every Qwen3 run passes
``CommOverlapConfig(tp_comm_overlap=True)``; DeepSeek-V3's recipe leaves it False
(recipes/deepseek/deepseek_v3.py). 25.11 (1804c076f) and 26.04.01 (17a381f95): Qwen3-235B on H100,
the only rows there with tp > 1, sets it False (configs/qwen/qwen3_llm_pretrain.py). Rows at
tp = 1 have nothing to pipeline."""


RECOMPUTE = {"25.11": {("DeepSeekV3", "GB300"): "moe_act", ("DeepSeekV3", "GB200"): "mla_up_proj",
                       ("DeepSeekV3", "B200"): "mla_up_proj", ("DeepSeekV3", "H100"): "mla_up_proj"},
             "25.09": {("DeepSeekV3", "H100"): "mla_up_proj",
                       ("DeepSeekV3", "GB200"): "mla_up_proj+moe_act",
                       ("DeepSeekV3", "B200"): "selective"},
             "26.04.01": {("DeepSeekV3", "GB300"): "mla_up_proj",
                          ("DeepSeekV3", "B200"): "mla_up_proj",
                          ("DeepSeekV3", "B300"): "mla_up_proj",
                          ("GPT OSS 120B", "GB200"): "moe_act",
                          ("GPT OSS 120B", "B200"): "moe_act", ("GPT OSS 120B", "H100"): "moe_act"},
             "26.06": {("DeepSeekV3", "B300"): "mla_up_proj"},
             "26.08": {("DeepSeekV3", "GB200"): "mla_up_proj"},
             REPORT_RELEASE: {("DeepSeekV3", "H100"): "mla_up_proj+moe_act",
                              ("Qwen3_235B_a22B", "GB200"): "moe_act",
                              ("Qwen3_235B_a22B", "H100"): "moe_act"}}
"""Per release, the (model, GPU) whose Megatron-Bridge performance configuration recomputes
something, and the planner's policy for it; the others recompute nothing. 25.11
(scripts/performance/configs/*/..._workload_base_configs.py at 1804c076f): DeepSeek-V3 runs
``recompute_granularity="selective"`` (deepseek_llm_pretrain.py) with ``recompute_modules``
moe_act on GB300, mla_up_proj on GB200 and B200, mla_up_proj and mlp on H100 (mlp: the three dense
layers' MLPs, about 1% of the FLOPs, not a policy of the planner's); GPT-OSS-120B's configurations
list layernorm and moe_act but set no selective granularity, and Megatron-Core reads the modules
only under it (TransformerConfig.recompute_granularity defaults to None): none; Qwen3 sets
``recompute_granularity=None``. 25.09 (scripts/performance/run_script.py at cac49dcd7):
DeepSeek-V3 mla_up_proj and mlp on H100, mla_up_proj, mlp and moe_act on GB200, and the
recipe's selective default on B200 (modules
unset: Megatron-Core's core_attn, the planner's selective); Qwen3 none.

Assumed, not read off a run: a configuration's layout sometimes differs from its published row's
(25.11 GB300 pp 4 / ep 64 against the row's pp 2 / ep 32, GB200 FP8-MX pp 4 / ep 64 against pp 8
/ ep 32; 25.09 GB200 vp 8 against vp 4, B200 tp 2 against tp 1), and its recomputation is taken
all the same; the 25.09 B200 FP8 rows also set CUDA graphs, which Megatron-Core 0.14's
TransformerConfig refuses beside any recomputation, so which of the two those runs had is not
known (priced selective, as the recipe sets); 25.11 GB300 lists moe_act without layernorm, which
the planner's moe_act recomputes too (the norms' share: a few MiB per sample and layer).
26.04.01 (17a381f95): DeepSeek-V3 selective mla_up_proj on GB300 and B300, mla_up_proj and mlp on
B200, mlp alone on GB200 (its three dense layers: none here); GPT-OSS-120B layernorm and moe_act
under selective on GB200, B200 and H100 (moe_act here), none on GB300 and B300; Qwen3 none (its
common settings clear the recipe's full recomputation). 26.06 (8f341b04f): DeepSeek-V3 on B300
mla_up_proj, the others none. 26.08 (4ab94dfad): DeepSeek-V3 on GB200 mla_up_proj; GPT-OSS-120B's
GB200 recipe lists layernorm and moe_act and then empties the list; the others none. The
Megatron-Core MoE report (REPORT_RELEASE, Appendix B.2 and Table 17): DeepSeek-V3 none on GB300,
mlp on GB200 (its three dense layers: none here), on H100 mlp, mla_up_proj, moe_act and layernorm
(Table 17, which sets that run out in full, at pp 8; its Appendix B.2 lists up_proj and mlp only,
and its Table 20 gives pp 4, which by the planner's memory model fits 80 GB only with full
recomputation); Qwen3-235B moe_act and layernorm on GB200 and H100, none on GB300."""


DSV3_16 = "Et*4|(t*4|)*14tmL"
"""DeepSeek-V3's layout on 16 stages in Megatron-Bridge's recipes (its pipeline-layout map for pp x
vp = 16 x 1, 8 x 2, 4 x 4, also written out in the performance configurations)."""
LAYOUTS = {"25.09": {("DeepSeekV3", "H100"): "Et|(tt|)*30mL"},
           "25.11": {("DeepSeekV3", "B200"): DSV3_16},
           "26.04.01": {("DeepSeekV3", "GB300"): DSV3_16, ("DeepSeekV3", "GB200"): DSV3_16,
                        ("DeepSeekV3", "B200"): DSV3_16,
                        ("DeepSeekV3", "B300"): "Et*8|(t*8|)*6t*5mL"},
           "26.06": {("DeepSeekV3", "B300"): "Et*8|(t*8|)*6t*5mL"},
           "26.08": {("DeepSeekV3", "GB300"): DSV3_16, ("DeepSeekV3", "GB200"): DSV3_16},
           REPORT_RELEASE: {("DeepSeekV3", "H100"): "Et*3|(tt|)*29m|L"}}
"""Per release, the (model, GPU) whose configuration pins the pipeline layout (Megatron's
notation, SearchOptions.layout), each with the MTP depth (m) the DeepSeek-V3 recipe trains by
default (``mtp_num_layers = 1``): 25.09's run_script.py passes ``Et|(tt|)*30mL`` (32 stages: the
H100 row's pp 8 x vp 4; its GB200 and B200 rows' 16 stages do not match it, so how those ran is
not known: searched split); 25.11's recipe maps B200's pp 16 (the "w/ MTP" row) to DSV3_16 (and,
by DSV3_MAP, GB200's pp 4 x vp 4 "w/o MTP" row to it without the m; the other "w/o MTP" rows'
pp x vp are outside its map: searched split); 26.04.01 (17a381f95) writes
DSV3_16 for GB300 and B200 and maps GB200's pp 4 x vp 4 to it, and B300's pp 8 to
``Et*8|(t*8|)*6t*5mL``, as 26.06 (8f341b04f); 26.08 (perf_recipes at 4ab94dfad) DSV3_16 for
GB300 and, by the map, GB200. The Megatron-Core MoE report's runs at pp 4 x vp 4 (GB300 and
GB200) take DSV3_MAP's layout, DSV3_16, which its Table 17 gives for GB200; for H100 Table 17 gives
pp 8 with ``Et*3|(tt|)*29m|L``, the MTP depth on a stage of its own before the head's; its GB200
BF16 run (pp 8 x vp 4) names none. Every other row is split by the search (its
exact, balanced cut)."""


DSV3_MAP = {(4, 1): "Et*16|t*16|t*16|t*13{m}L", (8, 1): "Et*8|(t*8|)*6t*5{m}L",
            (4, 2): "Et*8|(t*8|)*6t*5{m}L", (16, 1): "Et*4|(t*4|)*14t{m}L",
            (8, 2): "Et*4|(t*4|)*14t{m}L", (4, 4): "Et*4|(t*4|)*14t{m}L"}
"""DeepSeek-V3's layout per (pp, vp) in Megatron-Bridge's recipe at 25.11
(set_deepseek_v3_pipeline_model_parallel_layout, recipes/deepseek/deepseek_v3.py at 1804c076f),
with an ``m`` per MTP depth before the loss (none on the "w/o MTP" rows); the recipe turns the
embedding and loss accounting off, so a (pp, vp) outside the map splits 61 layers evenly, which
no 8, 16 or 32 stages do: not known how those rows ran (searched split)."""

LAYERS = {"DeepSeekV3": 61, "GPT OSS 120B": 36, "Qwen3_30B_a3B": 48, "Qwen3_235B_a22B": 94}
"""Each model's transformer layers (its public config.json)."""

ACCOUNTED = {"Qwen3_235B_a22B"}
"""Models whose recipe splits the pipeline with the embedding and the
loss each counted as a layer (``account_for_embedding_in_pipeline_split`` and
``account_for_loss_in_pipeline_split`` True: Megatron-Bridge's Qwen3-235B-A22B pre-training
recipe in every release here, recipes/qwen/qwen3_moe.py at 1804c076f, 17a381f95, 8f341b04f,
recipes/qwen/qwen3_235b_a22b.py at cac49dcd7, recipes/qwen/h100/qwen3_moe.py at 4ab94dfad): its
94 layers and those two fill pp x vp stages evenly (accounted_layout). The other models' recipes
(Qwen3-30B-A3B: recipes/qwen/qwen3_30b_a3b.py at cac49dcd7, recipes/qwen/qwen3_moe.py at
1804c076f and 17a381f95; GPT-OSS-120B: recipes/gpt_oss/gpt_oss.py at 1804c076f and
17a381f95) leave the accounting off and pin no layout: Megatron-Core splits their layers evenly
over the stages (even_layout)."""


def accounted_layout(layers: int, stages: int) -> str | None:
    """Megatron-LM's even split of ``layers`` over ``stages`` with the embedding and the loss
    counted as a layer each, in its layout notation; None where they do not divide evenly (its
    checks refuse that) or with one stage."""
    per, rest = divmod(layers + 2, stages)
    if rest or stages < 2 or per < 1:
        return None
    def part(n: int) -> str:
        return "" if n == 0 else "t" if n == 1 else f"t*{n}"
    middle = f"({part(per)}|)*{stages - 2}" if stages > 2 else ""
    return f"E{part(per - 1)}|{middle}{part(per - 1)}L"


def even_layout(layers: int, stages: int) -> str | None:
    """Megatron-LM's default split of ``layers`` over ``stages`` (no accounting, no layout): as
    many layers on each, the embedding with the first and the head with the last; None where they
    do not divide evenly or with one stage."""
    per, rest = divmod(layers, stages)
    if rest or stages < 2:
        return None
    many = "t" if per == 1 else f"t*{per}"
    middle = f"({many}|)*{stages - 2}" if stages > 2 else ""
    return f"E{many}|{middle}{many}L"


def layout_of(r: dict) -> str | None:
    """The row's pinned pipeline layout (LAYOUTS, DSV3_MAP, ACCOUNTED, even_layout), or None: the
    search's split."""
    model = _model_gpu(r)[0]
    pp, vp = int(r["pp"] or 1), int(r["vp"] or 1)
    pinned = LAYOUTS.get(_release(r), {}).get(_model_gpu(r))
    if pinned or pp == 1:
        return pinned
    if model not in LAYERS:  # a model whose recipe is not read here: the search's split
        return None
    if model in ACCOUNTED:
        return accounted_layout(LAYERS[model], pp * vp)
    if model == "DeepSeekV3":
        mapped = DSV3_MAP.get((pp, vp)) if _release(r) in ("25.11", REPORT_RELEASE) else None
        return mapped.format(m="" if "w/o MTP" in r["model"] else "m") if mapped else None
    return even_layout(LAYERS[model], pp * vp)


def _release(r: dict) -> str:
    releases = [name for name in A2A_OVERLAP if f"'{name} " in r["source"]]
    if len(releases) != 1:
        raise ValueError(f"row {r['index']}: source names no release of {sorted(A2A_OVERLAP)}")
    return releases[0]


SHARED_OVERLAP = ("DeepSeekV3",)
"""Models whose shared expert Megatron-Bridge runs beside the dispatch
(moe_shared_expert_overlap) wherever the all-to-all overlap is off: 25.11's DeepSeek provider
defaults it to True (src/megatron/bridge/models/deepseek/deepseek_provider.py at 1804c076f) and
its overlap override sets it False; 25.09's run_script.py sets it True without A2A_1F1B. Later
releases dispatch DeepSeek-V3's tokens with the flex dispatcher (FLEX), under which
Megatron-Bridge sets it False. Qwen3 and GPT-OSS have no shared expert."""


def _model_gpu(r: dict) -> tuple[str, str]:
    return r["model"].split(" (")[0], r["gpu"]


def release_settings(r: dict) -> str:
    """Engine settings (comma-led) of the row's release configuration (FLEX, TP_OVERLAP,
    A2A_OVERLAP, SHARED_OVERLAP)."""
    release = _release(r)
    flex = _model_gpu(r) in FLEX.get(release, ())
    dispatch = ",moe_dispatcher=" + ("deepep" if flex else "alltoall") \
        + (",tp_overlap=true" if _model_gpu(r) in TP_OVERLAP.get(release, ()) else "")
    if _model_gpu(r) not in A2A_OVERLAP[release]:
        return dispatch + (",moe_shared_overlap=true"
                           if _model_gpu(r)[0] in SHARED_OVERLAP and not flex else "")
    return dispatch + ",moe_overlap=true" + (",overlap_grad_reduce=false"
                                             if release == "25.09" else "")


OFFLOAD = {REPORT_RELEASE: {("DeepSeekV3", "GB200", "MXFP8")}}
"""Per release, the (model, GPU, precision) whose configuration keeps the optimizer states in host
memory (offload_optimizer): the Megatron-Core MoE report's DeepSeek-V3 on GB200 in MXFP8 (Table
18, "Optimizer states offloading" under GB200). Every other row keeps them on the GPUs."""


def _one_graph(r: dict) -> bool:
    """Whether the row's release configuration replays the whole iteration as one CUDA graph
    (FULL_ITERATION)."""
    return _model_gpu(r) in FULL_ITERATION.get(_release(r), ())


def host_op_s(r: dict, fitted: float) -> float:
    """The host time per op of the row's MoE layers: ``fitted``, or 0 where its release's
    configuration replays the whole iteration as one CUDA graph (FULL_ITERATION)."""
    return 0.0 if _one_graph(r) else fitted


def load_rows(path: str = DATA, first: int = 0) -> list[dict]:
    rows = read_rows(path)
    for r in rows:
        r["index"] += first
        base = r["model"].split(" (")[0]
        r["zoo"] = MODELS[base]
        if base == "DeepSeekV3" and "w/o MTP" not in r["model"]:
            r["zoo"] = "deepseek-v3-mtp"  # the recipes' default (MTP): every row not marked w/o
        r["variant"] = r["model"][len(base):].strip(" ()")
    return rows


def cluster_of(r: dict, memory: float | None = None):
    return nvidia_cluster(r["gpu"], int(r["gpus"]), memory)


def training_of(r: dict, moe_host_op_s: float = 0.0) -> TrainingSpec:
    dtype, recipe = PRECISION[r["precision"]]
    capacity = "1.0" if "tokendrop" in r["variant"] else "0"
    engine = engine_from_mapping(f"megatron-core,fp8_recipe={recipe},moe_imbalance=1.0,"
                                 f"moe_capacity_factor={capacity},"
                                 f"moe_host_op_s={host_op_s(r, moe_host_op_s)},"
                                 f"moe_bias_loop={str(not _one_graph(r)).lower()}"
                                 f"{software(r['source'])}{release_settings(r)}")
    return TrainingSpec(global_batch=int(r["gbs"]), seq_len=int(r["seq_len"]), dtype=dtype,
                        optimizer="adam", engine=engine)


def published_fix(r: dict, recompute: bool = True) -> str:
    """The row's published configuration as pins; ``recompute``: with its release's
    recomputation (RECOMPUTE), else recomputation left to the search."""
    tp, pp, cp, ep = (int(r[k] or 1) for k in ("tp", "pp", "cp", "ep"))
    vp = int(r["vp"] or 1)
    dp = int(r["gpus"]) // (tp * pp * cp)
    pins = [f"tp={tp}", f"pp={pp}", f"cp={cp}", f"ep={ep}", f"etp={int(r['etp'] or 1)}",
            f"dp={dp}", f"micro_batch={int(r['mbs'])}", "zero=1",
            f"offload_optimizer={'true' if _offloads(r) else 'false'}",
            f"sequence_parallel={'true' if tp > 1 else 'false'}"]
    if recompute:
        pins.append("recompute=" + RECOMPUTE[_release(r)].get(_model_gpu(r), "none"))
    if pp > 1:
        pins.append("schedule=interleaved-1f1b" if vp > 1 else "schedule=1f1b")
        pins.append(f"vpp={vp}")
    return ",".join(pins)


def _offloads(r: dict) -> bool:
    return (*_model_gpu(r), r["precision"]) in OFFLOAD.get(_release(r), ())


def predict(r: dict, prepared, *, fix: str | None, memory: float | None = BIG,
            moe_host_op_s: float = 0.0):
    options = SearchOptions(fix=parse_fix(fix) if fix else {}, top_k=0,
                            layout=layout_of(r) if fix else None)
    return plan_prepared(prepared, cluster_of(r, memory), training_of(r, moe_host_op_s), options)


def error(r: dict, prepared, moe_host_op_s: float) -> float:
    p = predict(r, prepared, fix=published_fix(r), moe_host_op_s=moe_host_op_s)
    return p.predicted["tokens_per_s"] / int(r["gpus"]) / float(r["tokens_per_s_per_gpu"]) - 1


def fit(rows: list[dict], prepared: dict) -> float:
    """moe_host_op_s minimizing the median |error| over ``rows``: 0..100 us in steps of 2 us, then
    0.25 us around the best."""
    def cost(h: float) -> float:
        return statistics.median(abs(error(r, prepared[key_of(r)], h)) for r in rows)

    coarse = min((2e-6 * i for i in range(51)), key=cost)
    return min((max(0.0, coarse - 2e-6 + 0.25e-6 * i) for i in range(17)), key=cost)


def fit_rows(rows: list[dict], mode: str) -> list[dict]:
    """Those of ``rows`` the host constant is fitted on: ``mode`` split (the reference data's
    half that published.split_by_configuration picks), all (all of them) or none; never a row
    from MORE."""
    half = split_by_configuration(load_rows())
    return [r for r in rows if r["index"] < MORE_INDEX and (
        mode == "all" or (mode == "split" and r["index"] in half))]


def key_of(r: dict) -> tuple:
    return (r["zoo"], int(r["seq_len"]), PRECISION[r["precision"]][0])


def on_device(r: dict, prepared, moe_host_op_s: float):
    """The published configuration on the real device (with its release's recomputation, else
    with the one the planner needs to fit it), or None when the planner thinks it does not
    fit."""
    for recompute in (True, False):
        try:
            return predict(r, prepared, fix=published_fix(r, recompute), memory=None,
                           moe_host_op_s=moe_host_op_s)
        except InfeasibleError:
            pass
    return None



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", help="comma-separated row numbers (default: all)")
    ap.add_argument("--no-search", action="store_true", help="skip the free search per row")
    ap.add_argument("--fit-rows", choices=["split", "all", "none"], default="split",
                    help="rows the host time per op is fitted on (none: 0, not modelled)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    # the token-drop rows carry their published capacity factor, which under the balanced routing
    # the benchmarks force drops nothing (the module docstring says so): the planner's warning
    # about it would come with every pricing
    # (and where the planner fits a published layout only with full recomputation, the overlap
    # its release sets is not run there: the fits column is what that check is for; where the
    # release leaves the overlap off, the hint that it could run is the release's choice)
    logging.getLogger("planner.api").addFilter(
        lambda record: not record.getMessage().startswith(("engine.moe_capacity_factor: under",
                                                           "engine.moe_overlap: not run by",
                                                           "engine.moe_overlap: off, and")))
    t0 = time.perf_counter()
    rows = load_rows() + load_rows(MORE, MORE_INDEX) + load_rows(NEWER, NEWER_INDEX) + \
        load_rows(REPORT, REPORT_INDEX)
    if args.rows:
        keep = {int(x) for x in args.rows.split(",")}
        rows = [r for r in rows if r["index"] in keep]
    prepared: dict = {}
    for r in rows:
        if key_of(r) not in prepared:
            prepared[key_of(r)] = prepare(r["zoo"], seq_len=key_of(r)[1], dtype=key_of(r)[2])
    fitted = fit_rows(rows, args.fit_rows)
    host = fit(fitted, prepared) if fitted else 0.0
    why = " among --rows" if args.rows and args.fit_rows != "none" else ""
    print(f"host time per op of an MoE layer: {host * 1e6:.2f} us"
          + (f" (fitted on rows {[r['index'] for r in fitted]})" if fitted
             else f" (not modelled: no rows to fit on{why})"))
    out = []
    for r in rows:
        prep = prepared[key_of(r)]
        p = predict(r, prep, fix=published_fix(r), moe_host_op_s=host)
        tps = p.predicted["tokens_per_s"] / int(r["gpus"])
        err = tps / float(r["tokens_per_s_per_gpu"]) - 1
        real = on_device(r, prep, host)
        line = {"r": r, "plan": p, "tps": tps, "err": err, "real": real, "fit": r in fitted,
                "fits": "no" if real is None else
                f"yes ({real.predicted['peak_memory_bytes'] / 1e9:.0f} GB)"
                if real.parallel["recompute"] == p.parallel["recompute"] else
                f"rc={real.parallel['recompute']} ({real.predicted['peak_memory_bytes'] / 1e9:.0f} GB)"}
        if not args.no_search and r["index"] < MORE_INDEX:
            t1 = time.perf_counter()
            try:
                free = predict(r, prep, fix=None, memory=None, moe_host_op_s=host)
                line["search"] = (free, time.perf_counter() - t1)
            except InfeasibleError as exc:
                line["search"] = (None, str(exc).splitlines()[0][:80])
        out.append(line)
    report(out, args.markdown)
    print(f"\n(benchmark took {time.perf_counter() - t0:.0f} s)")
    return 0


def _set_of(o: dict) -> str:
    """The row's set: fit or held out (the reference data), not in data (MORE), newer (NEWER) or
    report (REPORT)."""
    index = o["r"]["index"]
    return ("fit" if o["fit"] else "held out") if index < MORE_INDEX else \
        "not in data" if index < NEWER_INDEX else "newer" if index < REPORT_INDEX else "report"


def report(out: list[dict], markdown: bool) -> None:
    head = ["#", "model", "gpu", "gpus", "prec", "tp/pp/vp/cp/ep", "mbs/gbs", "published tok/s/GPU",
            "predicted", "error", "set", "fits", "largest part"]
    lines = []
    for o in out:
        r, p = o["r"], o["plan"]
        bd = p.predicted["breakdown"]
        part = max(bd, key=bd.get)
        lines.append([str(r["index"]), r["model"], r["gpu"], r["gpus"],
                      r["precision"].split(" (")[0],
                      f"{r['tp']}/{r['pp']}/{r['vp']}/{r['cp']}/{r['ep']}", f"{r['mbs']}/{r['gbs']}",
                      r["tokens_per_s_per_gpu"], f"{o['tps']:.0f}", f"{100 * o['err']:+.1f}%",
                      _set_of(o), o["fits"],
                      f"{part} {100 * bd[part] / p.step_time_s:.0f}%"])
    print_table(head, lines, markdown)
    print()
    ours = [o for o in out if o["r"]["index"] < MORE_INDEX]
    more = [o for o in out if MORE_INDEX <= o["r"]["index"] < NEWER_INDEX]
    newer = [o for o in out if NEWER_INDEX <= o["r"]["index"] < REPORT_INDEX]
    reported = [o for o in out if o["r"]["index"] >= REPORT_INDEX]
    for label, chosen in (("held-out rows", [o for o in ours if not o["fit"]]),
                          ("fit rows", [o for o in ours if o["fit"]]), ("all rows", ours),
                          ("not in data", more), ("newer", newer), ("report", reported)):
        if not chosen:
            continue
        by_gen: dict[str, list[float]] = {}
        for o in chosen:
            by_gen.setdefault(o["r"]["gpu"], []).append(o["err"])
        print_errors(by_gen, markdown, f"{label:>13}")
    if newer:  # by release (with or without host time per op) and by model
        by_release: dict[str, list[float]] = {}
        by_model: dict[str, list[float]] = {}
        for o in newer:
            graph = "one graph" if host_op_s(o["r"], 1.0) == 0.0 else "host ops"
            by_release.setdefault(f"{_release(o['r'])} ({graph})", []).append(o["err"])
            by_model.setdefault(o["r"]["zoo"], []).append(o["err"])
        print_errors(by_release, markdown, f"{'newer':>13}", total=False)
        print_errors(by_model, markdown, f"{'newer':>13}", total=False)
    searched = [o for o in out if "search" in o]
    if not searched:
        return
    print("\nFree search vs the published configuration, both under the planner's cost model and "
          "its memory check\n(the published configuration with its release's recomputation, or "
          "where that does not fit with the one the planner needs):\n")
    head = ["#", "model", "gpu"] + SEARCH_HEAD
    lines = []
    for o in searched:
        free, info = o["search"]
        lines.append([str(o["r"]["index"]), o["r"]["model"], o["r"]["gpu"]] + search_cells(
            o["real"], free, info if free is not None else 0.0, "" if free else info))
    print_table(head, lines, markdown)



if __name__ == "__main__":
    sys.exit(main())
