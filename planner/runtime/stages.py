"""Cut a model into pipeline stages by module FQN, from the plan's ``stages[].modules``.

Each rank keeps the whole module tree but replaces every unit (parameter-owning stage module) of
other stages by a parameter-free stand-in. A stage then runs the model's own ``forward``: its units
compute, the glue re-runs, and the stand-ins return what earlier stages sent (a value this stage
needs) or zeros of the probed shape (a value nobody here reads). A stage that is not the last stops
the forward at the first later-stage unit, once its own units have run. The tensors a stage sends
are its *carry*: every value made at or before it that a later stage needs (model inputs
included), so a DAG such as embed -> two towers -> merge passes the embedding output past the tower
that does not read it. Pipelining sees a plain module: ``forward(*carry_in) -> carry_out`` (or the logits).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from planner.errors import SpecError
from planner.runtime.dataflow import Dataflow, Key, Leaf


@dataclass(frozen=True)
class Cut:
    """What one stage receives, computes and sends."""

    index: int
    units: tuple[str, ...]
    carry_in: tuple[Key, ...]
    """Keys of the positional inputs (for stage 0: every tensor model input)."""
    carry_out: tuple[Key, ...]
    """Keys of the outputs (empty for the last stage, which returns the logits)."""


def units_of(model: nn.Module, stage_modules: list[list[str]]) -> list[list[str]]:
    """Per stage, the listed modules that own parameters; every parameter must be in one.
    (A parameter in units of two stages is tied; planner/runtime/tied.py keeps its copies equal.)"""
    names = dict(model.named_modules())
    out, owned = [], set()
    for i, mods in enumerate(stage_modules):
        keep = []
        for m in mods:
            if m not in names:
                raise SpecError(f"stages[{i}].modules: '{m}' is not a module of the model; "
                                "re-create the plan for this model")
            params = {id(p) for p in names[m].parameters()}
            if params:
                keep.append(m)
                owned |= params
        out.append(keep)
    for n, p in model.named_parameters():
        if id(p) not in owned and "." not in n:  # (timm's ViT keeps cls_token and pos_embed so)
            raise SpecError(f"stages: parameter '{n}' belongs to the model's top module itself, "
                            "and the runtime cuts a model by its submodules (at pp=1 too): move it "
                            "into the submodule that reads it (the patch embedding's, for a class "
                            "token or position embedding), or run the plan on an engine (plan "
                            "export)")
        if id(p) not in owned:
            raise SpecError(f"stages: parameter '{n}' lies outside every stage module; the runtime "
                            "needs each parameter inside a module that a stage lists")
    return out


def cuts(flow: Dataflow, units: list[list[str]]) -> list[Cut]:
    """Carry lists of every stage from the probe's dataflow."""
    stage_of = {u: s for s, us in enumerate(units) for u in us}
    last = len(units) - 1
    made_at: dict[Key, int] = {}
    readers: dict[Key, set[int]] = {}
    for u, keys in flow.needs.items():
        reader = last if u == "<loss>" else stage_of[u]
        for k in keys:
            readers.setdefault(k, set()).add(reader)
    for i, leaf in enumerate(flow.inputs):
        if isinstance(leaf, Leaf):
            made_at[("input", i)] = 0
    for u, (_, leaves) in flow.outputs.items():
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, Leaf):
                made_at[(u, i)] = stage_of[u]
    for k, rs in readers.items():
        if k not in made_at:
            raise SpecError(f"stages: value {k} read by stage {min(rs)} is not a tensor any stage "
                            "produces; the runtime cannot pipeline this model")
        if made_at[k] > min(rs):
            raise SpecError(f"stages: stage {min(rs)} reads an output of '{k[0]}' on stage "
                            f"{made_at[k]}; stages must follow the dataflow, re-create the plan")
    order = sorted(made_at, key=lambda k: (made_at[k], _pos(k, flow), k[1]))
    result, carry = [], tuple(k for k in order if k[0] == "input")
    for s, us in enumerate(units):
        out = () if s == last else tuple(
            k for k in order if made_at[k] <= s and max(readers.get(k, {-1})) > s)
        result.append(Cut(index=s, units=tuple(us), carry_in=carry, carry_out=out))
        carry = out
    return result


def _pos(key: Key, flow: Dataflow) -> int:
    return -1 if key[0] == "input" else flow.order.index(key[0])


class _StageDone(Exception):
    """Raised by a later stage's stand-in once this stage's units have all run."""


