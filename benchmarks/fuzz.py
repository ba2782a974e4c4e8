"""Fuzz the planner: random models, clusters, batches and pins through the Python API, and random
and mutated inputs through the `plan` command, by the ten thousand.

Every case must end in one of the documented outcomes:

- API (``planner.plan``, ``planner.prepare`` + ``planner.plan_prepared``): a Plan that passes its
  invariants (below), or ``SpecError`` (bad input) or ``InfeasibleError`` (nothing fits);
- CLI (``planner.cli.main.main(argv)`` called in this process, stdout and stderr captured): exit 0;
  exit 2 with one line ``plan: error: ...`` as the last line of stderr (argparse's own usage errors,
  ``plan <command>: error: ...``, are counted apart as "usage"); exit 3 with one line
  ``plan: no plan: ...``. Never exit 1, another code, a traceback or an exception out of ``main``;
  no output file left half-written (an existing ``-o`` file is unchanged unless the command
  succeeded, no stray temporary files, nothing written where the command failed).

Plan invariants (``plan_violations``): the stages' ranks partition the cluster's GPUs (dp x tp x pp
= GPUs; the stages of one pipeline rank share its dp x tp ranks; pipeline ranks are disjoint), each
model block sits in exactly one stage and every block edge runs forward, dp x micro-batch x
micro-batches = the global batch, each stage's memory and the peak fit the device's usable memory
(``planner.search.costs.capacity_bytes``), 0 < MFU <= 1, positive and finite times and rates that
agree with the batch, a per-rank schedule that runs every (stage, micro-batch) forward and backward
exactly once on the stage's own rank, pins and target honoured (by the plan and its runners-up),
the schema holds, and the same inputs give the same JSON bytes on a second run. Recommendation
models (``cli:recsys``: the zoo's, with --fix sharding=/zero=, --table-optimizer, --pipeline and
tables YAML files right or wrong): every table's shards tile its rows and columns on ranks of the
cluster, positive per-rank times, the dense part's ZeRO stage as pinned and as `parallel` says,
the step the larger of the host's and the device's time (``recsys_output_problems``).

A case is built from ``(--seed, case number)`` alone, so ``--case N`` rebuilds and reruns one case
(``--keep DIR`` keeps its files). Models are small (built on the meta device): a pool of random
Hugging Face configs (llama, qwen2, gpt2, bert, mixtral, opt, t5) and ``nn.Module`` factories
(benchmarks/data/fuzz/models.py) traced once into a private trace cache; the cases then plan them on
random clusters (presets resized, random YAML clusters, heterogeneous groups), batches and pins.

Usage:  python benchmarks/fuzz.py [--cases 10000] [--seed 0] [--workers 2] [--only api|cli]
                                  [--case N] [--keep DIR] [--timeout 120] [-v]

Prints the number of cases, the count of each outcome (ok / bad input / no plan / unexpected), each
unexpected case with its reproduction, cases slower than 10 s, the run time and the slowest case.
Exit status 1 when any case was unexpected.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import io
import json
import math
import multiprocessing as mp
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
DATA = os.path.join(HERE, "data", "fuzz")
MODELS_PY = os.path.join(DATA, "models.py")
CALIBRATION = os.path.join(DATA, "calibration.json")

SLOW_S = 10.0
"""A case slower than this is reported (issue 15: any fuzz case plans in seconds)."""
POOL_SIZE = 24
"""Random models traced once and planned by many cases (fixed: ``--case N`` needs no --cases)."""

# Outcomes.
OK, BAD, NO_PLAN, UNEXPECTED = "ok", "bad input", "no plan", "unexpected"


# ----------------------------------------------------------------------------------------------
# Random inputs. Each generator takes ``r``, a random.Random (or hypothesis' st.randoms()), and
# uses only r.random, r.randint, r.choice, r.sample and r.shuffle.
# ----------------------------------------------------------------------------------------------

HF_FAMILIES = ("llama", "qwen2", "gpt2", "bert", "mixtral", "opt", "t5")
PRESETS = ("dgx-a100-80g", "dgx-a100-40g", "dgx-h100", "hgx-h200", "dgx1-v100", "l4-8",
           "pcie-4090", "cpu")
DEVICE_PRESETS = ("a100-40g", "a100-80g", "h100", "h200", "v100", "l4", "rtx4090", "cpu")
from costmodels.memory import RECOMPUTE  # noqa: E402 - after the path is set; no torch here
from costmodels.pipeline import SCHEDULES  # noqa: E402
from planner.options import CP_COMMS, DTYPES, FIX_KEYS, OPTIMIZERS, PLACEMENTS  # noqa: E402
from planner.targets import TARGETS as TARGET_NAMES  # noqa: E402

SIMULATED_SCHEDULES = SCHEDULES + ("bidirectional",)
"""Schedules `plan simulate` runs (planner.schedule.builders.BUILDERS): the search's and more."""
ZOO = ("gpt2", "bert-large", "llama3-8b", "mixtral-8x7b", "gpt3-175b", "gpt-1.7b")
"""Zoo models the cases plan (traced once while setting up)."""


def weighted(r, table):
    """One key of ``table`` (key -> weight)."""
    total = sum(table.values())
    x = r.random() * total
    for key, w in table.items():
        x -= w
        if x < 0:
            return key
    return key


def junk(r):
    """A value of the wrong kind."""
    return r.choice(["", "x", "-1", "1e999", "nan", None, [], {}, [1, 2], {"a": 1}, True, -7, 0,
                     2.5, float("inf"), 10 ** 30, "\u00e9\u4e2d", "8 ", "0x10"])


def hf_config(r, *, invalid: float = 0.0):
    """A tiny random Hugging Face config, its sequence length (None: the model's default) and the
    reasons it is invalid (empty when valid). ``invalid``: the chance of one bad value."""
    family = r.choice(HF_FAMILIES)
    heads = r.choice((1, 2, 4, 8))
    head_dim = r.choice((4, 8, 16, 32))
    if family == "mixtral":  # grouped GEMMs of experts need rows of 16 bytes or more
        head_dim = max(head_dim, 16 // heads, 8)
    hidden = heads * head_dim
    layers = r.randint(1, 6)
    ffn = 16 * r.randint(1, 16)
    vocab = r.choice((16, 100, 257, 1000, 4096, 32000))
    positions = r.choice((32, 64, 128, 256, 512))
    if family in ("llama", "qwen2", "mixtral"):
        cfg = {"model_type": family, "num_hidden_layers": layers, "hidden_size": hidden,
               "intermediate_size": ffn, "num_attention_heads": heads,
               "num_key_value_heads": r.choice([k for k in (1, 2, 4, 8) if heads % k == 0]),
               "vocab_size": vocab, "max_position_embeddings": positions,
               "tie_word_embeddings": r.random() < 0.3}
        if family == "mixtral":
            experts = r.randint(2, 8)
            cfg.update(num_local_experts=experts, num_experts_per_tok=r.randint(1, experts))
        layer_key, heads_key, size_key = "num_hidden_layers", "num_attention_heads", "hidden_size"
    elif family == "gpt2":
        cfg = {"model_type": "gpt2", "n_layer": layers, "n_embd": hidden, "n_head": heads,
               "vocab_size": vocab, "n_positions": positions, "bos_token_id": 0, "eos_token_id": 0}
        layer_key, heads_key, size_key = "n_layer", "n_head", "n_embd"
    elif family == "bert":
        cfg = {"model_type": "bert", "num_hidden_layers": layers, "hidden_size": hidden,
               "intermediate_size": ffn, "num_attention_heads": heads, "vocab_size": vocab,
               "max_position_embeddings": positions}
        layer_key, heads_key, size_key = "num_hidden_layers", "num_attention_heads", "hidden_size"
    elif family == "opt":
        cfg = {"model_type": "opt", "num_hidden_layers": layers, "hidden_size": hidden,
               "ffn_dim": ffn, "num_attention_heads": heads, "vocab_size": vocab,
               "max_position_embeddings": positions, "word_embed_proj_dim": hidden}
        layer_key, heads_key, size_key = "num_hidden_layers", "num_attention_heads", "hidden_size"
    else:  # t5: relative positions, no learned limit
        cfg = {"model_type": "t5", "d_model": hidden, "d_ff": ffn, "d_kv": head_dim,
               "num_layers": layers, "num_decoder_layers": r.randint(1, 4), "num_heads": heads,
               "vocab_size": vocab, "decoder_start_token_id": 0, "pad_token_id": 0}
        layer_key, heads_key, size_key = "num_layers", "num_heads", None
        positions = 0
    seq_len = None if r.random() < 0.4 else r.randint(1, positions or 512)
    bad: list[str] = []
    if r.random() < invalid:
        kind = r.choice(("negative layers", "zero size", "negative vocab", "string size",
                         "unknown model_type", "no model_type", "heads do not divide",
                         "kv heads do not divide", "experts per token", "seq_len too long",
                         "seq_len zero", "float size"))
        if kind == "negative layers":
            cfg[layer_key] = -r.randint(1, 3)
        elif kind == "zero size":
            cfg[size_key or "d_model"] = 0
        elif kind == "negative vocab":
            cfg["vocab_size"] = -r.randint(1, 100)
        elif kind == "string size":
            cfg[size_key or "d_model"] = r.choice(("sixty-four", "", "[64]"))
        elif kind == "unknown model_type":
            cfg["model_type"] = r.choice(("llamma", "gpt-5", "", "GPT2"))
        elif kind == "no model_type":
            del cfg["model_type"]
        elif kind == "heads do not divide" and family in ("gpt2", "bert", "opt"):
            cfg[heads_key] = hidden + 1
        elif kind == "kv heads do not divide" and family in ("llama", "qwen2", "mixtral") \
                and heads > 1:
            cfg["num_key_value_heads"] = heads + 1
        elif kind == "experts per token" and family == "mixtral":
            cfg["num_experts_per_tok"] = cfg["num_local_experts"] + r.randint(1, 3)
        elif kind == "seq_len too long" and family in ("gpt2", "bert", "opt"):  # learned positions
            seq_len = positions + r.randint(1, 1000)
        elif kind == "seq_len zero":
            seq_len = r.choice((0, -1))
        elif kind == "float size":
            cfg[size_key or "d_model"] = hidden + 0.5
        else:
            kind = ""
        if kind:
            bad.append(kind)
    return cfg, seq_len, bad


def module_dims(r):
    """A random nn.Module of benchmarks/data/fuzz/models.py: (kind, dims, seq_len)."""
    kind = r.choice(("mlp", "mlp", "towers", "encoder", "conv"))
    heads = r.choice((1, 2, 4))
    dims = {"vocab": r.choice((16, 64, 500, 4096)), "width": heads * r.choice((4, 8, 16, 32)),
            "depth": r.randint(1, 5), "ffn": 8 * r.randint(1, 16)}
    if kind == "encoder":
        dims["heads"] = heads
    if kind == "conv":
        dims["image"] = r.choice((4, 8, 16))
    frozen = r.choice(("", "", "lower", "most"))  # fine-tuning: part of the weights frozen
    if frozen:
        dims["frozen"] = frozen
    return kind, dims, r.choice((1, 8, 16, 32, 64))


def cluster_mapping(r, *, small_memory: bool | None = None) -> dict:
    """A homogeneous cluster in its YAML form, valid."""
    if small_memory is None:
        small_memory = r.random() < 0.3
    if r.random() < 0.5:
        device = r.choice(DEVICE_PRESETS)
    else:
        peaks = {dt: round(r.choice((0.1, 1, 19.5, 125, 312, 989)) * (0.5 + r.random()), 3)
                 for dt in (DTYPES if r.random() < 0.6 else r.sample(DTYPES, r.randint(1, 3)))}
        device = {"name": f"dev{r.randint(0, 99)}",
                  # near the 1 GB reserve: a few MB to a few hundred MB usable, so that tiny
                  # models need pipelines, ZeRO or recomputation to fit
                  "memory_GB": round(1.06 + r.random() * 0.3, 4) if small_memory
                  else r.choice((8, 16, 24, 40, 80, 141)),
                  "peak_TFLOPs": peaks, "hbm_GBps": r.choice((20, 300, 900, 2039, 4800))}
        if r.random() < 0.3:
            device["matmul_efficiency"] = round(0.05 + 0.95 * r.random(), 3)
    out = {"name": f"fuzz-{r.randint(0, 999)}", "device": device,
           "nodes": r.choice((1, 1, 2, 3, 4, 8, 16)),
           "gpus_per_node": r.choice((1, 2, 3, 4, 8, 8, 16)),
           "intra_node": link(r), "inter_node": link(r)}
    if r.random() < 0.2:
        out["description"] = "random"
    return out


def link(r) -> dict:
    out = {"bandwidth_GBps": r.choice((0.1, 1.25, 12.5, 25, 50, 150, 300, 450)),
           "latency_us": r.choice((0, 1, 3, 10, 50, 500))}
    if r.random() < 0.3:
        out["efficiency"] = round(0.1 + 0.9 * r.random(), 3)
    return out


def hetero_mapping(r) -> dict:
    """A cluster of 2-3 groups of nodes, valid."""
    groups = []
    for i in range(r.randint(2, 3)):
        g = cluster_mapping(r, small_memory=r.random() < 0.2)
        g = {"name": f"g{i}", "device": g["device"], "nodes": r.randint(1, 3),
             "gpus_per_node": r.choice((1, 2, 4, 8)), "intra_node": g["intra_node"]}
        if r.random() < 0.3:
            g["inter_node"] = link(r)
        groups.append(g)
    out = {"name": "fuzz-hetero", "groups": groups, "inter_node": link(r)}
    if r.random() < 0.7:
        out["inter_group"] = link(r)
    return out


def mutate(r, obj, notes: list | None = None):
    """A copy of a JSON-like ``obj`` with 1-3 random changes: a key removed, a value of the wrong
    kind or out of range, a list cut or repeated, an unknown key. ``notes`` gets one line per
    change (the key path and what it became)."""
    obj = copy.deepcopy(obj)
    notes = [] if notes is None else notes
    for _ in range(r.randint(1, 3)):
        paths = list(_paths(obj))
        if not paths:
            obj = junk(r)
            notes.append(f"the whole document -> {obj!r}")
            return obj
        path = r.choice(paths)
        parent, key = _parent(obj, path)
        where = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path).lstrip(".")
        op = r.choice(("delete", "junk", "number", "number", "list", "unknown key", "type"))
        value = parent[key]
        if op == "delete":
            if isinstance(parent, dict):
                del parent[key]
            else:
                parent.pop(key)
            notes.append(f"{where} removed")
            continue
        if op == "number":
            new = r.choice((0, -1, -0.5, 1e-300, 1e300, 10 ** 18, 3, 7, 0.999, float("nan"),
                            float("-inf")))
        elif op == "list" and isinstance(value, list) and value:
            new = r.choice((value[:r.randint(0, len(value) - 1)], value + value,
                            list(reversed(value)), [value[0]] * 3))
        elif op == "unknown key" and isinstance(value, dict):
            new = dict(value)
            new[r.choice(("extra", "Nodes", "gpus", "devcie"))] = 1
        elif op == "type":
            new = str(value) if not isinstance(value, str) else r.choice((1, [value], {"v": value}))
        else:
            new = junk(r)
        parent[key] = new
        notes.append(f"{where} = {json.dumps(new)[:120]}")
    return obj


