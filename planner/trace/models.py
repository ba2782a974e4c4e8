"""Resolve MODEL into a module on the meta device and example inputs.

MODEL forms (README.md, "MODEL"): a zoo name (``plan models``), a path to a Hugging Face ``config.json``,
``path/to/file.py:factory`` or ``package.module:factory`` returning ``(model, example_inputs)``,
or an ``nn.Module`` passed to the API. Nothing is downloaded and no weights are allocated.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib
import importlib.util
import inspect
import logging
import os
import sys
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten

from planner.errors import SpecError
from planner.files import read_json_object, refuse_plan
from planner.inputs.modules import import_from_working_folder
from planner.inputs.zoo import ZOO, ZooEntry, learned_positions, unknown_model
from planner.trace import hf, mtp
from planner.trace.cache import imported_digests
from planner.trace.failures import model_frame

log = logging.getLogger(__name__)

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                "fp8": torch.bfloat16}
"""The dtype a model is traced (and, by `plan run`, built) in; FP8 training stores weights and
activations in bf16 and only runs weight GEMMs in FP8 (costmodels.precision)."""


@dataclass
class ResolvedModel:
    """A model ready to trace."""

    name: str
    module: torch.nn.Module
    args: tuple
    kwargs: dict
    seq_len: int
    batch: int
    """Batch size of the example inputs (figures are divided by it)."""
    source: str
    """zoo, hf-config, factory or module."""
    num_params: int = 0
    frozen_params: int = 0
    """Of ``num_params``, those the model does not train (requires_grad=False)."""
    fingerprint: str = ""
    config: dict = field(default_factory=dict)
    attention: str = ""
    """The attention implementation a Hugging Face model was built with (sdpa or eager)."""
    positions: int = 0
    """A Hugging Face config's max_position_embeddings where the traced length exceeds it and its
    positions are not learned (rotary or relative: they extend, as learned ones do not); else 0."""
    learned_positions: int = 0
    """The longest sequence a Hugging Face config's learned absolute positions take
    (planner.inputs.zoo.learned_positions); 0: none, or not a config."""
    defaulted: dict = field(default_factory=dict)
    """Dimensions a config.json does not give, with the values transformers' defaults filled in
    (planner.trace.hf.defaulted_dimensions)."""
    quantization: str = ""
    """How a config.json says its checkpoint is stored (planner.trace.hf.quantization)."""
    mtp_layers: dict = field(default_factory=dict)
    """Multi-token-prediction layers a config.json declares, by its key, which the traced model
    does not run (planner.trace.hf.mtp_layers)."""
    mtp_depths: int = 0
    """Multi-token-prediction depths the traced model runs (planner.trace.mtp), priced."""

    @property
    def encoder_tokens(self) -> int:
        """For a Hugging Face encoder-decoder, the positions its encoder reads per sample (T5's
        input ids; Whisper's audio frames after its stride-2 convolution: max_source_positions;
        a vision encoder-decoder's patches and prepended tokens), while ``seq_len`` counts the
        decoder's; 0 for other models."""
        cfg = getattr(self.module, "config", None)
        first = self.args[0] if self.args else None
        if self.source not in ("zoo", "hf-config") or not getattr(cfg, "is_encoder_decoder",
                                                                  False) or first is None:
            return 0
        if first.is_floating_point() and first.dim() >= 4:  # an image's (TrOCR's)
            return hf.image_tokens(hf.vision_config(cfg), self.module)
        if first.is_floating_point():  # audio features [batch, mel bins, frames]
            return int(getattr(cfg, "max_source_positions", 0) or first.shape[-1])
        return int(first.shape[1])

    @property
    def image_tokens(self) -> bool:
        """A Hugging Face image model reading pixel values alone: its sequence is the image's
        patches (and prepended tokens), which its config sets."""
        first = self.args[0] if self.args else None
        decoder = getattr(getattr(self.module, "config", None), "is_encoder_decoder", False)
        return (self.source in ("zoo", "hf-config") and isinstance(first, torch.Tensor)
                and first.is_floating_point() and first.dim() >= 4
                and "input_ids" not in self.kwargs and not decoder)


def _forward_params(module: torch.nn.Module) -> tuple:
    """The names ``module``'s forward takes (none where its signature cannot be read)."""
    try:
        return tuple(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return ()


def _as_trained(module: torch.nn.Module, kwargs: dict) -> dict:
    """``kwargs`` with ``use_cache=False`` where ``module``'s forward takes it and they leave it
    out, as training runs it: a Hugging Face model returns its key/value caches otherwise, which
    stop the trace (a new-user check: a T5 from a factory failed to trace where the same module
    given to planner.plan did not)."""
    if "use_cache" not in kwargs and "use_cache" in _forward_params(module):
        return {**kwargs, "use_cache": False}
    return kwargs


def resolve(model, *, seq_len: int | None, dtype: str, example_inputs=None,
            per_sample: bool = False) -> ResolvedModel:
    """Any MODEL form -> ResolvedModel (module on the meta device). ``per_sample``: a module whose
    inputs are not token sequences (a recommendation model's dense features): one "token" per
    sample, whatever the inputs' dim 1 holds."""
    if isinstance(model, torch.nn.Module):
        args, kwargs = _split_inputs(example_inputs, "example_inputs")
        model = _meta_twin(model, dtype)
        args = tuple(_cast(a, dtype, meta=True) for a in args)
        kwargs = _as_trained(model, {k: _cast(v, dtype, meta=True) for k, v in kwargs.items()})
        return _finish(ResolvedModel(name=type(model).__name__, module=model, args=args,
                                     kwargs=kwargs, seq_len=1 if per_sample else
                                     _infer_seq(args, kwargs, seq_len),
                                     batch=_infer_batch(args, kwargs), source="module"))
    if not isinstance(model, str) or not model:
        raise SpecError("model: expected a zoo name, a config.json path, file.py:factory or an "
                        f"nn.Module, got {model_kind(model)}")
    if example_inputs is not None:  # a named model builds its own inputs
        raise SpecError(f"example_inputs: given with the model {model!r}, which builds its own "
                        "inputs (a file.py:factory returns them); they go with an nn.Module "
                        "only: drop them, and give seq_len for another length")
    if model.lower() in ZOO:
        return _from_zoo(ZOO[model.lower()], seq_len, dtype)
    if model.endswith(".json") or os.path.isdir(model):
        return _from_hf_config(model, seq_len, dtype)
    if ":" in model:
        return _from_factory(model, seq_len, dtype)
    raise SpecError(f"model: {unknown_model(model)}")


def model_kind(model) -> str:
    """What a wrong MODEL argument is, in a few words (its repr can run to pages): a traced model
    or a plan says where it goes instead."""
    kind = type(model).__name__
    if kind == "Prepared":
        return "a Prepared model (pass it to planner.plan_prepared, or its spec to planner.plan)"
    if kind == "Plan":
        return ("a Plan (its model.spec names the model it was planned for: "
                "plan.model['spec'])")
    text = repr(model)
    return text if len(text) <= 80 else f"a {kind}"


def _from_zoo(entry: ZooEntry, seq_len: int | None, dtype: str) -> ResolvedModel:
    from transformers import AutoConfig  # lazy: transformers takes seconds to import; only Hugging Face models need it

    cfg = AutoConfig.for_model(entry.model_type, **entry.config)
    return _build_hf(entry.name, cfg, entry.architecture, seq_len or entry.seq_len, dtype, "zoo",
                     asked=seq_len, mtp_depths=_declared_depths(entry.config))


def _from_hf_config(path: str, seq_len: int | None, dtype: str) -> ResolvedModel:
    from transformers import AutoConfig  # lazy: transformers takes seconds to import; only Hugging Face models need it

    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    raw = read_json_object(file, what="model",
                           missing_hint="give the path to a Hugging Face config.json")
    refuse_plan(raw, file)  # (the object just read, not the file again)
    if "model_type" not in raw:
        raise SpecError(f"{file}: key 'model_type' is missing; add the transformers model type "
                        "(e.g. \"llama\", \"gpt2\")")
    hf.check_counts(raw, os.path.basename(file))
    hf.check_ratios(raw, os.path.basename(file))
    raw = dict(raw)
    model_type = raw.pop("model_type")
    try:
        cfg = AutoConfig.for_model(model_type, **raw)
    except Exception as exc:  # noqa: BLE001 - transformers' validation errors have no common base
        text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        if isinstance(exc, ValueError) and text.startswith("Unrecognized model"):
            raise SpecError(f"{file}: model_type '{model_type}' is not a transformers model type"
                            f"{hf.type_of_architectures(raw.get('architectures'))}") from None
        raise SpecError(f"{file}: transformers rejects the config: {text[:200]}; fix the config"
                        ) from None
    archs = raw.get("architectures") or []
    rm = _build_hf(None, cfg, archs[0] if archs else "", seq_len or hf.default_seq_len(cfg),
                   dtype, "hf-config", asked=seq_len, mtp_depths=_declared_depths(raw))
    rm.defaulted = hf.defaulted_dimensions(raw, cfg)
    rm.mtp_layers = {} if rm.mtp_depths else hf.mtp_layers(raw)
    rm.quantization = hf.quantization(raw)
    return rm


def _declared_depths(raw: dict) -> int:
    """The MTP depths a config dict declares by DeepSeek-V3's key (planner.trace.mtp builds
    them): a config without the key gets none, whatever transformers' default for it."""
    declared = hf.mtp_layers(raw)  # (transformers reads num_mtp_layers as the same key)
    return int(declared.get("num_nextn_predict_layers") or declared.get("num_mtp_layers") or 0)


def _build_hf(name: str | None, cfg, architecture: str, seq_len: int, dtype: str,
              source: str, asked: int | None = None, mtp_depths: int = 0) -> ResolvedModel:
    """A Hugging Face model on the meta device (planner.trace.hf), named ``name`` or from its
    config; ``asked``: the sequence length the user gave, if any; ``mtp_depths``: the
    multi-token-prediction depths its config declares (built where planner.trace.mtp can)."""
    hf.check_seq_len(cfg, seq_len, name or cfg.model_type)
    built = hf.build(cfg, architecture, seq_len, TORCH_DTYPES[dtype], "meta", mtp_depths)
    rm = _finish(ResolvedModel(name=name or "", module=built.module, args=built.args,
                               kwargs=built.kwargs, seq_len=built.seq_len, batch=1, source=source,
                               config=cfg.to_diff_dict(), attention=built.attention,
                               positions=hf.positions_exceeded(cfg, built.seq_len),
                               learned_positions=learned_positions(cfg) or 0))
    rm.name = name or hf.name_of(cfg, rm.num_params)
    rm.mtp_depths = len(built.module.mtp) if mtp.has_mtp(built.module) else 0
    return rm


TRACEBACK_HINT = "--debug shows the traceback; from Python, the exception's __cause__"
"""Where the traceback of the user's own code is, after its error's one line."""


def load_factory(spec: str):
    """The callable named by ``path/to/file.py:factory`` or ``package.module:factory``."""
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py"):
        if not os.path.exists(target):
            raise SpecError(f"model: file '{target}' not found (MODEL form path/to/file.py:factory)")
        folder = os.path.dirname(os.path.abspath(target))
        if folder not in sys.path:  # its own imports of modules beside it, as `python file.py`
            sys.path.append(folder)  # (after the planner's own: no module of it is shadowed)
        _forget_edited(target)
        mod_spec = importlib.util.spec_from_file_location(f"_planner_user_{_digest(target)}", target)
        module = importlib.util.module_from_spec(mod_spec)
        argv, sys.argv = sys.argv, [target]  # (a parser at import names the file, not plan)
        try:
            mod_spec.loader.exec_module(module)
        except SystemExit as exc:  # a script's argparse or sys.exit at import: not the CLI's own
            raise SpecError(f"model: importing '{target}' exited (SystemExit {exc.code}): the "
                            "file runs a script when imported (argument parsing, sys.exit); "
                            "put that under `if __name__ == \"__main__\":`") from None
        except ImportError as exc:
            if "relative import" not in str(exc):
                raise SpecError(f"model: importing '{target}' failed: {type(exc).__name__}: "
                                f"{(str(exc).splitlines() or [''])[0][:160]}; "
                                f"{TRACEBACK_HINT}") from exc
            package = os.path.splitext(os.path.normpath(target))[0].replace(os.sep, ".")
            raise SpecError(f"model: '{target}' imports relatively (from . import ...), which "
                            f"a file path cannot: name it as a module, e.g. {package}:{attr}, "
                            "from the folder its package is in") from None
        except Exception as exc:
            raise SpecError(f"model: importing '{target}' failed: {type(exc).__name__}: "
                            f"{(str(exc).splitlines() or [''])[0][:160]}; {TRACEBACK_HINT}"
                            ) from exc
        finally:
            sys.argv = argv
    else:
        import_from_working_folder()
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            missing = getattr(exc, "name", None)
            hint = (f"; run from the folder that holds {missing.split('.')[0]}/ or add it to "
                    "PYTHONPATH" if missing and target.startswith(missing) else "")
            raise SpecError(f"model: cannot import '{target}' ({exc}){hint}") from None
        except SystemExit as exc:
            raise SpecError(f"model: importing '{target}' exited (SystemExit {exc.code}): the "
                            "module runs a script when imported (argument parsing, sys.exit); "
                            "put that under `if __name__ == \"__main__\":`") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise SpecError(f"model: '{target}' has no callable '{attr}'; it must return "
                        "(model, example_inputs)")
    return factory


_IMPORTED: dict[str, str] = {}
"""A factory file's local modules (planner.trace.cache.local_sources) -> the hash of their bytes
when load_factory last loaded it."""


def _forget_edited(target: str) -> None:
    """Where a module beside a factory file was edited since this process last loaded it, drop
    every one of the file's local modules from sys.modules, so that its import reads them all
    again (planning twice from one Python session, a notebook, traced the edited model's first
    version, and the trace cache then kept that under the new sources' key; a module importing
    the edited one keeps the old objects, hence all of them)."""
    digests = imported_digests(target)
    local = set(digests)
    edited = False
    for path, digest in digests.items():
        edited = edited or _IMPORTED.get(path, digest) != digest
        _IMPORTED[path] = digest
    if edited:
        for name, mod in list(sys.modules.items()):
            file = getattr(mod, "__file__", None)
            if file and os.path.abspath(file) in local:
                del sys.modules[name]


def call_factory(factory, spec: str, seq_len: int | None = None, *, meta: bool = True):
    """What ``factory`` (of the MODEL form ``file.py:factory``) returns, called (on the meta
    device where ``meta``) with ``seq_len`` where it takes one and nothing else; its errors as
    one line naming it."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # (a builtin or C callable: called as it is)
        params = {}
    required = [n for n, p in params.items() if p.default is p.empty and n != "seq_len"
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if "seq_len" in params and params["seq_len"].default is params["seq_len"].empty \
            and not seq_len:
        raise SpecError(f"model: {spec} takes seq_len without a default; pass --seq-len "
                        "(seq_len= from Python), or give it a default")
    if required:
        raise SpecError(f"model: {spec} takes {', '.join(required)} without a default; the "
                        "factory is called with no arguments (seq_len only, where it has that "
                        "parameter): give them defaults, or wrap it in a factory that does")
    kw = {"seq_len": seq_len} if seq_len and "seq_len" in params else {}
    try:
        with torch.device("meta") if meta else contextlib.nullcontext():
            return factory(**kw)
    except SystemExit as exc:  # (exit 0 read as success, with no plan written)
        raise SpecError(f"model: {spec} exited (SystemExit {exc.code}) instead of returning "
                        "(model, example_inputs); fix the factory") from None
    except Exception as exc:  # the user's code: one line naming it; --debug shows the traceback
        where = model_frame(exc)
        raise SpecError(f"model: {spec} raised {type(exc).__name__}: "
                        f"{(str(exc).splitlines() or [''])[0][:160]}"
                        f"{f' at {where}' if where else ''}; fix the factory ({TRACEBACK_HINT})"
                        ) from exc


def _from_factory(spec: str, seq_len: int | None, dtype: str) -> ResolvedModel:
    factory = load_factory(spec)
    target, _, attr = spec.rpartition(":")
    result = call_factory(factory, spec, seq_len)
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module)):
        raise SpecError(f"model: {spec} must return (nn.Module, example_inputs), got "
                        f"{type(result).__name__}")
    net, inputs = result
    args, kwargs = _split_inputs(inputs, f"{spec} example_inputs")
    net = net.to(TORCH_DTYPES[dtype])  # train in the requested dtype (free on the meta device)
    args = tuple(_cast(a, dtype) for a in args)
    kwargs = _as_trained(net, {k: _cast(v, dtype) for k, v in kwargs.items()})
    return _finish(ResolvedModel(name=os.path.basename(target).removesuffix(".py") + ":" + attr,
                                 module=net, args=args, kwargs=kwargs,
                                 seq_len=_infer_seq(args, kwargs, seq_len),
                                 batch=_infer_batch(args, kwargs), source="factory"))


def _cast(value, dtype: str, meta: bool = False):
    """Floating tensors in the training dtype (and on the meta device if ``meta``)."""
    if not isinstance(value, torch.Tensor):
        return value
    to = TORCH_DTYPES[dtype] if value.is_floating_point() else value.dtype
    return torch.empty_like(value, dtype=to, device="meta") if meta else value.to(to)


def _meta_twin(module: torch.nn.Module, dtype: str) -> torch.nn.Module:
    """A copy of the caller's module on the meta device with floating weights and buffers in the
    training dtype, as a factory's model is cast; the caller's module (maybe real and large) is
    neither changed nor copied weight by weight. Tied weights stay tied."""
    memo: dict[int, object] = {}
    for p in module.parameters():
        memo[id(p)] = torch.nn.Parameter(_cast(p.detach(), dtype, meta=True),
                                         requires_grad=p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = _cast(b, dtype, meta=True)
    return copy.deepcopy(module, memo)


def _split_inputs(inputs, where: str) -> tuple[tuple, dict]:
    if inputs is None:
        raise SpecError(f"{where}: required with an nn.Module (a tensor, tuple of args or dict of kwargs)")
    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    raise SpecError(f"{where}: expected a tensor, tuple or dict, got {type(inputs).__name__}")


def _tensors(args, kwargs) -> list:
    """The example inputs' tensors in order, inside dicts, lists and tuples too (a forward that
    takes one ``batch`` dict of ids and labels)."""
    return [v for v in tree_flatten((list(args), dict(kwargs)))[0] if isinstance(v, torch.Tensor)]


def _first_tensor(args, kwargs):
    tensors = _tensors(args, kwargs)
    return tensors[0] if tensors else None


def _infer_batch(args, kwargs) -> int:
    t = _first_tensor(args, kwargs)
    return int(t.shape[0]) if t is not None and t.dim() >= 1 else 1


def _infer_seq(args, kwargs, seq_len) -> int:
    """The tokens per sample: ``seq_len`` if given, else dim 1 of the first input (one for an
    image's [batch, channels, height, width], whose dim 1 holds channels, and for a [batch,
    features] floating input, whose dim 1 holds features: a new-user check saw a residual MLP
    on 512 features priced as 512 tokens a sample, its tokens/s 512x and its active parameters
    1/512 of its own). Given, it
    must agree with the inputs' token ids ([batch, tokens], integer) when they are the first
    input and every integer input of that rank has their shape (labels, a mask, same-length
    encoder and decoder ids): the trace prices the inputs' shapes, so another length would only
    mislabel the plan's tokens/s. Other inputs (embeddings, audio frames, an encoder's and a
    decoder's ids of two lengths) only get a warning when dim 1 differs: what is a token there
    is the caller's word; an image's count is the caller's too."""
    t = _first_tensor(args, kwargs)
    ids = [v for v in _tensors(args, kwargs) if v.dim() == 2 and not v.is_floating_point()]
    if seq_len:
        if ids and ids[0] is t and int(t.shape[1]) != int(seq_len) and \
                all(v.shape == t.shape for v in ids):
            # one sequence of token ids (its labels alike): another length would only relabel
            # the plan's tokens/s
            raise SpecError(f"seq_len: the example inputs hold {int(t.shape[1])} tokens per sample "
                            f"(their token ids), not {int(seq_len)}; give inputs of that length (a "
                            "factory may take a seq_len argument) or leave seq_len out")
        if t is not None and t.dim() >= 2 and int(t.shape[1]) != int(seq_len) and \
                not _one_per_sample(args, kwargs):  # (an image's tokens: the caller's count)
            log.warning("seq_len %d is not dim 1 of the first example input (%s): the plan is "
                        "priced from the inputs' shapes and reports %d tokens per sample",
                        int(seq_len), "x".join(map(str, t.shape)), int(seq_len))
        return int(seq_len)
    if _one_per_sample(args, kwargs):  # [batch, channels, ...], [batch, features]
        return 1
    return int(t.shape[1]) if t is not None and t.dim() >= 2 else 1


