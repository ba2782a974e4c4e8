"""Build this process's part of a plan: mesh, stage modules, parallelisms, schedule, optimizer.

Runs inside an initialized process group (one process per mesh rank). Everything comes from the
plan and the RunOptions; nothing is read from elsewhere.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from costmodels.engine import engine_from_mapping
from costmodels.memory import layer_interval
from planner import targets
from planner.errors import SpecError
from planner.options import FIX_KEYS, KNOBS, fix_text
from planner.planfile.document import Plan
from planner.schedule import Action, torch_actions
from planner.runtime import context as ctxp
from planner.runtime import experts as moe
from planner.runtime import model as mdl
from planner.runtime import parallelize as par
from planner.runtime.dataflow import Dataflow, probe
from planner.trace.hf import experts_modules
from planner.runtime.inner_weights import InnerWeights, inside_modules, split_inner
from planner.runtime.layout import Layout, layout_of
from planner.runtime.options import RunOptions
from planner.runtime.stages import StageModule, cuts, units_of
from planner.runtime.tied import TieSync, find_ties, tie_sync

log = logging.getLogger(__name__)


@dataclass
class Built:
    """This rank's share of the plan, ready to step."""

    layout: Layout
    coords: dict
    device: torch.device
    stages: list = field(default_factory=list)
    """PipelineStage objects this rank runs."""
    modules: list = field(default_factory=list)
    """Their StageModules (for parameters)."""
    schedule: object = None
    microbatches: int = 1
    """Micro-batches per step (the schedule divides each one's loss by their number)."""
    optimizer: object = None
    inputs: tuple = ()
    """This data-parallel replica's share of the synthetic batch."""
    targets: torch.Tensor | None = None
    notes: list = field(default_factory=list)
    """Where the run departs from the plan, one line each."""
    ties: TieSync = field(default_factory=TieSync)
    """Parameters shared by stages (tied embeddings) and how their gradients are summed."""
    inner: InnerWeights = field(default_factory=InnerWeights)
    """Weights inside tensor-parallel regions: per-head slices, and shared ones kept in step."""
    experts: moe.ExpertGroups | None = None
    """Expert parallelism on this rank (ep > 1): its groups and expert parameters."""
    routing: moe.RoutingRecord | None = None
    """Without expert parallelism, the routing of this rank's MoE layer calls (None: no MoE)."""
    expert_names: set = field(default_factory=set)
    """FQNs (in the model) of the expert parameters this rank holds a slice of."""
    dp_wrap: str = "none"


