"""Re-check the memory of a plan when an export must change a knob that can raise it.

An engine sometimes runs only a nearby configuration (DeepSpeed's pipeline engine runs ZeRO-0 or
ZeRO-1, not ZeRO-3; its AutoTP has no sequence parallelism). The export then prices that
configuration on the plan's own stage split, with the model states laid out as that engine keeps
them, with the search's own cost model (``planner.search.pricing.price``, activations from a
simulation of the schedule as the search's refinement does), from the plan's model spec, cluster
and training (the model is read from the trace cache when it was traced before), and compares
each pipeline rank's memory with what a GPU may use. ``recheck`` raises InfeasibleError with the
numbers when the changed configuration no longer fits, and otherwise returns a note with them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from costmodels.engine import engine_from_mapping
from costmodels.topology import cluster_from_mapping
from planner import api
from planner.errors import InfeasibleError, PlannerError, SpecError
from planner.export import common, replan
from planner.inputs.clusters import planned_cluster
from planner.options import KNOBS, Config, SearchOptions, TrainingSpec
from planner.planfile.document import Plan
from planner.search.costs import ModelArrays, capacity_bytes, config_costs
from planner.search.pricing import price
from planner.search.refine import simulated

log = logging.getLogger("planner.export")


@dataclass(frozen=True)
class Memory:
    """Per pipeline rank, the bytes a GPU needs under one configuration, and what it may use."""

    per_rank: list[float]
    usable: float
    """Bytes a GPU may use after the reserve (planner.search.costs.capacity_bytes)."""
    device: float
    """The device's memory in bytes."""

    @property
    def peak(self) -> float:
        return max(self.per_rank)

    @property
    def worst_rank(self) -> int:
        return max(range(len(self.per_rank)), key=self.per_rank.__getitem__)


def configuration(plan: Plan, **changes) -> Config:
    """The plan's configuration with ``changes`` applied (plans from before a knob existed get its
    default)."""
    known = {k: plan.parallel[k] for k in KNOBS if k in plan.parallel}
    return Config(**{**known, **changes})


