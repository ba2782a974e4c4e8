"""Published runs: their rows as read from a CSV, and the clusters they ran on."""

from __future__ import annotations

import csv
import dataclasses
import re

from planner import load_cluster

BIG = 1e15
"""Device memory (bytes) while pricing a published configuration: its time, not its fit."""
BRIDGE_STATES = "state_layout=megatron-bf16-grads"
"""Engine setting of every Megatron-Bridge performance run: its configurations keep and reduce
gradients in bf16 (mixed_precision.grad_reduce_in_fp32 and ddp.grad_reduce_in_fp32 set to false
in scripts/performance/configs of the 25.09 and 25.11 releases, every model)."""
NEMO_LAUNCHER_FA2 = ("24.03", "24.03.01", "24.05", "24.07")
"""NeMo containers whose launcher (NVIDIA/NeMo-Framework-Launcher, the release tags of these names)
sets NVTE_FUSED_ATTN=0 for every run in launcher_scripts/conf/config.yaml ("Disable cudnn FA until
we've tested it more"; added 2024-02-13, removed 2024-08-29 for the 24.09 release): Transformer
Engine then runs the flash-attn package's FlashAttention-2 kernels instead of cuDNN's, on Hopper
too. NeMo's own pre-training scripts set the same until 2024-10-11 (NVIDIA/NeMo e1e8b107bc)."""
NVIDIA_SYSTEMS = {"H100": ("dgx-h100", 8), "B200": ("dgx-b200", 8), "B300": ("dgx-b300", 8),
                  "GB200": ("gb200-nvl72", 64), "GB300": ("gb300-nvl72", 64)}
"""GPU column of NVIDIA's performance summaries -> (cluster preset, GPUs per NVLink domain the
runs use: 8 on DGX nodes; 64 of an NVL72 rack, so 256 GPUs are 4 domains and 8 one tray group)."""


def read_rows(path: str) -> list[dict]:
    """The CSV's rows as dicts, each with its 0-based ``index``."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for i, r in enumerate(rows):
        r["index"] = i
    return rows


CONFIGURATION = ("gpu", "tp", "pp", "vp", "cp", "ep", "mbs")
"""Columns that, with the model, make a row's configuration (split_by_configuration); a column a
table lacks counts as empty."""


def base_model(r: dict) -> str:
    """The model a row names, without its variant in brackets ("Qwen3_30B_a3B (tokendrop)" ->
    "Qwen3_30B_a3B")."""
    return r["model"].split(" (")[0]


def split_by_configuration(rows: list[dict]) -> set[int]:
    """Indices of the rows to fit on: the configurations (model, GPU, layout and micro-batch:
    CONFIGURATION) in the order they first appear go to fitting and holding out by turns, and
    every row of a configuration goes where its first row went. Rows that differ only in what a
    configuration leaves out (FP8 recipe, precision, release, GPU count) are near twins: one held
    out while its twin is fitted would check little."""
    side: dict[tuple, bool] = {}
    for r in rows:
        key = (base_model(r), *(r.get(c, "") for c in CONFIGURATION))
        side.setdefault(key, len(side) % 2 == 0)
    return {r["index"] for r in rows
            if side[(base_model(r), *(r.get(c, "") for c in CONFIGURATION))]}


def software(source: str) -> str:
    """Engine settings (``k=v`` pairs, comma-led, or empty) a published row's software implies
    beyond its preset, from the ``source`` it names: Megatron-Bridge runs keep gradients in bf16
    (BRIDGE_STATES); NeMo runs in a container of NEMO_LAUNCHER_FA2 run FlashAttention-2."""
    if "Megatron-Bridge" in source:
        return f",{BRIDGE_STATES}"
    container = re.search(r"NeMo ?(\d\d\.\d\d(?:\.\d\d)?)", source)
    if container and container.group(1) in NEMO_LAUNCHER_FA2:
        return ",attention=flash2"
    return ""


def nvidia_cluster(gpu: str, gpus: int, memory: float | None = None, **device):
    """The cluster a run of ``gpus`` GPUs of kind ``gpu`` (NVIDIA_SYSTEMS) used; ``memory``
    (bytes) and ``device`` fields replace the device's."""
    preset, per_domain = NVIDIA_SYSTEMS[gpu]
    gpn = min(gpus, per_domain)
    cluster = load_cluster(preset, nodes=gpus // gpn, gpus_per_node=gpn)
    if memory is not None:
        device["memory_bytes"] = memory
    if device:
        cluster = dataclasses.replace(cluster, device=dataclasses.replace(cluster.device,
                                                                          **device))
    return cluster