def build(plan: Plan, opts: RunOptions, device: torch.device) -> Built:
    layout = layout_of(plan)
    rank = dist.get_rank()
    if dist.get_world_size() != layout.world:
        raise SpecError(f"parallel: the plan needs {layout.world} processes, "
                        f"{dist.get_world_size()} were started")
    check_knobs(plan)
    mesh = _device_mesh(layout, device)
    spec = plan.model_spec(opts.model)
    meta = mdl.resolve_meta(plan, spec)
    real = mdl.build_real(plan, spec, meta, seed=opts.seed)
    mdl.check_fingerprint(plan, spec, mdl.fingerprint(real.module))
    check_model(plan, real.module, layout)
    inputs = mdl.synthetic_batch(real, plan.training["global_batch"], seed=opts.seed)
    out = Built(layout=layout, coords={**layout.coords(rank), "ep": layout.ep_index(rank)},
                device=device)
    dropout = dropout_note(real.module)
    if dropout:
        out.notes.append(dropout)
    positions = _cp_positions(plan, layout, out.coords["cp"])
    units, flow, stage_cuts = cut_model(plan, real, inputs, positions)
    ties = find_ties(real.module, units)
    out.inputs, out.targets = _data(plan, inputs, flow, out.coords, layout, opts.seed, device,
                                    positions)
    out.experts = _expert_groups(layout, rank, mesh)  # every rank creates the groups, in order
    ring = _ring(layout, rank, mesh)
    kwargs = dict(real.kwargs)
    if positions is not None:
        ctxp.register()
        ctxp.set_ring(ring)
        kwargs["position_ids"] = positions.unsqueeze(0).to(device)
    dp_mesh = _dp_mesh(mesh, layout, int(plan.parallel["zero"]))
    id_ranges = {i: (int(x.min()), int(x.max())) for i, x in enumerate(inputs)
                 if not x.is_floating_point() and x.dtype != torch.bool and x.numel()}
    for s in layout.local_stages(rank):
        module = StageModule(copy.deepcopy(real.module), stage_cuts[s], flow, units, kwargs,
                             mdl.output_logits, id_ranges)
        out.modules.append(_parallelize(module, plan, flow, mesh, dp_mesh, layout, device, out))
    del real
    split = any("W" in a for acts in plan.schedule["actions"] for a in acts)
    local = layout.local_stages(rank)
    out.stages = [_pipeline_stage(m, s, layout, mesh, device,
                                  _whole_backward(m, flow, split, plan, out))
                  for m, s in zip(out.modules, local)]
    if out.experts is None and any(experts_modules(m.model) for m in out.modules):
        out.routing = moe.RoutingRecord()
        for m in out.modules:
            moe.record_routing(m.model, out.routing)
    for st in out.stages:
        moe.record_routing_outside(st, out.experts or out.routing)
    out.ties = tie_sync(ties, layout, rank, dict(zip(local, out.modules)))
    out.schedule = _schedule(plan, out.stages, layout)
    out.microbatches = int(plan.parallel["num_microbatches"])
    out.optimizer = mdl.make_optimizer(plan, [p for m in out.modules for p in m.parameters()],
                                       opts.lr)
    out.notes.extend(unrun_notes(plan, layout))
    return out


def unrun_notes(plan: Plan, layout: Layout) -> list[str]:
    """What of the plan the runtime runs otherwise than planned (printed by a run, and before it
    by ``plan run --dry-run``)."""
    notes = []
    edited = plan.parallel_edits()
    if edited:  # (every knob a person pins, so that the re-plan prices this configuration; the
        # micro-batch count follows from the batch, dp and micro_batch)
        pins = fix_text({k: v for k, v in plan.parallel.items() if k in FIX_KEYS})
        notes.append("parallel edited after planning (" + ", ".join(
            f"{k} {old} -> {new}" for k, (old, new) in edited.items()) + "): the predictions "
            "are the planned configuration's, so measured vs predicted compares two "
            f"configurations; re-plan with plan solve ... --fix {pins} for a prediction of this "
            "one")
    optimizer = plan.training_edits().get("optimizer")
    if optimizer:
        notes.append(f"training.optimizer edited after planning ({optimizer[0]} -> "
                     f"{optimizer[1]}): the predictions are {optimizer[0]}'s (its states' memory, "
                     f"its step); re-plan with plan solve ... --optimizer {optimizer[1]} for a "
                     "prediction of this one")
    if plan.parallel.get("sequence_parallel"):
        notes.append("sequence_parallel not applied (tensor parallelism runs without it)")
        if (plan.training.get("engine") or {}).get("tp_overlap") and plan.parallel["tp"] > 1:
            notes.append("tp_overlap not applied: tensor parallelism's collectives run after "
                         "their GEMMs, where the plan prices them hidden behind them")
    if plan.parallel.get("offload_optimizer"):
        notes.append("offload_optimizer not applied: the optimizer steps on the device, so the "
                     "prediction (which offloads) is not comparable; plan with --fix "
                     "offload_optimizer=false")
    note = unrun_moe_settings(plan) if layout.ep > 1 else None
    if note:
        notes.append(note)
    if layout.ep > 1 and layout.edp > 1 and int(plan.parallel["zero"]) >= 1:
        notes.append(f"experts' optimizer states not sharded over edp={layout.edp} (their "
                     "gradients are all-reduced over it); the dense states are sharded as "
                     "planned")
    dtype = plan.training["dtype"]
    layout_name = (plan.training.get("engine") or {}).get("state_layout", "megatron")
    if dtype in ("bf16", "fp16") and layout_name != "native":  # (the others keep fp32 masters)
        notes.append(f"the model trains in {dtype} throughout: parameters, gradients and "
                     f"optimizer states in {dtype}, no fp32 master copy, where the plan prices "
                     f"the {layout_name} layout, with fp32 master weights: model states and "
                     "peak memory come out lower than predicted")
    return notes


