"""Coarsen an OpGraph into blocks along module boundaries, and re-create repeated layers.

Rules, in order:
1. An op inside a repeated layer (``model.layers.<i>``) belongs to that layer's block.
2. Any other op belongs to the shallowest module under the root that contains no repeated list
   (``model.embed_tokens``, ``lm_head``; for models without repeated lists, each child of the root).
3. Glue ops that run in a container's own forward join the block of their producer when it is
   one block (a residual add after a layer); joins of several blocks (a concatenation of two
   towers) and constants (masks, positions) go to the first block that uses them. Blocks that
   compute only constants (rotary tables) merge likewise.
4. When the model repeats layers, the blocks between repeated layers merge into one (the embedding
   side, the head side), matching how pipeline engines place them.
5. Traced layers stand for the rest: layer k >= 2 copies layer 1 and takes its inputs from layer
   k-1; whatever consumed layer 1's output now consumes the last layer's.
"""

from __future__ import annotations

import networkx as nx

from planner.trace.annotate import block_work
from planner.trace.graph import Block, BlockEdge, BlockGraph, OpGraph, is_mtp_depth_unit
from planner.trace.tp_roles import ROLE_KINDS, TPAnalysis


def unchained_repeats(graph: OpGraph) -> set[str]:
    """Repeated lists whose traced layers do not form a chain (each right after the one before
    and reading its output): copying the last traced ones would then misdescribe the model, so
    they must be traced whole."""
    keys = _merge_constant_blocks(graph, _assign(graph))
    order = _block_order(graph, keys)
    by = graph.by_name
    bad = set()
    for rep in graph.repeats:
        if rep.count < 2 or rep.traced >= rep.count:  # traced whole: nothing is copied
            continue
        for i in range(rep.traced - 1):
            first, second = f"{rep.fqn}.{i}", f"{rep.fqn}.{i + 1}"
            if first not in order or second not in order or \
                    order.index(second) != order.index(first) + 1 or not any(
                        keys.get(x) == first for op in graph.ops if keys.get(op.name) == second
                        for x in op.inputs if by[x].differentiable):
                bad.add(rep.fqn)
                break
        # a copy reads the layer before it and what its template reads outside the repeating
        # part; a layer of that part that reads another one of it but the one before (k - 2)
        # could not be copied so: traced whole (a review)
        prefix = rep.traced - 2 * rep.period
        layer = {f"{rep.fqn}.{i}": i for i in range(rep.traced)}
        if any(prefix <= layer.get(keys.get(x), -1) < layer[keys[op.name]] - 1
               for op in graph.ops if keys.get(op.name) in layer for x in op.inputs):
            bad.add(rep.fqn)
    return bad


def build_blocks(graph: OpGraph, tp: TPAnalysis) -> BlockGraph:
    """Blocks in topological order with their per-sample work and the edges between them."""
    keys = _assign(graph)
    keys = _merge_constant_blocks(graph, keys)
    order = _block_order(graph, keys)
    if graph.repeats:
        keys, order = _merge_segments(keys, order, graph)
    members: dict[str, list[str]] = {k: [] for k in order}
    for op in graph.ops:
        if op.name in keys:
            members[keys[op.name]].append(op.name)
    blocks = [_make_block(graph, tp, name, members[name]) for name in order]
    if any(_is_layer(b.name, graph) for b in blocks):  # checkpoint the layers only
        for b in blocks:
            b.recompute = _is_layer(b.name, graph)
    edges = _edges(graph, keys)
    bg = BlockGraph(blocks=blocks, edges=edges, tp_roles=dict(tp.roles),
                    tp_other_modules=_other_modules(tp.roles, graph.module_kinds, tp.fused),
                    shared=_shared_params(blocks, graph))
    return _replicate(bg, graph) if any(r.traced < r.count for r in graph.repeats) else bg


