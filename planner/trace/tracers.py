"""Trace an nn.Module into an OpGraph on meta tensors: torch.export (non-strict) first, for the
ATen-level graph in which composite modules (``nn.MultiheadAttention``, ``nn.TransformerEncoder``)
are their ops and layers; torch.fx as the fallback.

Nothing is allocated: the model lives on the meta device, and each node that computes is run
again on meta tensors and priced from the ATen ops it dispatches (planner.trace.aten).

Models that stack identical layers (a ModuleList or Sequential of equal children) are traced with
the first two layers only; the block builder re-creates the rest from the second one. Two, not one,
so the trace shows which tensors a layer passes to the next.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import operator
import os

import torch
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from planner.errors import TraceError
from planner.options import TRACE_METHODS
from planner.trace.aten import CallWork, price
from planner.trace.failures import DataDependentSize, ModuleStack, describe, expert_loop_fix, \
    fix_for, stack_trace_frame
from planner.trace import masks
from planner.trace.graph import OpGraph, ParamInfo, RepeatInfo
from planner.trace.records import NodeView, build_ops

log = logging.getLogger(__name__)


def expert_groups(model: torch.nn.Module) -> list[int]:
    """[groups, groups per token] of a router module that limits each token's experts to its
    best groups (transformers' DeepSeek-V3 router: ``num_group`` (``n_group`` in its config)
    and ``topk_group``), where it limits them (more than one group, fewer kept); else []."""
    for module in model.modules():
        groups = getattr(module, "num_group", getattr(module, "n_group", None))
        kept = getattr(module, "topk_group", None)
        if isinstance(groups, int) and isinstance(kept, int) and 0 < kept < groups:
            return [groups, kept]
    return []


def find_repeats(model: torch.nn.Module) -> list[tuple[str, int]]:
    """(FQN, length) of each ModuleList/Sequential of >= 3 structurally identical children."""
    return [(fqn, n) for fqn, n, pattern in find_layer_lists(model) if pattern == (0, 1)]


def find_layer_lists(model: torch.nn.Module) -> list[tuple[str, int, tuple[int, int] | None]]:
    """(FQN, length, pattern) of each ModuleList/Sequential of >= 3 children of one class: the
    layers of a stack, and how they repeat (layer_pattern over their signatures: same parameter
    shapes, frozen ones, submodules and declared attention masks). Identical layers, (0, 1), are
    traced two and copied; a list that repeats a pattern after a prefix (DeepSeek-V3's three
    dense layers before its MoE layers; gpt-oss alternating sliding-window and full attention;
    T5's first block, which carries the relative position bias) traces its prefix and two
    periods; a list with no such pattern (None) is traced whole, each layer still a block."""
    found: list[tuple[str, int, tuple[int, int] | None]] = []
    for fqn, mod in model.named_modules():
        if not isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)) or len(mod) < 3:
            continue
        if any(fqn.startswith(f + ".") for f, _, _ in found):
            continue
        if len({type(child) for child in mod}) != 1:
            continue
        switches = _without_counters([_switches(child) for child in mod])
        found.append((fqn, len(mod), layer_pattern([
            (_signature(child), s) for child, s in zip(mod, switches)])))
    return found


def layer_pattern(signatures: list) -> tuple[int, int] | None:
    """(prefix, period) that traces the fewest layers (prefix + 2 x period, fewer than all) such
    that from the prefix on every layer is the one ``period`` before it, which a copy of the last
    traced period's layer of the same phase then stands for; None where no pattern saves a layer."""
    n, best = len(signatures), None
    for period in range(1, n // 2 + 1):
        i = n - period - 1
        while i >= 0 and signatures[i] == signatures[i + period]:
            i -= 1
        traced = i + 1 + 2 * period
        if traced < n and (best is None or traced < best[0] + 2 * best[1]):
            best = (i + 1, period)
    return best


def _signature(module: torch.nn.Module) -> tuple:
    params = tuple((n, tuple(p.shape), str(p.dtype), p.requires_grad)
                   for n, p in module.named_parameters())
    subs = tuple((n, type(m).__qualname__) for n, m in module.named_modules())
    return type(module).__qualname__, params, subs, masks.signature(module)


def _switches(module: torch.nn.Module) -> dict:
    """The plain settings a layer's modules hold (bools, ints, strings: Llama 4's ``use_rope``,
    0 on every fourth layer, or an ``attention_type``), by (module, attribute): layers that differ
    only there run differently (a review: Maverick's rotary layers were copied from one
    without)."""
    return {(name, key): value for name, m in module.named_modules()
            for key, value in vars(m).items()
            if not key.startswith("_") and key != "training"
            and isinstance(value, (bool, int, str))}


def _without_counters(switches: list[dict]) -> list[tuple]:
    """Each layer's switches less those that count the layers (a layer's own index, or its
    index plus one: the same step as the position in the list), as sorted tuples."""
    counters = {k for k in set().union(*switches)
                if all(isinstance(s.get(k), int) and not isinstance(s.get(k), bool)
                       for s in switches)
                and len({s[k] - i for i, s in enumerate(switches)}) == 1}
    return [tuple(sorted((k, v) for k, v in s.items() if k not in counters)) for s in switches]


@contextlib.contextmanager
def truncated(model: torch.nn.Module, keep: dict[str, int]):
    """Temporarily keep only the first ``keep[fqn]`` children of each repeated list."""
    saved = []
    try:
        for fqn, kept in keep.items():
            parent_name, _, attr = fqn.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            original = getattr(parent, attr)
            short = type(original)(*list(original)[:kept]) if isinstance(
                original, torch.nn.Sequential) else torch.nn.ModuleList(list(original)[:kept])
            setattr(parent, attr, short)
            saved.append((parent, attr, original))
        yield
    finally:
        for parent, attr, original in reversed(saved):
            setattr(parent, attr, original)


@contextlib.contextmanager
def counting_own_checkpoints():
    """Count the calls of torch.utils.checkpoint the model's own forward makes while traced
    (yields a one-item list): the trace records the ops, not that the model will run them again
    in backward, so a model checkpointing itself is priced as if it did not. Both of
    checkpoint's paths are looked up in its module at call time (the non-reentrant generator,
    the reentrant autograd function), so a model that imported ``checkpoint`` by name is counted
    too; absent in a torch without them, nothing is counted."""
    import torch.utils.checkpoint as ckpt  # lazy: patched for the trace only (torch is loaded)

    calls = [0]
    saved = {name: getattr(ckpt, name, None)
             for name in ("_checkpoint_without_reentrant_generator", "CheckpointFunction")}
    generator, function = saved.values()

    def counted_generator(*a, **kw):
        calls[0] += 1
        return generator(*a, **kw)

    class CountedFunction(function if function is not None else object):
        @classmethod
        def apply(cls, *a, **kw):
            calls[0] += 1
            return function.apply(*a, **kw)

    try:
        if generator is not None:
            ckpt._checkpoint_without_reentrant_generator = counted_generator
        if function is not None:
            ckpt.CheckpointFunction = CountedFunction
        yield calls
    finally:
        for name, value in saved.items():
            if value is not None:
                setattr(ckpt, name, value)


def trace(model: torch.nn.Module, args: tuple, kwargs: dict, *, seq_len: int, batch: int,
          dtype: str, method: str = "auto", name: str = "model",
          whole: frozenset[str] = frozenset(), not_layers: frozenset[str] = frozenset()) -> OpGraph:
    """Trace ``model(*args, **kwargs)`` into an OpGraph (per-sample figures: divided by ``batch``).

    Lists of identical layers are traced with their first two layers, lists that repeat a pattern
    with their prefix and two periods (find_layer_lists), except those in ``whole`` (and lists with
    no pattern, traced whole); lists in ``not_layers`` are not treated as layer stacks at all."""
    if method not in TRACE_METHODS:
        raise TraceError(f"trace: unknown method '{method}'; choose auto, fx or export")
    model.train()
    lists = [(f, n, pattern) for f, n, pattern in find_layer_lists(model) if f not in not_layers]
    whole = whole | {f for f, _, pattern in lists if pattern is None}
    layer_lists = [(f, n) for f, n, _ in lists]
    # fqn -> (layers traced, period): the prefix and two periods
    keep = {f: (pattern[0] + 2 * pattern[1], pattern[1]) for f, _, pattern in lists
            if f not in whole}
    errors: list[str] = []
    fixes: list[str] = []
    methods = ("export", "fx") if method == "auto" else (method,)
    kept = {f: k for f, (k, _) in keep.items()}
    with truncated(model, kept), _grouped_query_attention(), _masks_as_eager(), _quiet_fakes():
        params = {n: ParamInfo(shape=list(p.shape), numel=p.numel(),
                               nbytes=p.numel() * p.element_size(), trainable=p.requires_grad)
                  for n, p in model.named_parameters()}
        frozen = frozenset(n for n, p in model.named_parameters(remove_duplicate=False)
                           if not p.requires_grad)
        aliases = _param_aliases(model)
        for how in methods:
            try:
                views, outputs = (_fx_views if how == "fx" else _export_views)(model, args, kwargs)
            except Exception as exc:  # noqa: BLE001 - every tracer failure is reported below
                errors.append(f"{how}: {describe(exc)}")
                fixes.append(expert_loop_fix(model, exc) or fix_for(exc))
                log.debug("%s tracing failed", how, exc_info=True)
                continue
            ops = build_ops(views, batch=batch, outputs=outputs, frozen=frozen)
            masks.mark(ops, model)
            for op in ops:
                op.params = list(dict.fromkeys(aliases.get(p, p) for p in op.params))
            log.debug("traced %s with %s: %d ops", name, how, len(ops))  # (api says it once)
            containers = [n for n, m in model.named_modules() if n and isinstance(
                m, (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential))]
            return OpGraph(
                ops=ops, params=params, outputs=outputs, seq_len=seq_len, batch=batch,
                dtype=dtype, method=how, containers=containers, module_kinds=_kinds(model),
                expert_groups=expert_groups(model),
                repeats=[RepeatInfo(fqn=f, count=n, traced=keep[f][0], period=keep[f][1])
                         if f in keep else RepeatInfo(fqn=f, count=n, traced=n)
                         for f, n in layer_lists],
            )
    fix = next((f for f in fixes if f and not ("export" in methods and "--trace export" in f)),
               "")
    other = {"fx": "--trace export", "export": "--trace fx"}.get(method)
    hint = (f"; {fix}" if fix else "; make the forward traceable on meta tensors") + (
        f", or try {other}" if other and other not in fix else "") + (
        "; example inputs that match the forward's signature help both tracers"
        if method == "auto" and "looks like experts" not in fix else "")
    raise TraceError(f"could not trace {name}: " + "; ".join(errors) + hint)


def module_kind(module: torch.nn.Module) -> str:
    """``linear`` (a torch.nn.Linear), ``embedding`` (a torch.nn.Embedding) or the class name."""
    return "linear" if isinstance(module, torch.nn.Linear) else \
        "embedding" if isinstance(module, torch.nn.Embedding) else type(module).__name__


def _kinds(model: torch.nn.Module) -> dict[str, str]:
    """OpGraph.module_kinds of ``model``'s modules that hold parameters of their own, under
    every name a module is registered by."""
    return {name: module_kind(m) for name, m in model.named_modules(remove_duplicate=False)
            if name and next(m.parameters(recurse=False), None) is not None}


@contextlib.contextmanager
def _quiet_fakes():
    """Keep torch's fake-tensor logger from printing a failed op's traceback to stderr, and its
    symbolic-shapes logger its warnings about a data-dependent size: a trace failure is reported
    once, in one line (the traceback is in the debug log)."""
    loggers = [logging.getLogger(name) for name in ("torch._subclasses.fake_tensor",
                                                    "torch.fx.experimental.symbolic_shapes")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


@contextlib.contextmanager
def _masks_as_eager():
    """Hugging Face models decide on their attention mask as they do when run eagerly on
    unpadded samples: SDPA gets no mask and ``is_causal`` (a fused kernel then skips the masked
    half). Traced, transformers cannot read the model's own position ids, so it takes the
    samples for packed sequences, and under torch.export it never leaves the mask to
    ``is_causal``; either way it materializes the causal mask, and causal attention would be
    priced (and its FLOPs counted) as unmasked. The trace's samples are one sequence each."""
    try:
        from transformers import masking_utils  # lazy: transformers takes seconds to import
    except ImportError:  # no transformers: no Hugging Face masks to decide on
        yield
        return
    eager = {"is_torchdynamo_exporting": lambda: False,
             "find_packed_sequence_indices": lambda position_ids: None}
    saved = {name: getattr(masking_utils, name) for name in eager
             if hasattr(masking_utils, name)}  # another release may lack one: leave it
    for name in saved:
        setattr(masking_utils, name, eager[name])
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(masking_utils, name, fn)


@contextlib.contextmanager
def _grouped_query_attention():
    """Hugging Face attention hands grouped-query attention to SDPA as it is (``enable_gqa``)
    instead of repeating the key/value heads first, as it does on GPUs without a mask: the trace
    then sees the key/value heads a fused kernel reads (and context parallelism exchanges)."""
    key = "TRANSFORMERS_SDPA_FORCE_GQA"
    before = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[key]
        else:
            os.environ[key] = before


def _param_aliases(model: torch.nn.Module) -> dict[str, str]:
    """Every name of a tied parameter -> the name ``named_parameters()`` reports first."""
    canonical: dict[int, str] = {}
    out = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        out[n] = canonical.setdefault(id(p), n)
    return out


# --- torch.fx -------------------------------------------------------------------------------------

SHAPE_PRESERVING = (torch.nn.LayerNorm, torch.nn.Dropout, torch.nn.GELU, torch.nn.ReLU,
                    torch.nn.SiLU, torch.nn.Tanh, torch.nn.Sigmoid, torch.nn.Identity)


class _Recorder(torch.fx.Interpreter):
    """Runs a GraphModule on meta tensors and keeps every node's value.

    Common leaf modules get their output shape directly instead of running their meta kernels
    (PyTorch's Python decompositions make a meta Linear cost milliseconds)."""

    def __init__(self, gm):
        super().__init__(gm)
        self.values: dict[str, object] = {}

    def run_node(self, n):
        try:
            out = super().run_node(n)
        except Exception as exc:  # name the node's module and source line in the report
            if not getattr(exc, "planner_source", ""):
                exc.planner_source = stack_trace_frame(n.stack_trace)  # type: ignore[attr-defined]
                exc.planner_module = n.target if n.op == "call_module" else ""  # type: ignore[attr-defined]
            raise
        self.values[n.name] = out
        return out

    def call_module(self, target, args, kwargs):
        mod = self.fetch_attr(target)
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.device.type == "meta" and not kwargs and len(args) == 1:
            if isinstance(mod, torch.nn.Linear):
                if x.shape[-1] != mod.in_features:  # as the real Linear would refuse it
                    raise ValueError(f"Linear({mod.in_features}, {mod.out_features}) got an input "
                                     f"of size {x.shape[-1]} in its last dimension; check the "
                                     "example inputs' shapes")
                return torch.empty(*x.shape[:-1], mod.out_features, dtype=x.dtype, device="meta")
            if isinstance(mod, SHAPE_PRESERVING):
                return torch.empty_like(x)
        return super().call_module(target, args, kwargs)


def _fx_views(model, args, kwargs):
    stack = ModuleStack(model)
    tracer = torch.fx.Tracer()
    tracer.record_stack_traces = True  # source lines for the report when a node cannot run
    try:
        with stack:
            graph = tracer.trace(model)
    except Exception as exc:
        raise stack.mark(exc) from exc
    gm = torch.fx.GraphModule(tracer.root, graph, type(model).__name__)
    bound = inspect.signature(model.forward).bind(*args, **kwargs)
    bound.apply_defaults()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = [bound.arguments.get(n.target, None) for n in placeholders]
    rec = _Recorder(gm)
    rec.run(*values)
    param_names = {n for n, _ in model.named_parameters()}
    views, outputs = [], []
    for node in gm.graph.nodes:
        if node.op == "output":
            outputs = [a.name for a in _flat_nodes(node.args)]
            continue
        views.append(_fx_node_view(node, rec.values, gm, model, param_names))
    return views, outputs


def _fx_node_view(node, values, gm, model, param_names) -> NodeView:
    if node.op == "placeholder":
        return NodeView(name=node.name, op="input", short="input", module="",
                        value=values.get(node.name), inputs=[], params=[])
    if node.op == "get_attr":
        is_param = node.target in param_names
        return NodeView(name=node.name, op="param" if is_param else "buffer", short=node.target,
                        module="", value=values.get(node.name), inputs=[], params=[])
    if node.op == "call_module":
        mod = model.get_submodule(node.target)
        short = type(mod).__name__
        module = node.target
        mod_params = [f"{node.target}.{n}" for n, _ in mod.named_parameters()]
        fn = mod
    else:
        short = node.target if node.op == "call_method" else getattr(node.target, "__name__",
                                                                     str(node.target))
        module = _stack_owner(node)
        mod_params = []
        fn = None
    view = NodeView(name=node.name, op="call", short=str(short), module=module,
                    value=values.get(node.name), inputs=_flat_nodes((node.args, node.kwargs)),
                    params=mod_params)
    view.work_fn = lambda flags: _price(node, values, fn, flags)
    view.attrs = _attrs(node)
    return view


def _attrs(node) -> dict:
    """is_causal and dropout_p of an attention call (keywords, or positions 5 and 4 of
    scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal))."""
    causal = node.kwargs.get("is_causal")
    if causal is None and len(node.args) > 5:
        causal = node.args[5]
    dropout = node.kwargs.get("dropout_p")
    if dropout is None and len(node.args) > 4:
        dropout = node.args[4]
    return {"causal": causal is True,
            "dropout": float(dropout) if isinstance(dropout, (int, float)) else 0.0}


def _stack_owner(node) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    return list(stack.values())[-1][0]


def _flat_nodes(obj) -> list:
    out: list = []
    torch.fx.node.map_arg(obj, lambda n: out.append(n))
    return out


def _price(node, values, module, flags) -> CallWork:
    """What one node computes: the node run again on meta tensors (a leaf module with meta copies
    of its weights), priced from its ATen ops. ``flags(name)`` -> (requires_grad, is_param) of the
    node an operand comes from. A node that cannot run on meta is priced as nothing and listed as
    unpriced."""
    weights: set[int] = set()

    def operand(n):
        grad, param = flags(n.name)
        value = _meta_like(values.get(n.name), grad)
        if param:
            weights.update(id(t) for t in _flat_tensors(value))
        return value

    args = torch.fx.node.map_arg(node.args, operand)
    kwargs = torch.fx.node.map_arg(node.kwargs, operand)
    if module is not None:  # a leaf module, run with meta copies of its weights
        state = {n: _param_like(t) for n, t in module.named_parameters()}
        weights.update(id(t) for t in state.values())
        state.update({n: _meta_like(t) for n, t in module.named_buffers()})

        def run():
            torch.func.functional_call(module, state, tuple(args), dict(kwargs))
    elif node.op == "call_method":
        def run():
            getattr(args[0], node.target)(*args[1:], **kwargs)
    else:
        def run():
            node.target(*args, **kwargs)
    try:
        return price(run, weights=weights)
    except Exception:  # noqa: BLE001 - a node that cannot run on meta is reported as unpriced
        log.debug("could not price %s", node.name, exc_info=True)
        name = str(getattr(node.target, "__name__", node.target))
        return CallWork(unpriced={f"{name} (cannot run on meta)": [1, 0.0]})


def _meta_like(value, requires_grad: bool = False):
    """A meta tensor like ``value``; one that carries a gradient is made by an op (not a leaf),
    as activations are, so that in-place ops on it run."""
    if isinstance(value, torch.Tensor):
        t = torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype,
                                device="meta")
        if requires_grad and t.is_floating_point():
            return t.requires_grad_(True).clone()
        return t
    if isinstance(value, (list, tuple)):
        return type(value)(_meta_like(v, requires_grad) for v in value)
    return value


def _param_like(p: torch.Tensor) -> torch.Tensor:
    """A meta leaf like parameter ``p`` (parameters are leaves; their gradients are the weight
    gradients)."""
    t = torch.empty_strided(tuple(p.shape), tuple(p.stride()), dtype=p.dtype, device="meta")
    return t.requires_grad_(p.requires_grad and t.is_floating_point())


def _flat_tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _flat_tensors(v)]
    return []


# --- torch.export ---------------------------------------------------------------------------------

def _export_views(model, args, kwargs):
    stack = ModuleStack(model)
    chatter = io.StringIO()  # export prints the partial graph when it fails; keep it for --debug
    try:
        with stack, contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            ep = torch.export.export(model, tuple(args), kwargs=dict(kwargs), strict=False)
    except Exception as exc:
        log.debug("torch.export output:\n%s", chatter.getvalue())
        raise stack.mark(exc) from exc
    sig = ep.graph_signature
    to_param = dict(sig.inputs_to_parameters)
    to_buffer = dict(sig.inputs_to_buffers)
    values = {n.name: n.meta.get("val") for n in ep.graph.nodes}
    views, outputs = [], []
    for node in ep.graph.nodes:
        if node.op == "output":
            outputs = [a.name for a in _flat_nodes(node.args)]
            continue
        if node.op == "placeholder":
            op = "param" if node.name in to_param else "buffer" if node.name in to_buffer else "input"
            short = to_param.get(node.name) or to_buffer.get(node.name) or "input"
            views.append(NodeView(name=node.name, op=op, short=short, module="",
                                  value=values[node.name], inputs=[], params=[]))
            continue
        if node.op != "call_function":
            continue
        target = node.target
        short = getattr(target, "_opname", None) or getattr(target, "__name__", str(target))
        if target is operator.getitem:
            short = "getitem"
        if free_unbacked_symbols(values[node.name]):
            raise DataDependentSize(str(short), _stack_owner(node) or stack.names[id(model)],
                                    stack_trace_frame(node.meta.get("stack_trace")))
        view = NodeView(name=node.name, op="call", short=str(short), module=_stack_owner(node),
                        value=values[node.name], inputs=_flat_nodes((node.args, node.kwargs)),
                        params=[])
        view.work_fn = (lambda flags, n=node: _price(n, values, None, flags))
        view.attrs = _attrs(node)
        views.append(view)
    return views, outputs
