"""Tracing: FLOPs, bytes, owners, repeated layers, the fx -> export fallback, and errors."""

import os

import pytest
import torch
from torch import nn

from planner.errors import TraceError
from planner.trace.models import resolve
from planner.trace.tracers import find_repeats, trace


class MLP(nn.Module):
    def __init__(self, d=32, depth=3):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(d, d) for _ in range(depth)])

    def forward(self, x):
        return torch.relu(self.layers(x))


def test_fx_trace_counts_linear_flops_exactly():
    model, x = MLP(), torch.randn(4, 10, 32)
    g = trace(model, (x,), {}, seq_len=10, batch=4, dtype="fp32", method="fx")
    assert g.method == "fx"
    linears = [op for op in g.ops if op.kind == "matmul"]
    assert linears, "the Linear modules appear as matmul ops"
    # per sample: 2 * tokens * in * out per Linear
    assert linears[0].flops == pytest.approx(2 * 10 * 32 * 32)
    assert linears[0].out_bytes == 10 * 32 * 4
    assert linears[0].module.startswith("layers.")
    assert linears[0].params == [f"{linears[0].module}.weight", f"{linears[0].module}.bias"]


def test_blocks_of_gemm_only_layers():
    from planner.trace.blocks import build_blocks
    from planner.trace.tp_roles import analyze

    model, x = MLP(depth=4), torch.randn(2, 10, 32)
    g = trace(model, (x,), {}, seq_len=10, batch=2, dtype="fp32")
    bg = build_blocks(g, analyze(g))
    layers = [b for b in bg.blocks if b.name.startswith("layers.")]
    assert len(layers) == 4 and all(b.work.kernel_bytes == 0 for b in layers)
    # the relu applied to the stack's output is not copied into every layer
    assert bg.blocks[-1].name == "(output)" and bg.blocks[-1].ops == ["relu"]
    for b in layers:
        assert b.work.mm_flops_tp + b.work.mm_flops_rep == pytest.approx(2 * 10 * 32 * 32)


def test_hf_model_falls_back_to_export_and_keeps_two_layers(tiny_gpt2_config):
    rm = resolve(tiny_gpt2_config, seq_len=64, dtype="bf16")
    assert all(p.device.type == "meta" for p in rm.module.parameters())
    g = trace(rm.module, rm.args, rm.kwargs, seq_len=64, batch=1, dtype="bf16")
    assert g.method == "export"
    assert [(r.fqn, r.count, r.traced) for r in g.repeats] == [("transformer.h", 4, 2)]
    modules = {op.module for op in g.ops}
    assert any(m.startswith("transformer.h.1") for m in modules)
    assert not any(m.startswith("transformer.h.2") for m in modules)
    assert len(rm.module.transformer.h) == 4, "the model is restored after tracing"


def test_layer_flops_match_the_analytic_count(tiny_llama):
    # A Llama layer's GEMMs: q,o (h x h), k,v (h x kv), gate/up/down (h x f), 2 FLOPs per MAC.
    h, f, kv, s = 64, 176, 32, 128
    gemm = 2 * s * (2 * h * h + 2 * h * kv + 3 * h * f)
    attn = 2 * 2 * s * s * h  # QK^T and AV, full (non-causal) count
    layer = next(b for b in tiny_llama.blocks.blocks if b.name == "model.layers.2")
    assert layer.template == "model.layers.1"
    assert layer.work.mm_flops_tp + layer.work.mm_flops_rep == pytest.approx(gemm)
    assert layer.work.attn_flops == pytest.approx(attn)
    # traced as it runs eagerly on unpadded samples: SDPA with is_causal, not a materialized mask
    assert layer.work.attn_causal_flops == pytest.approx(layer.work.fused_attn_flops)
    assert layer.work.fused_attn_calls == 1


def test_the_trace_leaves_transformers_mask_decisions_as_they_were(tiny_llama):
    from transformers import masking_utils

    assert tiny_llama.blocks.blocks  # traced before this test runs
    for name in ("find_packed_sequence_indices", "is_torchdynamo_exporting"):
        assert getattr(masking_utils, name).__name__ != "<lambda>", name