def check_knobs(plan: Plan) -> None:
    """Refuse (SpecError naming the knob) the parallelisms the runtime does not run yet, and a
    batch the plan's knobs do not make up (a hand-edited plan), before any process starts."""
    par_ = plan.parallel
    batch, dp, mb, m = (int(x) for x in (plan.training["global_batch"], par_["dp"],
                                        par_["micro_batch"], par_["num_microbatches"]))
    if batch != dp * mb * m:
        raise SpecError(f"parallel.micro_batch: dp {dp} x micro_batch {mb} x num_microbatches {m} "
                        f"= {dp * mb * m} samples, but training.global_batch is {batch}; make "
                        "them agree, or re-plan with plan solve")
    _check_edits(plan)
    cp, ep, etp = (int(par_.get(k, 1)) for k in ("cp", "ep", "etp"))
    comm = par_.get("cp_comm", "p2p")
    if cp > 1 and comm != "p2p":
        raise SpecError(f"parallel.cp_comm: the runtime exchanges keys and values around a ring "
                        f"(p2p), not by {comm}; re-plan with --fix cp_comm=p2p (or --target torch)")
    if etp > 1:
        raise SpecError(f"parallel.etp: the runtime does not split experts' matrices (etp={etp}); "
                        "re-plan with --fix etp=1 (or --target torch)")
    runs = targets.engine("torch").recompute
    if par_["recompute"] not in runs:
        raise SpecError(f"parallel.recompute: the runtime does not run {par_['recompute']} "
                        f"recomputation (it runs {', '.join(runs)}); re-plan with --fix "
                        "recompute=full (or --target torch)")


PARALLEL_KEYS = (*KNOBS, "dp_replicate")
"""The keys a plan's ``parallel`` section holds (emit)."""


def _check_edits(plan: Plan) -> None:
    """Refuse (SpecError naming the field) a hand edit that leaves the plan's parts disagreeing,
    before any process starts (a new-user check saw an edited sequence run 10x longer than its
    memory check assumed, an edited micro-batch count crash inside torch's schedule, and tp=2
    with a map that splits nothing run as two copies of the whole model)."""
    par_ = plan.parallel
    unknown = sorted(set(par_) - set(PARALLEL_KEYS))
    if unknown:
        raise SpecError(f"parallel.{unknown[0]}: not a knob of a plan (they are "
                        f"{', '.join(PARALLEL_KEYS)}); remove it or re-plan with plan solve")
    traced = int(plan.model.get("trace", {}).get("seq_len") or 0)
    if traced and int(plan.training["seq_len"]) != traced:
        raise SpecError(f"training.seq_len: {plan.training['seq_len']}, but the plan was traced and "
                        f"priced at {traced} tokens (model.trace.seq_len); re-plan with --seq-len "
                        f"{plan.training['seq_len']}")
    if int(par_["tp"]) > 1 and not any(role in ("colwise", "rowwise", "vocab")
                                       for role in (plan.tensor_parallel or {}).values()):
        raise SpecError(f"parallel.tp: {par_['tp']}, but tensor_parallel splits no module (every "
                        "role replicate): each rank would run the whole model; re-plan with "
                        "plan solve")
    schedule = plan.schedule or {}
    if schedule.get("name", par_["schedule"]) != par_["schedule"]:
        raise SpecError(f"schedule.name: {schedule['name']}, but parallel.schedule is "
                        f"{par_['schedule']}; make them agree, or re-plan with plan solve")
    actions = schedule.get("actions")
    # (a bidirectional schedule is refused later; one stage's actions are run by
    # torch.distributed.pipelining too: a new-user check's edited pp=1 plan crashed inside it)
    if actions and schedule.get("name") != "bidirectional":
        _check_actions(actions, plan, int(par_["num_microbatches"]))