def _other_modules(roles: dict[str, str], kinds: dict[str, str],
                   fused: set[str]) -> dict[str, str]:
    """BlockGraph.tp_other_modules: the split modules whose class is not the one their role
    needs (a Linear role on anything but torch.nn.Linear, ``vocab`` on anything but
    torch.nn.Embedding), and column-parallel Linears whose output is cut apart (``fused``:
    TPAnalysis.fused); modules the trace did not classify are left out."""
    other = {m: kinds[m] for m, role in roles.items()
             if role in ROLE_KINDS and m in kinds and kinds[m] != ROLE_KINDS[role]}
    return {**other, **{m: "Linear, its output cut into parts: fused" for m in sorted(fused)
                        if m not in other}}


def _shared_params(blocks: list[Block], graph: OpGraph) -> list[list]:
    first: dict[str, str] = {}
    out = []
    for b in blocks:
        for p in b.params:
            if p in first:
                out.append([first[p], b.name, graph.params[p].numel, p in b.split_params,
                            not graph.params[p].trainable])
            else:
                first[p] = b.name
    return out


def _layer_of(module: str, graph: OpGraph) -> str | None:
    for r in graph.repeats:
        prefix = r.fqn + "."
        if module.startswith(prefix):
            return prefix + module[len(prefix):].split(".")[0]
    return None


def _unit_of(module: str, graph: OpGraph) -> str | None:
    """Shallowest module path containing ``module`` that holds no repeated list and is not itself a
    ModuleList/Sequential (whose children are the units: parallel branches in a ModuleList become
    one block each); None for ops run by a container's own forward."""
    if not module:
        return None
    lists = [r.fqn for r in graph.repeats]
    containers = set(graph.containers)
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if prefix in containers and prefix != module:
            continue
        if not any(lst == prefix or lst.startswith(prefix + ".") for lst in lists):
            return prefix
    return None


OUTPUT_BLOCK = "(output)"
"""Block for glue that follows a truncated layer stack and feeds no module."""


def _assign(graph: OpGraph) -> dict[str, str]:
    keys: dict[str, str] = {}
    glue = []
    units = {op.name: _layer_of(op.module, graph) or _unit_of(op.module, graph)
             for op in graph.ops if op.kind != "input"}
    reused = _reused_stateless(graph, units)
    for op in graph.ops:
        if op.kind == "input":
            continue
        key = units[op.name]
        if key is None or key in reused:
            glue.append(op)
        else:
            keys[op.name] = key
    first = _first_indices(graph, keys)
    cons = graph.consumers()
    # The last traced layer of a truncated stack stands for the last real layer only through its
    # edges: glue after it belongs after the stack, not inside every copied layer.
    last_traced = {f"{r.fqn}.{r.traced - 1}" for r in graph.repeats if r.traced < r.count}
    for op in glue:  # forward: gradient-carrying glue with one producer block joins it
        producers = {keys[i] for i in op.inputs if i in keys}
        if op.differentiable and len(producers) == 1 and not producers & last_traced:
            keys[op.name] = producers.pop()
    for op in reversed(glue):  # backward: joins and constants go to their first consumer
        if op.name not in keys:
            users = [keys[c] for c in cons[op.name] if c in keys]
            if users:
                keys[op.name] = min(users, key=lambda k: first.get(k, 0))
    default = next((keys[o.name] for o in graph.ops if o.name in keys), "model")
    for op in glue:
        if op.name not in keys:
            producers = [keys[i] for i in op.inputs if i in keys]
            if producers and producers[-1] in last_traced:
                keys[op.name] = OUTPUT_BLOCK  # e.g. an activation applied to the stack's output
            else:
                keys[op.name] = producers[-1] if producers else default
    return keys


