"""Rebuild a plan's model with real weights, check it is the planned one, and make synthetic data.

Every rank builds the whole model on the CPU from the same seed, so all ranks (and a
single-process reference) start from identical weights; each rank then keeps only its stages.
The fingerprint is the planner's own (planner.trace.models: class name, parameter names, shapes and
dtypes), computed here on the real module.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from planner.errors import SpecError
from planner.planfile.document import Plan
from planner.trace import hf, models
from planner.trace.models import TORCH_DTYPES, ResolvedModel, resolve


@dataclass
class RealModel:
    """A model with weights plus what a step needs to call it."""

    module: torch.nn.Module
    args: tuple
    """Example positional inputs (real tensors for factories; meta for Hugging Face models)."""
    kwargs: dict
    """Constant keyword inputs (e.g. ``use_cache=False``); tensors here are not supported."""
    vocab: int | None
    """Token range for integer inputs of Hugging Face models (whose example inputs are meta
    tensors: a batch draws tokens in this range, and floating inputs, pixel values, from a
    standard normal); None for a factory's, whose own inputs are repeated."""


def resolve_meta(plan: Plan, spec: str) -> ResolvedModel:
    """The planner's view of the model (meta device), at the plan's sequence length and dtype."""
    tr = plan.training
    try:
        return resolve(spec, seq_len=tr["seq_len"], dtype=tr["dtype"])
    except SpecError as err:
        raise plan.moved_model(err, spec) from None


def check_runnable(meta: ResolvedModel) -> None:
    """SpecError for a Hugging Face model the runtime cannot feed: it trains models that read
    token ids alone (decoder-only language models) on synthetic ids, image models that read
    pixel values alone (ViT) on synthetic images, and encoder-decoders (token ids or audio
    features for the encoder, and the decoder's ids: _decoder_ids); audio features without a
    decoder and two towers (images and captions) are not supported (a new-user check saw them
    crash in the processes). A factory's model must take its example inputs as positional
    tensors (the runtime cuts them into micro-batches along dim 0)."""
    if meta.source == "factory":
        inner = [type(a).__name__ for a in meta.args if not isinstance(a, torch.Tensor)]
        if inner or _given_kwargs(meta):
            what = ("keyword inputs" if not inner else f"a {inner[0]}"
                    if inner[0] in ("dict", "list", "tuple") else f"{inner[0]} values")
            raise SpecError(f"model: {meta.name}'s example inputs hold {what}; plan run feeds "
                            "positional tensors only (each cut into micro-batches along its "
                            "first dimension): return a tuple of tensors from the factory, and "
                            "take them as forward's arguments")
    if meta.source not in ("zoo", "hf-config"):
        return
    if meta.mtp_depths:
        raise SpecError(f"model: {meta.name} trains {meta.mtp_depths} multi-token-prediction "
                        "depth(s) (planner.trace.mtp), whose loss plan run does not compute yet; "
                        "set num_nextn_predict_layers: 0 in its config to run the main model, or "
                        "export the plan (plan export megatron writes --mtp-num-layers)")
    first = meta.args[0] if meta.args else None
    feeds = [k for k, v in meta.kwargs.items() if isinstance(v, torch.Tensor) and k != "labels"]
    if _encoder_decoder(meta):
        return
    if getattr(meta.module.config, "is_encoder_decoder", False):
        what = "an encoder's and a decoder's sequences (an encoder-decoder)"
    elif isinstance(first, torch.Tensor) and first.is_floating_point() and first.dim() < 4:
        what = "audio or other features"
    elif feeds:
        what = " and ".join(["token ids", *feeds])
    else:
        return
    raise SpecError(f"model: plan run trains Hugging Face models that read token ids or pixel "
                    f"values alone (decoder-only language models, image models), or an "
                    f"encoder's input and the decoder's ids (encoder-decoders); {meta.name} "
                    f"reads {what}, which it does not "
                    "feed yet (docs/runtime.md, Not supported); export the plan (plan export) or "
                    "give a file.py:factory of the model with its example inputs")


def _given_kwargs(meta: ResolvedModel) -> dict:
    """A factory's keyword example inputs, less the ``use_cache=False`` the planner adds to
    them (planner.trace.models._as_trained; build_real passes it on)."""
    return {k: v for k, v in meta.kwargs.items() if not (k == "use_cache" and v is False)}


def _encoder_decoder(meta: ResolvedModel) -> bool:
    return bool(getattr(meta.module.config, "is_encoder_decoder", False)) and isinstance(
        meta.kwargs.get("labels"), torch.Tensor)


def _decoder_ids(n: int):
    """A forward pre-hook that passes the positional input after the first ``n`` as the
    decoder's token ids (``decoder_input_ids``): the runtime feeds, splits and pipelines
    positional tensors only, and the model then returns its logits without a loss of its own."""
    def hook(module, args, kwargs):
        if len(args) > n:
            return tuple(args[:n]), {**kwargs, "decoder_input_ids": args[n]}
        return None
    return hook


def check_fingerprint(plan: Plan, spec: str, fingerprint: str) -> None:
    problem = plan.fingerprint_problem(spec, fingerprint)
    if problem:
        raise SpecError(problem)


def fingerprint(module: torch.nn.Module) -> str:
    """planner.trace.models' fingerprint (class, parameter names, shapes, dtypes) of any module."""
    return models.fingerprint(module)[0]