def _check_actions(actions, plan: Plan, m: int) -> None:
    """Each pipeline rank's actions run a forward and a backward of every micro-batch (and a
    weight-gradient pass, where the schedule splits them) for each stage it holds, once."""
    ranks = {int(st.get("pipeline_rank", i)) for i, st in enumerate(plan.stages)}
    if len(actions) != len(ranks):
        raise SpecError(f"schedule.actions: {len(actions)} lists, one per pipeline rank, but the "
                        f"stages occupy {len(ranks)}; re-plan with plan solve")
    for r, acts in enumerate(actions):
        held = sorted(i for i, st in enumerate(plan.stages)
                      if int(st.get("pipeline_rank", i)) == r)
        seen: dict[tuple, list] = {}
        for a in acts:
            act = Action.parse(a)
            seen.setdefault((act.stage, act.kind), []).append(act.microbatch)
        kinds = ["F", "B"] + (["W"] if any(k == "W" for _, k in seen) else [])
        for stage in held:
            for kind in kinds:
                if sorted(seen.get((stage, kind), [])) != list(range(m)):
                    raise SpecError(f"schedule.actions[{r}]: stage {stage}'s {kind} actions do not "
                                    f"cover micro-batches 0..{m - 1} once each "
                                    f"(parallel.num_microbatches is {m}); re-plan with plan solve")
        stray = sorted({s for s, _ in seen} - set(held))
        if stray:
            raise SpecError(f"schedule.actions[{r}]: actions of stage {stray[0]}, which pipeline "
                            f"rank {r} does not hold; re-plan with plan solve")
    if plan.parallel["schedule"] != "zb-h1" and any("W" in str(a) for acts in actions
                                                    for a in acts):
        raise SpecError(f"schedule.actions: weight-gradient (W) actions belong to zb-h1, but "
                        f"parallel.schedule is {plan.parallel['schedule']}; re-plan with plan "
                        "solve")


def dropout_note(module) -> str:
    """'' or a note that the model drops activations at random in training: every layout draws
    other masks, so its losses differ from another layout's, or the single process's (a
    new-user check compared T5 and BART layouts and found them apart, with no word why)."""
    rates = sorted({round(m.p, 4) for m in module.modules()
                    if isinstance(m, torch.nn.Dropout) and m.p > 0})
    config = getattr(module, "config", None)
    rates += sorted({getattr(config, k) for k in ctxp.DROPOUT_KEYS
                     if isinstance(getattr(config, k, None), float) and getattr(config, k) > 0})
    if not rates:
        return ""
    return (f"the model has dropout (p = {', '.join(f'{r:g}' for r in sorted(set(rates)))}): "
            "each layout draws other random masks, so its losses differ from another layout's; "
            "set the model's dropout to 0 to compare layouts")


def check_model(plan: Plan, module, layout: Layout) -> None:
    """Refuse (SpecError naming cp, ep or the tensor-parallel module) a model the runtime cannot
    run with the plan's cp/ep/tp, before any process starts."""
    if layout.tp > 1:
        par.check_modules(plan.tensor_parallel, dict(module.named_modules()))
    if layout.cp > 1:
        ctxp.check_model(module, int(plan.training["seq_len"]), layout.cp)
    if layout.ep > 1:
        moe.check_model(module, layout.ep, layout.etp)
        if layout.tp > 1:
            tokens = int(plan.parallel["micro_batch"]) * int(plan.training["seq_len"]) // layout.cp
            if tokens % layout.tp:
                raise SpecError(f"parallel.ep: with tp={layout.tp} each tp rank routes 1/tp of a "
                                f"micro-batch's {tokens} tokens, which do not split evenly; plan "
                                "another micro_batch")


def _cp_positions(plan: Plan, layout: Layout, cp_index: int):
    """Global positions of this cp rank's tokens (None without context parallelism)."""
    if layout.cp == 1:
        return None
    return ctxp.chunk_positions(int(plan.training["seq_len"]), layout.cp, cp_index)


