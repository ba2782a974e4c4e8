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
    dimension (a fused q/k/v or gate/up projection sliced or chunked apart), or reshaped into
    pieces ahead of its heads and taken apart along them (timm's qkv: _Tags.packed)."""


CUTS = {torch.Tensor.__getitem__, torch.Tensor.split, torch.split, torch.Tensor.chunk,
        torch.chunk, torch.Tensor.narrow, torch.narrow, torch.Tensor.tensor_split,
        torch.tensor_split, torch.Tensor.split_with_sizes}
"""Calls that take parts of a tensor (Dataflow.cut)."""
RESHAPES = {torch.Tensor.reshape, torch.Tensor.view, torch.reshape, torch.Tensor.unflatten,
            torch.unflatten}
"""Calls that can split a tensor's last dimension into several (_Tags.packed)."""
PERMUTES = {torch.Tensor.permute, torch.permute}
TRANSPOSES = {torch.Tensor.transpose, torch.transpose, torch.Tensor.swapaxes, torch.swapaxes}
PIECE_CUTS = CUTS | {torch.Tensor.unbind, torch.unbind, torch.Tensor.select, torch.select,
                     torch.Tensor.__iter__}
"""Calls that take parts of a tensor along one dimension (_Tags.packed)."""


def _dim(value, ndim: int) -> int:
    return value + ndim if value < 0 else value


def _cut_dim(func, args, kwargs) -> int | None:
    """The dimension a PIECE_CUTS call takes parts along, or None where it cannot say."""
    x = args[0]
    if func is torch.Tensor.__getitem__:
        index = args[1] if len(args) > 1 else None
        if isinstance(index, int):
            return 0
        if isinstance(index, tuple):
            for i, item in enumerate(index):
                if isinstance(item, int):
                    return i
                if item is Ellipsis or item is None or not (
                        isinstance(item, slice) and item == slice(None)):
                    return None
        return None
    if func is torch.Tensor.__iter__:
        return 0
    if func in (torch.Tensor.narrow, torch.narrow, torch.Tensor.select, torch.select):
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
    elif func in (torch.Tensor.unbind, torch.unbind):
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    else:  # split, chunk, tensor_split, split_with_sizes: (tensor, sizes or parts, dim=0)
        dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
    return _dim(dim, x.dim()) if isinstance(dim, int) else None


class _Tags(TorchFunctionMode):
    """Propagate source tags through every torch call."""

    def __init__(self):
        super().__init__()
        self.tags: dict[int, tuple[torch.Tensor, frozenset]] = {}
        self.cut: set[str] = set()
        self.direct: dict[int, tuple[torch.Tensor, str]] = {}
        """id -> (tensor, module) of the tensors a watched module returned, as returned."""
        self.packed: dict[int, tuple[torch.Tensor, str, int]] = {}
        """id -> (tensor, module, axis) of views of such an output whose last dimension was split
        into several, ``axis`` holding the first of them (and kept through permutes): pieces
        packed ahead of the heads (a fused q/k/v reshaped to (..., 3, heads, head_dim), as timm's
        ViT does) are taken apart along it; (heads, 3 x head_dim), GPT-NeoX's, is not."""

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

    def _follow_pieces(self, func, args, kwargs, out) -> None:
        """Track reshapes of a watched module's output into pieces (``packed``) through permutes
        and transposes, and note the module where they are taken apart along the first piece
        dimension (Dataflow.cut)."""
        src = args[0]
        entry = self.direct.get(id(src))
        if entry is not None and func in RESHAPES and isinstance(out, torch.Tensor):
            k = src.dim()
            if k and out.dim() > k and tuple(out.shape[:k - 1]) == tuple(src.shape[:-1]) \
                    and out.shape[k - 1] > 1:
                self.packed[id(out)] = (out, entry[1], k - 1)
            return
        packed = self.packed.get(id(src))
        if packed is None:
            return
        _, module, axis = packed
        if func in PERMUTES and isinstance(out, torch.Tensor):
            dims = args[1] if len(args) == 2 and isinstance(args[1], (tuple, list)) \
                else args[1:] or kwargs.get("dims", ())
            dims = [_dim(d, src.dim()) for d in dims]
            if axis in dims:
                self.packed[id(out)] = (out, module, dims.index(axis))
        elif func in TRANSPOSES and isinstance(out, torch.Tensor) and len(args) >= 3:
            a, b = _dim(args[1], src.dim()), _dim(args[2], src.dim())
            self.packed[id(out)] = (out, module, b if axis == a else a if axis == b else axis)
        elif func in PIECE_CUTS and _cut_dim(func, args, kwargs) == axis:
            self.cut.add(module)

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
        if args and isinstance(args[0], torch.Tensor) and (func in RESHAPES or self.packed):
            self._follow_pieces(func, args, kwargs, out)
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
                                "runtime cuts stages by module and needs each to run once: "
                                "give each use a module of its own with the parameters tied "
                                "(second.weight = first.weight), which it runs")
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