class StandIn(nn.Module):
    """Takes the place of another stage's unit: returns the values its stage set. Attributes it
    lacks are read off a copy of the unit on the meta device, outside the module tree (no
    parameters, no memory): the model's glue may read a unit's weight's dtype or shape (Hugging
    Face's ViT reads its patch projection's dtype before the embeddings run)."""

    def __init__(self, name: str, owner: "StageModule", unit: nn.Module):
        super().__init__()
        self.unit_name = name
        self.__dict__["owner"] = owner  # not a submodule: avoids a reference cycle in the tree
        self.__dict__["shadow"] = _on_meta(unit)

    def forward(self, *args, **kwargs):
        return self.owner.stand_in_value(self.unit_name)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["shadow"], name)


def _on_meta(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers are meta tensors of the same shapes and
    dtypes (nothing copied: the copy is made with each tensor already mapped to its meta twin)."""
    memo = {id(p): nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
            for p in module.parameters()}
    memo.update({id(b): torch.empty_like(b, device="meta") for b in module.buffers()})
    return copy.deepcopy(module, memo)


class StageModule(nn.Module):
    """One pipeline stage of ``model``: ``forward(*carry_in)`` -> carry_out, or the logits.
    ``id_ranges``: (lowest, highest) value of each integer model input (by position; booleans
    are masks, not ids, and left out), which a
    later stage clamps the inputs it receives to: torch's pipelining infers a stage's shapes by
    running it once on uninitialized tensors, which as token ids (an encoder-decoder's decoder
    ids, read by a later stage) index outside the embedding; real ids are left as they are."""

    def __init__(self, model: nn.Module, cut: Cut, flow: Dataflow, units: list[list[str]],
                 kwargs: dict, logits_of, id_ranges: dict[int, tuple[int, int]] | None = None):
        super().__init__()
        self.model = model
        self.cut, self.flow = cut, flow
        self.id_ranges = {} if cut.index == 0 else dict(id_ranges or {})
        self.is_last = cut.index == len(units) - 1
        self.const_kwargs = dict(kwargs)
        self.__dict__["logits_of"] = logits_of
        self._later = {u for us in units[cut.index + 1:] for u in us}
        for name in (u for us in units for u in us):
            if name not in cut.units:
                parent, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent) if parent else model, child,
                        StandIn(name, self, model.get_submodule(name)))
        self._values: dict[Key, torch.Tensor] = {}
        self._done: set[str] = set()
        self._active = False

    def attach_hooks(self) -> None:
        """Watch this stage's units (call after any wrapping so outputs are final)."""
        for name in self.cut.units:
            self.model.get_submodule(name).register_forward_hook(self._capture(name))

    def _capture(self, name: str):
        def hook(module, args, output):
            if not self._active:
                return  # a recomputation in backward, or a call outside a stage forward
            leaves = tree_flatten(output)[0]
            for i, x in enumerate(leaves):
                if isinstance(x, torch.Tensor):
                    self._values[(name, i)] = x
            self._done.add(name)
        return hook

    def stand_in_value(self, name: str):
        if name in self._later and self._done >= set(self.cut.units) and not self.is_last:
            raise _StageDone
        spec, leaves = self.flow.outputs[name]
        return tree_unflatten([self._value((name, i), leaf) for i, leaf in enumerate(leaves)], spec)

    def _value(self, key: Key, leaf):
        if not isinstance(leaf, Leaf):
            return leaf
        if key in self._values:
            return self._values[key]
        return torch.zeros(leaf.shape, dtype=leaf.dtype, device=self._device)

    def forward(self, *carry):
        self._device = carry[0].device if carry else torch.device("cpu")
        carry = tuple(_ContiguousGrad.apply(x) if x.requires_grad else x for x in carry)
        if self.id_ranges:
            carry = tuple(x.clamp(*self.id_ranges[k[1]]) if k[0] == "input" and
                          k[1] in self.id_ranges else x for k, x in zip(self.cut.carry_in, carry))
        self._values = dict(zip(self.cut.carry_in, carry))
        self._done = set()
        leaves = [self._value(("input", i), leaf) for i, leaf in enumerate(self.flow.inputs)]
        args, kwargs = tree_unflatten(leaves, self.flow.input_spec)
        self._active = True
        try:
            out = self.model(*args, **{**kwargs, **self.const_kwargs})
        except _StageDone:
            out = None
        finally:
            self._active = False
        if self.is_last:
            self._values = {}
            return self.logits_of(out)
        missing = [k for k in self.cut.carry_out if k not in self._values]
        if missing:
            raise SpecError(f"stages[{self.cut.index}]: the forward never produced {missing[0]}")
        # (contiguous: point-to-point sends refuse a strided tensor, as T5's position bias is)
        out = tuple(self._values[k].contiguous() for k in self.cut.carry_out)
        self._values = {}  # pipelining keeps what backward needs; hold nothing between calls
        return out


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous: the gradient of an input read
    through a slice or a concatenation is strided, and point-to-point sends need dense tensors."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()