def _expert_groups(layout: Layout, rank: int, mesh) -> moe.ExpertGroups | None:
    if layout.ep == 1:
        return None
    mine = {}
    for kind, groups in (("ep", layout.ep_groups()), ("edp", layout.edp_groups())):
        for ranks in groups:
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            if rank in ranks:
                mine[kind] = group
    me = layout.coords(rank)
    return moe.ExpertGroups(
        ep=layout.ep, ep_index=layout.ep_index(rank), ep_group=mine["ep"],
        edp_group=mine.get("edp"), tp=layout.tp, tp_index=me["tp"],
        tp_group=mesh.get_group("tp") if layout.tp > 1 else None,
        grad_divisor=layout.dp * layout.cp)


def _ring(layout: Layout, rank: int, mesh) -> ctxp.Ring | None:
    if layout.cp == 1:
        return None
    me = layout.coords(rank)
    at = {k: me[k] for k in ("pp", "dp", "tp")}
    c = me["cp"]
    return ctxp.Ring(group=mesh.get_group("cp"), rank=c, size=layout.cp,
                     next_rank=layout.rank_of(cp=(c + 1) % layout.cp, **at),
                     prev_rank=layout.rank_of(cp=(c - 1) % layout.cp, **at),
                     ranks=tuple(layout.rank_of(cp=i, **at) for i in range(layout.cp)))


def cut_model(plan: Plan, real: mdl.RealModel, inputs: tuple, positions=None):
    """Units per stage, the dataflow of one micro-batch through the real model (CPU, no autograd),
    and each stage's carry lists. With context parallelism the probe reads this rank's tokens
    (``positions``), so that the probed shapes are those the stages exchange."""
    units = units_of(real.module, [st["modules"] for st in plan.stages])
    args = tuple(x[:plan.parallel["micro_batch"]] for x in inputs)
    if positions is not None:
        args = tuple(x[:, positions] for x in args)
    tp_modules = [m for m, role in plan.tensor_parallel.items() if role in par.TP_ROLES]
    # replicated modules with weights of their own: whether a column-parallel Linear feeds one
    # (a norm over each head: planner.runtime.inner_weights keeps its weights in step)
    named = dict(real.module.named_modules())
    watch = [m for m, role in plan.tensor_parallel.items() if role == "replicate" and m in named
             and any(True for _ in named[m].parameters(recurse=False))]
    flat = [u for us in units for u in us]
    with torch.no_grad():
        flow = probe(real.module, args, real.kwargs, flat, tp_modules, mdl.output_logits,
                     watch=watch)
    return units, flow, cuts(flow, units)


def _parallelize(module: StageModule, plan: Plan, flow: Dataflow, mesh, dp_mesh, layout: Layout,
                 device: torch.device, out: Built) -> StageModule:
    module.to(device)
    units = module.cut.units
    if layout.tp > 1:
        named = dict(module.model.named_modules())
        present = {n for n in named if any(n == u or n.startswith(u + ".") for u in units)}
        fused = sorted(m for m in flow.cut if m in present
                       and plan.tensor_parallel.get(m) == "colwise")
        if fused:  # (a plan for --target torch has none: planner.trace.tp_roles finds them too)
            raise SpecError(f"tensor_parallel.{fused[0]}: its output is cut into parts (a fused "
                            "projection), which DTensor's column-parallel split of its rows would "
                            "mix up across ranks; re-plan with --target torch, or --fix tp=1")
        styles, notes = par.tp_styles(plan.tensor_parallel, flow.feeds, present, named, layout.tp)
        out.notes.extend(notes)
        out.inner.tp, out.inner.tp_index = layout.tp, out.coords["tp"]
        out.inner.group = mesh["tp"].get_group()
        # (before apply_tp divides the modules' head counts, by which split_inner knows a
        # per-head weight)
        split_inner(module.model, inside_modules(plan.tensor_parallel, flow.feeds, present, named),
                    out.inner)
        par.apply_tp(module.model, mesh["tp"], styles)
    ignored = set()
    if out.experts is not None:
        names = moe.shard_experts(module.model, out.experts)
        out.expert_names.update(names)
        ignored = {module.model.get_parameter(n) for n in names}
    if layout.cp > 1:
        module.model.config._attn_implementation = ctxp.RING
    rc = plan.parallel["recompute"]
    par.apply_recompute(module.model, _checkpointed(plan, units),
                        "full" if layer_interval(rc) else rc)
    out.dp_wrap = par.apply_dp(module, units, dp_mesh, int(plan.parallel["zero"]), ignored)
    module.attach_hooks()
    return module


