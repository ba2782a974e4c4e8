"""Hugging Face models, as the planner builds and feeds them: the class for a config, the attention
implementation, and example inputs for each kind of model.

- Class: the architecture the config names, else the first auto class that has the config type:
  causal LM, masked LM, sequence-to-sequence LM, speech sequence-to-sequence, image
  classification, then the bare model (dual-tower models such as CLIP and SigLIP are bare models
  that return a contrastive loss).
- Attention: ``sdpa`` where the class offers it, else its eager attention (BLOOM, Gemma-2, MPT,
  DeBERTa-v2, ...); the cost model prices an eager attention core by ``--engine attention``.
- Inputs (batch 1), by what ``forward`` takes: token ids (and labels, for a model with a loss
  head); token ids and decoder labels (encoder-decoder); pixels (and a class label); pixels and
  token ids with ``return_loss`` (dual towers); pixels and decoder labels (a vision
  encoder-decoder: a ViT with GPT-2, TrOCR); log-mel features and decoder labels (Whisper).
  Every model is fed so that it returns its training loss.

``build`` works on any device: the planner builds on the meta device (nothing allocated); the
coverage benchmark builds the same model on the CPU to count its FLOPs for real.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import traceback
from dataclasses import dataclass, fields, is_dataclass

import torch

from planner.errors import SpecError
from planner.inputs.zoo import (LEARNED_POSITION_TYPES, NESTED_TEXT, learned_positions,
                                 position_offset)
from planner.trace import dense_experts, mtp

AUTO_CLASSES = ("AutoModelForCausalLM", "AutoModelForMaskedLM", "AutoModelForSeq2SeqLM",
                "AutoModelForSpeechSeq2Seq", "AutoModelForImageClassification", "AutoModel")
"""Where a config without ``architectures`` finds its class, in this order."""


@dataclass
class Built:
    """A Hugging Face model ready to run."""

    module: torch.nn.Module
    args: tuple
    kwargs: dict
    seq_len: int
    """Tokens per sample: the (decoder) text length, or the image's patches."""
    attention: str
    """sdpa or eager."""


def build(cfg, architecture: str, seq_len: int, dtype: torch.dtype, device: str,
          mtp_depths: int = 0) -> Built:
    """The model of ``cfg`` on ``device`` with example inputs of ``seq_len`` tokens, and the
    ``mtp_depths`` multi-token-prediction depths its config declares where planner.trace.mtp
    builds them."""
    import transformers  # lazy: transformers takes seconds to import; only Hugging Face models need it

    transformers.logging.set_verbosity_error()
    _grouped_mm_needs_alignment()
    cls = getattr(transformers, architecture, None) if architecture else None
    if cls is None:
        cls = auto_class(cfg)
    module, refusals = None, []
    with torch.device(device), _no_init(device):
        for attention in ("sdpa", "eager", ""):  # "": the class's own default
            kw = {"attn_implementation": attention} if attention else {}
            try:
                module = cls._from_config(cfg, dtype=dtype, **kw)
                break
            except (ValueError, TypeError, ImportError) as exc:  # this attention is not offered
                refusals.append(exc)
            except Exception as exc:  # noqa: BLE001 - the config is wrong; say where, in one line
                raise SpecError(f"model: transformers cannot build {cls.__name__} from this config "
                                f"({_where(exc)}); check its sizes and counts") from None
    if module is None:
        raise SpecError(f"model: transformers cannot build {cls.__name__} from this config "
                        f"({_where(refusals[-1])}); check its sizes and counts")
    attention = attention or str(getattr(module.config, "_attn_implementation", "default"))
    dense_experts.route(module)  # every expert on every token, as written: routed instead
    mtp.build(module, mtp_depths)
    args, kwargs, tokens = inputs(module, cfg, seq_len, device)
    return Built(module=module, args=args, kwargs=kwargs, seq_len=tokens, attention=attention)


def _where(exc: Exception) -> str:
    """``IndexError: list index out of range at modeling_convnext.py:222``."""
    frames = traceback.extract_tb(exc.__traceback__)
    last = f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
    first = str(exc).splitlines()[0][:120] if str(exc) else ""
    return f"{type(exc).__name__}: {first}{last}"


