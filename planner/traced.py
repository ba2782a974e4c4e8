"""A model traced once: ``Prepared`` (its op graph and blocks, with what the plan records of it),
made by tracing a MODEL on the meta device (``trace_model``), and the MODEL spec a plan keeps to
build the model again (``spec_of``).

planner.api.prepare puts the trace cache in front of ``trace_model``; the recommendation models'
entry points (planner.recsys_api) trace their dense part with it.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from planner.errors import SpecError, TraceError
from planner.inputs.zoo import ZOO
from planner.trace.blocks import build_blocks, unchained_repeats
from planner.trace.graph import BlockGraph, OpGraph
from planner.trace.tp_roles import analyze, whole_attention
from planner.units import counted, human_count

log = logging.getLogger("planner.api")  # the API's lines, which a sweep holds back together


@dataclass
class Prepared:
    """A traced and coarsened model: reusable across clusters, batches and pinned knobs."""

    info: dict
    """name, source, num_params, fingerprint (and attention, unpriced_ops, frozen_params,
    image_tokens, encoder_tokens, learned_positions, defaulted, mtp_layers_left_out, mtp_depths,
    checkpoint_quantization, experts_own_code where they apply)."""
    seq_len: int
    dtype: str
    opgraph: OpGraph
    blocks: BlockGraph

    def to_dict(self) -> dict:
        return {"info": self.info, "seq_len": self.seq_len, "dtype": self.dtype,
                "opgraph": self.opgraph.to_dict(), "blocks": self.blocks.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> "Prepared":
        return cls(info=dict(d["info"]), seq_len=int(d["seq_len"]), dtype=d["dtype"],
                   opgraph=OpGraph.from_dict(d["opgraph"]),
                   blocks=BlockGraph.from_dict(d["blocks"]))


def spec_of(model) -> str | None:
    """The MODEL spec a plan records, from which ``plan run`` and the exports' memory check build
    the model again, wherever they run: a zoo name as given, a file (config.json, its folder, or
    file.py:factory) by its absolute path; None for a module object."""
    if not isinstance(model, str):
        return None
    if model.lower() in ZOO:
        return model
    path, colon, factory = model.rpartition(":") if ".py:" in model else (model, "", "")
    return os.path.abspath(path) + colon + factory if os.path.exists(path) else model


def rename(info: dict, model) -> None:
    """A cached trace keyed by a file's bytes names the file it was traced from; make it name
    this call's (the plan records it, and ``plan run`` builds the model from it)."""
    old, new = info.get("spec"), spec_of(model)
    if new and old and old != new:
        info["spec"] = new
        info["source"] = str(info.get("source", "")).replace(old, new)
        if ":" in new and info.get("name") == _factory_name(old):  # (a factory's: its file's)
            info["name"] = _factory_name(new)


def _factory_name(spec: str) -> str:
    """The name a ``file.py:factory`` or ``module:factory`` spec's model takes (as traced)."""
    target, _, attr = spec.rpartition(":")
    return os.path.basename(target).removesuffix(".py") + ":" + attr


def _tied_embeddings(module) -> bool | None:
    """Whether a Hugging Face model's input embedding and output head share one weight
    (``tie_word_embeddings``); None for a module without the two (an encoder, a classifier, a
    model of the user's own code)."""
    try:
        inputs, outputs = module.get_input_embeddings(), module.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if getattr(inputs, "weight", None) is None or getattr(outputs, "weight", None) is None:
        return None
    return inputs.weight is outputs.weight


