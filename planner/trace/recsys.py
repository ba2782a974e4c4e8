"""Recommendation models: build the zoo's (TorchRec tables, plain-torch dense part), find the
embedding tables of any module, and measure the dense part from the ops it runs.

A module is a recommendation model when it holds embedding tables: TorchRec
``EmbeddingBagCollection`` / ``EmbeddingCollection`` or plain ``nn.EmbeddingBag`` / ``nn.Embedding``
outside of them. Per-table statistics the module cannot tell (ids per sample, access skew) come
from the zoo entry or from a tables YAML::

    tables:
      t_cat_0: {pooling: 3, skew: 0.6}
      t_cat_1: {pooling: 1}

When the module offers ``dense_forward(*dense_inputs(batch))`` (the zoo's models do), its dense
part is traced apart from the tables (``dense_arch``) and planned by the dense search
(planner.search.dense_part), and its ATen ops are counted on the meta device
(torch.utils.flop_counter) for the host's share of the step; otherwise the dense part is priced
from its ``nn.Linear`` layers (2 x in x out FLOPs per sample each), which leaves element-wise ops
unpriced.
"""

from __future__ import annotations

import copy
import logging
import math
import numbers
import os

import torch
from torch import nn

from costmodels.embeddings import MAX_POOLING, RecModel, Table
from planner.errors import SpecError, TraceError

log = logging.getLogger(__name__)
from planner.inputs.zoo import RECSYS, RecEntry


def torchrec_available() -> bool:
    try:
        import torchrec  # noqa: F401  # lazy: an optional library, installed by `make install`
    except Exception:  # noqa: BLE001 - any import failure means "not usable here"
        return False
    return True


def _ebc(entry: RecEntry, device):
    """A TorchRec EmbeddingBagCollection with one table per feature (``t_<feature>``)."""
    with torch.device("cpu"):  # its first import runs tensor code (tensordict), which fails on
        # the meta device a factory is called under (planner.trace.models)
        from torchrec.modules.embedding_configs import EmbeddingBagConfig  # lazy: optional library
        from torchrec.modules.embedding_modules import EmbeddingBagCollection  # lazy: as above

    configs = [EmbeddingBagConfig(name=f"t_{f}", embedding_dim=entry.dim, num_embeddings=rows,
                                  feature_names=[f])
               for f, rows in zip(feature_names(entry), entry.rows)]
    return EmbeddingBagCollection(tables=configs, device=torch.device(device))


def feature_names(entry: RecEntry) -> list:
    return [f"cat_{i}" for i in range(len(entry.rows))]


def _mlp(widths, first: int, last_plain: bool) -> nn.Sequential:
    layers, prev = [], first
    for i, w in enumerate(widths):
        layers.append(nn.Linear(prev, w))
        if not (last_plain and i == len(widths) - 1):
            layers.append(nn.ReLU())
        prev = w
    return nn.Sequential(*layers)


class LowRankCross(nn.Module):
    """DCNv2's cross layers, low rank (Wang et al. 2021, eq. 2 with W = U V)."""

    def __init__(self, width: int, layers: int, rank: int):
        super().__init__()
        self.v = nn.ModuleList(nn.Linear(width, rank, bias=False) for _ in range(layers))
        self.u = nn.ModuleList(nn.Linear(rank, width) for _ in range(layers))

    def forward(self, x0):
        x = x0
        for v, u in zip(self.v, self.u):
            x = x0 * u(v(x)) + x
        return x