def test_an_encoder_attends_without_a_causal_mask():
    from planner import prepare

    bert = {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 512,
            "max_position_embeddings": 128}
    import json
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/config.json"
        with open(path, "w") as f:
            json.dump(bert, f)
        prep = prepare(path, seq_len=64, dtype="fp32", cache_dir=None)
    works = [b.work for b in prep.blocks.blocks if b.work.fused_attn_flops]
    assert works and all(w.attn_causal_flops == 0 for w in works)


def test_repeats_need_identical_children():
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 16)])
            self.b = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])

    assert find_repeats(Mixed()) == [("b", 3)]


def test_untraceable_model_names_the_module():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return self.inner(x)

    class Inner(nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: no tracer can follow it
                return x * 2
            return x

    with pytest.raises(TraceError, match="in module 'inner'") as err:
        trace(Branchy(), (torch.randn(2, 4),), {}, seq_len=4, batch=2, dtype="fp32")
    text = str(err.value)
    assert "\n" not in text
    # both tracers' reports: the source line of the branch, the construct, and the fix
    assert text.count("at test_trace.py:") == 2 and "(`if x.sum() > 0:" in text
    assert "depends on tensor values" in text and "control flow on a traced value" in text
    assert "torch.where" in text
    with pytest.raises(TraceError, match="try --trace export"):
        trace(Branchy(), (torch.randn(2, 4),), {}, seq_len=4, batch=2, dtype="fp32", method="fx")


def test_an_expert_loop_is_told_to_use_a_grouped_gemm():
    class Loop(nn.Module):  # eager Mixtral-style: each expert picks its tokens by value
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(8, 4)
            self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))

        def forward(self, x):
            chosen = self.gate(x).argmax(-1)
            out = torch.zeros_like(x)
            for e, expert in enumerate(self.experts):
                rows = torch.where(chosen == e)[0]
                out = out.index_add(0, rows, expert(x[rows]))
            return out

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.moe = Loop()

        def forward(self, x):
            return self.moe(x)

    with torch.device("meta"):
        model, x = Net(), torch.randn(6, 8)
    with pytest.raises(TraceError, match=r"'moe.experts' looks like experts run one by one.*"
                                         r"torch._grouped_mm"):
        trace(model, (x,), {}, seq_len=6, batch=6, dtype="fp32")