def trace_model(model, example_inputs, seq_len: int | None, dtype: str, trace_method: str,
                per_sample: bool = False) -> Prepared:
    """``model`` (a MODEL spec or module) built on the meta device and traced at ``seq_len``
    tokens (None: the model's own; ``per_sample``: one sample of a model without sequences) in
    ``dtype`` by ``trace_method``, coarsened into blocks; a SpecError or TraceError naming what
    cannot be planned (no parameters, none trained, positions too few, no arithmetic traced)."""
    from planner.trace.models import (  # lazy: torch, transformers (seconds)
        features_shape, image_shape, resolve)
    from planner.trace.tracers import counting_own_checkpoints, trace  # lazy: as above

    t0 = time.perf_counter()
    rm = resolve(model, seq_len=seq_len, dtype=dtype, example_inputs=example_inputs,
                 per_sample=per_sample)
    if not rm.num_params:
        raise SpecError(f"model: {rm.name} has no parameters, so there is no training to plan; "
                        "give the model whose weights you train")
    if rm.frozen_params >= rm.num_params:
        raise SpecError(f"model: {rm.name} trains none of its {human_count(rm.num_params)} "
                        "parameters (all have requires_grad=False), so there is no training to "
                        "plan; set requires_grad=True on those you train")
    log.info("model %s: %s parameters (%s); tracing it on the meta device %s (seconds; a minute "
             "for the largest)", rm.name, human_count(rm.num_params), rm.source,
             "for one sample" if per_sample else f"at {counted(rm.seq_len, 'token')}")
    with counting_own_checkpoints() as own_checkpoints:
        og = trace(rm.module, rm.args, rm.kwargs, seq_len=rm.seq_len, batch=rm.batch,
                   dtype=dtype, method=trace_method, name=rm.name)
    unchained = unchained_repeats(og)
    if unchained:  # lists of identical modules that are not a chain of layers are no layer
        # stack; a list with a pattern that is not a chain is traced whole, each layer a block
        log.debug("tracing %s whole: not a chain of layers", ", ".join(sorted(unchained)))
        uniform = {r.fqn for r in og.repeats if r.fqn in unchained and r.traced == 2 and
                   r.period == 1}
        og = trace(rm.module, rm.args, rm.kwargs, seq_len=rm.seq_len, batch=rm.batch, dtype=dtype,
                   method=og.method, name=rm.name, not_layers=frozenset(uniform),
                   whole=frozenset(unchained - uniform))
    # (a config's learned positions are checked from the config; a zoo name is a shape at any
    # length; a Hugging Face model built by a factory or given as a module, from its config
    # too: RoBERTa's position ids are a cumulative sum the trace does not see as positions)
    hf_config = getattr(rm.module, "config", None)
    if rm.source in ("factory", "module") and getattr(hf_config, "model_type", None):
        from planner.trace.hf import check_seq_len  # lazy: loads torch, as above

        check_seq_len(hf_config, rm.seq_len, rm.name)
    tables = og.position_tables() if rm.source not in ("hf-config", "zoo") else []
    for table, rows in tables:
        if rows < rm.seq_len:  # (on meta tensors the lookup does not fail; a real run does)
            raise SpecError(f"seq_len: {rm.seq_len:,} tokens exceed the {rows:,} learned "
                            f"positions of {table} (an embedding looked up by position); give "
                            f"--seq-len {rows:,} or less, or a model with more positions")
    tp = analyze(og)
    bg = build_blocks(og, tp)
    if not any(b.work.fwd_flops for b in bg.blocks):  # (a plan of nothing to compute)
        hidden = [op for op in og.unpriced_ops() if "set_grad_enabled" in op["op"]]
        raise TraceError(f"could not trace {rm.name}: its forward, as traced, does no arithmetic "
                         "(no matmul, convolution or attention)"
                         + ("; its layers run inside torch.no_grad or reentrant checkpointing "
                            "(torch.utils.checkpoint with use_reentrant=True), which the tracer "
                            "does not enter: use use_reentrant=False, or turn the model's own "
                            "checkpointing off" if hidden else
                            ", so there is no compute for a plan to split; give example inputs "
                            "that reach its layers"))
    log.info("traced with %s: %d ops -> %d blocks in %.1f s", og.method, len(og.ops),
             len(bg.blocks), time.perf_counter() - t0)
    info = {"name": rm.name, "source": rm.source, "spec": spec_of(model),
            "num_params": rm.num_params, "fingerprint": rm.fingerprint}
    if rm.attention:
        info["attention"] = rm.attention
    if rm.config.get("model_type"):
        info["model_type"] = rm.config["model_type"]
    tied = _tied_embeddings(rm.module)
    if tied is not None:
        info["tied_embeddings"] = tied
    if rm.image_tokens:
        info["image_tokens"] = True
    if rm.encoder_tokens:
        info["encoder_tokens"] = rm.encoder_tokens
    if any(b.work.num_experts for b in bg.blocks):
        from planner.trace.hf import experts_modules  # lazy: loads torch, as above
        if not experts_modules(rm.module):  # (plan run spreads transformers' experts only)
            info["experts_own_code"] = True
    if rm.defaulted:
        info["defaulted"] = dict(rm.defaulted)
    if rm.mtp_layers:
        info["mtp_layers_left_out"] = dict(rm.mtp_layers)
    if rm.mtp_depths:
        info["mtp_depths"] = rm.mtp_depths
    if rm.quantization:
        info["checkpoint_quantization"] = rm.quantization
    unpriced = og.unpriced_ops()
    if unpriced:
        info["unpriced_ops"] = unpriced
    if own_checkpoints[0]:
        info["own_checkpoints"] = own_checkpoints[0]
    if rm.frozen_params:
        info["frozen_params"] = int(rm.frozen_params)
    whole = whole_attention(og, tp)
    if whole:
        info["tp_whole_attention"] = whole
    positions = rm.learned_positions or min((rows for _, rows in tables), default=0)
    if positions:  # (the lengths a hint may offer: planner.search.feasibility.length_note)
        info["learned_positions"] = positions
    if rm.positions and rm.source == "hf-config":  # (a zoo name is a shape at any length)
        info["max_position_embeddings"] = rm.positions
    image = image_shape(rm.args, rm.kwargs)
    if image and rm.seq_len == 1 and rm.source in ("factory", "module"):  # (a config: patches)
        info["image_input"] = image
    elif image and rm.source in ("factory", "module"):  # the caller counts the patches
        info["image_tokens"] = True
    features = features_shape(rm.args, rm.kwargs)
    if features and rm.seq_len == 1 and rm.source in ("factory", "module"):
        info["features_input"] = features
    return Prepared(info=info, seq_len=rm.seq_len, dtype=dtype, opgraph=og, blocks=bg)