class RecNet(nn.Module):
    """DLRM (dot or DCNv2 interaction) or a two-tower model over TorchRec tables."""

    def __init__(self, entry: RecEntry, device="meta"):
        super().__init__()
        self.entry = entry
        self.features = feature_names(entry)
        self.sparse = _ebc(entry, device)
        n, d = len(entry.rows), entry.dim
        with torch.device(device):
            if entry.interaction == "two_tower":
                q = entry.towers[0]
                self.query = _mlp(entry.top, q * d, last_plain=True)
                self.candidate = _mlp(entry.top, (n - q) * d, last_plain=True)
                return
            self.bottom = _mlp(entry.bottom, entry.dense_in, last_plain=False)
            if entry.interaction == "dot":
                pairs = (n + 1) * n // 2
                self.over = _mlp(entry.top, d + pairs, last_plain=True)
            elif entry.interaction == "dcn":
                self.cross = LowRankCross((n + 1) * d, entry.dcn_layers, entry.dcn_rank)
                self.over = _mlp(entry.top, (n + 1) * d, last_plain=True)
            else:
                raise SpecError(f"model {entry.name}: interaction {entry.interaction!r} is not "
                                "one of dot, dcn, two_tower")

    def dense_inputs(self, batch: int, device="meta"):
        """Inputs of ``dense_forward``: dense features and the pooled embeddings."""
        n, d = len(self.entry.rows), self.entry.dim
        pooled = torch.randn(batch, n, d, device=device)
        dense = torch.randn(batch, max(self.entry.dense_in, 1), device=device)
        return dense, pooled

    def dense_forward(self, dense, pooled):
        """Everything but the table lookups: ``pooled`` is [batch, tables, dim]."""
        if self.entry.interaction == "two_tower":
            q = self.entry.towers[0]
            a = self.query(pooled[:, :q].flatten(1))
            b = self.candidate(pooled[:, q:].flatten(1))
            return (a * b).sum(-1)
        x = self.bottom(dense)
        if self.entry.interaction == "dot":
            z = torch.cat([x.unsqueeze(1), pooled], dim=1)
            dots = torch.bmm(z, z.transpose(1, 2))
            i, j = torch.triu_indices(z.shape[1], z.shape[1], offset=1, device=z.device)
            return self.over(torch.cat([x, dots[:, i, j]], dim=1))
        z = torch.cat([x.unsqueeze(1), pooled], dim=1).flatten(1)
        return self.over(self.cross(z))

    def forward(self, dense, sparse):
        """``sparse``: a KeyedJaggedTensor with the features ``cat_0``, ``cat_1``, ..."""
        kt = self.sparse(sparse)
        pooled = torch.stack([kt[f] for f in self.features], dim=1)
        return self.dense_forward(dense, pooled)


def build(entry: RecEntry, device="meta") -> RecNet:
    if not torchrec_available():
        raise TraceError(f"model {entry.name}: recommendation models need TorchRec "
                         "(torchrec 1.8.0 with fbgemm-gpu-cpu 1.8.0); run `make install`")
    return RecNet(entry, device)


def is_recsys(model) -> bool:
    """A zoo name of a recommendation model, or a module holding embedding tables."""
    if isinstance(model, str):
        return model.lower() in RECSYS
    if isinstance(model, nn.Module):
        return bool(find_tables(model))
    return False


def find_tables(module: nn.Module) -> list:
    """(name, rows, dim, feature names, pooled, the collection's module path or '') of every
    table in ``module``."""
    out, inside = [], set()
    for path, m in module.named_modules():
        if hasattr(m, "embedding_bag_configs") or hasattr(m, "embedding_configs"):
            pooled = hasattr(m, "embedding_bag_configs")
            configs = m.embedding_bag_configs() if pooled else m.embedding_configs()
            for c in configs:
                out.append((c.name, int(c.num_embeddings), int(c.embedding_dim),
                            tuple(c.feature_names), pooled, path))
            inside.update(p for p, _ in m.named_modules(prefix=path))
    for path, m in module.named_modules():
        if path in inside:
            continue
        if isinstance(m, (nn.EmbeddingBag, nn.Embedding)):
            out.append((path, int(m.num_embeddings), int(m.embedding_dim), (path,),
                        isinstance(m, nn.EmbeddingBag), ""))
    return out


def read_table_stats(path: str) -> dict:
    """The ``tables:`` mapping of a tables YAML: name -> {pooling, skew, features}."""
    from planner.files import read_yaml  # lazy: keeps this module's imports to torch

    doc = read_yaml(path, what="tables file", missing_hint=(
        "give the path of a YAML of 'tables:' name -> {pooling, skew, features}, or leave "
        "--tables out for the zoo's statistics (or MODEL.tables.yaml beside a factory)"))
    doc = doc if isinstance(doc, dict) else {}
    tables = doc.get("tables")
    extra = sorted(set(doc) - {"tables"})
    if extra:
        raise SpecError(f"{path}: unknown key '{extra[0]}'; the file holds one 'tables:' mapping "
                        "of table name -> {pooling, skew, features}")
    if not isinstance(tables, dict):
        raise SpecError(f"{path}: expected a 'tables:' mapping of table name -> "
                        "{pooling, skew}")
    return check_table_stats(tables, f"{path}: tables")


