"""Where each process sits: the (pp, dp, cp, tp) mesh of a plan, its expert-parallel groups, and
which pipeline stages it holds.

Plain data, no torch: the launcher uses it to check a plan before any process starts, the worker
to build its DeviceMesh and process groups. Ranks follow ``parallel.placement`` exactly as
planner.search.placement lays them out (tensor parallelism innermost, context parallelism next;
``tp-pp-dp`` puts pipeline neighbours next, ``tp-dp-pp`` data-parallel peers next), and every
stage's ``ranks`` list must agree with that mesh, up to the order of the pipeline ranks: a plan for
node groups or sites may run its first stage on the ranks the mesh counts as a later pipeline
rank (the slower group first), and the pipeline then follows the plan's ``pipeline_rank`` numbers
(``Layout.pp_order``). Expert parallelism folds over the flattened
(tp, cp, dp) index of a pipeline rank (Megatron-Core's "parallel folding"): an expert-parallel
group is ``ep`` positions ``etp`` apart, the expert-data-parallel group (which reduces the experts'
gradients) the ``tp*cp*dp / (ep*etp)`` positions ``ep*etp`` apart that hold the same experts.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import SpecError
from planner.options import PLACEMENTS
from planner.planfile.document import Plan


@dataclass(frozen=True, kw_only=True)
class Layout:
    """The process grid of one plan."""

    pp: int
    """Pipeline ranks (mesh dimension ``pp``)."""
    dp: int
    """Data-parallel replicas (mesh dimension ``dp``)."""
    tp: int
    """Tensor-parallel shards (mesh dimension ``tp``)."""
    placement: str
    """``tp-pp-dp`` or ``tp-dp-pp`` (see planner/search/placement.py)."""
    stage_pp_rank: tuple[int, ...]
    """Pipeline rank holding each stage id (several ids per rank for interleaved schedules)."""
    cp: int = 1
    """Context-parallel ranks (mesh dimension ``cp``): each holds 1/cp of every sequence."""
    ep: int = 1
    """Expert-parallel degree (folded over the flattened (tp, cp, dp) index)."""
    etp: int = 1
    """Expert tensor parallelism (the runtime runs 1 only)."""
    replicate: int = 1
    """Groups of the data-parallel replicas (``dp_replicate``: one per site, data parallelism
    across sites): the dp index is replicate-major, so each group is dp / replicate consecutive
    replicas, sharded among themselves and replicated across the groups (HSDP)."""
    pp_order: tuple[int, ...] = ()
    """Where each pipeline rank (the plan's ``pipeline_rank``) sits on the placement's mesh: its
    position along the mesh's pipeline dimension (empty: the same, the usual case)."""

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def num_stages(self) -> int:
        return len(self.stage_pp_rank)

    @property
    def edp(self) -> int:
        """Ranks of one pipeline rank that hold the same experts."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)

    def strides(self) -> dict[str, int]:
        inner = self.tp * self.cp
        if self.placement == "tp-pp-dp":
            return {"tp": 1, "cp": self.tp, "pp": inner, "dp": inner * self.pp}
        return {"tp": 1, "cp": self.tp, "dp": inner, "pp": inner * self.dp}

    def rank_of(self, *, pp: int, dp: int, tp: int, cp: int = 0) -> int:
        s = self.strides()
        return tp * s["tp"] + cp * s["cp"] + self.pp_group_rank(pp) * s["pp"] + dp * s["dp"]

    def coords(self, rank: int) -> dict[str, int]:
        """Global rank -> its (pp, dp, cp, tp) coordinates (pp: its pipeline rank)."""
        s = self.strides()
        size = {"tp": self.tp, "cp": self.cp, "pp": self.pp, "dp": self.dp}
        out = {k: rank // s[k] % size[k] for k in ("pp", "dp", "cp", "tp")}
        if self.pp_order:
            out["pp"] = self.pp_order.index(out["pp"])
        return out

    def mesh(self) -> list:
        """Global ranks indexed [pp][dp][cp][tp]: the array of a DeviceMesh with dims
        (pp, dp, cp, tp)."""
        return [[[[self.rank_of(pp=p, dp=d, cp=c, tp=t) for t in range(self.tp)]
                  for c in range(self.cp)] for d in range(self.dp)] for p in range(self.pp)]

    def pp_group_rank(self, p: int) -> int:
        """Pipeline rank ``p``'s rank in its torch pipeline process group: torch numbers a
        group's members by global rank, which follows the mesh's pipeline dimension
        (``pp_order``), not the plan's pipeline ranks."""
        return self.pp_order[p] if self.pp_order else p

    def local_stages(self, rank: int) -> list[int]:
        """Stage ids this rank runs, in increasing order."""
        me = self.coords(rank)["pp"]
        return [s for s, r in enumerate(self.stage_pp_rank) if r == me]

    def pipeline_ranks(self, stage: int) -> list[int]:
        """Global ranks that hold ``stage`` (all its dp replicas, cp and tp shards)."""
        return self.pp_ranks(self.stage_pp_rank[stage])

    def pp_ranks(self, p: int) -> list[int]:
        """Global ranks of pipeline rank ``p``."""
        return sorted(self.rank_of(pp=p, dp=d, cp=c, tp=t) for d in range(self.dp)
                      for c in range(self.cp) for t in range(self.tp))

    # Expert parallelism: positions along the flattened (tp, cp, dp) index of one pipeline rank.

    def flat_index(self, rank: int) -> int:
        """The rank's position in the flattened (tp, cp, dp) index (tp fastest)."""
        c = self.coords(rank)
        return c["tp"] + self.tp * (c["cp"] + self.cp * c["dp"])

    def _rank_at(self, pp: int, flat: int) -> int:
        tp, rest = flat % self.tp, flat // self.tp
        return self.rank_of(pp=pp, tp=tp, cp=rest % self.cp, dp=rest // self.cp)

    def ep_index(self, rank: int) -> int:
        """Which slice of the experts the rank holds (its place in its expert-parallel group)."""
        return self.flat_index(rank) // self.etp % self.ep

    def ep_groups(self) -> list[list[int]]:
        """Every expert-parallel group (global ranks, in ep_index order), pipeline rank by
        pipeline rank: ``ep`` positions ``etp`` apart along the flattened index."""
        n, block = self.tp * self.cp * self.dp, self.ep * self.etp
        return [[self._rank_at(p, b + e + j * self.etp) for j in range(self.ep)]
                for p in range(self.pp) for b in range(0, n, block) for e in range(self.etp)]

    def edp_groups(self) -> list[list[int]]:
        """Every expert-data-parallel group: the positions ``ep*etp`` apart that hold the same
        experts (they sum the experts' gradients)."""
        n, block = self.tp * self.cp * self.dp, self.ep * self.etp
        return [[self._rank_at(p, o + b) for b in range(0, n, block)]
                for p in range(self.pp) for o in range(block)]


def layout_of(plan: Plan) -> Layout:
    """Read and check the process grid of a plan; SpecError names the first inconsistency."""
    par = plan.parallel
    pp, dp, tp = (int(par[k]) for k in ("pp", "dp", "tp"))
    cp, ep, etp = (int(par.get(k, 1)) for k in ("cp", "ep", "etp"))
    placement = par.get("placement", "tp-pp-dp")
    replicate = int(par.get("dp_replicate", 1))
    if dp % replicate or (replicate > 1 and pp > 1 and placement != "tp-pp-dp"):
        raise SpecError(f"parallel.dp_replicate: {replicate} groups of the {dp} replicas, one per "
                        "site, need dp divisible by it and, with a pipeline, placement tp-pp-dp "
                        "(whole replicas on each site); re-create the plan")
    if placement not in PLACEMENTS:
        raise SpecError(f"parallel.placement: unknown placement '{placement}'; the runtime knows "
                        f"{', '.join(PLACEMENTS)}")
    if ep * etp > 1 and (tp * cp * dp) % (ep * etp):
        raise SpecError(f"parallel.ep: ep x etp = {ep * etp} does not divide tp x cp x dp = "
                        f"{tp * cp * dp}; re-create the plan")
    base = Layout(pp=pp, dp=dp, tp=tp, cp=cp, ep=ep, etp=etp, placement=placement,
                  stage_pp_rank=())
    mesh = f"the {placement} mesh (pp={pp}, dp={dp}" + (f", cp={cp}" if cp > 1 else "") + \
        f", tp={tp})"
    owners, order = [], {}
    for i, st in enumerate(plan.stages):
        if st["index"] != i:
            raise SpecError(f"stages[{i}].index: is {st['index']}, expected {i}; stages must be "
                            "listed in order")
        pps = {base.coords(r)["pp"] for r in st["ranks"] if 0 <= r < base.world}
        if len(pps) != 1:
            raise SpecError(f"stages[{i}].ranks: {st['ranks']} do not lie on one pipeline rank of "
                            f"{mesh}; re-create the plan")
        at = pps.pop()  # its place along the mesh's pipeline dimension
        expected = base.pp_ranks(at)
        if sorted(st["ranks"]) != expected:
            raise SpecError(f"stages[{i}].ranks: {st['ranks']} but {mesh} puts "
                            f"position {at} of its pipeline dimension on {expected}; re-create "
                            "the plan")
        owner = int(st.get("pipeline_rank", at))
        if order.setdefault(owner, at) != at:
            raise SpecError(f"stages[{i}].pipeline_rank: {owner} on ranks {st['ranks']}, but "
                            f"another stage puts pipeline rank {owner} on "
                            f"{base.pp_ranks(order[owner])}; re-create the plan")
        owners.append(owner)
    if sorted(order) != list(range(pp)) or len(set(order.values())) != pp:
        raise SpecError(f"stages: they occupy pipeline ranks {sorted(order)}, expected every "
                        f"one of 0..{pp - 1} on ranks of its own")
    pp_order = tuple(order[p] for p in range(pp))
    return Layout(pp=pp, dp=dp, tp=tp, cp=cp, ep=ep, etp=etp, placement=placement,
                  stage_pp_rank=tuple(owners), replicate=replicate,
                  pp_order=() if pp_order == tuple(range(pp)) else pp_order)
