"""Where each process sits: the (pp, dp, tp) mesh of a plan, and which pipeline stages it holds.

Plain data, no torch: the launcher uses it to check a plan before any process starts, the worker
to build its DeviceMesh. Ranks follow ``parallel.placement`` exactly as planner.search.placement
lays them out (tensor parallelism innermost; ``tp-pp-dp`` puts pipeline neighbours next,
``tp-dp-pp`` data-parallel peers next), and every stage's ``ranks`` list must agree with that mesh.
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

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def num_stages(self) -> int:
        return len(self.stage_pp_rank)

    def rank_of(self, *, pp: int, dp: int, tp: int) -> int:
        if self.placement == "tp-pp-dp":
            return tp + self.tp * (pp + self.pp * dp)
        return tp + self.tp * (dp + self.dp * pp)

    def coords(self, rank: int) -> dict[str, int]:
        """Global rank -> its (pp, dp, tp) coordinates."""
        tp, rest = rank % self.tp, rank // self.tp
        if self.placement == "tp-pp-dp":
            return {"pp": rest % self.pp, "dp": rest // self.pp, "tp": tp}
        return {"pp": rest // self.dp, "dp": rest % self.dp, "tp": tp}

    def mesh(self) -> list[list[list[int]]]:
        """Global ranks indexed [pp][dp][tp]: the array of a DeviceMesh with dims (pp, dp, tp)."""
        return [[[self.rank_of(pp=p, dp=d, tp=t) for t in range(self.tp)] for d in range(self.dp)]
                for p in range(self.pp)]

    def local_stages(self, rank: int) -> list[int]:
        """Stage ids this rank runs, in increasing order."""
        me = self.coords(rank)["pp"]
        return [s for s, r in enumerate(self.stage_pp_rank) if r == me]

    def pipeline_ranks(self, stage: int) -> list[int]:
        """Global ranks that hold ``stage`` (all its dp replicas and tp shards)."""
        p = self.stage_pp_rank[stage]
        return sorted(self.rank_of(pp=p, dp=d, tp=t)
                      for d in range(self.dp) for t in range(self.tp))


def layout_of(plan: Plan) -> Layout:
    """Read and check the process grid of a plan; SpecError names the first inconsistency."""
    par = plan.parallel
    pp, dp, tp = (int(par[k]) for k in ("pp", "dp", "tp"))
    placement = par.get("placement", "tp-pp-dp")
    if placement not in PLACEMENTS:
        raise SpecError(f"parallel.placement: unknown placement '{placement}'; the runtime knows "
                        f"{', '.join(PLACEMENTS)}")
    base = Layout(pp=pp, dp=dp, tp=tp, placement=placement, stage_pp_rank=())
    owners = []
    for i, st in enumerate(plan.stages):
        if st["index"] != i:
            raise SpecError(f"stages[{i}].index: is {st['index']}, expected {i}; stages must be "
                            "listed in order")
        pps = {base.coords(r)["pp"] for r in st["ranks"] if 0 <= r < base.world}
        if len(pps) != 1:
            raise SpecError(f"stages[{i}].ranks: {st['ranks']} do not lie on one pipeline rank of "
                            f"the {placement} mesh (pp={pp}, dp={dp}, tp={tp}); re-create the plan")
        owner = pps.pop()
        if st.get("pipeline_rank", owner) != owner:
            raise SpecError(f"stages[{i}].pipeline_rank: {st['pipeline_rank']} but its ranks "
                            f"{st['ranks']} are pipeline rank {owner}; re-create the plan")
        expected = sorted(base.rank_of(pp=owner, dp=d, tp=t) for d in range(dp) for t in range(tp))
        if sorted(st["ranks"]) != expected:
            raise SpecError(f"stages[{i}].ranks: {st['ranks']} but the {placement} mesh puts "
                            f"pipeline rank {owner} on {expected}; re-create the plan")
        owners.append(owner)
    if sorted(set(owners)) != list(range(pp)):
        raise SpecError(f"stages: they occupy pipeline ranks {sorted(set(owners))}, expected every "
                        f"one of 0..{pp - 1}")
    return Layout(pp=pp, dp=dp, tp=tp, placement=placement, stage_pp_rank=tuple(owners))