def check_table_stats(tables, where: str = "tables") -> dict:
    """``tables`` (name -> {pooling, skew, features}), each value checked (STAT_RULES);
    SpecError naming the entry (``where``.name.key) otherwise."""
    if not isinstance(tables, dict):
        raise SpecError(f"{where}: expected a mapping of table name -> {{pooling, skew, "
                        "features}")
    keys = ("pooling", "skew", "features")
    for name, stats in tables.items():
        if not isinstance(stats, dict):
            raise SpecError(f"{where}.{name}: expected a mapping with pooling, skew and/or "
                            "features")
        unknown = sorted(set(stats) - set(keys))
        if unknown:
            raise SpecError(f"{where}.{name}.{unknown[0]}: unknown key; use {', '.join(keys)}")
        for key, value in stats.items():
            _check_stat(f"{where}.{name}.{key}", key, value)
    return tables


STAT_RULES = {"pooling": f"a number of ids per sample and feature above 0 and below "
                         f"{MAX_POOLING:,.0f}, e.g. 1.5",
              "skew": "a number from 0 (ids drawn uniformly) up to, not including, 1, e.g. 0.6",
              "features": "a whole number of features above 0 looking the table up, e.g. 2"}
"""What each statistic of a tables file takes, in the words of its error."""


def _check_stat(where: str, key: str, value) -> None:
    """SpecError unless ``value`` is what ``key`` takes (STAT_RULES): a number (not a list, text
    or true/false), above 0 (skew: at or above), whole for features."""
    if isinstance(value, str):  # (PyYAML reads 1e3 as text)
        try:
            value = float(value)
        except ValueError:
            pass
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    ok = number and math.isfinite(value) and (0 <= value < 1 if key == "skew" else value > 0) \
        and (key != "features" or float(value).is_integer()) \
        and (key != "pooling" or value < MAX_POOLING)
    if not ok:
        hint = " (one figure for all the table's features: their mean)" \
            if isinstance(value, list) and key == "pooling" else ""
        raise SpecError(f"{where}: expected {STAT_RULES[key]}, got {value!r}{hint}")


def rec_model(model, *, batch: int = 1024, stats: dict | None = None,
              name: str | None = None) -> RecModel:
    """MODEL (a zoo name or a module) -> RecModel: its tables with their statistics, and the dense
    part's FLOPs, parameters and saved activations per sample."""
    entry = None
    if isinstance(model, str):
        entry = RECSYS[model.lower()]
        module = build(entry)
        name = entry.name
    else:
        module = model
        name = name or type(model).__name__
    stats = dict(stats or {})
    found = find_tables(module)
    if not found:
        raise TraceError(f"model {name}: no embedding tables found (EmbeddingBagCollection, "
                         "EmbeddingCollection, nn.EmbeddingBag or nn.Embedding)")
    known = {t[0] for t in found}
    unknown = sorted(set(stats) - known)
    if unknown:
        raise SpecError(f"tables.{unknown[0]}: not a table of the model (its tables: "
                        f"{', '.join(sorted(known)[:6])}{', ...' if len(known) > 6 else ''}); "
                        "name the tables file's entries after the model's tables")
    tables = []
    for i, (tname, rows, dim, feats, pooled, holder) in enumerate(found):
        s = stats.get(tname, {})
        pool = entry.pooling[i] if entry is not None and entry.pooling else 1.0
        tables.append(Table(name=tname, rows=rows, dim=dim, pooling=float(s.get("pooling", pool)),
                            features=int(s.get("features", len(feats) or 1)),
                            skew=float(s.get("skew", 0.0)), pooled=pooled,
                            feature_names=tuple(feats), module=holder))
    guessed = [t.name for t in tables if "pooling" not in stats.get(t.name, {})]
    if entry is None and guessed:  # (the zoo's tables carry their published ids per sample)
        log.warning("%s: ids per sample of %s not given, 1 taken (a lookup's share of the step "
                    "grows with them); give them as pooling in a tables YAML (--tables FILE, "
                    "or MODEL.tables.yaml beside a factory; README, recommendation models)",
                    name, ", ".join(guessed[:4]) + (f" and {len(guessed) - 4} more"
                                                     if len(guessed) > 4 else ""))
    table_params = sum(t.rows * t.dim for t in tables)
    dense_params = sum(p.numel() for p in module.parameters()) - table_params
    flops, acts, ops = _dense_work(module, batch)
    return RecModel(name=name, tables=tuple(tables), dense_params=max(0, int(dense_params)),
                    dense_flops_per_sample=flops, dense_act_bytes_per_sample=acts, dense_ops=ops)