def test_an_output_size_that_depends_on_values_is_named_with_its_source_line():
    class Picky(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            h = self.lin(x)
            rows = torch.nonzero(h > 0)  # how many rows: known only from the data
            return h[rows[:, 0]].mean()

    with torch.device("meta"):  # as the planner traces: nothing allocated, no data to look at
        model, x = Picky(), torch.randn(2, 4)
    for method in ("export", "fx"):
        with pytest.raises(TraceError) as err:
            trace(model, (x,), {}, seq_len=4, batch=2, dtype="fp32", method=method)
        text = str(err.value)
        assert "(`rows = torch.nonzero(h > 0)" in text, (method, text)
        assert "output size depends on tensor values" in text and "nonzero" in text


class _Spectral(torch.nn.Module):
    """A Linear, then an FFT: an op no formula prices."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)

    def forward(self, x):
        return torch.fft.rfft(self.lin(x), dim=-1).abs().mean()


def test_an_op_no_formula_prices_is_listed_in_the_plan_and_warned(caplog):
    import planner
    from planner.report.summary import summary

    p = planner.plan(_Spectral(), example_inputs=(torch.randn(2, 16, 64),),  # no bf16 FFT
                     cluster="dgx-a100-80g", nodes=1, global_batch=8, dtype="fp32")
    (row,) = p.provenance["unpriced_ops"]
    assert row["op"] == "aten._fft_r2c" and row["count"] == 1 and 0 < row["bytes_share"] < 1
    assert "aten._fft_r2c x1" in caplog.text and "costed by their bytes only" in caplog.text
    assert "not priced  1 kind(s) of op without a FLOP formula" in summary(p)  # plan show's
    frozen = torch.nn.Linear(64, 64)
    frozen.bias.requires_grad_(False)
    clean = planner.plan(frozen, example_inputs=(torch.randn(2, 16, 64),),
                         cluster="dgx-a100-80g", nodes=1, global_batch=8)
    assert clean.provenance["unpriced_ops"] == [] and "not priced" not in summary(clean)
    assert "frozen      4,096 of its 4.16 K parameters train (98.5%); the other 64 are frozen" \
        in summary(clean)


def test_leaf_modules_are_priced_from_their_aten_ops():
    """No zero-cost leaves: an fx-traced nn.MultiheadAttention and nn.LSTM carry the FLOPs of the
    GEMMs and attention they run (FLOPs per sample, forward)."""
    d, s = 32, 8
    mha = torch.nn.MultiheadAttention(d, 4, batch_first=True)

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]

    x = torch.randn(2, s, d)
    g = trace(Attn(), (x,), {}, seq_len=s, batch=2, dtype="fp32", method="fx")
    (op,) = [o for o in g.ops if o.target == "MultiheadAttention"]
    projections = 2 * s * d * 3 * d + 2 * s * d * d  # in_proj (q, k, v) and out_proj
    scores = 2 * s * s * d * 2  # QK^T and attention x V over all heads
    assert op.flops == pytest.approx(projections + scores)
    assert op.dims["attention"][0]["heads_q"] == 4
    class Recurrent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(d, d, batch_first=True)

        def forward(self, x):
            return self.lstm(x)[0]

    g = trace(Recurrent(), (x,), {}, seq_len=s, batch=2, dtype="fp32", method="fx")
    (op,) = [o for o in g.ops if o.target == "LSTM"]
    assert op.flops == pytest.approx(s * 2 * (d * 4 * d) * 2)  # per step: input and hidden GEMMs


def test_trace_failures_name_the_construct_and_the_fix():
    from planner.trace.failures import describe, fix_for

    missing = AttributeError("'T5Config' object has no attribute 'decoder_start_token_id'")
    assert "reads a config field the file does not set" in describe(missing)
    assert "decoder_start_token_id" in fix_for(missing)
    fx = ValueError("code: co_varnames is too small")
    assert "signature torch.fx cannot rewrite" in describe(fx)
    assert fix_for(fx).startswith("use --trace export")
    cache = RuntimeError("Found <class 'transformers.cache_utils.DynamicCache'> in output, which "
                         "is not a known type")
    assert "returns its key/value cache" in describe(cache)
    assert fix_for(cache).startswith("build it with use_cache=False")
    both = RuntimeError("Found <class 'transformers.cache_utils.EncoderDecoderCache'> in output, "
                        "which is not a known type")  # T5 built by a factory (a new-user check)
    assert "encoder-decoder that returns its key/value caches" in describe(both)
    assert fix_for(both).startswith("build it with use_cache=False")


def test_an_image_model_says_when_seq_len_does_not_apply(tmp_path, caplog):
    """Said on every plan, the trace cached or not (a new-user check: silent on a cache hit)."""
    import json

    import planner
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "vit", "hidden_size": 64, "num_attention_heads": 4,
                                "num_hidden_layers": 2, "intermediate_size": 128,
                                "image_size": 64, "patch_size": 16, "num_channels": 3}))
    for _ in range(2):  # traced, then read from the cache
        caplog.clear()
        with caplog.at_level("WARNING", logger="planner"):
            prepared = planner.prepare(str(path), seq_len=1000, dtype="fp32",
                                       cache_dir=str(tmp_path / "cache"))
        assert prepared.seq_len == 17  # (64 / 16)^2 patches and the class token
        assert "--seq-len 1000 does not apply; a sample is 17 tokens" in caplog.text


class _Images(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x, target):
        return (self.conv(x).mean((2, 3)) - target).square().mean()


def test_an_image_input_counts_one_token_a_sample_and_says_so_on_every_plan(caplog):
    """An image's dim 1 is its channels: no 'not dim 1' warning for the tokens given, and the
    note that one token per sample is counted on every plan (a new-user check: lost on a cache
    hit, and contradicted by a warning once seq_len was given as it advised)."""
    import planner

    inputs = (torch.randn(2, 3, 16, 16), torch.randn(2, 8))
    for _ in range(2):
        caplog.clear()
        with caplog.at_level("INFO", logger="planner"):
            p = planner.prepare(_Images(), example_inputs=inputs, cache_dir=None)
        assert p.seq_len == 1 and "the plan counts one token per sample" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="planner"):
        p = planner.prepare(_Images(), example_inputs=inputs, seq_len=196, cache_dir=None)
    assert p.seq_len == 196 and "not dim 1" not in caplog.text and "one token" not in caplog.text


def test_labels_beside_the_token_ids_do_not_let_another_seq_len_through():
    """(ids, labels) of one shape are one sequence: a seq_len that differs only relabels the
    tokens/s (a new-user check: 1,024 given on inputs of 512 doubled the throughput)."""
    from planner.errors import SpecError

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(64, 16), nn.Linear(16, 64)

        def forward(self, ids, labels):
            return nn.functional.cross_entropy(self.head(self.emb(ids)).flatten(0, 1),
                                               labels.flatten())

    ids = torch.randint(0, 64, (2, 32))
    with pytest.raises(SpecError, match="hold 32 tokens per sample"):
        resolve(LM(), example_inputs=(ids, ids.clone()), seq_len=64, dtype="fp32")
    assert resolve(LM(), example_inputs=(ids, ids.clone()), seq_len=32, dtype="fp32").seq_len == 32


def test_a_seq_len_the_example_inputs_do_not_have_is_refused():
    """The trace prices the inputs' shapes: another seq_len would only relabel tokens/s."""
    from planner.errors import SpecError
    net = nn.Embedding(100, 8)
    ids = torch.zeros(2, 512, dtype=torch.long)
    with pytest.raises(SpecError, match=r"^seq_len: the example inputs hold 512 tokens per "
                                        r"sample \(their token ids\), not 4096"):
        resolve(net, seq_len=4096, dtype="fp32", example_inputs=(ids,))
    assert resolve(net, seq_len=512, dtype="fp32", example_inputs=(ids,)).seq_len == 512
    assert resolve(net, seq_len=None, dtype="fp32", example_inputs=(ids,)).seq_len == 512
    # not token ids (an image batch, audio frames [batch, mels, frames]): the caller's word
    conv = nn.Conv2d(3, 4, 3)
    assert resolve(conv, seq_len=49, dtype="fp32",
                   example_inputs=(torch.randn(2, 3, 9, 9),)).seq_len == 49
    audio = nn.Conv1d(80, 8, 3)
    assert resolve(audio, seq_len=1500, dtype="fp32",
                   example_inputs=(torch.randn(2, 80, 3000),)).seq_len == 1500
    # two sequences of ids (an encoder's and a decoder's): the caller says which length
    pair = resolve(net, seq_len=128, dtype="fp32", example_inputs=(ids, ids[:, :128]))
    assert pair.seq_len == 128


def test_example_inputs_of_the_wrong_shape_are_a_trace_error():
    """Both tracers refuse them (fx's meta shortcut for Linear checks the width as Linear does),
    rather than a plan that prices the layer from its bytes."""
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 8)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    rm = resolve(Two(), seq_len=None, dtype="fp32", example_inputs=(torch.randn(4, 32),))
    with pytest.raises(TraceError, match=r"Linear\(64, 64\) got an input of size 32"):
        trace(rm.module, rm.args, rm.kwargs, seq_len=1, batch=4, dtype="fp32")


