"""Second pass over the search's best candidates: exact stage assignment on DAGs, and simulation.

The search ranks every configuration with closed forms on a chain split (fast). Its top k are then:

1. re-split with CP-SAT when the blocks form a DAG rather than a chain (planner.solve.dag), with
   the chain split as the starting hint, so the result is never worse;
2. re-timed by simulating their schedule event by event (planner.schedule.simulator): unequal
   stages, p2p delays and the schedule's exact order set the pipeline time and the activations in
   flight.

The candidates are then re-ranked by the refined step time.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from costmodels import pipeline
from costmodels.topology import Cluster
from planner.options import SearchOptions, TrainingSpec
from planner.schedule import difference_s
from planner.schedule.builders import SPLIT_BACKWARD
from planner.schedule.simulator import built, simulate
from planner.search.costs import BlockCosts, ModelArrays, capacity_bytes, config_costs, stage_memory
from planner.search.pricing import Estimate, idle_s, price, weight_grad_s
from planner.solve.dag import solve_dag
from planner.trace.graph import BlockGraph

log = logging.getLogger(__name__)


def cpsat_budget_s(options: SearchOptions, deadline: float | None, left: int) -> float:
    """CP-SAT seconds for one of ``left`` candidates still to refine: the option's limit, or an
    equal share of the time until ``deadline`` (at least 0.05 s)."""
    if deadline is None:
        return options.cpsat_time_limit_s
    return max(0.05, (deadline - time.perf_counter()) / left)


def refine(candidates: list[Estimate], bg: BlockGraph, ma: ModelArrays, cost_of, cluster: Cluster,
           training: TrainingSpec, options: SearchOptions, deadline: float | None) -> list[Estimate]:
    """The candidates re-split (DAGs; not where a layout pins the split) and re-timed
    (simulation), best first. ``cost_of(cfg)`` gives a candidate's BlockCosts."""
    out = []
    for i, est in enumerate(candidates):
        if not bg.is_chain() and est.config.vpp == 1 and options.layout is None:
            budget = cpsat_budget_s(options, deadline, len(candidates) - i)
            est = refine_dag(est, bg, ma, cost_of(est.config), cluster, training, options, budget)
        out.append(simulated(est, training))
    return sorted(out, key=lambda e: e.rank)


def refine_dag(est: Estimate, bg: BlockGraph, ma: ModelArrays, costs: BlockCosts, cluster: Cluster,
               training: TrainingSpec, options: SearchOptions, budget_s: float) -> Estimate:
    """Re-split ``est`` with CP-SAT; keep the chain split when CP-SAT finds nothing better."""
    cfg = est.config
    mem = stage_memory(cfg, costs, ma, training, capacity_bytes(cluster, options))
    position = {name: i for i, name in enumerate(ma.names)}
    hint = [0] * len(ma.names)
    for st in est.stages:
        for name in st.blocks:
            hint[position[name]] = st.index
    edges = sorted({(position[e.src], position[e.dst]) for e in bg.edges})
    t0 = time.perf_counter()
    res = solve_dag(costs.split_s(cfg), edges, cfg.pp, mem, time_limit_s=budget_s,
                    seed=options.cpsat_seed, hint=hint)
    took = time.perf_counter() - t0  # (said where it took a while: a what-if asks it per point)
    log.log(logging.INFO if took >= 1.0 else logging.DEBUG,
            "CP-SAT stage assignment for %s: %s in %.2f s", cfg.short(),
            res.status if res else "no solution", took)
    if res is None:
        return dataclasses.replace(est, split_status="feasible", split_gap=None)
    chain_bottleneck = max(st.compute_s + st.tp_comm_s for st in est.stages)
    if res.bottleneck >= chain_bottleneck * (1 - 1e-6):
        return dataclasses.replace(est, split_status=res.status, split_gap=res.gap)
    ma2 = ModelArrays.from_blocks(bg, order=[bg.index()[ma.names[b]] for b in res.order])
    better = price(cfg, res.bounds, ma2, costs.permuted(res.order), cluster, training)
    return dataclasses.replace(better, stage_split="cp-sat", split_status=res.status,
                               split_gap=res.gap)