def _paths(obj, prefix=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:8]):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


def _parent(obj, path):
    for k in path[:-1]:
        obj = obj[k]
    return obj, path[-1]


def mutate_text(r, text: str) -> bytes:
    """The bytes of ``text`` damaged: cut, garbage, a line dropped or repeated, wrong encoding."""
    data = text.encode()
    op = r.choice(("truncate", "garbage", "binary", "flip", "line", "empty", "utf16", "bom",
                   "indent", "tab"))
    if op == "truncate":
        return data[:r.randint(0, max(0, len(data) - 1))]
    if op == "garbage":
        at = r.randint(0, len(data))
        return data[:at] + bytes(r.randint(0, 255) for _ in range(r.randint(1, 20))) + data[at:]
    if op == "binary":
        return bytes(r.randint(0, 255) for _ in range(r.randint(1, 300)))
    if op == "flip":
        b = bytearray(data)
        for _ in range(r.randint(1, 5)):
            if b:
                b[r.randint(0, len(b) - 1)] = r.randint(0, 255)
        return bytes(b)
    if op == "line":
        lines = text.splitlines(keepends=True)
        if lines:
            i = r.randint(0, len(lines) - 1)
            lines = lines[:i] + (lines[i:i + 1] * 2 if r.random() < 0.5 else []) + lines[i + 1:]
        return "".join(lines).encode()
    if op == "empty":
        return r.choice((b"", b"   \n", b"null\n", b"[]\n", b"42\n", b"- a\n- b\n"))
    if op == "utf16":
        return text.encode("utf-16")
    if op == "bom":
        return b"\xef\xbb\xbf" + data
    if op == "indent":
        return "\n".join("  " * r.randint(0, 2) + ln for ln in text.splitlines()).encode()
    return text.replace(" ", "\t", r.randint(1, 5)).encode()


def pins(r, *, invalid: float = 0.1):
    """Random --fix pins as a dict (or a 'k=v,...' string) and the reasons they are invalid."""
    keys = r.sample(FIX_KEYS, r.choice((0, 0, 1, 1, 1, 2, 2, 3, 4)))
    fix, bad = {}, []
    for k in keys:
        if k in ("dp", "tp", "pp", "micro_batch"):
            fix[k] = r.choice((1, 1, 2, 2, 4, 8, 3, 16, 5, 64))
        elif k == "vpp":
            fix[k] = r.choice((1, 2, 3, 4))
        elif k in ("cp", "ep", "etp"):
            fix[k] = r.choice((1, 1, 2, 4, 8))
        elif k == "cp_comm":
            fix[k] = r.choice(CP_COMMS)
        elif k == "schedule":
            fix[k] = r.choice(SCHEDULES)
        elif k == "recompute":
            fix[k] = r.choice(RECOMPUTE)
        elif k == "zero":
            fix[k] = r.randint(0, 3)
        elif k == "placement":
            fix[k] = r.choice(PLACEMENTS)
        else:
            fix[k] = r.random() < 0.5
    if r.random() < invalid:
        k = r.choice(FIX_KEYS + ("tpp", "DP"))
        v = {"dp": r.choice((0, -2, "two", 1.5)), "tp": r.choice((0, -1, "x")),
             "pp": r.choice((0, -4, "")), "vpp": r.choice((0, -1, "many")),
             "micro_batch": r.choice((0, -1, "big")), "schedule": r.choice(("1F1B", "ring", "")),
             "recompute": r.choice(("all", "yes", "")), "zero": r.choice((4, -1, "three")),
             "sequence_parallel": r.choice(("maybe", 2, "")),
             "offload_optimizer": r.choice(("perhaps", 7)), "cp": r.choice((0, -2, 1.5)),
             "ep": r.choice((0, "x")), "etp": r.choice((-1, 2.5)),
             "cp_comm": r.choice(("ring", "", "A2A")),
             "placement": r.choice(("tp-dp", "", "pp-dp-tp"))}.get(k, 1)
        fix[k] = v
        bad.append(f"fix {k}={v!r}")
    if fix and r.random() < 0.4:
        return ",".join(f"{k}={_pin_text(v)}" for k, v in fix.items()), bad
    return fix, bad