def test_a_factory_file_imports_the_modules_beside_it(tmp_path, monkeypatch):
    (tmp_path / "my_layers_beside.py").write_text(
        "import torch.nn as nn\n\ndef block():\n    return nn.Linear(8, 8)\n")
    (tmp_path / "model_file.py").write_text(
        "import torch\nimport my_layers_beside\n\n"
        "def build():\n    return my_layers_beside.block(), (torch.zeros(2, 8),)\n")
    monkeypatch.chdir(os.path.dirname(os.path.abspath(__file__)))  # not the file's folder
    rm = resolve(f"{tmp_path}/model_file.py:build", seq_len=None, dtype="fp32")
    assert isinstance(rm.module, nn.Linear)


T5_FACTORY = (
    "import torch\nfrom transformers import T5Config, T5ForConditionalGeneration\n\n"
    "def build(seq_len=16):\n"
    "    cfg = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,\n"
    "                   decoder_start_token_id=0, pad_token_id=0)\n"
    "    ids = torch.randint(0, 64, (2, seq_len))\n"
    "    return T5ForConditionalGeneration(cfg), (ids, torch.ones_like(ids), ids)\n")


def test_a_hugging_face_model_from_a_factory_is_traced_without_its_caches(tmp_path):
    """A new-user check: a T5 from a file.py:factory failed to trace ("returns its key/value
    caches") unless its config set use_cache=False, where the same module passed to planner.plan
    traced; plan run still takes the factory's positional inputs, and passes use_cache on."""
    import planner
    from planner.runtime.model import check_runnable

    (tmp_path / "t5_factory.py").write_text(T5_FACTORY)
    spec = f"{tmp_path}/t5_factory.py:build"
    rm = resolve(spec, seq_len=None, dtype="fp32")
    assert rm.kwargs == {"use_cache": False}
    check_runnable(rm)  # (the planner's keyword, not one the factory returned)
    assert planner.prepare(spec, cache_dir=None).info["num_params"] == rm.num_params