class DenseArch(nn.Module):
    """The dense part of a module with ``dense_forward``/``dense_inputs``, apart from its tables:
    the children that hold no table, and ``dense_forward`` as its forward (what the dense search
    traces and prices)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        holding = {p.split(".")[0] for p, m in module.named_modules() if p and _is_table(m)}
        # ``dense_forward`` runs on a shallow copy of the module that lacks the children holding
        # tables: not a child here (no parameters counted twice), and copying this module (the
        # tracer's meta twin) never copies a table
        rest = copy.copy(module)
        rest.__dict__["_modules"] = {n: c for n, c in module._modules.items() if n not in holding}
        self.__dict__["whole"] = rest
        for name, child in rest.named_children():
            self.add_module(name, child)

    def forward(self, *args):
        return self.whole.dense_forward(*args)


def dense_arch(module: nn.Module, batch: int = 64):
    """(DenseArch, example inputs) of ``module``, or None when its dense part cannot be run
    apart from its tables (no ``dense_forward``/``dense_inputs``)."""
    if not (hasattr(module, "dense_forward") and hasattr(module, "dense_inputs")):
        return None
    return DenseArch(module), tuple(module.dense_inputs(batch, device="meta"))


def _is_table(m: nn.Module) -> bool:
    return (hasattr(m, "embedding_bag_configs") or hasattr(m, "embedding_configs")
            or isinstance(m, (nn.EmbeddingBag, nn.Embedding)))


def _dense_work(module: nn.Module, batch: int) -> tuple:
    """Forward FLOPs, saved-activation bytes and ATen op count of the dense part, per sample."""
    from torch.utils.flop_counter import FlopCounterMode  # lazy: only recommendation models

    if hasattr(module, "dense_forward") and hasattr(module, "dense_inputs"):
        dense = [p for n, p in module.named_parameters() if p.device.type != "meta"]
        device = dense[0].device if dense else torch.device("meta")
        args = module.dense_inputs(batch, device=device)
        counter = FlopCounterMode(display=False)
        ops = _OpCount()
        with counter, ops:
            out = module.dense_forward(*args)
        acts = _saved_bytes(module, args)
        del out
        return counter.get_total_flops() / batch, acts / batch, ops.count
    flops = acts = 0.0
    for m in module.modules():
        if isinstance(m, nn.Linear):
            flops += 2.0 * m.in_features * m.out_features
            acts += 4.0 * (m.in_features + m.out_features)
    return flops, acts, 0


class _OpCount(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _saved_bytes(module: nn.Module, args) -> float:
    """Bytes autograd saves for the backward of ``dense_forward`` (meta tensors, counted once)."""
    seen, total = set(), 0

    def pack(t):
        nonlocal total
        key = (t.untyped_storage().data_ptr() if t.device.type != "meta" else id(t), t.shape)
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
        return t

    params = {id(p) for p in module.parameters()}
    args = [a.requires_grad_(True) if a.is_floating_point() else a for a in args]
    with torch.autograd.graph.saved_tensors_hooks(lambda t: pack(t) if id(t) not in params else t,
                                                  lambda t: t):
        module.dense_forward(*args)
    return float(total)


def default_stats_path(spec: str) -> str | None:
    """``model.tables.yaml`` beside a ``model.py:factory`` spec, if it exists."""
    if ":" not in spec:
        return None
    path = spec.rsplit(":", 1)[0]
    if not path.endswith(".py"):
        return None
    beside = path[:-3] + ".tables.yaml"
    return beside if os.path.exists(beside) else None


def has_table_collections(module: nn.Module) -> bool:
    """True when the tables are TorchRec collections or EmbeddingBags: a model whose only table is
    an ``nn.Embedding`` of tokens (a language model) stays with the dense search."""
    for m in module.modules():
        if hasattr(m, "embedding_bag_configs") or hasattr(m, "embedding_configs") or \
                isinstance(m, nn.EmbeddingBag):
            return True
    return False