def _device_mesh(layout: Layout, device: torch.device) -> DeviceMesh:
    """The DeviceMesh with dims (pp, dp, cp, tp); with replicate groups (data parallelism across
    sites) built as (pp, dp_replicate, dp_shard, cp, tp) and its dp dimension the flattened
    (dp_replicate, dp_shard), which numbers the replicas alike."""
    ranks = torch.tensor(layout.mesh())
    if layout.replicate == 1:
        return DeviceMesh(device.type, ranks, mesh_dim_names=("pp", "dp", "cp", "tp"))
    k = layout.replicate
    mesh = DeviceMesh(device.type, ranks.reshape(layout.pp, k, layout.dp // k, layout.cp,
                                                 layout.tp),
                      mesh_dim_names=("pp", "dp_replicate", "dp_shard", "cp", "tp"))
    mesh["dp_replicate", "dp_shard"]._flatten("dp")
    return mesh


def _dp_mesh(mesh, layout: Layout, zero: int = 0):
    """The ranks that average the dense gradients: dp x cp (the cp ranks hold the same weights
    and different tokens); None when that is one rank. With replicate groups and sharded states
    (ZeRO >= 1), the 2-D mesh FSDP2 runs as HSDP: sharded over a group's dp_shard (x cp) ranks,
    replicated across the groups."""
    if layout.dp * layout.cp == 1:
        return None
    if layout.replicate > 1 and zero >= 1:
        if layout.cp == 1:
            return mesh["dp_replicate", "dp_shard"]
        mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
        return mesh["dp_replicate", "dp_shard_cp"]
    if layout.cp == 1:
        return mesh["dp"]
    if layout.dp == 1:
        return mesh["cp"]
    if layout.replicate > 1:  # (the flattened dp joins no other dimension)
        return mesh["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp")
    return mesh["dp", "cp"]._flatten("dp_cp")


def _pipeline_stage(module: StageModule, s: int, layout: Layout, mesh, device, dw_builder):
    from torch.distributed.pipelining import PipelineStage  # lazy: only plans with pp > 1 build pipeline stages

    return PipelineStage(module, s, layout.num_stages, device, group=mesh.get_group("pp"),
                         dw_builder=dw_builder)


def _whole_backward(module: StageModule, flow: Dataflow, split: bool, plan: Plan, out: Built):
    """torch's split backward (B = input gradients, W = weight gradients) fails on a module that
    runs twice in one stage (pytorch/pytorch#180952), on activation checkpointing (its weight
    pass cannot replay torch.utils.checkpoint's recomputation) and on a later stage with a trained
    weight applied to what no received activation feeds: model inputs it receives (an
    encoder-decoder's decoder embedding its own token ids, a diffusion UNet's text context) or
    constants (T5's relative position
    bias, an embedding of bucket indices); W then runs into parts of the graph another weight's
    pass freed. Such a stage computes the weight gradients during B and runs W as a no-op (same
    numbers, no deferred weight work)."""
    if not split:
        return None
    units = module.cut.units
    reused = sorted(m for m in flow.reused if any(m == u or m.startswith(u + ".") for u in units))
    ids = [k[1] for k in module.cut.carry_in if k[0] == "input" and k[1] in module.id_ranges]
    # a float model input a later stage receives beside its activations (a diffusion UNet's text
    # context for its cross-attention, a review found torch's split backward crash on)
    floats = [] if module.cut.index == 0 else [
        k[1] for k in module.cut.carry_in if k[0] == "input" and k[1] not in module.id_ranges]
    consts = [] if module.cut.index == 0 else sorted(
        m for m, fed in flow.feeds.items() if not fed and any(
            m == u or m.startswith(u + ".") for u in units) and any(
            p.requires_grad for p in module.model.get_submodule(m).parameters(recurse=False)))
    if reused:
        why = f"{reused[0]} runs twice per forward"
    elif ids:
        why = f"it reads integer model input {ids[0]} (token ids) beside the activations it receives"
    elif floats:
        why = f"it reads model input {floats[0]} beside the activations it receives"
    elif consts:
        why = f"{consts[0]}'s weight is applied to constants, not to what the stage receives"
    elif plan.parallel["recompute"] != "none" and _checkpointed(plan, units):
        why = f"its blocks are recomputed, recompute={plan.parallel['recompute']}"
    else:
        return None
    out.notes.append(f"stage {module.cut.index}: W runs inside B ({why}; torch's split backward "
                     "cannot handle that)")
    return lambda: _no_op