class Mixer(nn.Module):
    """Products of two activations, made into attention by a softmax or into a decayed scan (the
    shape of Mamba2's chunked SSD) by an exponent."""

    def __init__(self, mix: str, d=32):
        super().__init__()
        self.mix = mix
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (f(x).view(b, s, 4, d // 4).transpose(1, 2) for f in (self.q, self.k, self.v))
        scores = q @ k.transpose(-1, -2)
        if self.mix == "softmax":
            mixed = scores.softmax(-1)
        elif self.mix == "by hand":  # a softmax written out
            e = torch.exp(scores - scores.amax(-1, keepdim=True))
            mixed = e / e.sum(-1, keepdim=True)
        elif self.mix == "log-softmax":  # log-probabilities, as a contrastive loss takes them
            mixed = scores.log_softmax(-1)
        else:  # a decayed scan
            mixed = scores * torch.exp(-scores.abs())
        return x + (mixed @ v).transpose(1, 2).reshape(b, s, d)


@pytest.mark.parametrize("mix,method", [("softmax", "fx"), ("by hand", "fx"),
                                        ("by hand", "export"), ("log-softmax", "fx"),
                                        ("scan", "fx")])
def test_only_products_whose_scores_reach_a_softmax_are_eager_attention(mix, method):
    """A product of activations is an attention core where its scores are normalized as a
    softmax does (written out too: an exp over its sum); a scan's products (Mamba2's SSD, linear
    mixers) and log-probabilities are not: no scores priced as attention's and no key/value
    exchange for context parallelism (a new-user check found cp planned for Mamba2; a review,
    a hand-written softmax missed)."""
    from planner.trace.annotate import block_work
    from planner.trace.eager_attention import eager_attention
    from planner.trace.tp_roles import analyze

    softmax = mix in ("softmax", "by hand")
    g = trace(Mixer(mix), (torch.randn(2, 16, 32),), {}, seq_len=16, batch=2, dtype="fp32",
              method=method)
    gemms, scores = eager_attention(g)
    products = [op.name for op in g.ops if op.kind == "matmul" and not op.params]
    assert len(products) == 2
    assert gemms == (set(products) if softmax else set())
    assert bool(scores) == softmax
    work, _ = block_work(g, analyze(g), [op.name for op in g.ops])
    assert (work.attn_kv_bytes > 0) == softmax
    assert any(gemm.attention for gemm in work.gemms) == softmax


class FoldedHeads(nn.Module):
    """Attention on (batch x heads, tokens, width) tensors with an additive bias, as BLOOM's
    ``baddbmm(alibi, q, k^T)`` computes it."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (f(x).view(b, s, self.heads, d // self.heads).transpose(1, 2)
                   .reshape(b * self.heads, s, d // self.heads) for f in (self.q, self.k, self.v))
        bias = torch.zeros_like(q[:, :1, :1]).expand(-1, 1, s)
        scores = torch.baddbmm(bias, q, k.transpose(1, 2)).softmax(-1)
        return x + torch.bmm(scores, v).view(b, self.heads, s, d // self.heads) \
            .transpose(1, 2).reshape(b, s, d)


def test_attention_with_heads_folded_into_the_batch_gives_its_key_value_bytes():
    """Context parallelism exchanges keys and values and splits heads: a core on
    three-dimensional tensors counts its bytes and its heads, folded into the batch (BLOOM's came
    out with neither, and cp was refused as if it had no attention)."""
    from planner.trace.annotate import block_work
    from planner.trace.tp_roles import analyze

    g = trace(FoldedHeads(), (torch.randn(2, 16, 32),), {}, seq_len=16, batch=2, dtype="fp32",
              method="export")
    work, _ = block_work(g, analyze(g), [op.name for op in g.ops])
    width = 16 * 32 * 4  # keys, then values: tokens x width per sample, fp32
    assert work.attn_kv_bytes == pytest.approx(2 * width)
    assert work.attn_q_bytes == pytest.approx(width)
    assert work.attn_heads_q == 4 and work.attn_heads_kv == 4  # batch x heads over the batch


@pytest.mark.parametrize("model_type,extra,added", [
    ("vit", {}, 1), ("deit", {}, 2), ("dinov2", {}, 1),
    ("dinov2_with_registers", {"num_register_tokens": 4}, 5),
    ("siglip_vision_model", {}, 0), ("clip_vision_model", {}, 1),
    ("aimv2_vision_model", {"use_head": True}, 0)])
def test_a_vision_transformer_counts_the_tokens_its_embeddings_prepend(model_type, extra, added):
    """Class, distillation and register tokens join the patches in attention; a pooling head's
    query named like one (AIMv2's cls_token) does not (a review)."""
    from transformers import AutoConfig, AutoModel

    from planner.trace.hf import _extra_tokens

    cfg = AutoConfig.for_model(model_type, hidden_size=32, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=64, image_size=32,
                               patch_size=16, **extra)
    with torch.device("meta"):
        module = AutoModel.from_config(cfg)
    assert _extra_tokens(module) == added


def _blocks_both_ways(config: dict, tmp_path, seq_len: int = 64):
    """The model of ``config`` traced as the planner does (a layer stack with a pattern: its
    prefix and two periods) and traced whole: (repeat info, blocks, blocks traced whole)."""
    import json

    from planner.trace.blocks import build_blocks
    from planner.trace.models import resolve
    from planner.trace.tp_roles import analyze

    (tmp_path / "config.json").write_text(json.dumps(config))
    rm = resolve(str(tmp_path / "config.json"), seq_len=seq_len, dtype="bf16")
    out = []
    for whole in (frozenset(), frozenset({"model.layers"})):
        og = trace(rm.module, rm.args, rm.kwargs, seq_len=rm.seq_len, batch=rm.batch,
                   dtype="bf16", whole=whole)
        out.append((og.repeats, build_blocks(og, analyze(og))))
    return out[0][0], out[0][1], out[1][1]


def _same_blocks(copied, whole):
    assert [b.name for b in copied.blocks] == [b.name for b in whole.blocks]
    for a, b in zip(copied.blocks, whole.blocks):
        assert (a.work, a.params, a.split_params, a.modules, a.recompute) == \
            (b.work, b.params, b.split_params, b.modules, b.recompute), a.name
    assert {(e.src, e.dst, e.nbytes) for e in copied.edges} == \
        {(e.src, e.dst, e.nbytes) for e in whole.edges}
    assert copied.tp_roles == whole.tp_roles


def test_a_stack_that_alternates_layers_traces_two_periods_and_copies_by_phase(tmp_path):
    """gpt-oss alternates sliding-window and full attention: four of its eight layers are
    traced, each later one copied from the traced layer of its phase, and the blocks are those of
    the stack traced whole (it was traced whole until 2026-12-06: 36 layers of gpt-oss-120b)."""
    from conftest import TINY_GPT_OSS

    repeats, copied, whole = _blocks_both_ways(
        {**TINY_GPT_OSS, "num_hidden_layers": 8, "layer_types": None}, tmp_path)
    (rep,) = repeats
    assert (rep.count, rep.traced, rep.period) == (8, 4, 2)
    assert [rep.template(k) for k in range(4, 8)] == [2, 3, 2, 3]
    _same_blocks(copied, whole)
    layers = {b.name: b.work for b in copied.blocks}
    assert layers["model.layers.6"].eager_attn_masked_flops != \
        layers["model.layers.7"].eager_attn_masked_flops  # (sliding, then full)


def test_a_stack_with_other_first_layers_traces_them_and_copies_the_rest(tmp_path):
    """DeepSeek-V3 opens with dense layers before its MoE layers: the dense one and two MoE
    layers are traced, the rest copied from the second MoE layer (all 61 were traced before)."""
    repeats, copied, whole = _blocks_both_ways({
        "model_type": "deepseek_v3", "num_hidden_layers": 5, "hidden_size": 64,
        "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 32,
        "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "first_k_dense_replace": 1, "intermediate_size": 128, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "moe_intermediate_size": 32,
        "n_shared_experts": 1, "vocab_size": 128, "max_position_embeddings": 64,
        "num_nextn_predict_layers": 0}, tmp_path)
    (rep,) = repeats
    assert (rep.count, rep.traced, rep.period) == (5, 3, 1)
    _same_blocks(copied, whole)
    layers = {b.name: b.work for b in copied.blocks}
    assert not layers["model.layers.0"].num_experts and layers["model.layers.4"].num_experts == 4


def test_layer_patterns_trace_the_fewest_layers():
    from planner.trace.tracers import layer_pattern

    assert layer_pattern(list("aaaaaa")) == (0, 1)
    assert layer_pattern(list("dddmmmmmmm")) == (3, 1)
    assert layer_pattern(list("sfsfsfsf")) == (0, 2)
    assert layer_pattern(list("lllflllflllf")) == (0, 4)
    assert layer_pattern(list("sfsf")) is None  # (two periods are the whole stack)
    assert layer_pattern(list("abcde")) is None
    assert layer_pattern(list("xaaaa")) == (1, 1)


def test_layers_that_differ_only_in_a_plain_setting_are_told_apart(tmp_path):
    """Llama 4 Maverick's layers alternate dense and MoE feed-forwards, and every fourth one skips
    rotary positions through a plain attribute (use_rope = 0), which no parameter shows: a review
    found its rotary layers copied from one without. The pattern is four layers long, and the
    copies are the whole trace's (their tensor-parallel roles included; the works equal but for
    the bytes left after fusion, within 5%: a cast the traced layers share fuses otherwise when
    fewer layers read it)."""
    import dataclasses

    repeats, copied, whole = _blocks_both_ways({
        "model_type": "llama4_text", "num_hidden_layers": 12, "hidden_size": 64,
        "intermediate_size": 32, "intermediate_size_mlp": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4,
        "num_experts_per_tok": 1, "vocab_size": 256, "max_position_embeddings": 256,
        "interleave_moe_layer_step": 2, "use_qk_norm": False}, tmp_path)
    (rep,) = repeats
    assert (rep.traced, rep.period) == (8, 4) and rep.template(11) == 7
    assert copied.tp_roles == whole.tp_roles
    assert [b.name for b in copied.blocks] == [b.name for b in whole.blocks]
    for a, b in zip(copied.blocks, whole.blocks):
        assert (a.params, a.split_params) == (b.params, b.split_params), a.name
        assert a.work.gemms == b.work.gemms, a.name
        for key, value in dataclasses.asdict(a.work).items():
            if key != "gemms":
                assert getattr(b.work, key) == pytest.approx(
                    value, rel=5e-2 if key.startswith("fused_") else 1e-9), (a.name, key)


def test_a_periodic_stack_whose_layers_read_two_back_is_traced_whole():
    """A copy reads the layer before it; a layer that also reads the one two back (a review) could
    not be copied so, and the stack is traced whole."""
    from planner.trace.blocks import unchained_repeats

    class Layer(torch.nn.Module):
        def __init__(self, kind):
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)
            if kind:
                self.extra = torch.nn.Linear(16, 16)

        def forward(self, x, skip):
            h = x + self.fc(x)
            return (h + self.extra(h) if hasattr(self, "extra") else h) + skip

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(32, 16)
            self.layers = torch.nn.ModuleList(Layer(i % 2) for i in range(8))
            self.head = torch.nn.Linear(16, 32)

        def forward(self, ids):
            before = x = self.emb(ids)
            for layer in self.layers:
                before, x = x, layer(x, before)
            return self.head(x)

    ids = torch.zeros(2, 8, dtype=torch.long)
    with torch.device("meta"):
        model = Model()
    og = trace(model, (ids.to("meta"),), {}, seq_len=8, batch=2, dtype="fp32")
    assert [(r.traced, r.period) for r in og.repeats] == [(4, 2)]
    assert unchained_repeats(og) == {"layers"}


class _Decomposed(torch.nn.Module):
    """A Linear, then an SVD: ATen names it _linalg_svd (a new-user check found SVD, eigh, solve
    and det priced as free while QR was listed)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        return torch.linalg.svdvals(self.lin(x)).sum()


def test_linear_algebra_decompositions_are_listed_as_not_priced():
    import planner

    p = planner.plan(_Decomposed(), example_inputs=(torch.randn(2, 16, 16),),
                     cluster="dgx-a100-80g", nodes=1, global_batch=8, dtype="fp32")
    assert any(row["op"].startswith("aten._linalg_svd") for row in p.provenance["unpriced_ops"])


class _Recurrent(torch.nn.Module):
    def __init__(self, hidden=64, layers=2):
        super().__init__()
        self.lstm = torch.nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True)

    def forward(self, x):
        return self.lstm(x)[0].sum()


def test_a_recurrent_layer_keeps_each_timesteps_gates_for_backward():
    """A new-user check: a 2-layer LSTM's activations were priced 8x too low (its input and
    output only); a native LSTM cell keeps its 4H gates, its cell state and its output each
    timestep (7H), the pricing its gate GEMMs' results (8H)."""
    import planner

    hidden, steps, layers = 64, 16, 2
    prepared = planner.prepare(_Recurrent(hidden, layers),
                               example_inputs=(torch.randn(2, steps, hidden),), dtype="bf16",
                               cache_dir=None)
    saved = {k: b for op in prepared.opgraph.ops for k, b in op.saves}
    states = sum(b for k, b in saved.items() if k.endswith(":states"))
    assert states == pytest.approx(8 * hidden * steps * layers * 2)  # bf16, per sample


def test_a_features_input_counts_one_token_a_sample(caplog):
    """[batch, features] floating point holds features along dim 1, not tokens (a new-user check:
    a residual MLP on 512 features was priced as 512 tokens a sample, its tokens/s 512x and its
    active parameters 1/512 of its own); token ids of that rank still count dim 1."""
    import planner

    mlp = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 4))
    with caplog.at_level("INFO", logger="planner"):
        p = planner.prepare(mlp, example_inputs=(torch.randn(16, 512),), cache_dir=None)
    assert p.seq_len == 1 and "[batch, features]: the plan counts one token per sample" \
        in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="planner"):
        p = planner.prepare(mlp, example_inputs=(torch.randn(16, 512),), seq_len=1,
                            cache_dir=None)
    assert p.seq_len == 1 and "not dim 1" not in caplog.text
    lm = nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 64))
    assert planner.prepare(lm, example_inputs=(torch.randint(0, 64, (2, 32)),),
                           cache_dir=None).seq_len == 32