def auto_class(cfg):
    """The first of AUTO_CLASSES that knows ``cfg``'s type; for a config with a text and a vision
    tower, the bare model (both towers, trained with their contrastive loss); for an
    encoder-decoder, the sequence-to-sequence model."""
    import transformers  # lazy: transformers takes seconds to import; only Hugging Face models need it

    towers = hasattr(cfg, "text_config") and hasattr(cfg, "vision_config")
    first = ["AutoModel"] if towers else []
    if getattr(cfg, "is_encoder_decoder", False):  # not the decoder alone (BartForCausalLM)
        first = ["AutoModelForSeq2SeqLM", "AutoModelForSpeechSeq2Seq"]
    for auto in (*first, *AUTO_CLASSES):
        mapping = getattr(transformers, auto)._model_mapping
        if type(cfg) in mapping:
            found = mapping[type(cfg)]
            return found[0] if isinstance(found, (tuple, list)) else found
    # a composite of two models that no auto class maps (VisionEncoderDecoderConfig): its own
    composite = getattr(transformers, type(cfg).__name__.removesuffix("Config") + "Model", None)
    if composite is not None and getattr(composite, "config_class", None) is type(cfg):
        return composite
    raise SpecError(f"model: transformers has no model class for model_type '{cfg.model_type}'")


def inputs(module: torch.nn.Module, cfg, seq_len: int, device: str) -> tuple[tuple, dict, int]:
    """(args, kwargs, tokens per sample) that make ``module`` return its training loss; images
    and audio features in the dtype of the module's weights (a convolution refuses others)."""
    params = inspect.signature(module.forward).parameters
    weights = next((p.dtype for p in module.parameters() if p.is_floating_point()),
                   torch.float32)
    kwargs: dict = {}
    tokens = seq_len
    vocab = int(getattr(text_config(cfg), "vocab_size", 2) or 2)
    kind = getattr(cfg, "model_type", "this model")
    if "input_values" in params and "input_ids" not in params:
        raise SpecError(f"model: {kind} takes raw audio (input_values), which the planner does "
                        "not build from a config.json; give it as file.py:factory returning the "
                        "model and example inputs (README, MODEL)")
    if "pixel_values" in params and "input_ids" in params and any(
            getattr(cfg, k, None) is not None for k in ("image_token_index", "image_token_id")):
        raise SpecError(f"model: {kind} takes images placed among its text tokens (image token "
                        "ids in input_ids), which the planner does not build from a config.json; "
                        "give it as file.py:factory returning the model and example inputs "
                        "(README, MODEL)")
    if "pixel_values" in params:
        vision = vision_config(cfg)
        size = _image_size(vision)
        channels = int(getattr(vision, "num_channels", 3) or 3)
        kwargs["pixel_values"] = torch.randn(1, channels, size, size, device=device,
                                             dtype=weights)
        if "input_ids" in params:  # two towers: images and their captions
            kwargs["input_ids"] = _ids(seq_len, vocab, device)
            if "return_loss" in params:
                kwargs["return_loss"] = True
        elif "decoder_input_ids" in params:  # an image encoder and a text decoder (TrOCR):
            # the decoder's labels, from which it makes its input ids
            kwargs["labels"] = _ids(seq_len, vocab, device)
        else:
            tokens = image_tokens(vision, module)
            if "labels" in params:
                labels = int(getattr(cfg, "num_labels", 2) or 2)
                kwargs["labels"] = torch.randint(0, labels, (1,), device=device)
    elif "input_features" in params:  # speech: log-mel frames of the encoder's full window
        frames = 2 * int(getattr(cfg, "max_source_positions", 1500))
        kwargs["input_features"] = torch.randn(1, int(cfg.num_mel_bins), frames, device=device,
                                               dtype=weights)
        kwargs["labels"] = _ids(seq_len, vocab, device)
    else:
        kwargs["input_ids"] = _ids(seq_len, vocab, device)
        if "labels" in params and _has_loss_head(module):
            kwargs["labels"] = _ids(seq_len, vocab, device)
    if "use_cache" in params:
        kwargs["use_cache"] = False
    first = next(iter(params), None)  # the main input positionally, as a runtime passes it
    args = (kwargs.pop(first),) if first in kwargs else ()
    return args, kwargs, tokens


EXTRA_TOKENS = ("cls_token", "distillation_token", "register_tokens", "class_embedding")
"""Parameters a vision transformer prepends to its patches as tokens of their own (ViT's class
token, DeiT's distillation token, DINOv2's registers, CLIP's class embedding)."""


def _extra_tokens(module: torch.nn.Module) -> int:
    """The tokens a vision transformer adds to its patches (EXTRA_TOKENS: [1, n, d] each gives n,
    a lone vector one): ViT-B/16 attends over 197 tokens, not its 196 patches."""
    n = 0
    for name, p in module.named_parameters():
        owner, _, leaf = name.rpartition(".")
        # (in the embeddings only: a pooling head's query named cls_token, as AIMv2's, is none)
        if leaf in EXTRA_TOKENS and owner.rsplit(".", 1)[-1] == "embeddings":
            n += int(p.shape[1]) if p.dim() == 3 else 1
    return n