def memory(plan: Plan, *, state_layout: str | None = None, software: str | None = None,
           target: str = "<engine>", dtype: str | None = None, **changes) -> Memory:
    """Memory per pipeline rank of the plan's configuration with ``changes``, on its split, run
    by ``software`` (an ``--engine`` preset: its kernels, attention and state layout replace the
    plan's; the plan's MoE settings stay) if given, with the model states laid out as
    ``state_layout`` (costmodels.engine.EngineSpec) if given: the target engine's, whose data
    parallelism is FSDP2's only under ``fsdp2`` (torchtitan, which drives micro-batches with
    torch's pipelining schedules only with a pipeline), in ``dtype`` if given (an engine that
    trains in another precision than planned). A plan of data parallelism across sites
    (``dp_replicate``) is priced on one site, for its share of the batch, as it was planned."""
    spec = plan.model.get("spec")
    what = "re-check the memory of the configuration the engine runs"
    if not spec:
        raise SpecError(f"export: cannot {what}: the plan was made from a Python module, not a "
                        f"model spec; re-plan with planner.plan(..., target='{target}')")
    cluster = _cluster(plan, what, target)
    t = plan.training
    engine = engine_from_mapping(t.get("engine"))
    if software is not None:
        runs = engine_from_mapping(software)
        engine = replace(engine, **{k: getattr(runs, k) for k in common.SOFTWARE_KEYS})
    if state_layout is not None and hasattr(engine, "state_layout"):
        engine = replace(engine, state_layout=state_layout, pipelined_accumulation=False,
                         fsdp_copies=state_layout == "fsdp2",
                         fsdp_experts=state_layout == "fsdp2",
                         cp_ring="torch" if state_layout == "fsdp2" else "te")
    dtype = dtype or t["dtype"]
    sites = plan.parallel.get("dp_replicate", 1)  # each site runs dp / sites of the replicas
    training = TrainingSpec(global_batch=t["global_batch"] // sites, seq_len=t["seq_len"],
                            dtype=dtype, optimizer=t["optimizer"], engine=engine)
    prepared = api.prepare(spec, seq_len=t["seq_len"], dtype=dtype)
    if dtype == t["dtype"] and prepared.info["fingerprint"] != plan.model["fingerprint"]:
        log.warning("%s traces differently now than when the plan was made; the memory re-check "
                    "uses the model as it traces now", spec)
    ma = ModelArrays.from_blocks(prepared.blocks)
    cfg = configuration(plan, **changes)
    cfg = cfg.with_(dp=cfg.dp // sites)
    costs = config_costs(ma, cluster, training, cfg)
    est = simulated(price(cfg, _bounds(plan, ma.names), ma, costs, cluster, training), training)
    per_rank = [0.0] * cfg.pp
    for st in est.stages:
        per_rank[st.rank] = st.memory["total"]
    usable = capacity_bytes(cluster, SearchOptions(**plan.memory_reserve()))
    return Memory(per_rank=per_rank, usable=usable, device=cluster.device.memory_bytes)







def _fp8_linear_words(plan: Plan, software: str) -> str:
    """``, torchao's FP8 Linear (...)``: where the target's FP8 Linear is not the one the plan
    was priced with (EngineSpec.fp8_linear), what that changes in memory; else ''."""
    runs = engine_from_mapping(software).fp8_linear
    if plan.training.get("dtype") != "fp8" or \
            runs == engine_from_mapping(plan.training.get("engine")).fp8_linear:
        return ""
    return (", torchao's FP8 Linear (16-bit inputs saved, no FP8 weight copies)" if runs ==
            "torchao" else ", Transformer Engine's FP8 Linear (inputs saved in FP8, FP8 weight "
            "copies kept)")


def recheck(plan: Plan, target: str, change: str, *, state_layout: str | None = None,
            required: bool = True, dtype: str | None = None, **changes) -> str:
    """Price the plan with ``changes`` (described by ``change``, e.g. "ZeRO-1 instead of ZeRO-3")
    as ``target``'s software runs it (its kernels and attention) with the engine's
    ``state_layout``; InfeasibleError with the numbers when a rank no longer fits, else a note with
    them. Not ``required`` (only the software or the state layout differs): a plan this machine
    cannot price again (its model not found here, made from a module) gets a note saying so."""
    parts = [change] if change else []
    if state_layout and common.planned_layout(plan) != state_layout:  # (or not recorded)
        parts.append(f"the {common.STATE_LAYOUT_WORDS.get(state_layout, state_layout)}")
    software = common.software_of(target, plan)
    if common.kernels_differ(plan, target):
        parts.append(f"the kernels {target} runs (--engine {software})" + _fp8_linear_words(
            plan, software))
    change = " and ".join(parts) or "the plan's settings"
    try:
        mem = memory(plan, state_layout=state_layout, software=software, target=target,
                     dtype=dtype, **changes)
    except PlannerError as exc:  # the model not found here, or no longer traced
        if required:
            raise
        return f"memory not re-checked with {change}: {exc}"
    planned = plan.predicted["peak_memory_bytes"]
    if mem.peak > mem.usable:  # valid inputs, no room: exit 3 (no plan fits), as a search's
        needs = (f"{rank_words(mem)} needs {common.gb(mem.peak)} per GPU" if rank_words(mem)
                 else f"a GPU needs {common.gb(mem.peak)}")
        raise InfeasibleError(
            f"no {target} export fits: with {change}, {needs}, more than the "
            f"{common.gb(mem.usable)} usable of "
            f"{common.gb(mem.device)} (the plan: {common.gb(planned)}); re-plan for it with "
            f"`{replan.resolve_hint(plan, target, nearest=False)}`", reason="out of memory")
    where = f" ({rank_words(mem)})" if rank_words(mem) else ""
    versus = ("as the plan's" if common.gb(mem.peak) == common.gb(planned)
              else f"instead of the plan's {common.gb(planned)}")
    return (f"memory re-checked with {change}: a peak of {common.gb(mem.peak)} per GPU{where} "
            f"{versus}; still within the {common.gb(mem.usable)} usable")


def rank_words(mem: Memory) -> str:
    """Which GPU the peak is on, in words: its pipeline rank where there is a pipeline, else
    ""."""
    return f"pipeline rank {mem.worst_rank}" if len(mem.per_rank) > 1 else ""


def _cluster(plan: Plan, what: str, target: str):
    c = plan.cluster
    if plan.parallel.get("dp_replicate", 1) > 1 and "spec" in c["groups"][0]:
        return cluster_from_mapping(c["groups"][0]["spec"], where="plan.cluster.groups[0].spec")
    if "groups" in c:
        raise SpecError(f"export: cannot {what} on a cluster with node groups; re-plan with "
                        f"--target {target}")
    return planned_cluster(c, f"export: cannot {what}")


def _bounds(plan: Plan, names: list[str]) -> list[int]:
    """Block index bounds of the plan's stages (chunk c = blocks [b[c], b[c+1]))."""
    index = {n: i for i, n in enumerate(names)}
    bounds = [0]
    for st in plan.stages:
        blocks = st["blocks"]
        if not blocks or blocks[0] not in index or index[blocks[0]] != bounds[-1]:
            raise SpecError("export: the plan's stages do not match the model's blocks as it "
                            "traces now; re-create the plan")
        bounds.append(bounds[-1] + len(blocks))
    if bounds[-1] != len(names):
        raise SpecError("export: the plan's stages do not cover the model's blocks as it traces "
                        "now; re-create the plan")
    return bounds