def repriced(est: Estimate, bg: BlockGraph, cluster: Cluster, training: TrainingSpec) -> Estimate:
    """``est``'s configuration and stage split priced under ``training`` (another dtype or
    engine) and its schedule simulated: what the same plan costs with that software."""
    cfg = est.config
    index = bg.index()
    order = [index[name] for st in est.stages for name in st.blocks]
    ma = ModelArrays.from_blocks(bg, order=order)
    bounds = [0]
    for st in est.stages:
        bounds.append(bounds[-1] + len(st.blocks))
    costs = config_costs(ma, cluster, training, cfg)
    return simulated(price(cfg, bounds, ma, costs, cluster, training), training)


def simulated(est: Estimate, training: TrainingSpec, runs: dict | None = None, *,
              sends_apart: bool = True) -> Estimate:
    """``est`` with its pipeline time and activation memory taken from a simulation. ``runs``: a
    dict the calls of one search share, keyed by the simulation's inputs (pipeline_key):
    configurations that differ only in what the pipeline does not see (ZeRO stage, offload)
    are simulated once. ``sends_apart``: the waits for the sends between stages told apart from
    the bubble (a second simulation, with free sends); a search re-timing many candidates leaves
    them in the bubble and tells them apart for the plans it returns (the step is the same)."""
    cfg = est.config
    m = cfg.num_microbatches
    fwd, bwd, wgrad, act = _passes(est)
    sim_key = pipeline_key(est) if runs is not None else None
    hit = runs.get(sim_key) if sim_key is not None else None
    if hit is None:
        hit = _simulated_step(cfg, fwd, bwd, wgrad, est.cut_p2p_s or 0.0, act)
        if sim_key is not None:
            runs[sim_key] = hit
    step_s, peaks = hit
    stages = [dataclasses.replace(st) for st in est.stages]
    for r in range(cfg.pp):
        mine = [st for st in stages if st.rank == r]
        mem = dict(mine[0].memory)
        mem["activations"] = float(peaks[r])
        mem["total"] = sum(v for k, v in mem.items() if k != "total")
        for st in mine:
            st.memory = mem
    busy = [sum(st.compute_s + _inside_comm_s(st) for st in stages if st.rank == r)
            for r in range(cfg.pp)]
    slow = int(np.argmax(busy))
    bd = dict(est.breakdown)
    bd["compute_s"] = m * sum(st.compute_s for st in stages if st.rank == slow)
    bd["tp_comm_s"] = m * sum(st.tp_comm_s for st in stages if st.rank == slow)
    for key, attr in (("cp_comm_s", "cp_comm_s"), ("ep_comm_s", "ep_comm_s")):
        if key in bd:
            bd[key] = m * sum(getattr(st, attr) for st in stages if st.rank == slow)
    bd["pp_comm_s"] = 0.0  # sends overlap compute; waiting for them shows as bubble
    bd["bubble_s"] = idle_s(step_s, m * busy[slow])
    bd["straggler_s"] = est.straggler_excess * (bd["compute_s"] + bd["optimizer_s"])
    out = dataclasses.replace(
        est, stages=stages,
        step_time_s=step_s + bd["dp_comm_s"] + bd["optimizer_s"] + bd["straggler_s"],
        breakdown=bd, peak_memory_bytes=max(st.memory["total"] for st in stages),
        timing="simulated")
    return with_sends_apart(out, step_s, runs, sim_key) if sends_apart else out


def with_sends_apart(est: Estimate, pipeline_s: float | None = None, runs: dict | None = None,
                     sim_key: tuple | None = None) -> Estimate:
    """A simulated ``est`` whose waits for the sends between stages (slow links, on device
    groups and sites above all) are told apart from its bubble (breakdown pp_comm_s): the same
    schedule simulated with free sends, the step's difference the sends' share. ``pipeline_s``:
    its pipeline's simulated time (None: its step less what runs after the pipeline); ``runs``
    and ``sim_key`` as ``simulated``'s. The step is the same; an estimate without sends, or whose
    sends are told apart already, comes back as it is."""
    bd = est.breakdown
    if est.timing != "simulated" or not est.cut_p2p_s or max(est.cut_p2p_s) <= 0 or \
            bd.get("pp_comm_s"):
        return est
    if pipeline_s is None:
        pipeline_s = est.step_time_s - bd["dp_comm_s"] - bd["optimizer_s"] - bd["straggler_s"]
    free = runs.get((sim_key, "free")) if sim_key is not None else None
    if free is None:
        fwd, bwd, wgrad, act = _passes(est)
        free = _simulated_step(est.config, fwd, bwd, wgrad, 0.0, act)
        if sim_key is not None:
            runs[sim_key, "free"] = free
    sends = min(bd["bubble_s"], max(0.0, pipeline_s - free[0]))
    return dataclasses.replace(est, breakdown={**bd, "pp_comm_s": sends,
                                               "bubble_s": bd["bubble_s"] - sends})


