"""A pinned pipeline layout (SearchOptions.layout, Megatron-LM's notation) as a stage split.

The search cuts the blocks into stages itself (planner.solve.chain); an engine's configuration
may instead fix the cut, as Megatron-Bridge's DeepSeek-V3 recipes do
(``Et*4|(t*4|)*14tmL``). Pinned, the plan is priced on that cut: the embedding side's blocks
(those before the first layer) go with ``E``, each ``t`` is the next layer block, the ``m``s
(all on one stage) the MTP depths' block (planner.trace.mtp: with the final norm), and the head
side's other blocks (the head, for the model and every depth, and the losses) go with ``L``.
"""

from __future__ import annotations

from planner.errors import SpecError
from planner.options import parse_layout


def layout_problem(layout: str, checkpointed: list[bool], mtp_depths: int, pp: int | None,
                   vpp: int | None) -> str:
    """'' or one line saying why ``layout`` does not describe the model's blocks (per block:
    whether it is a repeated layer, ``checkpointed``) or the pinned pp / vpp."""
    stages = parse_layout(layout)
    layers = [i for i, c in enumerate(checkpointed) if c]
    if not layers or len(layers) == len(checkpointed):
        return ("layout: the model has no stack of layers with an embedding and a head side "
                "apart (its blocks are all layers, or none is); leave the split to the search")
    if layers != list(range(layers[0], layers[-1] + 1)):
        return ("layout: the model has blocks between its layers (more than one stack), which "
                "the notation cannot place; leave the split to the search")
    count = sum(st.count("t") for st in stages)
    if count != len(layers):
        return (f"layout: {count} layers (t) given, the model has {len(layers)}; give each of "
                "them a place")
    mtp = sum(st.count("m") for st in stages)
    if mtp != mtp_depths:
        return (f"layout: {mtp} MTP depths (m) given, the model runs {mtp_depths}; "
                + ("write them before L" if mtp_depths else "leave m out (or plan a model "
                                                             "that declares them, such as "
                                                             "deepseek-v3-mtp)"))
    if pp is None:
        return (f"layout: its {len(stages)} stages are pp x vpp: pin pp too (e.g. --fix "
                f"pp={len(stages)})")
    problem = layout_pp_problem(layout, pp, vpp)
    if problem:
        return problem
    try:
        layout_bounds(layout, checkpointed)
    except SpecError as err:  # a stage of E or L alone where the model has no such side
        return str(err)
    return ""


def layout_pp_problem(layout: str, pp: int | None, vpp: int | None) -> str:
    """'' or one line saying why a pinned ``pp`` (and ``vpp``) does not make ``layout``'s stages
    (pp x vpp of them); '' where pp is not pinned. Needs no model: checked before the trace, and
    before the pins are checked against the cluster (a pp the layout rules out is named so)."""
    if pp is None:
        return ""
    stages = len(parse_layout(layout))
    if vpp is not None and pp > 1 and stages % pp == 0 and pp * vpp != stages:  # (vpp named)
        return (f"layout: {stages} stages on pp={pp} are vpp={stages // pp}, not {vpp}; pin "
                f"vpp={stages // pp} or leave vpp out (it follows from the layout)")
    if stages % pp or (vpp is not None and pp * vpp != stages) or (pp == 1 and stages > 1):
        fits = [d for d in range(2, stages + 1) if stages % d == 0] or [1]
        if stages == 1:
            return (f"layout: 1 stage is pp=1, not pp={pp}; pin pp=1 or leave pp out" if pp > 1
                    else f"layout: 1 stage is pp=1 x vpp=1, not vpp={vpp}; leave vpp out")
        return (f"layout: {stages} stages, and pp={pp}" + (f" x vpp={vpp}" if vpp else "")
                + " does not make them; use pp " + (f"= {fits[0]}" if len(fits) == 1 else
                                                   f"one of {', '.join(map(str, fits))}")
                + f" (vpp follows: pp x vpp = {stages})")
    return ""


def layout_bounds(layout: str, checkpointed) -> list[int]:
    """Chunk bounds (planner.search.pricing.Split) of ``layout`` over the blocks (layout_problem
    has passed)."""
    flags = [bool(c) for c in checkpointed]
    first = flags.index(True)
    last = len(flags) - 1 - flags[::-1].index(True)
    stages = parse_layout(layout)
    depths = int(any("m" in st for st in stages))  # (the depths' one block)
    head = len(flags) - 1 - last - depths
    bounds, at = [0], 0
    for stage in stages:
        at += (first if "E" in stage else 0) + stage.count("t") + int("m" in stage) + (
            head if "L" in stage else 0)
        if at == bounds[-1]:
            raise SpecError(f"layout: stage {len(bounds) - 1} ({stage}) holds no block of this "
                            "model (it has nothing before its first layer, or after its last); "
                            "give that stage a layer")
        bounds.append(at)
    return bounds