def _reused_stateless(graph: OpGraph, units: dict[str, str | None]) -> set[str]:
    """Units without parameters that run at several places of the forward (a stack's one dropout
    module, applied after the embedding and again after the last layer): their ops are glue, so
    that each use joins the block around it instead of tying both places into one block."""
    spans: dict[str, list[int]] = {}
    for i, op in enumerate(graph.ops):
        unit = units.get(op.name)
        if unit is not None:
            spans.setdefault(unit, []).append(i)
    out = set()
    for unit, where in spans.items():
        others = {units.get(graph.ops[i].name) for i in range(where[0], where[-1] + 1)} - {unit, None}
        stateless = not any(p == unit or p.startswith(unit + ".") for p in graph.params)
        if others and stateless:
            out.add(unit)
    return out


def _first_indices(graph: OpGraph, keys: dict[str, str]) -> dict[str, int]:
    """Where each block starts running: its first op that carries a gradient or reads a weight
    (constants it was given, such as an attention mask built before the first layer, do not
    count), or its first op of any kind when it has none."""
    first: dict[str, int] = {}
    any_op: dict[str, int] = {}
    for i, op in enumerate(graph.ops):
        if op.name in keys:
            any_op.setdefault(keys[op.name], i)
            if op.differentiable or op.params:
                first.setdefault(keys[op.name], i)
    return {k: first.get(k, i) for k, i in any_op.items()}


def _merge_constant_blocks(graph: OpGraph, keys: dict[str, str]) -> dict[str, str]:
    """Blocks without parameters whose outputs carry no gradient join their first consumer."""
    by, cons = graph.by_name, graph.consumers()
    first = _first_indices(graph, keys)
    groups: dict[str, list[str]] = {}
    for name, key in keys.items():
        groups.setdefault(key, []).append(name)
    for key, names in groups.items():
        if any(by[n].differentiable or by[n].params for n in names):
            continue
        users = [keys[c] for n in names for c in cons[n] if keys.get(c) not in (None, key)]
        if users:
            target = min(users, key=lambda k: first.get(k, 0))
            for n in names:
                keys[n] = target
    return keys


def _block_order(graph: OpGraph, keys: dict[str, str]) -> list[str]:
    first = _first_indices(graph, keys)
    g = nx.DiGraph()
    for op in graph.ops:
        if op.name not in keys:
            continue
        k = keys[op.name]
        g.add_node(k)
        for src in op.inputs:
            if src in keys and keys[src] != k:
                g.add_edge(keys[src], k)
    if not nx.is_directed_acyclic_graph(g):
        return sorted(first, key=first.get)  # blocks interleave; fall back to first appearance
    return list(nx.lexicographical_topological_sort(g, key=lambda k: first[k]))


def _is_layer(key: str, graph: OpGraph) -> bool:
    return any(key.startswith(r.fqn + ".") and key[len(r.fqn) + 1:].isdigit() for r in graph.repeats)


def _merge_segments(keys, order, graph: OpGraph):
    """Merge each run of consecutive non-layer blocks into one block; the last MTP depth
    (planner.trace.mtp) closes its run, so that the depths are one block before the head's (as
    Megatron-Core runs them: all on one stage)."""
    depths = [k for k in order if is_mtp_depth_unit(k)]
    groups: list[list[str]] = []
    previous_is_layer = True
    for k in order:
        is_layer = _is_layer(k, graph)
        if not is_layer and not previous_is_layer:
            groups[-1].append(k)
        else:
            groups.append([k])
        previous_is_layer = is_layer or (bool(depths) and k == depths[-1])
    rename = {}
    for grp in groups:
        name = grp[0] if len(grp) == 1 else f"{grp[0]}..{grp[-1]}"
        rename.update({k: name for k in grp})
    new_order = list(dict.fromkeys(rename[k] for k in order))
    return {op: rename[k] for op, k in keys.items()}, new_order


def _make_block(graph: OpGraph, tp: TPAnalysis, name: str, op_names: list[str]) -> Block:
    by = graph.by_name
    modules: list[str] = []
    for n in op_names:
        unit = _layer_of(by[n].module, graph) or _unit_of(by[n].module, graph)
        if unit and unit not in modules:
            modules.append(unit)
    params = list(dict.fromkeys(p for n in op_names for p in by[n].params))
    divisors = sorted({d for n in op_names for d in tp.divisors.get(n, [])})
    work, split = block_work(graph, tp, op_names)
    return Block(name=name, modules=modules or [name], work=work, params=params, ops=op_names,
                 tp_divisors=divisors, split_params=split,
                 tp_inner_weights=any(n in tp.inner_weights for n in op_names))