def image_tokens(vision, module: torch.nn.Module) -> int:
    """The tokens a vision transformer of config ``vision`` attends over: its patches and the
    tokens it prepends (_extra_tokens); one for a model without patches (a convolution's)."""
    patch = getattr(vision, "patch_size", None)
    if not patch:
        return 1
    return (_image_size(vision) // _first(patch)) ** 2 + _extra_tokens(module)


def vision_config(cfg):
    """The config of the model that reads the image: a dual tower's vision_config, a vision
    encoder-decoder's encoder, else ``cfg``."""
    for key in ("vision_config", "encoder"):
        nested = getattr(cfg, key, None)
        if getattr(nested, "model_type", None):
            return nested
    return cfg


def _ids(seq_len: int, vocab: int, device: str) -> torch.Tensor:
    return torch.randint(0, vocab, (1, seq_len), device=device)


def text_config(cfg):
    """The config of the model that reads the text: a composite's nested one (a dual tower's
    text_config, a vision encoder-decoder's decoder), else ``cfg``."""
    for key in NESTED_TEXT:
        nested = getattr(cfg, key, None)
        if getattr(nested, "model_type", None):
            return nested
    return cfg


def _image_size(vision) -> int:
    size = getattr(vision, "image_size", 224)
    return int(_first(size))


def _first(value) -> int:
    return int(value[0] if isinstance(value, (list, tuple)) else value)


def _has_loss_head(module) -> bool:
    name = type(module).__name__
    return name.endswith(("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForConditionalGeneration",
                          "ForSeq2SeqLM"))


def default_seq_len(cfg) -> int:
    """The text length to plan when none is given: the model's learned positions (those a
    sequence can take: planner.inputs.zoo.learned_positions), else its positions, at most
    4,096."""
    text = text_config(cfg)
    positions = (learned_positions(cfg) or getattr(text, "max_position_embeddings", 0)
                 or getattr(text, "n_positions", 0) or getattr(text, "max_target_positions", 0)
                 or 2048)
    return min(int(positions), 4096)


def name_of(cfg, num_params: int) -> str:
    """A model's name from its config: the checkpoint it names (``_name_or_path``), else its type
    and size (``llama-8.03B``)."""
    named = str(getattr(cfg, "_name_or_path", "") or "").rstrip("/")
    if named:
        return named.rsplit("/", 1)[-1]
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if num_params >= scale:
            return f"{cfg.model_type}-{num_params / scale:.3g}{unit}"
    return f"{cfg.model_type}-{num_params}"


def _grouped_mm_needs_alignment() -> None:
    """Route routed experts whose operands are not 16-byte aligned (an expert FFN size that is
    not a multiple of 8 in 16-bit) to transformers' own grouped GEMM fallback: torch's
    ``grouped_mm`` refuses such strides on every device, meta included, where transformers
    checks only availability. Aligned operands take ``grouped_mm`` as before; both are priced
    as grouped GEMMs (planner.trace.aten)."""
    try:
        from transformers.integrations import moe  # lazy: only Hugging Face models need it
    except ImportError:  # a transformers without routed-expert kernels
        return
    check = moe._can_use_grouped_mm
    if getattr(check, "planner_aligned", False):
        return

    def aligned(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> bool:
        misaligned = any(st != 1 and st * t.element_size() % 16 for t in (input, weight)
                         for st in t.stride())
        return not misaligned and check(input, weight, offs)

    aligned.planner_aligned = True
    moe._can_use_grouped_mm = aligned


@contextlib.contextmanager
def _no_init(device: str):
    """On the meta device, skip random weight initialization: there is no data to fill, and
    initializers dominate the build time of deep models. Elsewhere, initialize as usual."""
    if device != "meta":
        yield
        return
    names = [n for n in dir(torch.nn.init) if n.endswith("_") and not n.startswith("_")]
    saved = {n: getattr(torch.nn.init, n) for n in names}
    try:
        for n in names:
            setattr(torch.nn.init, n, lambda tensor, *a, **k: tensor)
        yield
    finally:
        for n, fn in saved.items():
            setattr(torch.nn.init, n, fn)


def positions_exceeded(cfg, seq_len: int) -> int:
    """The text config's max_position_embeddings where ``seq_len`` exceeds it and the positions
    are not learned ones (check_seq_len refuses those), else 0."""
    limit = getattr(text_config(cfg), "max_position_embeddings", 0)
    if learned_positions(cfg) or not isinstance(limit, int) or not 0 < limit < seq_len:
        return 0
    return limit


def check_seq_len(cfg, seq_len: int, name: str) -> None:
    """SpecError when ``seq_len`` is longer than the model's learned positions (those a sequence
    takes: after the padding token's row, for RoBERTa and its kin; a nested text model's, for
    CLIP and a vision encoder-decoder), naming why where the table has more rows."""
    limit = learned_positions(cfg)
    if limit is None and not getattr(cfg, "relative_attention_num_buckets", None):
        keys = ("n_positions",) + (("max_position_embeddings", "max_target_positions") if getattr(
            cfg, "model_type", None) in LEARNED_POSITION_TYPES else ())
        for key in keys:
            if getattr(cfg, key, None) == 0:  # (a new-user check: read as no limit at all)
                raise SpecError(f"model config: {key} is 0, so {name} has no learned position "
                                "to put a token at; give the number of positions it was built "
                                "for")
    if limit is not None and seq_len > limit:
        text = text_config(cfg)
        offset, rows = position_offset(text), getattr(text, "max_position_embeddings", None)
        why = (f": max_position_embeddings {rows} less {offset}, as its positions start after "
               f"pad_token_id {offset - 1}" if offset and rows else "")
        if not limit:
            raise SpecError(f"model config: {name} has no learned position to put a token at "
                            f"({limit}{why}); give the number of positions it was built for")
        raise SpecError(f"seq_len: {seq_len} exceeds {name}'s learned positions ({limit}{why}); "
                        f"use --seq-len {limit} or less")


_COUNT = re.compile(r"(^|_)(num|n)_|_(layers|heads|size|dim|experts|positions)$|^vocab_size$")
"""Config keys that count or size something (layers, heads, hidden size, experts, vocabulary)."""


def experts_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """FQN -> routed-experts module of transformers' experts interface (``num_experts`` and the
    decorated forward taking the tokens, their experts and their weights; every parameter
    ``[num_experts, ...]``): what ``plan run`` spreads over expert-parallel ranks. Other MoE
    layers (Llama 4's, built routed by planner.trace.dense_experts) have none."""
    out = {}
    for name, mod in model.named_modules():
        n = getattr(mod, "num_experts", None)
        if not isinstance(n, int) or not hasattr(mod, "_is_expert_parallel"):
            continue
        params = list(mod.parameters(recurse=False))
        if params and all(p.dim() >= 2 and p.shape[0] == n for p in params):
            out[name] = mod
    return out


def check_counts(raw: dict, where: str) -> None:
    """SpecError naming the key when a count or size in a config (nested configs included) is
    negative, or a size is zero: transformers would build an empty or broken model silently."""
    for key, value in raw.items():
        if isinstance(value, dict):
            check_counts(value, f"{where}.{key}")
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not _COUNT.search(key):
            continue
        sized = key.endswith(("_size", "_dim")) or key == "vocab_size"
        if value < 0 or (sized and value == 0):
            raise SpecError(f"{where}.{key}: expected {'a positive' if sized else 'a non-negative'}"
                            f" integer, got {value}; fix the config")


EXPERT_COUNTS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
"""Config keys that count a mixture's routed experts (Mixtral and gpt-oss, Qwen MoE, DeepSeek,
ERNIE)."""


def check_ratios(raw: dict, where: str) -> None:
    """SpecError naming the key when two counts of a config (nested configs included) cannot go
    together: more experts per token than routed experts, key/value heads that do not divide the
    attention heads. transformers builds such a model and the trace then fails with the kernel's
    words (a new-user check got "k not in range" and advice to make the forward traceable)."""
    for key, value in raw.items():
        if isinstance(value, dict):
            check_ratios(value, f"{where}.{key}")

    def count(key: str) -> int | None:
        value = raw.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
            else None

    top_k = count("num_experts_per_tok")
    experts = next(((k, count(k)) for k in EXPERT_COUNTS if count(k)), None)
    if top_k and experts and top_k > experts[1]:
        raise SpecError(f"{where}.num_experts_per_tok: {top_k} experts per token, more than the "
                        f"{experts[1]} routed experts ({experts[0]}); fix the config")
    heads, kv = count("num_attention_heads"), count("num_key_value_heads")
    if heads and kv and heads % kv:
        raise SpecError(f"{where}.num_key_value_heads: {kv} key/value heads do not divide the "
                        f"{heads} attention heads (num_attention_heads), as grouped-query "
                        "attention needs; fix the config")


DIMENSIONS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "vocab_size")
"""Sizes a config should give (by transformers' common names; a model type may name them
otherwise, as T5's d_model and num_layers, which its config's attribute_map says)."""


MTP_KEYS = ("num_nextn_predict_layers", "num_mtp_layers", "mtp_num_hidden_layers")
"""Config keys that declare multi-token-prediction (MTP) layers: DeepSeek-V3's and GLM-4.5's
``num_nextn_predict_layers`` (transformers maps its ``num_mtp_layers`` to it), Qwen3-Next's
``mtp_num_hidden_layers``."""


def type_of_architectures(architectures) -> str:
    """What to say of a config whose model_type transformers does not know: where its
    ``architectures`` name a class transformers has (a hub model with its own code, such as
    Kimi K2's ``kimi_k2`` built as DeepseekV3ForCausalLM), the model type of that class to set;
    else the config forms transformers takes."""
    import transformers  # lazy: transformers takes seconds to import; only Hugging Face models need it

    for name in architectures if isinstance(architectures, list) else []:
        config = getattr(getattr(transformers, str(name), None), "config_class", None)
        kind = getattr(config, "model_type", "")
        if kind:
            return (f"; its architectures name {name}, a transformers class of model type "
                    f"'{kind}': set \"model_type\": \"{kind}\" to plan it as that")
    return ("; give the model_type of a transformers model (as in its config classes, e.g. "
            "\"llama\", \"qwen3_moe\", \"deepseek_v3\"), or a file.py:factory that builds it")


def quantization(raw: dict) -> str:
    """How a config.json says its checkpoint's weights are stored (``quantization_config``:
    DeepSeek-V3's ``fp8``, gpt-oss's ``mxfp4``), in words; "" where it says nothing. Training
    runs in the plan's dtype whatever the checkpoint holds."""
    q = raw.get("quantization_config")
    if not isinstance(q, dict):
        return ""
    method = str(q.get("quant_method") or q.get("quant_type") or "quantized")
    block = q.get("weight_block_size")
    return method + (f", weight blocks {'x'.join(str(b) for b in block)}"
                     if isinstance(block, list) and block else "")


def mtp_layers(raw: dict) -> dict[str, int]:
    """The multi-token-prediction layers a config.json declares, by the key that declares them
    (MTP_KEYS; empty for none). The model transformers builds from it never runs them in its
    training forward (5.x keeps them for speculative decoding, a model of its own): those of the
    model types planner.trace.mtp builds onto the model are priced, the others (Qwen3-Next's)
    are left out, and this names them."""
    for key in MTP_KEYS:
        value = raw.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return {key: value}
    return {}


def defaulted_dimensions(raw: dict, cfg) -> dict[str, int]:
    """The model's dimensions (DIMENSIONS, as its config names them) that the config.json does
    not give, with the values transformers' defaults fill in: a config missing them builds a
    model of another size without a word (a new-user check planned a T5 without d_model and
    vocab_size at the defaults' 369 M parameters). A value the config class derives from keys
    the file gives is no default, even where it equals the bare class's (BLOOM's hidden_size
    from n_embed; Swin's num_layers, the length of its depths: a new-user check was warned of
    it): only a setting of the class (one of its fields) is reported; and a layer count equal
    to the length of a per-layer list the file gives (ConvNeXt's num_stages and its depths) is
    given by that list."""
    names = getattr(cfg, "attribute_map", {}) or {}
    try:
        bare = type(cfg)()
    except Exception:  # noqa: BLE001 - a config class that needs arguments: nothing to compare
        return {}
    settings = _settings(type(cfg))
    out = {}
    for key in DIMENSIONS:
        real = names.get(key, key)
        value = getattr(cfg, real, None)
        if key in raw or real in raw or isinstance(value, bool) or not isinstance(value, int):
            continue
        if settings and real not in settings:  # derived from other keys (__post_init__)
            continue
        if key == "num_hidden_layers" and any(
                isinstance(raw.get(k), list) and len(raw[k]) == value for k in PER_LAYER_LISTS):
            continue
        if value == getattr(bare, real, None):
            out[real] = value
    return out


PER_LAYER_LISTS = ("depths", "layer_types")
"""Config keys of a list with one entry per layer or stage (ConvNeXt's and Swin's depths, the
layer types of models that mix attention kinds)."""


def _settings(cls) -> frozenset[str]:
    """The keys a config class takes as settings: its dataclass fields (transformers 5), else
    its ``__init__``'s parameters."""
    if is_dataclass(cls):
        return frozenset(f.name for f in fields(cls))
    try:
        return frozenset(inspect.signature(cls.__init__).parameters)
    except (TypeError, ValueError):
        return frozenset()