def unrun_moe_settings(plan: Plan) -> str | None:
    """What the runtime's experts do not run of the MoE settings the prediction assumed (a
    capacity factor, the allgather or deepep dispatcher, the overlapped all-to-alls), with the
    re-plan that prices what it runs; None when it runs them all."""
    try:
        targets.check_engine(engine_from_mapping(plan.training.get("engine")), "torch")
    except SpecError as exc:
        said, _, fix = str(exc).partition("; ")
        fix = fix.split(" or use --target any")[0]
        return (f"{said}, so the prediction is not comparable; re-plan with --target torch and "
                f"{fix}")
    return None


def _schedule(plan: Plan, stages: list, layout: Layout):
    from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime  # lazy: private torch API, only for pp > 1

    actions = plan.schedule["actions"]
    if plan.schedule["name"] == "bidirectional":
        raise SpecError("schedule.name: bidirectional schedules keep two weight copies per stage; "
                        "the runtime does not run them yet, plan with another schedule")
    # (check_knobs checked the actions against the stages and micro-batches: _check_actions)
    sched = _PipelineScheduleRuntime(stages, plan.parallel["num_microbatches"],
                                     loss_fn=mdl.micro_batch_loss(plan.parallel[
                                         "num_microbatches"]), scale_grads=False)
    sched._prepare_schedule_with_comms(  # (torch reads the stages' places from these keys)
        {layout.pp_group_rank(r): [_Action.from_str(a) for a in acts]
         for r, acts in enumerate(torch_actions(actions))})
    return sched


def _data(plan: Plan, inputs: tuple, flow: Dataflow, coords: dict, layout: Layout, seed: int,
          device, positions=None):
    """This replica's slice of the global synthetic batch, and of the targets; with context
    parallelism, this cp rank's tokens of each sequence (dimension 1)."""
    batch = plan.training["global_batch"]
    par_ = plan.parallel
    dp = layout.dp
    if batch != dp * par_["micro_batch"] * par_["num_microbatches"]:
        raise SpecError(f"training.global_batch: {batch} != dp {dp} x micro_batch "
                        f"{par_['micro_batch']} x num_microbatches {par_['num_microbatches']}")
    shape = flow.logits.shape
    if positions is not None:  # the probe saw this rank's tokens; the targets cover the sequence
        shape = (shape[0], int(plan.training["seq_len"]), *shape[2:])
    targets = mdl.synthetic_targets(shape, batch, seed=seed)
    share = batch // dp
    sl = slice(coords["dp"] * share, (coords["dp"] + 1) * share)
    xs, ys = tuple(x[sl] for x in inputs), targets[sl]
    if positions is not None:
        xs, ys = tuple(x[:, positions] for x in xs), ys[:, positions]
    return tuple(x.to(device) for x in xs), ys.to(device)


def _no_op() -> None:
    """The deferred weight-gradient pass of a stage that already did it in B."""


def _checkpointed(plan: Plan, units) -> tuple[str, ...]:
    """The units of blocks the plan recomputes (model.blocks[].recompute, all in older plans;
    under full/k every k-th of those: costmodels.memory.layer_policies)."""
    names = set(plan.recomputed_blocks())
    modules = [m for b in plan.model["blocks"] if b["name"] in names for m in b["modules"]]
    return tuple(u for u in units if any(u == m or u.startswith(m + ".") for m in modules))