def _one_per_sample(args, kwargs) -> bool:
    """Whether the first input holds no tokens along dim 1: an image's or features'."""
    return bool(image_shape(args, kwargs) or features_shape(args, kwargs))


def features_shape(args, kwargs) -> str:
    """The first example input's shape (``16x512``) where it is [batch, features] floating
    point, else ''."""
    t = _first_tensor(args, kwargs)
    if t is None or t.dim() != 2 or not t.is_floating_point():
        return ""
    return "x".join(map(str, t.shape))


def image_shape(args, kwargs) -> str:
    """The first example input's shape (``2x3x128x128``) where it is an image's (floating,
    [batch, channels, height, width] or more dimensions), else ''."""
    t = _first_tensor(args, kwargs)
    if t is None or t.dim() < 4 or not t.is_floating_point():
        return ""
    return "x".join(map(str, t.shape))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def fingerprint(module: torch.nn.Module) -> tuple[str, int]:
    """(fingerprint, parameter count) of an architecture: its class, parameter names, shapes,
    dtypes and which are frozen, hashed; the same on the meta device and with real weights."""
    h = hashlib.sha256(type(module).__qualname__.encode())
    seen = set()
    total = 0
    for n, p in module.named_parameters():
        # frozen parameters change what a step computes; trained ones keep older fingerprints
        h.update(f"{n}:{tuple(p.shape)}:{p.dtype}{'' if p.requires_grad else ':frozen'};"
                 .encode())
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return h.hexdigest()[:16], total


def _finish(rm: ResolvedModel) -> ResolvedModel:
    rm.fingerprint, rm.num_params = fingerprint(rm.module)
    rm.frozen_params = sum(p.numel() for p in rm.module.parameters() if not p.requires_grad)
    return rm