def _pin_text(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def batch(r) -> int:
    return weighted(r, {1: 1, r.randint(1, 64): 6, r.randint(65, 4096): 4, 2 ** r.randint(0, 12): 4,
                        r.randint(4097, 150000): 1, 1048576: 0.3})


# ----------------------------------------------------------------------------------------------
# Plan invariants
# ----------------------------------------------------------------------------------------------

ACTION = re.compile(r"^(\d+)([FBWI])(\d+)$")
REL = 1e-5
"""Plan files round floats to 6 significant digits: comparisons allow this much."""


def capacities(cluster) -> dict:
    """Usable bytes per GPU, by group name ('' for a homogeneous cluster), as the search computes
    them (planner.search.costs.capacity_bytes with the default reserves)."""
    from planner.options import SearchOptions
    from planner.search.costs import capacity_bytes

    groups = getattr(cluster, "groups", None)
    if groups:
        return {g.name: capacity_bytes(g, SearchOptions()) for g in groups}
    return {"": capacity_bytes(cluster, SearchOptions())}


def plan_violations(d: dict, *, cluster=None, edges=None, fix=None, target=None,
                    training=None) -> list[str]:
    """What is wrong with plan dict ``d`` (empty: nothing). ``cluster``: the Cluster planned for
    (else the plan's own cluster section is trusted); ``edges``: (src, dst) block names; ``fix``:
    the parsed pins; ``target``: the engine name; ``training``: the inputs' global_batch, seq_len,
    dtype, optimizer (None values are not checked)."""
    v: list[str] = []
    try:
        _check_plan(d, v, cluster, edges, fix, target, training or {})
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        v.append(f"plan malformed: {type(exc).__name__}: {exc}")
    return v


def _close(a, b) -> bool:
    return abs(a - b) <= REL * max(abs(a), abs(b), 1e-300)


def _check_plan(d, v, cluster, edges, fix, target, training):
    par, stages, pred = d["parallel"], d["stages"], d["predicted"]
    dp, tp, pp, vpp = par["dp"], par["tp"], par["pp"], par["vpp"]
    cp, ep, etp = par.get("cp", 1), par.get("ep", 1), par.get("etp", 1)
    mb, nmb = par["micro_batch"], par["num_microbatches"]
    n = cluster.num_gpus if cluster is not None else d["cluster"]["num_gpus"]
    if d["cluster"]["num_gpus"] != n:
        v.append(f"cluster.num_gpus {d['cluster']['num_gpus']} != the cluster's {n}")
    if dp * cp * tp * pp != n:
        v.append(f"dp x cp x tp x pp = {dp}x{cp}x{tp}x{pp} = {dp * cp * tp * pp} != {n} GPUs")
    if (dp * cp * tp) % (ep * etp):
        v.append(f"ep x etp = {ep}x{etp} does not divide dp x cp x tp = {dp * cp * tp}")
    if dp * mb * nmb != d["training"]["global_batch"]:
        v.append(f"dp x micro_batch x micro-batches = {dp}x{mb}x{nmb} != global batch "
                 f"{d['training']['global_batch']}")
    for key, want in training.items():
        if want is not None and d["training"].get(key) != want:
            v.append(f"training.{key} {d['training'].get(key)!r} != input {want!r}")
    # ranks
    if sorted(s["index"] for s in stages) != list(range(pp * vpp)):
        v.append(f"stage indices {[s['index'] for s in stages]} != 0..{pp * vpp - 1}")
    by_rank: dict[int, list] = {}
    for s in stages:
        by_rank.setdefault(s["pipeline_rank"], []).append(s)
        if len(s["ranks"]) != dp * cp * tp:
            v.append(f"stage {s['index']} has {len(s['ranks'])} ranks, not dp x cp x tp = "
                     f"{dp * cp * tp}")
    if sorted(by_rank) != list(range(pp)):
        v.append(f"pipeline ranks {sorted(by_rank)} != 0..{pp - 1}")
    seen: list[int] = []
    for r_, group in sorted(by_rank.items()):
        if len(group) != vpp:
            v.append(f"pipeline rank {r_} holds {len(group)} stages, not vpp = {vpp}")
        if any(sorted(s["ranks"]) != sorted(group[0]["ranks"]) for s in group):
            v.append(f"stages of pipeline rank {r_} sit on different ranks")
        seen += group[0]["ranks"]
    if sorted(seen) != list(range(n)):
        dup = [x for x, c in Counter(seen).items() if c > 1]
        v.append(f"ranks do not partition 0..{n - 1}: {len(seen)} ranks, duplicates {dup[:5]}, "
                 f"missing {sorted(set(range(n)) - set(seen))[:5]}")
    # blocks
    names = [b["name"] for b in d["model"]["blocks"]]
    where: dict[str, int] = {}
    for s in sorted(stages, key=lambda s: s["index"]):
        if not s["blocks"]:
            v.append(f"stage {s['index']} holds no block")
        for b in s["blocks"]:
            if b in where:
                v.append(f"block {b} in stages {where[b]} and {s['index']}")
            where[b] = s["index"]
    if set(where) != set(names):
        v.append(f"blocks in stages != model blocks: missing "
                 f"{sorted(set(names) - set(where))[:3]}, "
                 f"unknown {sorted(set(where) - set(names))[:3]}")
    for src, dst in edges or ():
        if src in where and dst in where and where[src] > where[dst]:
            v.append(f"edge {src} -> {dst} runs backward: stage {where[src]} -> {where[dst]}")
    # memory
    caps = capacities(cluster) if cluster is not None else None
    peak = pred["peak_memory_bytes"]
    if not (peak > 0 and math.isfinite(peak)):
        v.append(f"peak_memory_bytes {peak!r}")
    if caps is not None:
        if peak > max(caps.values()) * (1 + REL):
            v.append(f"peak memory {peak:.6g} B > usable {max(caps.values()):.6g} B")
        for s in stages:
            cap = (caps.get(s.get("group", ""), caps.get("")) if len(caps) > 1
                   else next(iter(caps.values())))
            total = s["predicted"]["memory_bytes"]["total"]
            if cap is not None and total > cap * (1 + REL):
                v.append(f"stage {s['index']} memory {total:.6g} B > usable {cap:.6g} B")
    # rates and times
    mfu = pred["mfu"]
    if not 0 < mfu <= 1:
        v.append(f"mfu {mfu!r} not in (0, 1]")
    for key in ("step_time_s", "samples_per_s", "tokens_per_s", "tflops_per_device"):
        x = pred[key]
        if not (isinstance(x, (int, float)) and x > 0 and math.isfinite(x)):
            v.append(f"predicted.{key} {x!r} not positive and finite")
    for key, x in pred.get("breakdown", {}).items():
        if not (x >= 0 and math.isfinite(x)):
            v.append(f"breakdown.{key} {x!r} negative or not finite")
    for s in stages:
        for key, x in s["predicted"].items():
            number = isinstance(x, (int, float)) and not isinstance(x, bool)
            if number and not (x >= 0 and math.isfinite(x)):
                v.append(f"stage {s['index']} predicted.{key} {x!r}")
        if not s["predicted"].get("time_per_microbatch_s", 1) > 0:
            v.append(f"stage {s['index']} time_per_microbatch_s not positive")
    gb, seq = d["training"]["global_batch"], d["training"]["seq_len"]
    if pred["step_time_s"] > 0 and not _close(pred["samples_per_s"], gb / pred["step_time_s"]):
        v.append(f"samples_per_s {pred['samples_per_s']} != global batch / step time "
                 f"{gb / pred['step_time_s']:.6g}")
    if not _close(pred["tokens_per_s"], pred["samples_per_s"] * seq):
        v.append(f"tokens_per_s {pred['tokens_per_s']} != samples_per_s x seq_len")
    # schedule
    _check_schedule(d, v, by_rank, pp, vpp, nmb)
    # search
    if d["search"]["status"] not in ("optimal", "feasible"):
        v.append(f"search.status {d['search']['status']!r}")
    # pins and target, for the plan and each runner-up
    if target is not None and d["search"].get("target", target) != target:
        v.append(f"search.target {d['search'].get('target')!r} != {target!r}")
    _check_config(par, "the plan", v, fix, target)
    caps_max = max(caps.values()) if caps is not None else None
    for i, alt in enumerate(d["search"].get("alternatives") or ()):
        where = f"runner-up {i + 1}"
        ap = alt["parallel"]
        _check_config(ap, where, v, fix, target)
        if ap["dp"] * ap.get("cp", 1) * ap["tp"] * ap["pp"] != n:
            v.append(f"{where}: dp x cp x tp x pp != {n} GPUs")
        if ap["dp"] * ap["micro_batch"] * ap["num_microbatches"] != gb:
            v.append(f"{where}: dp x micro_batch x micro-batches != global batch {gb}")
        if caps_max is not None and alt["peak_memory_bytes"] > caps_max * (1 + REL):
            v.append(f"{where}: peak memory {alt['peak_memory_bytes']:.6g} B > usable "
                     f"{caps_max:.6g} B")
        if not alt["step_time_s"] > 0:
            v.append(f"{where}: step_time_s {alt['step_time_s']!r}")


def _check_config(par: dict, where: str, v: list, fix, target) -> None:
    """``par`` (a plan's or a runner-up's parallel section) keeps to the pins and the target."""
    from planner.targets import ENGINES

    for key, want in (fix or {}).items():
        if key == "schedule" and par["pp"] == 1:
            continue  # one stage: no pipeline schedule to honour
        if key == "cp_comm" and par.get("cp", 1) == 1:
            continue  # no context parallelism: no exchange to honour
        if par.get(key) != want:
            v.append(f"{where}: pinned {key}={want!r} but it has {par.get(key)!r}")
    eng = ENGINES.get(target) if target else None
    if eng is None:
        return
    if par["pp"] > 1 and par["schedule"] not in eng.schedules:
        v.append(f"{where}: target {target} does not run schedule {par['schedule']}")
    if par["dp"] > 1 and par["zero"] not in (eng.zero_with_pp if par["pp"] > 1 else eng.zero):
        v.append(f"{where}: target {target} does not run ZeRO-{par['zero']} (pp={par['pp']})")
    if par["offload_optimizer"] and not eng.offload:
        v.append(f"{where}: target {target} does not offload the optimizer")
    if par["tp"] > 1 and par["sequence_parallel"] not in eng.sequence_parallel:
        v.append(f"{where}: target {target} does not run sequence_parallel="
                 f"{par['sequence_parallel']}")
    if par.get("cp", 1) > 1 and par.get("cp_comm") not in eng.cp_comms:
        v.append(f"{where}: target {target} does not run cp_comm={par.get('cp_comm')}")
    if par.get("cp", 1) > 1 and not eng.cp_with_tp_pp and (par["tp"] > 1 or par["pp"] > 1):
        v.append(f"{where}: target {target} runs cp with data parallelism only")
    if par.get("ep", 1) > 1 and not eng.expert_parallel:
        v.append(f"{where}: target {target} runs no expert parallelism")
    if par.get("etp", 1) > 1 and not eng.expert_tensor_parallel:
        v.append(f"{where}: target {target} does not split experts' matrices")


def _check_schedule(d, v, by_rank, pp, vpp, nmb):
    actions = d["schedule"]["actions"]
    if len(actions) != pp:
        v.append(f"schedule has {len(actions)} rank lists, not pp = {pp}")
        return
    rank_of = {s["index"]: s["pipeline_rank"] for group in by_rank.values() for s in group}
    split = d["schedule"]["name"] == "zb-h1"
    for r_, acts in enumerate(actions):
        count: Counter = Counter()
        first: dict = {}
        for i, a in enumerate(acts):
            m = ACTION.match(a)
            if not m:
                v.append(f"rank {r_}: action {a!r} is not <stage><F|B|W><mb>")
                return
            stage, kind, micro = int(m[1]), m[2], int(m[3])
            if rank_of.get(stage) != r_:
                v.append(f"rank {r_} runs {a}, a stage of rank {rank_of.get(stage)}")
            if not 0 <= micro < nmb:
                v.append(f"rank {r_}: {a} names micro-batch {micro} of {nmb}")
            count[(stage, kind, micro)] += 1
            first.setdefault((stage, kind, micro), i)
        for stage in (s for s, rk in rank_of.items() if rk == r_):
            for micro in range(nmb):
                f = count[(stage, "F", micro)]
                b = count[(stage, "B", micro)] + count[(stage, "I", micro)]
                w = count[(stage, "W", micro)]
                if f != 1 or b != 1 or w > 1 or (split and w != 1 and pp > 1):
                    v.append(f"rank {r_}: stage {stage} micro-batch {micro} runs F x{f}, B x{b}, "
                             f"W x{w}")
                    return
                key_b = (stage, "B", micro) if (stage, "B", micro) in first else (stage, "I", micro)
                if first[(stage, "F", micro)] > first[key_b]:
                    v.append(f"rank {r_}: {stage}B{micro} before {stage}F{micro}")
                    return


# ----------------------------------------------------------------------------------------------
# The workspace: pool models, seed plans, a read-only folder, the trace cache
# ----------------------------------------------------------------------------------------------


_MODELS: list = []


def fuzz_models():
    """benchmarks/data/fuzz/models.py, loaded once under its own name."""
    if not _MODELS:
        import importlib.util

        spec = importlib.util.spec_from_file_location("planner_fuzz_models", MODELS_PY)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _MODELS.append(module)
    return _MODELS[0]


def rng_for(seed: int, *parts):
    import random

    return random.Random(hashlib.sha256(repr((seed,) + parts).encode()).hexdigest())


@dataclass
class PoolModel:
    index: int
    spec: str
    """MODEL as the CLI takes it: a config.json path or file.py:build."""
    form: str
    """hf or factory."""
    seq_len: int | None
    config: dict = field(default_factory=dict)
    """The HF config, or {kind, dims} of a factory."""


class Workspace:
    """Files the cases share: made once from the seed (by the parent), read by the workers."""

    def __init__(self, root: str, seed: int):
        self.root, self.seed = root, seed
        self.cache = os.path.join(root, "cache", "planner", "traces")
        self.readonly = os.path.join(root, "readonly")
        self.cases = os.path.join(root, "cases")
        self.pool = [self._pool_model(i) for i in range(POOL_SIZE)]
        self.plans = sorted(os.path.join(root, "plans", f)
                            for f in (os.listdir(os.path.join(root, "plans"))
                                      if os.path.isdir(os.path.join(root, "plans")) else ()))
        self.schedule = os.path.join(root, "schedule.json")

    def _pool_model(self, i: int) -> PoolModel:
        r = rng_for(self.seed, "pool", i)
        folder = os.path.join(self.root, "models", f"m{i:02d}")
        if i % 4 == 3:  # every fourth: an nn.Module factory
            kind, dims, seq = module_dims(r)
            return PoolModel(i, os.path.join(folder, "factory.py") + ":build", "factory", seq,
                             {"kind": kind, "dims": dims})
        cfg, seq, _ = hf_config(r)
        return PoolModel(i, os.path.join(folder, "config.json"), "hf", seq, cfg)

    def create(self, log) -> None:
        """Write the pool's files, trace each pool model once, make the seed plans and schedule,
        and the read-only folder."""
        for m in self.pool:
            os.makedirs(os.path.dirname(m.spec.split(":")[0]), exist_ok=True)
            if m.form == "hf":
                _write(m.spec, json.dumps(m.config, indent=1))
            else:
                _write(m.spec.rsplit(":", 1)[0], fuzz_models().factory_source(
                    m.config["kind"], m.seq_len or 16, m.config["dims"]))
        os.makedirs(self.cases, exist_ok=True)
        os.makedirs(self.readonly, exist_ok=True)
        _write(os.path.join(self.readonly, "existing.json"), "SENTINEL\n")
        import planner

        t0 = time.perf_counter()
        for m in self.pool:
            for seq in {m.seq_len, None}:
                try:
                    planner.prepare(m.spec, seq_len=seq, cache_dir=self.cache)
                except planner.PlannerError as exc:
                    log(f"  pool model {m.index} ({m.spec}) does not trace: {exc}")
        log(f"  traced {len(self.pool)} pool models in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        for name in ZOO:  # traced here, so that case times are planning times
            for dtype in DTYPES:
                planner.prepare(name, dtype=dtype, cache_dir=self.cache)
        log(f"  traced {len(ZOO)} zoo models in {len(DTYPES)} dtypes in "
            f"{time.perf_counter() - t0:.1f} s")
        self._seed_plans(log)
        self._seed_schedule(log)
        make_readonly(self.readonly)

    def _seed_plans(self, log) -> None:
        import planner

        folder = os.path.join(self.root, "plans")
        os.makedirs(folder, exist_ok=True)
        hetero = {"name": "h", "groups": [
            {"name": "big", "device": "a100-80g", "nodes": 1, "gpus_per_node": 4,
             "intra_node": {"bandwidth_GBps": 300, "latency_us": 3}},
            {"name": "small", "device": "v100", "nodes": 1, "gpus_per_node": 4,
             "intra_node": {"bandwidth_GBps": 150, "latency_us": 3}}],
            "inter_node": {"bandwidth_GBps": 25, "latency_us": 10}}
        settings = [("dgx-a100-80g", 1, None, 64, "bf16", None),
                    ("dgx-h100", 2, None, 256, "bf16", "pp=2,schedule=1f1b"),
                    ("dgx-a100-80g", 1, None, 64, "bf16", "pp=2,vpp=2,schedule=interleaved-1f1b"),
                    ("l4-8", 1, None, 32, "fp16", "pp=4,schedule=zb-h1"),
                    ("dgx-a100-40g", 1, 4, 16, "bf16", "pp=2,schedule=gpipe,tp=2,recompute=full"),
                    ("hgx-h200", 1, None, 128, "bf16", "zero=3,tp=2"),
                    ("dgx1-v100", 1, None, 64, "fp16", "pp=2,schedule=zb-h1,zero=1"),
                    (hetero, None, None, 64, "fp16", None),
                    ("cpu", 1, None, 8, "fp32", None)]
        made = 0
        for i, (cl, nodes, gpn, gb, dtype, fix) in enumerate(settings):
            for m in self.pool[i % 3::3][:2]:
                try:
                    p = planner.plan(m.spec, cluster=cl, nodes=nodes, gpus_per_node=gpn,
                                     global_batch=gb, seq_len=m.seq_len, dtype=dtype, fix=fix,
                                     cache_dir=self.cache)
                except planner.PlannerError:
                    continue
                p.save(os.path.join(folder, f"p{i}-m{m.index:02d}.json"))
                made += 1
                break
        self.plans = sorted(os.path.join(folder, f) for f in os.listdir(folder))
        log(f"  made {made} seed plans")

    def _seed_schedule(self, log) -> None:
        models_ = [m for m in self.pool if m.form == "hf"][:2]
        jobs = {"cluster": "dgx-a100-80g", "nodes": 1,
                "jobs": [{"name": f"j{k}", "model": m.spec, "global_batch": 16,
                          "seq_len": m.seq_len or 32, "steps": 100} for k, m in enumerate(models_)]}
        path = os.path.join(self.root, "jobs.yaml")
        _write(path, _yaml(jobs))
        res = call_cli(["jobs", path, "-o", self.schedule, "--time-limit", "2", "--workers", "1",
                        "-q"], cwd=self.root)
        log(f"  seed schedule: exit {res.code}"
            + (f" ({res.err.strip()[-200:]})" if res.code else ""))


def _write(path: str, data) -> None:
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(path, mode) as f:
        f.write(data)


def _yaml_load(path: str):
    import yaml

    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def _yaml(obj) -> str:
    import yaml

    return yaml.safe_dump(obj, sort_keys=False, allow_unicode=True)


def make_readonly(path: str) -> None:
    """A folder no command may write in (as root: the immutable attribute; else no write bit)."""
    if os.geteuid() == 0 and shutil.which("chattr"):
        if subprocess.run(["chattr", "+i", path], capture_output=True).returncode == 0:
            return
    os.chmod(path, 0o555)


def undo_readonly(path: str) -> None:
    if os.path.isdir(path):
        if os.geteuid() == 0 and shutil.which("chattr"):
            subprocess.run(["chattr", "-i", path], capture_output=True)
        os.chmod(path, 0o755)


# ----------------------------------------------------------------------------------------------
# Running the CLI in this process
# ----------------------------------------------------------------------------------------------


class CaseTimeout(BaseException):
    """Raised by the alarm when a case runs past --timeout (a BaseException: main() lets it by)."""


@dataclass
class CliResult:
    code: int | None
    out: str
    err: str
    exc: str = ""
    """An exception that escaped main(), with its traceback's last line."""


def call_cli(argv: list[str], cwd: str) -> CliResult:
    from planner.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
                exc = ""
            except SystemExit as e:  # argparse: --help / usage errors
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                exc = "SystemExit"
            except CaseTimeout:
                raise
            except BaseException as e:  # noqa: BLE001 - anything escaping main is a finding
                code = None
                exc = f"{type(e).__name__}: {str(e)[:200]}\n{traceback.format_exc()[-1500:]}"
    finally:
        os.chdir(here)
        import logging

        logging.getLogger("planner").handlers[:] = []
    return CliResult(code, out.getvalue(), err.getvalue(), exc)


def classify_cli(res: CliResult) -> tuple[str, str]:
    """(outcome, detail) of one command's exit code and stderr."""
    lines = [ln for ln in res.err.splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if res.exc and res.exc != "SystemExit":
        return UNEXPECTED, f"exception escaped main(): {res.exc}"
    if "Traceback (most recent call last)" in res.err:
        return UNEXPECTED, f"traceback on stderr (exit {res.code}): {last[:300]}"
    ours = [ln for ln in lines if ln.startswith("plan: ")]
    if res.exc == "SystemExit":  # argparse's own exit
        if res.code == 0:
            return OK, "help/version"
        if res.code == 2 and re.match(r"^plan( \S+)?: error: ", last):
            return BAD, "usage"
        return UNEXPECTED, f"SystemExit({res.code}): {last[:300]}"
    if res.code == 0:
        if ours:
            return UNEXPECTED, f"exit 0 with an error line: {ours[0][:300]}"
        return OK, ""
    if res.code == 2:
        if not last.startswith("plan: error: ") or len(ours) != 1:
            return UNEXPECTED, f"exit 2 without one 'plan: error:' last line: {last[:300]}"
        return BAD, last
    if res.code == 3:
        # README's exit codes: "no plan fits:" (memory), "no plan:" (a rule), "no schedule"
        if not last.startswith(("plan: no plan fits: ", "plan: no plan: ", "plan: no schedule"))\
                or len(ours) != 1:
            return UNEXPECTED, f"exit 3 without one 'plan: no plan...' last line: {last[:300]}"
        return NO_PLAN, last
    return UNEXPECTED, f"exit {res.code}: {last[:300]}"


# ----------------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------------


@dataclass
class Result:
    index: int
    family: str
    outcome: str
    seconds: float
    detail: str = ""
    repro: str = ""
    call_s: float = 0.0
    """Seconds of the planner call itself (the first, for a case that plans twice)."""
    trace_s: float = 0.0
    """Seconds of it spent tracing models (the trace cache missed: a new model, dtype or
    sequence length)."""

    @property
    def plan_s(self) -> float:
        """The call without tracing: what planning took."""
        return max(0.0, self.call_s - self.trace_s)


class Case:
    """One case's inputs under construction: its folder, files it wrote, a reproduction."""

    def __init__(self, ws: Workspace, index: int):
        self.ws, self.index = ws, index
        self.r = rng_for(ws.seed, "case", index)
        self.dir = os.path.join(ws.cases, f"c{index:06d}")
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.files: dict[str, str] = {}
        """Input files this case wrote: path -> a short description of the content."""
        self.outputs: list[str] = []
        """Paths the command may create or replace when it succeeds."""
        self.sentinels: dict[str, bytes] = {}
        self.expect_bad: list[str] = []
        self.loose = False
        """Outputs may land anywhere the command line says (a scrambled command line)."""

    def file(self, name: str, data, note: str = "") -> str:
        path = os.path.join(self.dir, name)
        _write(path, data)
        text = data if isinstance(data, str) else repr(data[:300])
        self.files[path] = note or (text if len(text) < 600 else text[:600] + " ...")
        return path

    # --- inputs that can go wrong ---

    def model_arg(self) -> str:
        r = self.r
        kind = weighted(r, {"pool": 80, "zoo": 6, "fresh": 5, "broken": 9})
        if kind == "pool":
            return r.choice(self.ws.pool).spec
        if kind == "zoo":
            return r.choice(ZOO)
        if kind == "fresh":
            cfg, _, bad = hf_config(r, invalid=0.5)
            self.expect_bad += [f"config: {b}" for b in bad if not b.startswith("seq_len")]
            return self.file("config.json", json.dumps(cfg))
        how = r.choice(("missing", "dir", "binary", "mutated", "factory raises", "bad return",
                        "no factory", "empty", "unknown"))
        self.expect_bad.append(f"model {how}")
        if how == "missing":
            return os.path.join(self.dir, "nope", "config.json")
        if how == "dir":
            return self.dir + os.sep
        if how == "binary":
            return self.file("config.json", bytes(r.randint(0, 255) for _ in range(200)))
        if how == "mutated":
            cfg, _, _ = hf_config(r)
            data = mutate_text(r, json.dumps(cfg, indent=1))
            self.expect_bad.pop()  # a mutation may leave a valid config
            return self.file("config.json", data)
        if how in ("factory raises", "bad return"):
            kind = "raises" if how == "factory raises" else "bad_return"
            return self.file("f.py", fuzz_models().factory_source(kind, 8, {"width": 8})) + ":build"
        if how == "no factory":
            return r.choice(self.ws.pool[3::4]).spec.rsplit(":", 1)[0] + ":nothing"
        if how == "empty":
            return ""
        return r.choice(("gtp2", "llama3-9b", "os:getcwd", "json:loads"))

    def cluster_arg(self, allow_hetero: bool = True) -> tuple[str, list[str]]:
        """A --cluster value and the extra argv (nodes, gpus per node)."""
        r = self.r
        kind = weighted(r, {"preset": 55, "yaml": 20, "hetero": 8 if allow_hetero else 0,
                            "bad yaml": 10, "bad name": 4, "missing": 3})
        extra: list[str] = []
        if kind == "preset":
            name = r.choice(PRESETS)
            if r.random() < 0.7:
                extra += ["--nodes", self.count()]
            if r.random() < 0.3:
                extra += ["--gpus-per-node", self.count(small=True)]
            return name, extra
        if kind == "yaml":
            return self.file("cluster.yaml", _yaml(cluster_mapping(r))), extra
        if kind == "hetero":
            if r.random() < 0.1:
                extra += ["--nodes", "2"]
                self.expect_bad.append("nodes with groups")
            return self.file("cluster.yaml", _yaml(hetero_mapping(r))), extra
        if kind == "bad yaml":
            base = cluster_mapping(r) if r.random() < 0.7 else hetero_mapping(r)
            if r.random() < 0.5:
                notes: list = []
                data = _yaml(mutate(r, base, notes))
                note = f"{data[:500]!r} ({'; '.join(notes)})"
                return self.file("cluster.yaml", data, note=note), extra
            return self.file("cluster.yaml", mutate_text(r, _yaml(base))), extra
        if kind == "bad name":
            self.expect_bad.append("unknown cluster")
            return r.choice(("dgx-a100", "h100", "DGX-H100x", "tpu-v5")), extra
        self.expect_bad.append("missing cluster file")
        return os.path.join(self.dir, "none.yaml"), extra

    def count(self, small: bool = False) -> str:
        r = self.r
        v = weighted(r, {"1": 3, str(r.randint(1, 8)): 6,
                         str(r.randint(9, 64)): 2 if not small else 0,
                         str(r.randint(65, 512)): 0.5 if not small else 0,
                         "0": 0.3, "-2": 0.3, "x": 0.2, "2.5": 0.2, "1e3": 0.1})
        if v in ("0", "-2"):
            self.expect_bad.append(f"count {v}")
        return v

    def out_path(self, name: str, *, dash: bool = False) -> str:
        """A path for -o / --gantt / --plot / --csv: new, existing, in a missing folder, a folder,
        read-only, or '-'."""
        r = self.r
        kind = weighted(r, {"new": 50, "existing": 14, "missing dir": 8, "dir": 6, "readonly": 8,
                            "readonly existing": 4, "sys": 2, "dash": 5 if dash else 0,
                            "empty": 1, "relative": 4})
        if kind == "new":
            path = os.path.join(self.dir, name)
        elif kind == "existing":
            path = os.path.join(self.dir, name)
            _write(path, b"SENTINEL\n")
            self.sentinels[path] = b"SENTINEL\n"
        elif kind == "missing dir":
            path = os.path.join(self.dir, "no", "such", name)
        elif kind == "dir":
            return self.dir
        elif kind == "readonly":
            path = os.path.join(self.ws.readonly, name)
        elif kind == "readonly existing":
            path = os.path.join(self.ws.readonly, "existing.json")
        elif kind == "sys":
            path = "/sys/" + name
        elif kind == "dash":
            return "-"
        elif kind == "empty":
            return ""
        else:
            path = name  # relative: the case folder is the working directory
        self.outputs.append(path if os.path.isabs(path) else os.path.join(self.dir, path))
        return path

    def plan_file(self) -> str:
        r = self.r
        base = r.choice(self.ws.plans)
        name = "plan.json" if "plan.json" not in {os.path.basename(p) for p in self.files} \
            else f"plan-{len(self.files)}.json"  # a second plan (diff) never overwrites the first
        kind = weighted(r, {"valid": 55, "mutated": 25, "text": 12, "missing": 3, "dir": 2,
                            "schedule": 2, "empty": 1})
        if kind == "valid":
            return base
        text = open(base).read()
        if kind == "mutated":
            notes: list = []
            return self.file(name, json.dumps(mutate(r, json.loads(text), notes)),
                             note=f"{os.path.basename(base)} with {'; '.join(notes)}")
        if kind == "text":
            return self.file(name, mutate_text(r, text),
                             note=f"{os.path.basename(base)} damaged")
        if kind == "missing":
            self.expect_bad.append("missing plan")
            return os.path.join(self.dir, "missing.json")
        if kind == "dir":
            self.expect_bad.append("plan is a folder")
            return self.dir
        if kind == "schedule":
            self.expect_bad.append("not a plan")
            return self.ws.schedule if os.path.exists(self.ws.schedule) else CALIBRATION
        self.expect_bad.append("empty plan")
        return self.file(name, b"")

    def calibration_arg(self) -> str:
        r = self.r
        kind = weighted(r, {"valid": 50, "mutated": 30, "text": 15, "missing": 5})
        if kind == "valid":
            return CALIBRATION
        text = open(CALIBRATION).read()
        if kind == "mutated":
            notes: list = []
            return self.file("calib.json", json.dumps(mutate(r, json.loads(text), notes)),
                             note=f"benchmarks/data/fuzz/calibration.json with {'; '.join(notes)}")
        if kind == "text":
            return self.file("calib.json", mutate_text(r, text), note="calibration.json damaged")
        self.expect_bad.append("missing calibration")
        return os.path.join(self.dir, "calib-missing.json")

    def fix_arg(self) -> str:
        fix, bad = pins(self.r)
        self.expect_bad += bad
        if isinstance(fix, dict):
            return ",".join(f"{k}={_pin_text(v)}" for k, v in fix.items())
        return fix

    # --- checks after a command ---

    def snapshot(self) -> dict:
        out = {}
        for folder in (self.dir, self.ws.readonly):
            for base, dirs, files in os.walk(folder):
                for f in files:
                    p = os.path.join(base, f)
                    try:
                        with open(p, "rb") as fh:
                            out[p] = hashlib.sha256(fh.read()).hexdigest()
                    except OSError:
                        out[p] = "?"
        return out

    def file_problems(self, before: dict, after: dict, ok: bool) -> list[str]:
        problems = []
        for p in after:
            name = os.path.basename(p)
            if name.startswith(".tmp") or name.endswith(".tmp"):
                problems.append(f"stray temporary file {p}")
        changed = sorted(p for p in after if before.get(p) != after[p])
        gone = sorted(set(before) - set(after))
        if gone:
            problems.append(f"input files removed: {gone[:3]}")
        if not ok:
            if changed:
                problems.append(f"failed command wrote {changed[:3]}")
        elif not self.loose:
            allowed = set(self.outputs)
            extra = [p for p in changed if p not in allowed and not any(
                p.startswith(os.path.splitext(a)[0] + "-") for a in allowed)
                and os.path.join(os.path.dirname(p), "*") not in allowed]
            if extra:
                problems.append(f"files written that were not asked for: {extra[:3]}")
        return problems

    def repro(self, argv: list[str]) -> str:
        lines = ["plan " + " ".join(shlex.quote(a) for a in argv)]
        for path, note in self.files.items():
            lines.append(f"  # {path}: {note[:400]!r}")
        return "\n".join(lines)


TRACING = {"s": 0.0}
"""Seconds this process spent in planner.traced.trace_model (counted by count_tracing)."""


def count_tracing() -> None:
    """Time every trace the planner makes in this process (planner.traced.trace_model runs when
    the trace cache misses), so that a case's planning time can be told from its tracing time."""
    import planner.traced as traced

    if getattr(traced.trace_model, "fuzz_counted", False):
        return
    inner = traced.trace_model

    def timed(*args, **kw):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kw)
        finally:
            TRACING["s"] += time.perf_counter() - t0

    timed.fuzz_counted = True
    traced.trace_model = timed


def run_case(ws: Workspace, index: int, only: str | None, timeout: float) -> Result:
    count_tracing()
    traced_before = TRACING["s"]
    r = rng_for(ws.seed, "family", index)
    family = only or ("api" if r.random() < 0.4 else "cli")
    t0 = time.perf_counter()
    case = Case(ws, index)
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        if family == "api":
            res = api_case(case)
        else:
            res = cli_case(case)
    except CaseTimeout:
        res = Result(index, family, UNEXPECTED, 0, f"hang: still running after {timeout:.0f} s",
                     getattr(case, "last_repro", ""))
    except Exception as exc:  # noqa: BLE001 - a bug of the fuzzer itself: report it as such
        res = Result(index, family, UNEXPECTED, 0,
                     f"fuzzer error {type(exc).__name__}: {exc}\n{traceback.format_exc()[-1200:]}",
                     getattr(case, "last_repro", ""))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    res.index = index
    res.seconds = time.perf_counter() - t0
    res.trace_s = TRACING["s"] - traced_before
    if res.outcome != UNEXPECTED and not os.environ.get("FUZZ_KEEP_CASES"):
        shutil.rmtree(case.dir, ignore_errors=True)
    return res


def _alarm(signum, frame):
    raise CaseTimeout()


# --- API cases ---

_PREPARED: dict = {}


def prepared(ws: Workspace, m: PoolModel, dtype: str):
    import planner

    key = (m.index, dtype)
    if key not in _PREPARED:
        _PREPARED[key] = planner.prepare(m.spec, seq_len=m.seq_len, dtype=dtype, cache_dir=ws.cache)
    return _PREPARED[key]


def api_case(case: Case) -> Result:
    import planner

    r, ws = case.r, case.ws
    form = weighted(r, {"plan": 45, "prepared": 35, "fresh": 8, "module": 6, "zoo": 6})
    kw: dict = {}
    bad: list[str] = []
    # the model
    model, example_inputs, seq_len = None, None, None
    if form in ("plan", "prepared"):
        m = r.choice(ws.pool)
        model, seq_len = m.spec, m.seq_len
        if form == "plan" and r.random() < 0.1:
            seq_len = r.choice((None, 8, 24))
    elif form == "fresh":
        cfg, seq_len, bad_cfg = hf_config(r, invalid=0.35)
        bad += bad_cfg
        model = case.file("config.json", json.dumps(cfg))
    elif form == "module":
        import torch

        kind, dims, seq_len = module_dims(r)
        with torch.device("meta"):
            model, example_inputs = fuzz_models().build(kind, seq_len=seq_len, **dims)
        how = weighted(r, {"ok": 85, "no inputs": 5, "wrong type": 5, "wrong shape": 5})
        if how == "no inputs":
            example_inputs = None
        elif how == "wrong type":
            example_inputs = r.choice(("tokens", 3, {1, 2}))
        elif how == "wrong shape":
            example_inputs = (torch.zeros(7, device="meta"),)  # 1-D floats: no model here takes it
        if how != "ok":
            bad.append(f"example_inputs {how}")
        case.files["module"] = (f"models.build({kind!r}, seq_len={seq_len}, **{dims!r}), "
                                f"inputs {how}")
        seq_len = None
    else:
        model = r.choice(ZOO)
    # the rest
    cluster, nodes, gpn, bad_cluster = api_cluster(case)
    bad += bad_cluster
    gb = batch(r)
    if r.random() < 0.04:
        gb = r.choice((0, -1, 2.5, "64", True, None))
        bad.append(f"global_batch {gb!r}")
    dtype = r.choice(DTYPES)
    if r.random() < 0.03:
        dtype = r.choice(("fp4", "int8", "BF16", ""))  # None is the API's default, not bad
        bad.append(f"dtype {dtype!r}")
    optimizer = r.choice(OPTIMIZERS)
    if r.random() < 0.02:
        optimizer = r.choice(("lamb", "Adam", None))
        bad.append(f"optimizer {optimizer!r}")
    fix, bad_fix = pins(r)
    bad += bad_fix
    top_k = r.choice((0, 1, 3, 3, 5))
    if r.random() < 0.02:
        top_k = r.choice((-1, "3", 2.5))
        bad.append(f"top_k {top_k!r}")
    target = weighted(r, {"any": 50, "torch": 10, "torchtitan": 10, "megatron": 10,
                          "deepspeed": 10, "nccl": 1})
    if target == "nccl":
        bad.append("target nccl")
    if r.random() < 0.05 and form != "prepared":
        seq_len = r.choice((0, -8, "128"))
        bad.append(f"seq_len {seq_len!r}")
    calibration = None
    if r.random() < 0.06:
        calibration = CALIBRATION if r.random() < 0.6 else json.loads(open(CALIBRATION).read())
        if r.random() < 0.4:
            notes: list = []
            calibration = mutate(r, json.loads(open(CALIBRATION).read()), notes)
            case.files["calibration"] = ("benchmarks/data/fuzz/calibration.json with "
                                         + "; ".join(notes))
    engine = None
    if r.random() < 0.06:
        engine = r.choice(({"attention": "materialized"}, "kernels=eager,overlap_grad_reduce=false",
                           {"fsdp_copies": True}, "attention=flash", "megatron-2021",
                           "megatron-core", "torchtitan", "torchtitan-compile",
                           "megatron-core,attention=materialized",
                           "moe_capacity_factor=1.25,moe_pad_to_capacity=true",
                           {"moe_imbalance": 1.5, "moe_dispatcher": "allgather"},
                           "megatron-core,moe_overlap=true,moe_capacity_factor=2",
                           "megatron-core,moe_dispatcher=deepep,moe_overlap=true"))
    time_limit = None
    if r.random() < 0.03:
        time_limit = r.choice((0.05, 0.5, 2.0))
    kw = dict(cluster=cluster, nodes=nodes, gpus_per_node=gpn, global_batch=gb, seq_len=seq_len,
              dtype=dtype, optimizer=optimizer, fix=fix, top_k=top_k, target=target)
    if calibration is not None:
        kw["calibration"] = calibration
    if engine is not None:
        kw["engine"] = engine
    if time_limit is not None:
        kw["time_limit_s"] = time_limit
    case.last_repro = api_repro(case, model, example_inputs, form, kw)

    def call(cache_dir):
        if form == "prepared":
            return call_prepared(case, model, kw)
        return planner.plan(model, example_inputs=example_inputs, cache_dir=cache_dir, **kw)

    err = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(err):
        outcome, detail, plan = api_outcome(lambda: call(ws.cache), bad)
    call_s = time.perf_counter() - t0
    if "Traceback" in err.getvalue() or "Logging error" in err.getvalue():
        outcome, detail = UNEXPECTED, (f"a traceback on stderr ({detail or outcome}): "
                                       f"{err.getvalue().strip().splitlines()[-1][:300]}")
    if plan is not None and outcome != UNEXPECTED:
        detail = check_api_plan(case, plan, model, kw, form, example_inputs)
        if not detail and time_limit is None and form != "zoo":
            with contextlib.redirect_stderr(io.StringIO()):
                again_outcome, again_detail, again = api_outcome(lambda: call(ws.cache), [])
            if again is None:
                detail = f"second run with the same inputs: {again_outcome}: {again_detail}"
            elif again.to_json() != plan.to_json():
                detail = "second run with the same inputs gave a different plan: " + _json_diff(
                    plan.to_dict(), again.to_dict())
        if detail:
            outcome = UNEXPECTED
    return Result(case.index, f"api:{form}", outcome, 0, detail, case.last_repro, call_s)


def call_prepared(case: Case, model: str, kw: dict):
    """prepare (from the trace cache) + plan_prepared, as planner.plan does."""
    import planner
    from planner.options import parse_fix
    from planner.targets import restrict

    m = next(m for m in case.ws.pool if m.spec == model)
    prep = prepared(case.ws, m, kw["dtype"]) if kw["dtype"] in DTYPES else None
    cl = planner.load_cluster(kw["cluster"], nodes=kw["nodes"], gpus_per_node=kw["gpus_per_node"])
    if kw.get("calibration") is not None and not hasattr(cl, "groups"):
        from planner.inputs.calibration import apply_calibration

        cl = apply_calibration(cl, kw["calibration"])
    from planner.settings import target_engine

    training = planner.TrainingSpec(global_batch=kw["global_batch"],
                                    seq_len=prep.seq_len if prep else 1, dtype=kw["dtype"],
                                    optimizer=kw["optimizer"],
                                    engine=target_engine(kw.get("engine"), kw["target"]))
    options = restrict(planner.SearchOptions(fix=parse_fix(kw["fix"]), top_k=kw["top_k"],
                                             time_limit_s=kw.get("time_limit_s")), kw["target"])
    if prep is None:
        raise AssertionError("unreachable: TrainingSpec accepts the dtype")
    return planner.plan_prepared(prep, cl, training, options, warn_default_engine=False)


def api_cluster(case: Case):
    """(cluster argument, nodes, gpus_per_node, reasons it is invalid)."""
    import planner

    r = case.r
    kind = weighted(r, {"preset": 50, "mapping": 14, "yaml": 8, "hetero": 8, "object": 5,
                        "mutated": 8, "bad": 7})
    nodes = gpn = None
    bad: list[str] = []
    if kind in ("preset", "object"):
        cluster = r.choice(PRESETS)
        if r.random() < 0.8:
            nodes = weighted(r, {1: 2, r.randint(1, 8): 6, r.randint(9, 64): 2,
                                 r.randint(65, 1024): 0.4})
        if r.random() < 0.3:
            gpn = r.choice((1, 2, 3, 4, 6, 8, 16))
        if r.random() < 0.04:
            nodes = r.choice((0, -1, 2.5, "4", True))
            bad.append(f"nodes {nodes!r}")
        if kind == "object" and not bad:
            cluster = planner.load_cluster(cluster, nodes=nodes, gpus_per_node=gpn)
            nodes = gpn = None
    elif kind in ("mapping", "yaml"):
        cluster = cluster_mapping(r)
        if kind == "yaml":
            cluster = case.file("cluster.yaml", _yaml(cluster))
    elif kind == "hetero":
        cluster = hetero_mapping(r)
        if r.random() < 0.5:
            cluster = case.file("cluster.yaml", _yaml(cluster))
        if r.random() < 0.05:
            nodes = 2
            bad.append("nodes with groups")
    elif kind == "mutated":
        cluster = mutate(r, cluster_mapping(r) if r.random() < 0.7 else hetero_mapping(r))
        if r.random() < 0.4:
            cluster = case.file("cluster.yaml", mutate_text(r, _yaml(cluster)))
    else:
        cluster = r.choice(("dgx-a100", "", 42, ["dgx-h100"], os.path.join(case.dir, "none.yaml"),
                            case.dir + os.sep))
        bad.append(f"cluster {cluster!r}")
    return cluster, nodes, gpn, bad


def api_outcome(fn, bad: list[str]):
    """Run ``fn``; (outcome, detail, plan or None)."""
    import planner

    try:
        plan = fn()
    except CaseTimeout:
        raise
    except planner.InternalError as exc:
        return UNEXPECTED, f"InternalError: {exc}", None
    except planner.InfeasibleError as exc:
        if bad:
            return UNEXPECTED, f"invalid input ({'; '.join(bad)}) answered as no plan: {exc}", None
        return NO_PLAN, str(exc), None
    except planner.SpecError as exc:
        if "\n" in str(exc).strip():
            return UNEXPECTED, f"SpecError of several lines: {str(exc)[:300]!r}", None
        return BAD, str(exc), None
    except planner.TraceError as exc:
        if bad:
            return BAD, f"TraceError: {exc}", None
        return UNEXPECTED, f"TraceError on a valid model: {exc}", None
    except Exception as exc:  # noqa: BLE001 - the finding
        tb = traceback.format_exc().strip().splitlines()
        site = next((ln.strip() for ln in reversed(tb) if ln.strip().startswith("File ")), "")
        return UNEXPECTED, f"{type(exc).__name__}: {str(exc)[:300]} [{site}]", None
    if bad:
        return UNEXPECTED, f"invalid input accepted ({'; '.join(bad)})", plan
    return OK, "", plan


def check_api_plan(case: Case, plan, model, kw: dict, form: str, example_inputs) -> str:
    """Violations of a plan from the API, as one string ('' when none)."""
    import planner
    from planner.options import parse_fix

    cl = planner.load_cluster(kw["cluster"], nodes=kw["nodes"], gpus_per_node=kw["gpus_per_node"])
    edges = None
    if form in ("plan", "prepared") and isinstance(model, str):
        m = next(m for m in case.ws.pool if m.spec == model)
        if kw["seq_len"] == m.seq_len:
            prep = prepared(case.ws, m, kw["dtype"])
            edges = [(e.src, e.dst) for e in prep.blocks.edges]
    d = json.loads(plan.to_json())
    try:
        planner.Plan.from_dict(d)
    except planner.PlannerError as exc:
        return f"the plan fails its own schema: {exc}"
    seq = kw["seq_len"] if isinstance(kw["seq_len"], int) and kw["seq_len"] > 0 else None
    v = plan_violations(d, cluster=cl, edges=edges, fix=parse_fix(kw["fix"]), target=kw["target"],
                        training={"global_batch": kw["global_batch"], "dtype": kw["dtype"],
                                  "optimizer": kw["optimizer"], "seq_len": seq})
    if d["search"].get("time_s") is not None:
        v.append("search.time_s recorded without record_timing")
    return "; ".join(v)


def api_repro(case: Case, model, example_inputs, form: str, kw: dict) -> str:
    lines = ["import planner"]
    if form == "module":
        lines.append(f"# model: {case.files.get('module')} (benchmarks/data/fuzz/models.py), "
                     "built under torch.device('meta'); example_inputs from it")
        mtext = "model, example_inputs=example_inputs"
    else:
        spec = model
        m = next((m for m in case.ws.pool if m.spec == model), None)
        if m is not None and m.form == "hf":
            lines.append(f"# {model} = {json.dumps(m.config)}")
        elif m is not None:
            lines.append(f"# {model}: models.build({m.config['kind']!r}, **{m.config['dims']!r})")
        for path, note in case.files.items():
            if path not in ("module", "calibration"):
                lines.append(f"# {path} = {note[:600]}")
        mtext = repr(spec)
    call = "plan_prepared (via prepare)" if form == "prepared" else "plan"
    def show(k, v):
        if k == "calibration" and isinstance(v, dict):
            return "calibration=<" + case.files.get("calibration", "the calibration mapping") + ">"
        return f"{k}={v!r}"

    args = ", ".join(show(k, v) for k, v in kw.items() if v is not None)
    lines.append(f"planner.plan({mtext}, {args})" + (f"   # {call}" if form == "prepared" else ""))
    return "\n".join(lines)


def _json_diff(a, b, path="") -> str:
    if type(a) is not type(b):
        return f"{path}: {a!r:.80} vs {b!r:.80}"
    if isinstance(a, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if a.get(k) != b.get(k):
                return _json_diff(a.get(k), b.get(k), f"{path}.{k}")
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _json_diff(x, y, f"{path}[{i}]")
    return f"{path}: {a!r:.80} vs {b!r:.80}"


# --- CLI cases ---

def cli_case(case: Case) -> Result:
    r = case.r
    cmd = weighted(r, {"solve": 34, "show": 15, "simulate": 11, "export": 10, "diff": 7,
                       "whatif": 8, "jobs": 4, "argv": 6, "misc": 2, "run": 1, "recsys": 4})
    argv = {"solve": solve_argv, "show": show_argv, "simulate": simulate_argv,
            "export": export_argv, "diff": diff_argv, "whatif": whatif_argv, "jobs": jobs_argv,
            "argv": garbage_argv, "misc": misc_argv, "run": run_argv,
            "recsys": recsys_argv}[cmd](case)
    if r.random() < 0.3:
        argv.append("-q")
    case.last_repro = case.repro(argv)
    before = case.snapshot()
    t0 = time.perf_counter()
    res = call_cli(argv, cwd=case.dir)
    call_s = time.perf_counter() - t0
    outcome, detail = classify_cli(res)
    if outcome != UNEXPECTED and case.expect_bad and outcome != BAD and cmd not in ("argv",):
        outcome, detail = UNEXPECTED, (f"invalid input ({'; '.join(case.expect_bad)}) gave "
                                       f"{'exit 0' if res.code == 0 else f'exit {res.code}'}: "
                                       f"{detail[:200]}")
    after = case.snapshot()
    problems = case.file_problems(before, after, ok=res.code == 0 and outcome != UNEXPECTED)
    if outcome == OK and cmd == "solve":
        problems += solve_output_problems(case, argv, res)
    if outcome == OK and cmd == "recsys":
        problems += recsys_output_problems(case, argv, res)
    if outcome == OK and cmd == "show" and "--json" in argv:
        try:
            json.loads(res.out)
        except ValueError:
            problems.append("show --json: stdout is not JSON")
    if problems:
        outcome, detail = UNEXPECTED, "; ".join(problems) + (f" [{detail}]" if detail else "")
    if outcome == UNEXPECTED and res.err:
        detail += f"\n    stderr tail: {res.err.strip()[-400:]!r}"
    return Result(case.index, f"cli:{cmd}", outcome, 0, detail, case.last_repro, call_s)


def solve_argv(case: Case) -> list[str]:
    r = case.r
    argv = ["solve", case.model_arg()]
    cluster, extra = case.cluster_arg()
    argv += ["--cluster", cluster] + extra
    gb = str(batch(r))
    if r.random() < 0.05:
        gb = r.choice(("0", "-4", "x", "1.5", ""))
        case.expect_bad.append(f"global batch {gb!r}")
    argv += ["--global-batch", gb]
    if r.random() < 0.3:
        seq = r.choice(("8", "16", "32", "0", "-1", "100000", "x"))
        if seq in ("0", "-1"):
            case.expect_bad.append(f"seq len {seq}")
        argv += ["--seq-len", seq]
    if r.random() < 0.4:
        argv += ["--dtype", r.choice(DTYPES + ("fp4",) if r.random() < 0.05 else DTYPES)]
    if r.random() < 0.2:
        argv += ["--optimizer", r.choice(OPTIMIZERS)]
    if r.random() < 0.4:
        argv += ["--fix", case.fix_arg()]
    if r.random() < 0.3:
        argv += ["--target", r.choice(TARGET_NAMES)]
    if r.random() < 0.06:
        argv += ["--calibration", case.calibration_arg()]
    if r.random() < 0.05:
        argv += ["--engine", r.choice(("attention=materialized", "kernels=eager",
                                       "overlap_grad_reduce=no", "fsdp_copies=true",
                                       "megatron-2021", "torchtitan-compile",
                                       "megatron-core,kernels=eager", "deepspeed-9",
                                       "attention=fast", "bogus=1", "attention",
                                       "moe_pad_to_capacity=true", "moe_imbalance=9",
                                       "moe_capacity_factor=1.5,moe_pad_to_capacity=yes",
                                       "moe_capacity_factor=0.5"))]
    if r.random() < 0.1:
        k = r.choice(("0", "1", "5", "-1", "x"))
        if k == "-1":
            case.expect_bad.append("top-k -1")
        argv += ["--top-k", k]
    if r.random() < 0.04:
        t = r.choice(("0.05", "1", "0", "-1", "nan", "inf"))
        if t in ("0", "-1", "nan"):
            case.expect_bad.append(f"time limit {t}")
        argv += ["--time-limit", t]
    if r.random() < 0.03:
        argv += ["--trace", r.choice(("fx", "export"))]
    if r.random() < 0.03:
        argv += ["--no-cache"]
    if r.random() < 0.6:
        argv += ["-o", case.out_path("plan.json", dash=True)]
    return argv


RECSYS_ZOO = ("two-tower", "dlrm-criteo-1tb", "dlrm-dcnv2")
SHARDINGS = ("data_parallel", "table_wise", "column_wise", "row_wise", "table_row_wise",
             "grid_shard")


def recsys_argv(case: Case) -> list[str]:
    """`plan solve` of a recommendation model: the zoo's (two-tower mostly: it plans in a second),
    with its knobs (--fix sharding=/zero=, --table-optimizer, --pipeline, --tables) right or
    wrong."""
    r = case.r
    model = r.choice(RECSYS_ZOO) if r.random() < 0.3 else "two-tower"
    argv = ["solve", model]
    cluster, extra = case.cluster_arg(allow_hetero=r.random() < 0.1)
    # 2520 x 2^k divides over most GPU counts; a random batch often does not (an error)
    gb = 2520 * 2 ** r.randint(1, 4) if r.random() < 0.8 else batch(r) * 8
    argv += ["--cluster", cluster] + extra + ["--global-batch", str(gb)]
    if r.random() < 0.4:
        pins = []
        if r.random() < 0.6:
            kind = r.choice(SHARDINGS + ("diagonal",) if r.random() < 0.1 else SHARDINGS)
            if kind == "diagonal":
                case.expect_bad.append("sharding diagonal")
            pins.append(f"sharding={kind}")
        if r.random() < 0.5 or not pins:
            z = r.choice(("0", "3", "3", "1", "x"))
            if z in ("1", "x"):
                case.expect_bad.append(f"zero {z}")
            pins.append(f"zero={z}")
        if r.random() < 0.1:
            pins.append("tp=2")
            case.expect_bad.append("tp pinned on a recommendation model")
        argv += ["--fix", ",".join(r.sample(pins, len(pins)))]
    if r.random() < 0.3:
        opt = r.choice(("sgd", "rowwise_adagrad", "adagrad", "adam", "lamb"))
        if opt == "lamb":
            case.expect_bad.append("table optimizer lamb")
        argv += ["--table-optimizer", opt]
    if r.random() < 0.3:
        pipe = r.choice(("sparse-dist", "nested", "none", "fast"))
        if pipe == "fast":
            case.expect_bad.append("pipeline fast")
        argv += ["--pipeline", pipe]
    if r.random() < 0.2:
        argv += ["--dtype", r.choice(("fp32", "bf16", "fp16"))]
    if r.random() < 0.15:
        tables = {r.choice(("t_cat_0", "t_cat_1", "nope")): {"pooling": r.choice((1, 2.5, 0, -1)),
                                                           "skew": r.choice((0.0, 0.5, 1.5))}}
        argv += ["--tables", case.file("tables.yaml", _yaml({"tables": tables}))]
    argv += ["--time-limit", r.choice(("1", "2"))]
    if r.random() < 0.7:
        argv += ["-o", case.out_path("plan.json", dash=True)]
    return argv


def recsys_output_problems(case: Case, argv: list[str], res: CliResult) -> list[str]:
    """A recommendation plan: the schema; every table's shards tile its rows x columns and sit on
    ranks of the cluster; per-rank times positive; the dense part's ZeRO stage as pinned and the
    same in `parallel`; the step the larger of host and device."""
    d, problems = written_plan(case, argv, res)
    if d is None:
        return problems
    v = []
    e = d["embeddings"]
    world = e["world_size"]
    if world != d["parallel"]["dp"]:
        v.append(f"world {world} != dp {d['parallel']['dp']}")
    for t in e["tables"]:
        area = sum(s["sizes"][0] * s["sizes"][1] for s in t["shards"])
        if t["sharding_type"] != "data_parallel" and area != t["rows"] * t["dim"]:
            v.append(f"table {t['name']}: shards cover {area} of {t['rows']} x {t['dim']}")
        if any(not 0 <= s["rank"] < world for s in t["shards"]):
            v.append(f"table {t['name']}: a shard on a rank outside 0..{world - 1}")
    if any(not (r["time_s"] > 0 and math.isfinite(r["time_s"])) for r in e["ranks"]):
        v.append("a rank's time is not positive and finite")
    zero = e["dense"].get("zero", 0)
    if zero != d["parallel"]["zero"]:
        v.append(f"dense zero {zero} != parallel zero {d['parallel']['zero']}")
    fix = argv[argv.index("--fix") + 1] if "--fix" in argv else ""
    if "zero=3" in fix and zero != 3 or "zero=0" in fix and zero != 0:
        v.append(f"--fix {fix} but the dense part runs zero {zero}")
    bd = e["breakdown"]
    if not _close(d["predicted"]["step_time_s"], max(bd["host_s"], bd["device_s"])):
        v.append("step is not max(host, device)")
    return v


def written_plan(case: Case, argv: list[str], res: CliResult) -> tuple[dict | None, list[str]]:
    """(the plan a successful solve wrote with -o, in its file or on stdout for `-o -`, when it
    passes its schema; else None) and what is wrong with it."""
    import planner

    if "-o" not in argv:
        return None, []
    path = argv[argv.index("-o") + 1]
    if path == "-":
        try:
            d = json.loads(res.out[res.out.index("{"):])
        except ValueError:
            return None, ["-o -: stdout does not hold the plan JSON"]
        if os.path.exists(os.path.join(case.dir, "-")):
            return None, ["-o -: wrote a file named '-'"]
    else:
        full = path if os.path.isabs(path) else os.path.join(case.dir, path)
        if os.path.isdir(full):
            return None, []
        try:
            d = json.loads(open(full).read())
        except (OSError, ValueError) as exc:
            return None, [f"plan file {path} unreadable after exit 0: {exc}"]
    try:
        planner.Plan.from_dict(d)
    except planner.PlannerError as exc:
        return None, [f"plan file fails its schema: {exc}"]
    return d, []


def solve_output_problems(case: Case, argv: list[str], res: CliResult) -> list[str]:
    """A successful solve: its plan file (or `-o -` stdout) holds a plan that passes the
    invariants (the cluster as the plan records it)."""
    d, problems = written_plan(case, argv, res)
    if d is None:
        return problems
    return plan_violations(d, cluster=cluster_of(d))


def cluster_of(d: dict):
    """The cluster a plan file records (spec form), or None when it does not record one."""
    import planner

    c = d.get("cluster", {})
    try:
        if "groups" in c:
            return planner.load_cluster({"name": c["name"], "groups": [
                {**g["spec"], "name": g["name"]} for g in c["groups"]],
                "inter_node": c["groups"][0]["spec"]["inter_node"],
                "inter_group": {"bandwidth_GBps": c["inter_group_GBps"], "latency_us": 0}})
        if "spec" in c:
            return planner.load_cluster(c["spec"])
    except (planner.PlannerError, KeyError, TypeError):
        return None
    return None


def show_argv(case: Case) -> list[str]:
    r = case.r
    argv = ["show", case.plan_file()]
    if r.random() < 0.15:
        argv.append("--json")
    if r.random() < 0.3:
        argv += ["--why", case.fix_arg() or "tp=2"]
    if r.random() < 0.2:
        argv += ["--gantt", case.out_path(r.choice(("g.png", "g.svg", "g.png", "g.jpg", "g")))]
        if not argv[-1].endswith((".png", ".svg")) and argv[-1]:
            case.outputs.pop() if case.outputs and case.outputs[-1].endswith(argv[-1]) else None
    return argv


def simulate_argv(case: Case) -> list[str]:
    r = case.r
    argv = ["simulate", case.plan_file(), "--schedule",
            r.choice(SIMULATED_SCHEDULES + ("ring",) if r.random() < 0.03 else SIMULATED_SCHEDULES)]
    if r.random() < 0.5:
        mb = r.choice(("1", "2", "4", "8", "16", "3", "0", "-1", "100000", "x"))
        if mb in ("0", "-1"):
            case.expect_bad.append(f"microbatches {mb}")
        argv += ["--microbatches", mb]
    if r.random() < 0.4:
        vpp = r.choice(("1", "2", "3", "4", "0", "-2"))
        if vpp in ("0", "-2"):
            case.expect_bad.append(f"vpp {vpp}")
        argv += ["--vpp", vpp]
    if r.random() < 0.2:
        argv += ["--gantt", case.out_path(r.choice(("s.png", "s.svg")))]
    return argv


def export_argv(case: Case) -> list[str]:
    r = case.r
    argv = ["export", case.plan_file(), "--to", r.choice(("torchtitan", "megatron", "deepspeed"))]
    if r.random() < 0.3:
        argv += ["--engine-version", r.choice(("0.2.2", "0.3.0", "core_v0.14.0", "core_v0.19.0",
                                               "0.19.8", "latest", "0.1", ""))]
    if r.random() < 0.6:
        path = case.out_path(r.choice(("e.toml", "e.sh", "e.json")), dash=True)
        if path == case.dir:  # a folder: the suggested name inside it
            case.outputs.append(os.path.join(case.dir, "*"))
        argv += ["-o", path]
    return argv


def diff_argv(case: Case) -> list[str]:
    return ["diff", case.plan_file(), case.plan_file()]


def whatif_argv(case: Case) -> list[str]:
    r = case.r
    m = r.choice(case.ws.pool)
    model = m.spec if r.random() < 0.9 else case.model_arg()
    argv = ["whatif", model, "--workers", r.choice(("1",) * 12 + ("0", "-1"))]
    if argv[-1] != "1":
        case.expect_bad.append(f"workers {argv[-1]}")
    keys = r.sample(("nodes", "gpus_per_node", "global_batch", "seq_len", "dtype", "optimizer",
                     "cluster", "device", "inter_node_bandwidth", "tp", "pp", "zero", "recompute",
                     "bogus"), r.randint(1, 2))
    points = 1
    for k in keys:
        vals = {"nodes": ["1", "2", "4"], "gpus_per_node": ["1", "2", "8"],
                "global_batch": ["8", "64", "512"], "seq_len": ["8", "16"],
                "dtype": ["bf16", "fp32", "fp16"], "optimizer": ["adam", "sgd"],
                "cluster": ["dgx-h100", "l4-8", "pcie-4090"], "device": ["a100-80g", "h100", "l4"],
                "inter_node_bandwidth": ["1", "25", "0"], "tp": ["1", "2", "3"],
                "pp": ["1", "2", "4"], "zero": ["0", "3", "5"], "recompute": ["none", "full"],
                "bogus": ["1"]}[k]
        vals = r.sample(vals, r.randint(1, len(vals)))
        points *= len(vals)
        argv += ["--vary", f"{k}={','.join(vals)}"]
        if (k == "bogus" or (k == "inter_node_bandwidth" and "0" in vals)
                or (k == "zero" and "5" in vals)):
            case.expect_bad.append(f"vary {k}={vals}")
    if "cluster" not in keys:
        cluster, extra = case.cluster_arg(allow_hetero=False)
        argv += ["--cluster", cluster] + extra
    if "global_batch" not in keys:
        argv += ["--global-batch", str(r.choice((8, 32, 128, 1024)))]
    if m.seq_len and "seq_len" not in keys and model == m.spec:
        argv += ["--seq-len", str(m.seq_len)]
    if r.random() < 0.3:
        argv += ["--fix", case.fix_arg()]
    if r.random() < 0.15:
        argv += ["--price-per-gpu-hour", r.choice(("h100=4,a100-80g=2", "a100=2", "x=1", "h100=-1",
                                                   "l4"))]
        if r.random() < 0.5:
            argv += ["--tokens", r.choice(("1e12", "0", "-5", "x"))]
    if r.random() < 0.2:
        argv += ["--csv", case.out_path("w.csv")]
    if r.random() < 0.1:
        argv += ["--plot", case.out_path(r.choice(("w.png", "w.svg", "w.pdf")))]
    return argv


def jobs_argv(case: Case) -> list[str]:
    r, ws = case.r, case.ws
    if r.random() < 0.15 and os.path.exists(ws.schedule):
        sched = ws.schedule
        if r.random() < 0.5:
            doc = json.loads(open(ws.schedule).read())
            notes: list = []
            sched = case.file("schedule.json", json.dumps(mutate(r, doc, notes)),
                              note="the seed schedule with " + "; ".join(notes))
        argv = ["jobs", "--replan", sched, "--now", r.choice(("0", "10", "1e6", "-5", "x"))]
        if r.random() < 0.6:
            argv += ["--done", r.choice(("j0", "j1", "j0,j1", "nobody"))]
    else:
        models_ = r.sample([m for m in ws.pool if m.form == "hf"], r.randint(1, 2))
        jobs = {"cluster": r.choice(("dgx-a100-80g", "l4-8", "dgx-h100")), "nodes": r.randint(1, 2),
                "jobs": [{"name": f"j{k}",
                          "model": os.path.relpath(m.spec, case.dir) if r.random() < 0.5 else m.spec,
                          "global_batch": r.choice((8, 16, 64)),
                          "seq_len": m.seq_len or 32, "steps": r.choice((10, 1000, 100000))}
                         for k, m in enumerate(models_ * r.randint(1, 2))]}
        for k, job in enumerate(jobs["jobs"]):
            job["name"] = f"j{k}"
            if r.random() < 0.2:
                job["priority"] = r.randint(1, 3)
            if r.random() < 0.1:
                job["deadline_s"] = r.choice((1, 1e6))
        if r.random() < 0.35:
            jobs = mutate(r, jobs)
        text = _yaml(jobs)
        if r.random() < 0.1:
            path = case.file("jobs.yaml", mutate_text(r, text))
        else:
            path = case.file("jobs.yaml", text)
        argv = ["jobs", path, "--workers", "1"]
    argv += ["--time-limit", r.choice(("0.5", "1", "1", "1", "1", "2", "0", "-1"))]
    if argv[-1] in ("0", "-1"):
        case.expect_bad.append("time limit")
    if r.random() < 0.1:
        argv += ["--objective", r.choice(("makespan", "weighted"))]
    if r.random() < 0.4:
        argv += ["-o", case.out_path("schedule.json", dash=True)]
    if r.random() < 0.15:
        argv += ["--gantt", case.out_path(r.choice(("j.png", "j.svg", "j.txt")))]
    return argv


def garbage_argv(case: Case) -> list[str]:
    """A valid-looking command line with one token dropped, repeated, swapped or replaced."""
    r = case.r
    base = r.choice((solve_argv, show_argv, simulate_argv, export_argv, diff_argv))(case)
    case.expect_bad = []  # the change may or may not make it invalid
    case.loose = True
    op = r.choice(("drop", "dup", "swap", "replace", "flag", "abbrev"))
    i = r.randint(1, len(base) - 1) if len(base) > 1 else 0
    if op == "drop":
        base.pop(i)
    elif op == "dup":
        base.insert(i, base[i])
    elif op == "swap" and len(base) > 2:
        j = r.randint(1, len(base) - 1)
        base[i], base[j] = base[j], base[i]
    elif op == "replace":
        base[i] = r.choice(("", "-", "--", "--nodes", "1e999", "-1", "\u00e9", "--fix=", "x" * 300))
    elif op == "flag":
        base.insert(i, r.choice(("--bogus", "--nodes=1", "-v", "--debug=1", "-h", "--help")))
    else:
        base.insert(i, r.choice(("--node", "--global", "--gpus", "--out")))
        base.insert(i + 1, "2")
    return base


def misc_argv(case: Case) -> list[str]:
    r = case.r
    return r.choice((["models"], ["clusters"], ["--version"], [], ["bogus"], ["solve"],
                     ["show"], ["solve", "gpt2", "--cluster"], ["solve", "--help"]))


_DRY_RUN: list = []


def run_argv(case: Case) -> list[str]:
    """`plan run PLAN --dry-run` when this planner has --dry-run (it launches nothing), else
    `plan run --help`."""
    if not _DRY_RUN:
        res = call_cli(["run", "--help"], cwd=case.dir)
        _DRY_RUN.append("--dry-run" in res.out)
    if not _DRY_RUN[0]:
        return ["run", "--help"]
    argv = ["run", case.plan_file(), "--dry-run"]
    if case.r.random() < 0.3:
        argv += ["--steps", case.r.choice(("1", "0", "-1"))]
        if argv[-1] != "1":
            case.expect_bad.append("steps")
    return argv


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------


def _worker(root: str, seed: int, only, timeout: float, tasks, results) -> None:
    os.environ["XDG_CACHE_HOME"] = os.path.join(root, "cache")
    ws = Workspace(root, seed)
    import planner.trace.models  # noqa: F401 - torch and transformers load here, not in a case
    import transformers  # noqa: F401

    while True:
        index = tasks.get()
        if index is None:
            break
        results.put(run_case(ws, index, only, timeout))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10000, help="cases to run (default 10,000)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the pool and every case")
    ap.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--only", choices=("api", "cli"), help="only API or only CLI cases")
    ap.add_argument("--case", type=int, action="append",
                    help="run only this case number (repeatable); implies -v")
    ap.add_argument("--first", type=int, default=0, help="number of the first case (default 0)")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (pool, cases, plans)")
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="seconds after which a case counts as hung (default 120)")
    ap.add_argument("--examples", type=int, default=3,
                    help="cases shown per kind of unexpected outcome (default 3)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every case")
    args = ap.parse_args(argv)
    if args.cases < 0 or args.workers < 1:
        ap.error("--cases must be >= 0 and --workers >= 1")

    root = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="planner-fuzz-")
    os.makedirs(root, exist_ok=True)
    os.environ["XDG_CACHE_HOME"] = os.path.join(root, "cache")  # never the user's trace cache
    if args.keep or args.case:
        os.environ["FUZZ_KEEP_CASES"] = "1"
    t0 = time.perf_counter()
    print(f"fuzzing the planner: seed {args.seed}, workspace {root}")
    ws = Workspace(root, args.seed)
    undo_readonly(ws.readonly)
    try:
        ws.create(print)
        ws = Workspace(root, args.seed)
        setup_s = time.perf_counter() - t0
        indices = args.case or list(range(args.first, args.first + args.cases))
        results = run_all(ws, indices, args, verbose=args.verbose or bool(args.case))
    finally:
        undo_readonly(ws.readonly)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    report(results, time.perf_counter() - t0, setup_s, args)
    return 1 if any(r.outcome == UNEXPECTED for r in results) else 0