def _passes(est: Estimate) -> tuple[list, list, list, list]:
    """(forward, backward, weight-gradient seconds, activation bytes) of each chunk of ``est``
    per micro-batch, as the schedule's simulation takes them: the collectives inside a chunk,
    tensor parallelism's as the pricing split them between the passes
    (StageEstimate.tp_fwd_comm_s), cp's K/V exchange and expert dispatch by the share the
    recomputation leaves the forward."""
    share = pipeline.forward_comm_share(est.config.recompute)
    fwd = [st.fwd_s + st.tp_fwd_comm_s + share * (st.cp_comm_s + st.ep_comm_s)
           for st in est.stages]
    split = est.config.schedule in SPLIT_BACKWARD
    wgrad = [weight_grad_s(st) if split else 0.0 for st in est.stages]
    # (a chunk that runs no backward: its difference may round to -1e-22)
    bwd = [difference_s(st.compute_s - st.fwd_s + st.tp_comm_s - st.tp_fwd_comm_s
                        + (1 - share) * (st.cp_comm_s + st.ep_comm_s) - w, st.compute_s)
           for st, w in zip(est.stages, wgrad)]
    return fwd, bwd, wgrad, [st.act_bytes for st in est.stages]


def pipeline_key(est: Estimate) -> tuple:
    """What ``simulated`` simulates of ``est``: the schedule, its shape, and per chunk the
    passes, sends and activations (equal keys, equal simulations)."""
    cfg = est.config
    return (cfg.schedule, cfg.pp, cfg.vpp, cfg.num_microbatches, cfg.recompute,
            tuple((st.fwd_s, st.compute_s, _inside_comm_s(st), weight_grad_s(st), st.act_bytes)
                  for st in est.stages), tuple(est.cut_p2p_s or ()), bool(est.stages[0].group))


def _inside_comm_s(st) -> float:
    """Communication inside a chunk per micro-batch: tensor-parallel, context-parallel, expert."""
    return st.tp_comm_s + st.cp_comm_s + st.ep_comm_s


SIM_EXACT = 256
"""Micro-batches per step simulated event by event; longer steps are simulated at two lengths
past the warm-up (at least 4 x pp x vpp, pp apart, with the step's own remainder modulo pp: a
last partial round of pp costs what it costs) and extrapolated, since every schedule's
steady state adds the same time and memory per further micro-batch (1F1B: the bottleneck stage's
forward and backward, no memory; GPipe: that time and one micro-batch's activations)."""


def _simulated_step(cfg, fwd, bwd, wgrad, p2p_s: float, act) -> tuple[float, list[float]]:
    """(pipeline seconds, peak activation bytes per rank) of ``cfg``'s schedule."""
    def run(m: int):
        sim = simulate(built(cfg.schedule, cfg.pp, m, vpp=cfg.vpp), microbatches=m, fwd_s=fwd,
                       bwd_s=bwd, wgrad_s=wgrad, p2p_s=p2p_s, activation_bytes=act, vpp=cfg.vpp,
                       timeline=False)
        return sim.step_time_s, list(sim.peak_activation_bytes)

    m, unit = cfg.num_microbatches, cfg.pp
    m0 = unit * -(-max(SIM_EXACT, 4 * cfg.pp * cfg.vpp) // unit) + m % unit
    if m <= m0 + unit:
        return run(m)
    (t0, p0), (t1, p1) = run(m0), run(m0 - unit)
    k = (m - m0) / unit
    return t0 + k * (t0 - t1), [a + k * (a - b) for a, b in zip(p0, p1)]