def build_real(plan: Plan, spec: str, meta: ResolvedModel, *, seed: int) -> RealModel:
    """The model of ``meta`` again, on the CPU with initialized weights (same seed, same bytes)."""
    dtype = TORCH_DTYPES[plan.training["dtype"]]
    torch.manual_seed(seed)
    if meta.source in ("zoo", "hf-config"):
        module = hf.build(meta.module.config, type(meta.module).__name__, meta.seq_len, dtype,
                          "cpu", meta.mtp_depths).module
        kwargs = {k: v for k, v in meta.kwargs.items() if k != "labels"}
        # (a vision encoder-decoder's is its decoder's; 0: an image model)
        vocab = int(getattr(hf.text_config(meta.module.config), "vocab_size", 0) or 0)
        args = meta.args
        if _encoder_decoder(meta):  # the decoder's ids, shaped as the labels the trace gave
            module.register_forward_pre_hook(_decoder_ids(len(args)), with_kwargs=True)
            args = (*args, meta.kwargs["labels"])
    else:
        module, inputs = _call_factory(spec, plan.training["seq_len"])
        module = module.to(dtype)
        args = inputs if isinstance(inputs, tuple) else (inputs,)
        args = tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
        # use_cache=False where the planner traced it so (the factory's own keyword inputs are
        # refused by check_runnable)
        kwargs = {k: v for k, v in meta.kwargs.items() if k == "use_cache" and v is False}
        vocab = None
    if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
        raise SpecError(f"model: '{spec}' takes tensor keyword inputs; the runtime feeds "
                        "positional tensors only (return them as a tuple from the factory)")
    module.train()
    return RealModel(module=module, args=tuple(args), kwargs=kwargs, vocab=vocab)


def _call_factory(spec: str, seq_len: int):
    factory = models.load_factory(spec)
    kw = {"seq_len": seq_len} if "seq_len" in inspect.signature(factory).parameters else {}
    model, inputs = factory(**kw)
    if isinstance(inputs, dict):
        raise SpecError(f"model: {spec} returns keyword example inputs; the runtime needs a tensor "
                        "or a tuple of tensors")
    return model, inputs


def synthetic_batch(real: RealModel, batch: int, *, seed: int) -> tuple[torch.Tensor, ...]:
    """``batch`` samples shaped like the example inputs: random tokens (and normalized pixel
    values) for Hugging Face models, the factory's own example inputs repeated along the batch
    dimension otherwise."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for a in real.args:
        if not isinstance(a, torch.Tensor) or a.dim() == 0:
            raise SpecError("model: example inputs must be tensors with a batch dimension first")
        if real.vocab is not None:
            shape = (batch, *a.shape[1:])
            out.append(torch.randn(shape, generator=gen, dtype=a.dtype) if a.is_floating_point()
                       else torch.randint(0, real.vocab, shape, generator=gen))
            continue
        reps = -(-batch // a.shape[0])
        out.append(a.repeat(reps, *([1] * (a.dim() - 1)))[:batch].clone())
    return tuple(out)


def synthetic_targets(logits_shape: tuple[int, ...], batch: int, *, seed: int) -> torch.Tensor:
    """Class indices for a cross-entropy loss over the last dimension of the model's output."""
    if len(logits_shape) < 2:  # a loss, or a score per sample: nothing to take classes from
        raise SpecError(f"model: its forward returns a tensor of shape {list(logits_shape)}, but "
                        "plan run trains on logits [batch, ..., classes] with its own cross "
                        "entropy (docs/runtime.md); return the logits (leave the loss to the "
                        "runtime), or train the plan with your own loop")
    gen = torch.Generator().manual_seed(seed + 1)
    classes = logits_shape[-1]
    return torch.randint(0, classes, (batch, *logits_shape[1:-1]), generator=gen)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy over every position (the same for each micro-batch and the reference)."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]).float(), target.reshape(-1))


def micro_batch_loss(n: int):
    """loss_fn for one of ``n`` micro-batches, divided by n before its backward: the gradients
    the micro-batches add up are then those of the mean loss. (torch's schedules can instead
    divide every gradient by n after the last backward, ``scale_grads=True``: one more pass over
    all of them each step, which the cost model does not price; torchtitan scales the loss too.)
    The schedule reports these scaled losses; the worker multiplies them back."""
    if n == 1:
        return loss_fn
    return lambda output, target: loss_fn(output, target) / n


def output_logits(out) -> torch.Tensor:
    """The tensor the loss reads: a tensor output, ``.logits`` of a ModelOutput, or the first
    tensor of a tuple."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "logits") and isinstance(out.logits, torch.Tensor):
        return out.logits
    values = (out.values() if isinstance(out, dict)
              else out if isinstance(out, (tuple, list)) else ())
    for v in values:
        if isinstance(v, torch.Tensor):
            return v
    raise SpecError(f"model: its output ({type(out).__name__}) holds no tensor to train on")


SGD_MOMENTUM = 0.9
"""SGD runs with momentum, whose buffer the cost model counts (costmodels.memory: 4 bytes per
parameter; a new-user check saw plain SGD's states read as +100% against the prediction)."""


def make_optimizer(plan: Plan, params, lr: float) -> torch.optim.Optimizer:
    """The plan's optimizer (training.optimizer) with torch's default hyper-parameters; SGD with
    momentum (SGD_MOMENTUM). Its first step is plain SGD's (the buffer starts as the gradient)."""
    name = plan.training["optimizer"]
    if name == "sgd":
        return torch.optim.SGD(list(params), lr=lr, momentum=SGD_MOMENTUM)
    cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
    return cls(list(params), lr=lr)