def run_all(ws: Workspace, indices: list[int], args, verbose: bool) -> list[Result]:
    results: list[Result] = []
    t0 = time.perf_counter()
    step = max(1, len(indices) // 20)

    def done(res: Result):
        results.append(res)
        if verbose or res.outcome == UNEXPECTED:
            shown = res.detail and (verbose or res.outcome == UNEXPECTED)
            print(f"  case {res.index} {res.family}: {res.outcome} in {res.seconds:.2f} s"
                  + (f"  {res.detail[:300]}" if shown else ""), flush=True)
            if verbose and res.outcome == UNEXPECTED:
                print("    " + res.repro.replace("\n", "\n    "))
        if len(results) % step == 0:
            counts = Counter(r.outcome for r in results)
            print(f"  {len(results)}/{len(indices)} cases, {time.perf_counter() - t0:.0f} s: "
                  + ", ".join(f"{k} {counts[k]}" for k in (OK, BAD, NO_PLAN, UNEXPECTED)),
                  flush=True)

    if args.workers == 1 or len(indices) == 1:
        for i in indices:
            done(run_case(ws, i, args.only, args.timeout))
        return results
    ctx = mp.get_context("spawn")  # fresh interpreters: no torch state forked mid-use
    tasks, queue = ctx.Queue(), ctx.Queue()
    for i in indices:
        tasks.put(i)
    procs = []
    for _ in range(args.workers):
        tasks.put(None)
        p = ctx.Process(target=_worker, args=(ws.root, ws.seed, args.only, args.timeout, tasks,
                                              queue))
        p.start()
        procs.append(p)
    pending = len(indices)
    while pending:
        try:
            res = queue.get(timeout=args.timeout * 3 + 60)
        except Exception:  # noqa: BLE001 - a worker died (a crash in native code)
            alive = [p for p in procs if p.is_alive()]
            print(f"  a worker stopped answering; {len(alive)} alive, {pending} cases left")
            if not alive:
                break
            continue
        done(res)
        pending -= 1
    for p in procs:
        p.join(timeout=10)
        if p.exitcode not in (0, None):
            print(f"  worker {p.pid} exited with {p.exitcode}")
    seen = {r.index for r in results}
    for i in indices:
        if i not in seen:
            results.append(Result(i, "?", UNEXPECTED, 0, "no result: the worker running it died"))
    return results


def report(results: list[Result], total_s: float, setup_s: float, args) -> None:
    counts = Counter(r.outcome for r in results)
    print(f"\n{len(results)} cases (seed {args.seed}) in {total_s:.0f} s "
          f"({setup_s:.0f} s setting up, {args.workers} worker(s))")
    for k in (OK, BAD, NO_PLAN, UNEXPECTED):
        print(f"  {k:<11} {counts[k]:>6}")
    fam = Counter((r.family, r.outcome) for r in results)
    families = sorted({r.family for r in results})
    print("\n  by kind of case            ok   bad  none  unexp   mean s  max call s  max plan s")
    for f in families:
        secs = [r.seconds for r in results if r.family == f]
        calls = [r.call_s for r in results if r.family == f]
        plans = [r.plan_s for r in results if r.family == f]
        print(f"  {f:<24} {fam[(f, OK)]:>5} {fam[(f, BAD)]:>5} {fam[(f, NO_PLAN)]:>5} "
              f"{fam[(f, UNEXPECTED)]:>6} {sum(secs) / len(secs):>8.3f} {max(calls):>11.2f} "
              f"{max(plans):>11.2f}")
    print("  (mean s: a whole case: building its inputs, the call, a second call for the same "
          "plan, the checks;\n   call: the planner call or command alone; plan: the call without "
          "tracing models)")
    usage = sum(1 for r in results if r.outcome == BAD and r.detail == "usage")
    if usage:
        print(f"\n  {usage} of the bad inputs were argparse usage errors ('usage: ...' and "
              "'plan <command>: error: ...' on stderr, exit 2)")
    if results:
        for what, key in (("planning (tracing excluded)", lambda r: r.plan_s),
                          ("in all (tracing a model included)", lambda r: r.call_s)):
            slowest = max(results, key=key)
            print(f"\nslowest case {what}: {slowest.index} ({slowest.family}, {slowest.outcome}): "
                  f"the call {slowest.call_s:.2f} s, of which tracing {slowest.trace_s:.2f} s; "
                  f"the whole case {slowest.seconds:.2f} s")
            print("    " + slowest.repro.replace("\n", "\n    "))
    slow = sorted((r for r in results if r.plan_s > SLOW_S), key=lambda r: -r.plan_s)
    if slow:
        print(f"\n{len(slow)} case(s) whose call took more than {SLOW_S:.0f} s besides tracing:")
        for r in slow[:10]:
            print(f"  case {r.index} {r.family} {r.outcome}: {r.call_s:.1f} s "
                  f"(tracing {r.trace_s:.1f} s)")
            print("    " + r.repro.replace("\n", "\n    "))
    bad = [r for r in results if r.outcome == UNEXPECTED]
    if not bad:
        print("\nno unexpected outcome")
        return
    groups: dict[str, list[Result]] = {}
    for r in sorted(bad, key=lambda r: r.index):
        groups.setdefault(signature(r), []).append(r)
    print(f"\n{len(bad)} unexpected outcome(s) of {len(groups)} kind(s); rerun one with "
          f"`python benchmarks/fuzz.py --seed {args.seed} --case N --keep DIR`:")
    for sig, group in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        print(f"\n## {len(group)} x {sig}")
        for r in sorted(group, key=lambda r: len(r.repro))[:args.examples]:
            print(f"- case {r.index} ({r.family}, {r.seconds:.2f} s): {r.detail}")
            print("    " + r.repro.replace("\n", "\n    "))


def signature(r: Result) -> str:
    """The kind of an unexpected outcome: its detail without numbers, paths and quoted values."""
    text = r.detail.splitlines()[0] if r.detail else ""
    text = re.sub(r"\[File .*?\]", "", text).split("; ")[0]
    text = re.sub(r"^(the plan|runner-up \d+): ", "", text)
    text = re.sub(r"(/[\w.+-]+)+/?", "PATH", text)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", text)
    text = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "N", text)
    return f"{r.family.split(':')[0]}: {text[:200]}"


if __name__ == "__main__":
    sys.exit(main())