def _edges(graph: OpGraph, keys: dict[str, str]) -> list[BlockEdge]:
    by = graph.by_name
    seen = set()
    edges = []
    for op in graph.ops:
        if op.name not in keys:
            continue
        for src in op.inputs:
            if src not in keys or keys[src] == keys[op.name] or not by[src].differentiable:
                continue
            key = (src, keys[op.name])
            if key not in seen:
                seen.add(key)
                edges.append(BlockEdge(src=keys[src], dst=keys[op.name],
                                       nbytes=by[src].out_bytes, tensor=src))
    return edges


def _replicate(bg: BlockGraph, graph: OpGraph) -> BlockGraph:
    blocks = list(bg.blocks)
    edges = list(bg.edges)
    for rep in graph.repeats:
        if rep.traced >= rep.count:
            continue
        traced = [f"{rep.fqn}.{i}" for i in range(rep.traced)]
        names = [b.name for b in blocks]
        if any(t not in names for t in traced):
            continue
        copies = [_copy_block(blocks[names.index(traced[rep.template(k)])], rep.fqn,
                              rep.template(k), k) for k in range(rep.traced, rep.count)]
        pos = names.index(traced[-1]) + 1
        blocks[pos:pos] = copies
        last = f"{rep.fqn}.{rep.count - 1}"
        new_edges = []
        for e in edges:  # what the last traced layer sends out of the stack, the last layer does
            if e.src == traced[-1] and e.dst not in traced:
                new_edges.append(BlockEdge(src=last, dst=e.dst, nbytes=e.nbytes, tensor=e.tensor))
            else:
                new_edges.append(e)
        for k in range(rep.traced, rep.count):  # a copy reads what its template reads
            j = rep.template(k)
            before = f"{rep.fqn}.{j - 1}"
            for e in edges:
                if e.dst != traced[j]:
                    continue
                src = f"{rep.fqn}.{k - 1}" if e.src == before else e.src
                tensor = f"{e.tensor}@{k - 1}" if e.src == before else e.tensor
                new_edges.append(BlockEdge(src=src, dst=f"{rep.fqn}.{k}", nbytes=e.nbytes,
                                           tensor=tensor))
        edges = new_edges
    return BlockGraph(blocks=blocks, edges=edges, tp_roles=_expand_roles(bg.tp_roles, graph),
                      tp_other_modules=bg.tp_other_modules, shared=bg.shared)


def _copy_block(template: Block, fqn: str, j: int, k: int) -> Block:
    old, new = f"{fqn}.{j}", f"{fqn}.{k}"

    def rename(s: str) -> str:
        return new + s[len(old):] if s == old or s.startswith(old + ".") else s

    return Block(name=new, modules=[rename(m) for m in template.modules], work=template.work,
                 params=[rename(p) for p in template.params], ops=[], template=template.name,
                 tp_divisors=list(template.tp_divisors),
                 split_params=[rename(p) for p in template.split_params],
                 recompute=template.recompute, tp_inner_weights=template.tp_inner_weights)


def _expand_roles(roles: dict[str, str], graph: OpGraph) -> dict[str, str]:
    out = dict(roles)
    for rep in graph.repeats:
        if rep.traced >= rep.count:
            continue
        for k in range(rep.traced, rep.count):
            old = f"{rep.fqn}.{rep.template(k)}."
            for mod, role in roles.items():
                if mod.startswith(old):
                    out[f"{rep.fqn}.{k}." + mod[len(old):]] = role
    return dict(sorted(out.items(), key=lambda kv: _natural(kv[0])))


def _natural(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in name.split(".")]
