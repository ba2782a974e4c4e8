"""Which values cross each pipeline cut: a dataflow probe of one forward on the meta device.

Stages are cut by module (the plan's ``stages[].modules``). A *unit* is such a module that owns
parameters; parameter-free modules (rotary tables, dropout) and the containers' own code (masks,
residual adds, concatenations) are *glue* that every stage simply re-runs. The probe runs the model
once on meta tensors under a TorchFunctionMode that tags every tensor with the set of values it was
computed from: a model input (``("input", i)``) or a leaf of a unit's output (``(unit, i)``). A
unit's forward hook re-tags its outputs, so the tags that reach a unit's inputs (or the logits) name
exactly the unit outputs and inputs that unit needs, through any glue. The same tags on the
tensor-parallel modules pair column-parallel Linears with the row-parallel ones they feed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from planner.errors import SpecError

Key = tuple[str, int]
"""A value crossing modules: (unit FQN or "input", leaf index in its flattened output/inputs)."""


@dataclass
class Leaf:
    """Shape and dtype of one value at the probed micro-batch size (for stand-ins)."""

    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class Dataflow:
    """What the probe learned about one forward."""

    order: list[str] = field(default_factory=list)
    """Units in the order the forward calls them."""
    needs: dict[str, set] = field(default_factory=dict)
    """Unit -> keys its inputs were computed from (``"<loss>"`` for the logits)."""
    outputs: dict[str, tuple] = field(default_factory=dict)
    """Unit -> (treespec, [Leaf or constant per leaf]) of its output."""
    inputs: list = field(default_factory=list)
    """Leaf per flattened model input (Leaf for tensors, the value otherwise)."""
    input_spec: object = None
    """treespec of (args, kwargs)."""
    logits: Leaf | None = None
    feeds: dict[str, set] = field(default_factory=dict)
    """Tensor-parallel module -> other tensor-parallel modules whose outputs reach its input."""
    reused: set[str] = field(default_factory=set)
    """Modules with parameters of their own that run more than once per forward."""
    cut: set[str] = field(default_factory=set)
    """Modules (units and tensor-parallel ones) whose output is cut into parts along its last
    dimension (a fused q/k/v or gate/up projection sliced or chunked apart)."""


CUTS = {torch.Tensor.__getitem__, torch.Tensor.split, torch.split, torch.Tensor.chunk,
        torch.chunk, torch.Tensor.narrow, torch.narrow, torch.Tensor.tensor_split,
        torch.tensor_split, torch.Tensor.split_with_sizes}
"""Calls that take parts of a tensor (Dataflow.cut)."""


class _Tags(TorchFunctionMode):
    """Propagate source tags through every torch call."""

    def __init__(self):
        super().__init__()
        self.tags: dict[int, tuple[torch.Tensor, frozenset]] = {}
        self.cut: set[str] = set()
        self.direct: dict[int, tuple[torch.Tensor, str]] = {}
        """id -> (tensor, module) of the tensors a watched module returned, as returned."""

    def of(self, tree) -> frozenset:
        leaves, _ = tree_flatten(tree)
        out = frozenset()
        for t in leaves:
            if isinstance(t, torch.Tensor) and id(t) in self.tags:
                out |= self.tags[id(t)][1]
        return out

    def _note_cut(self, source: torch.Tensor, out) -> None:
        """A module's output, as it returned it (not a view or product of it: RoPE halves the
        heads' last dimension), cut into parts along its last dimension."""
        entry = self.direct.get(id(source))
        if entry is None or source.dim() == 0:
            return
        parts = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if any(t.dim() == source.dim() and 0 < t.shape[-1] < source.shape[-1] and
               t.shape[:-1] == source.shape[:-1] for t in parts):
            self.cut.add(entry[1])

    def set(self, tree, tags: frozenset, *, merge: bool) -> None:
        leaves, _ = tree_flatten(tree)
        for t in leaves:
            if isinstance(t, torch.Tensor):
                old = self.tags.get(id(t), (t, frozenset()))[1] if merge else frozenset()
                self.tags[id(t)] = (t, old | tags)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in CUTS and args and isinstance(args[0], torch.Tensor):
            self._note_cut(args[0], out)
        tags = self.of((args, kwargs))
        if tags:
            self.set(out, tags, merge=True)
        return out


def probe(model: torch.nn.Module, args: tuple, kwargs: dict, units: list[str],
          tp_modules: list[str], logits_of, watch: list[str] = ()) -> Dataflow:
    """Run ``model(*args, **kwargs)`` (meta tensors) once and record its dataflow. ``watch``:
    more modules whose feeds to record, without tagging their outputs (which would hide the
    modules feeding them from those downstream)."""
    flow = Dataflow()
    mode = _Tags()
    leaves, flow.input_spec = tree_flatten((args, kwargs))
    flow.inputs = [Leaf(tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x
                   for x in leaves]
    unit_set = set(units)
    handles = _count_calls(model, flow)
    for name in watch:
        if name not in units and name not in tp_modules:
            handles.append(model.get_submodule(name).register_forward_pre_hook(
                _pre(name, mode, flow, unit_set), with_kwargs=True))
    for name in dict.fromkeys(units + tp_modules):
        mod = model.get_submodule(name)
        handles.append(mod.register_forward_pre_hook(_pre(name, mode, flow, unit_set),
                                                     with_kwargs=True))
        handles.append(mod.register_forward_hook(_post(name, mode, flow, unit_set)))
    try:
        with mode:
            for i, x in enumerate(leaves):
                if isinstance(x, torch.Tensor):
                    mode.set(x, frozenset({("input", i)}), merge=False)
            logits = logits_of(model(*args, **kwargs))
            flow.needs["<loss>"] = set(mode.of(logits))
            flow.logits = Leaf(tuple(logits.shape), logits.dtype)
        flow.cut = set(mode.cut)
    finally:
        for h in handles:
            h.remove()
    return flow


def _pre(name: str, mode: _Tags, flow: Dataflow, units: set):
    def hook(module, args, kwargs):
        tags = mode.of((args, kwargs))
        if name in units:
            if name in flow.needs:
                raise SpecError(f"stages: module '{name}' runs more than once per forward; the "
                                "runtime cuts stages by module and needs each to run once")
            flow.order.append(name)
            flow.needs[name] = {t for t in tags if t[0] in units or t[0] == "input"}
        flow.feeds.setdefault(name, set()).update(t[0] for t in tags)
    return hook


def _post(name: str, mode: _Tags, flow: Dataflow, units: set):
    def hook(module, args, output):
        leaves, spec = tree_flatten(output)
        for i, x in enumerate(leaves):
            if isinstance(x, torch.Tensor):
                mode.tags[id(x)] = (x, frozenset({(name, i)}))
                mode.direct[id(x)] = (x, name)
        if name in units:
            flow.outputs[name] = (spec, [Leaf(tuple(x.shape), x.dtype)
                                         if isinstance(x, torch.Tensor) else x for x in leaves])
    return hook


def _count_calls(model: torch.nn.Module, flow: Dataflow) -> list:
    """Hooks that put every module with parameters of its own that runs twice in ``flow.reused``."""
    seen: set[str] = set()
    handles = []
    for name, mod in model.named_modules():
        if next(mod.parameters(recurse=False), None) is None:
            continue

        def hook(module, args, name=name):
            (flow.reused if name in seen else seen).add(name)
        handles.append(mod.register_forward_pre_hook(hook))
    return handles
