"""The Python API's arguments as a new user passes them (a new-user check of the API): paths as
pathlib.Path, a preset name for TrainingSpec's engine, a prepared model planned in another dtype,
a file argument that is not a path, and a Hugging Face module built with its default config."""

from __future__ import annotations

import json
import logging
import pathlib

import pytest

import planner
from planner.errors import SpecError


def test_a_relative_path_cluster_is_a_file_whatever_its_name(tiny_llama_config, tmp_path,
                                                             monkeypatch):
    """Path("mycluster") (no suffix, no folder) is the file, not a preset of that name, in
    plan and whatif as in load_cluster."""
    (tmp_path / "mycluster").write_text(
        "name: two-a100\ndevice: a100-80g\ngpus_per_node: 2\nnodes: 1\n"
        "intra_node: {bandwidth_GBps: 300, latency_us: 2}\n"
        "inter_node: {bandwidth_GBps: 25, latency_us: 5}\n")
    monkeypatch.chdir(tmp_path)
    assert planner.load_cluster(pathlib.Path("mycluster")).num_gpus == 2
    p = planner.plan(tiny_llama_config, cluster=pathlib.Path("mycluster"), global_batch=8,
                     seq_len=128, top_k=0)
    rows = planner.whatif(tiny_llama_config, cluster=pathlib.Path("mycluster"),
                          vary={"global_batch": [8, 16]}, seq_len=128, workers=1)
    assert p.cluster["num_gpus"] == 2 and [r["gpus"] for r in rows] == [2, 2]
    with pytest.raises(SpecError, match="'mycluster' is a file here, and a name without a suffix "
                                        "or folder is read as a preset; give it as ./mycluster"):
        planner.load_cluster("mycluster")  # a str without suffix or folder: a preset name
    (tmp_path / "mycluster.txt").write_text((tmp_path / "mycluster").read_text())
    assert planner.load_cluster("mycluster.txt").num_gpus == 2  # an existing file with a suffix


def test_paths_may_be_pathlib_paths(tiny_llama_config, tmp_path):
    """MODEL, cluster YAML and plan files given as pathlib.Path are read as the same str paths
    (Plan.save said 'PosixPath' object has no attribute 'endswith'; a cluster Path was refused)."""
    cluster = tmp_path / "cluster"  # (no .yaml suffix; the relative case is the test above)
    cluster.write_text("name: two-a100\ndevice: a100-80g\ngpus_per_node: 2\nnodes: 1\n"
                       "intra_node: {bandwidth_GBps: 300, latency_us: 2}\n"
                       "inter_node: {bandwidth_GBps: 25, latency_us: 5}\n")
    p = planner.plan(pathlib.Path(tiny_llama_config), cluster=cluster, global_batch=8,
                     seq_len=128, top_k=0)
    q = planner.plan(str(tiny_llama_config), cluster=str(cluster), global_batch=8, seq_len=128,
                     top_k=0)
    assert p.cluster["num_gpus"] == 2 and p.to_dict()["parallel"] == q.to_dict()["parallel"]
    p.save(tmp_path / "p.json")
    assert planner.load_plan(tmp_path / "p.json").to_dict() == p.to_dict()


@pytest.mark.parametrize("value", [1, True, 0])
@pytest.mark.parametrize("where", ["load_plan", "calibration"])
def test_a_number_given_for_a_file_is_refused_not_opened(where, value, capsys):
    """open(1) reads standard output as a file and closes it; open(0) waits on standard input."""
    with pytest.raises(SpecError, match=r"expected a (calibration )?file path \(a str or "
                                        r"pathlib.Path\)( or a mapping)?, got"):
        if where == "load_plan":
            planner.load_plan(value)
        else:
            planner.plan("gpt2", cluster="dgx-a100-80g", global_batch=8, seq_len=128,
                         calibration=value)
    print("stdout still open")
    assert "stdout still open" in capsys.readouterr().out


def test_training_spec_takes_an_engine_preset_name_or_settings(tiny_llama, tiny_llama_config):
    """TrainingSpec(engine="torchtitan") prices as planner.plan(target="torchtitan") does (it
    raised AttributeError: 'str' object has no attribute 'fp8_recipe'); anything else is named."""
    cluster = planner.load_cluster("dgx-h100")
    named = planner.TrainingSpec(global_batch=16, seq_len=128, engine="torchtitan")
    mapped = planner.TrainingSpec(global_batch=16, seq_len=128, engine={"attention": "flash2"})
    assert named.engine.attention == "flash2" and mapped.engine.attention == "flash2"
    prepared = planner.plan_prepared(tiny_llama, cluster, named,
                                     planner.SearchOptions(target="torchtitan", top_k=0))
    direct = planner.plan(tiny_llama_config, cluster="dgx-h100", global_batch=16,
                          seq_len=128, target="torchtitan", top_k=0)
    assert prepared.step_time_s == pytest.approx(direct.step_time_s, rel=1e-9)
    with pytest.raises(SpecError, match="^engine: expected an EngineSpec"):
        planner.TrainingSpec(global_batch=16, seq_len=128, engine=3)


def test_a_target_searched_with_the_default_engine_is_warned_about(tiny_llama, caplog):
    training = planner.TrainingSpec(global_batch=16, seq_len=128)
    planner.plan_prepared(tiny_llama, planner.load_cluster("dgx-h100"), training,
                          planner.SearchOptions(target="torchtitan", top_k=0))
    assert "engine='torchtitan'" in caplog.text


def test_a_prepared_model_planned_in_another_word_size_is_refused(tiny_llama):
    """Traced in bf16 (2-byte activations), planned in fp32: refused like a seq_len mismatch;
    fp8 (bf16 storage) is the bf16 trace's."""
    cluster = planner.load_cluster("dgx-h100")
    with pytest.raises(SpecError, match=r"^training.dtype: fp32, but the model was traced in "
                                        r"bf16; prepare it again with dtype='fp32'"):
        planner.plan_prepared(tiny_llama, cluster,
                              planner.TrainingSpec(global_batch=8, seq_len=128, dtype="fp32"),
                              planner.SearchOptions(top_k=0))
    fp8 = planner.plan_prepared(tiny_llama, cluster,
                                planner.TrainingSpec(global_batch=8, seq_len=128, dtype="fp8"),
                                planner.SearchOptions(top_k=0))
    assert fp8.training["dtype"] == "fp8"


def test_a_hugging_face_module_with_its_default_config_traces():
    """use_cache defaults to True in a Hugging Face config; training calls the model without a
    cache, and so does the trace (a returned cache stopped it)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128,
                        bos_token_id=0, eos_token_id=0)
    assert config.use_cache
    module = GPT2LMHeadModel(config)
    ids = torch.randint(0, 1000, (1, 64))
    p = planner.plan(module, example_inputs=(ids,), cluster="dgx-a100-80g", global_batch=8,
                     top_k=0)
    assert p.training["seq_len"] == 64 and p.step_time_s > 0
    assert config.use_cache  # the user's module and config are left as they were


def test_a_factory_read_from_the_trace_cache_takes_its_own_files_name(tmp_path):
    """Two factory files of the same bytes share a cached trace; the plan of the second names the
    second ('bbb:build'), not the one traced first."""
    import os
    import shutil
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for name in ("aaa", "bbb"):
        shutil.copy(os.path.join(root, "examples", "branched.py"), tmp_path / f"{name}.py")
    cache = str(tmp_path / "cache")
    first = planner.plan(f"{tmp_path / 'aaa.py'}:build", cluster="cpu", global_batch=8, top_k=0,
                         cache_dir=cache)
    second = planner.plan(f"{tmp_path / 'bbb.py'}:build", cluster="cpu", global_batch=8, top_k=0,
                          cache_dir=cache)
    assert first.model["name"] == "aaa:build" and second.model["name"] == "bbb:build"
    assert second.model["spec"].endswith("bbb.py:build")


def test_a_model_without_trainable_weights_is_named(tmp_path, caplog):
    """No parameters, or none trained: bad input (it crashed on an invariant); frozen ones:
    said, with how plans price them (new-user checks)."""
    (tmp_path / "models.py").write_text(
        "import torch\n"
        "from torch import nn\n"
        "def none():\n"
        "    return nn.ReLU(), (torch.randn(2, 8, 4),)\n"
        "def frozen():\n"
        "    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))\n"
        "    m[0].requires_grad_(False)\n"
        "    return m, (torch.randn(2, 8, 4),)\n"
        "def ice():\n"
        "    m = nn.Linear(4, 4).requires_grad_(False)\n"
        "    return m, (torch.randn(2, 8, 4),)\n")
    with pytest.raises(SpecError, match=r"^model: .*none has no parameters, so there is no "
                                        r"training to plan"):
        planner.prepare(f"{tmp_path}/models.py:none", cache_dir=None)
    with pytest.raises(SpecError, match=r"^model: .*ice trains none of its 20 parameters \(all "
                                        r"have requires_grad=False\)"):
        planner.prepare(f"{tmp_path}/models.py:ice", cache_dir=None)
    with caplog.at_level("INFO", logger="planner"):
        prepared = planner.prepare(f"{tmp_path}/models.py:frozen", cache_dir=None)
    assert prepared.info["frozen_params"] == 20 and prepared.info["num_params"] == 40
    assert "20 of its 40 parameters train (50%); the other 20 are frozen (requires_grad=False): " \
        "priced with their weights only" in caplog.text


def test_an_image_input_counts_one_token_per_sample(tmp_path, caplog):
    """dim 1 of [batch, channels, height, width] is channels, not tokens (a new-user check
    planned a ViT at 3 tokens per sample); a convolution's kernel, applied at every position of
    the image, counts once among the parameters that multiply each token (a new-user check read
    more of them than the model has), and a model without attention names no attention kernel
    (it read FlashAttention)."""
    from planner.report.summary import summary
    (tmp_path / "cnn.py").write_text(
        "import torch\n"
        "from torch import nn\n"
        "def build():\n"
        "    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10))\n"
        "    x = torch.randn(2, 3, 16, 16)\n"
        "    m(x)\n"
        "    return m, (x,)\n")
    with caplog.at_level("INFO", logger="planner"):
        plan = planner.plan(f"{tmp_path}/cnn.py:build", cluster="dgx-h100", nodes=1,
                            global_batch=16, cache_dir=None)
    assert plan.training["seq_len"] == 1 and "an image's shape" in caplog.text
    weights = 3 * 8 * 3 * 3 + 8 * 14 * 14 * 10  # biases multiply nothing
    assert plan.predicted["active_params_per_token"] == weights
    text = summary(plan)
    assert "15.9 K of the 15.9 K parameters multiply each image" in text  # (one token each)
    assert plan.model["no_attention"] is True and "Attention" not in text


def test_attention_written_by_hand_is_said_to_be_priced_fused(tmp_path, caplog):
    """A factory's own QK^T and softmax is priced as a fused kernel under the default engine:
    said, with the setting that prices it as written (a new-user check)."""
    (tmp_path / "attn.py").write_text(
        "import torch\n"
        "from torch import nn\n"
        "class Attn(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.q, self.k, self.v = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)\n"
        "    def forward(self, x):\n"
        "        q, k, v = (f(x).view(2, 16, 4, 8).transpose(1, 2) for f in (self.q, self.k,\n"
        "                                                                   self.v))\n"
        "        p = (q @ k.transpose(-1, -2)).softmax(-1)\n"
        "        return x + (p @ v).transpose(1, 2).reshape(2, 16, 32)\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.emb = nn.Embedding(64, 32)\n"
        "        self.layers = nn.ModuleList(Attn() for _ in range(2))\n"
        "        self.head = nn.Linear(32, 64)\n"
        "    def forward(self, ids):\n"
        "        x = self.emb(ids)\n"
        "        for layer in self.layers:\n"
        "            x = layer(x)\n"
        "        return self.head(x).float().logsumexp(-1).mean()\n"
        "def build():\n"
        "    return Net(), (torch.randint(0, 64, (2, 16)),)\n")
    with caplog.at_level("WARNING", logger="planner"):
        planner.plan(f"{tmp_path}/attn.py:build", cluster="dgx-h100", nodes=1, global_batch=8,
                     cache_dir=None)
    assert "computes attention with its own matmul and softmax" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="planner"):
        planner.plan(f"{tmp_path}/attn.py:build", cluster="dgx-h100", nodes=1, global_batch=8,
                     engine="attention=materialized", cache_dir=None)
    assert "own matmul" not in caplog.text


def test_a_config_planned_longer_than_its_positions_is_warned(tmp_path, caplog):
    """Rotary positions extend past max_position_embeddings (learned ones are refused): planned
    as asked, with a warning on every plan, the trace cached or not (a new-user check: 8,192
    tokens on a config of 4,096 passed silently)."""
    import json

    import planner

    config = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 256, "max_position_embeddings": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    cache = str(tmp_path / "cache")
    for _ in range(2):  # traced, then read from the trace cache
        caplog.clear()
        with caplog.at_level("WARNING", logger="planner"):
            prepared = planner.prepare(str(tmp_path / "config.json"), seq_len=256,
                                       cache_dir=cache)
        assert prepared.seq_len == 256
        assert "256 tokens per sequence, longer than the config's max_position_embeddings " \
               "(128)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="planner"):
        planner.prepare(str(tmp_path / "config.json"), seq_len=128, cache_dir=cache)
        planner.prepare("llama3-8b", seq_len=262144, cache_dir=None)  # the zoo: any length
    assert "max_position_embeddings" not in caplog.text


def test_target_megatron_refuses_a_model_of_two_layer_lists_as_its_export_would(tmp_path):
    """--target megatron keeps to plans its export takes: an encoder-decoder's two lists of
    layers are refused before the search (a new-user check got a plan, then the export's
    refusal)."""
    import json

    import planner

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "bart", "d_model": 32, "encoder_layers": 3, "decoder_layers": 3,
        "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64, "vocab_size": 128, "max_position_embeddings": 64}))
    with pytest.raises(planner.SpecError, match=r"target: megatron trains one transformer stack, "
                                                r"and .* has 2 lists of layers \(.*encoder.layers"):
        planner.plan(str(tmp_path / "config.json"), cluster="dgx-h100", nodes=1, global_batch=8,
                     seq_len=32, target="megatron", cache_dir=None)
    assert planner.plan(str(tmp_path / "config.json"), cluster="dgx-h100", nodes=1,
                        global_batch=8, seq_len=32, target="torchtitan", cache_dir=None)



def test_target_megatron_refuses_an_image_model_and_the_engines_line_agrees(tmp_path):
    """A new-user check: --target megatron planned a ViT that its export then refused, and the
    engines line of a --target any plan named megatron among the engines that run it."""
    from planner.report.summary import engine_fit

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "vit", "architectures": ["ViTForImageClassification"], "hidden_size": 32,
        "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 64,
        "image_size": 32, "patch_size": 8, "num_channels": 3, "num_labels": 10}))
    kw = dict(cluster="dgx-h100", nodes=1, global_batch=8, cache_dir=None)
    with pytest.raises(SpecError, match=r"^target: megatron trains token sequences "
                                        r"\(pretrain_gpt.py's layout\), and .* is an image "
                                        r"model; plan with --target torchtitan, deepspeed or any$"):
        planner.plan(str(tmp_path / "config.json"), target="megatron", **kw)
    vit = planner.plan(str(tmp_path / "config.json"), fix="pp=2", **kw)
    runs, refused = engine_fit(vit)
    assert not any(r.startswith("megatron") for r in runs)
    assert "megatron (image model)" in refused
    # priced with Megatron-Core's fused kernels (the default), which no engine running it has:
    # the line says so and names the engines that price plain code (a review); not when asked
    from planner.report.summary import summary
    said = " ".join(summary(vit).split())
    assert "its step is priced with Megatron-Core's fused kernels (the default --engine)" in said
    eager = planner.plan(str(tmp_path / "config.json"), fix="pp=2", engine="torch", **kw)
    assert "Megatron-Core's fused kernels" not in " ".join(summary(eager).split())

def test_a_config_missing_its_dimensions_is_warned_about(tmp_path, caplog):
    """A new-user check planned a T5 config without d_model and vocab_size at transformers'
    defaults (a model of another size) without a word."""
    (tmp_path / "t5.json").write_text(json.dumps(
        {"model_type": "t5", "num_layers": 1, "d_ff": 64, "d_kv": 8, "num_heads": 2,
         "decoder_start_token_id": 0, "pad_token_id": 0}))
    with caplog.at_level("WARNING", logger="planner"):
        planner.prepare(str(tmp_path / "t5.json"), seq_len=16, cache_dir=None)
    assert "its config gives no d_model, vocab_size; transformers' defaults for the model type " \
        "are used (d_model=512, vocab_size=32,128)" in caplog.text
    # a size the config class derives from another key the file gives is not a default (a
    # review: BLOOM's hidden_size from n_embed)
    from transformers import AutoConfig
    from planner.trace.hf import defaulted_dimensions
    raw = {"n_embed": 128, "n_layer": 2, "num_attention_heads": 4, "vocab_size": 128}
    assert defaulted_dimensions(raw, AutoConfig.for_model("bloom", **raw)) == {}


def test_the_torch_target_plans_what_plan_run_runs_of_an_encoder_decoder(tmp_path):
    """A new-user check: --target torch planned cp=2 for a T5, which plan run refuses, and chose
    zb-h1, whose weight pass the runtime runs inside B for the stage embedding the decoder's
    ids (no bubble filled); pins of either are refused, the search keeps cp at 1 without zb-h1."""
    (tmp_path / "t5.json").write_text(json.dumps(
        {"model_type": "t5", "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 3,
         "num_heads": 4, "vocab_size": 128, "decoder_start_token_id": 0, "pad_token_id": 0}))
    prepared = planner.prepare(str(tmp_path / "t5.json"), seq_len=16, dtype="fp32",
                               cache_dir=None)
    cluster = planner.load_cluster("cpu", nodes=1, gpus_per_node=2)
    training = planner.TrainingSpec(global_batch=8, seq_len=16, dtype="fp32")
    for pin, words in (({"cp": 2}, "fix.cp: plan run runs context parallelism on decoder-only"),
                       ({"schedule": "zb-h1", "pp": 2}, "fix.schedule: plan run computes an "
                                                        "encoder-decoder's weight gradients")):
        with pytest.raises(SpecError, match=words):
            planner.plan_prepared(prepared, cluster, training,
                                  planner.SearchOptions(fix=pin, target="torch"))
    plan = planner.plan_prepared(prepared, cluster, training,
                                 planner.SearchOptions(fix={"pp": 2}, target="torch"))
    assert plan.parallel["cp"] == 1 and plan.parallel["schedule"] != "zb-h1"
    assert planner.plan_prepared(prepared, cluster, training, planner.SearchOptions(
        fix={"cp": 2}, target="any")).parallel["cp"] == 2


def test_arguments_the_api_cannot_use_are_refused_naming_them(tiny_llama_config, tiny_llama):
    """Example inputs beside a named model (a zoo name or config builds its own), an unknown
    tracer and a progress that is not callable: SpecError naming the argument (a new-user check
    saw the inputs dropped silently, a TraceError and a bare TypeError from inside the search)."""
    import torch

    with pytest.raises(SpecError, match=r"^example_inputs: given with the model .* nn\.Module "
                                        r"only: drop them"):
        planner.prepare(tiny_llama_config, example_inputs=(torch.zeros(2, 16, dtype=torch.long),),
                        cache_dir=None)
    with pytest.raises(SpecError, match=r"^trace_method: unknown method 'jit'; choose auto, fx, "
                                        r"export"):
        planner.prepare(tiny_llama_config, trace_method="jit", cache_dir=None)
    training = planner.TrainingSpec(global_batch=8, seq_len=tiny_llama.seq_len)
    with pytest.raises(SpecError, match=r"^progress: expected a callable taking \(done, total\)"):
        planner.plan_prepared(tiny_llama, planner.load_cluster("dgx-h100", nodes=1), training,
                              planner.SearchOptions(), progress=5)
    # (the degrees every rule takes: the tiny Llama's heads split in 2 at most)
    with pytest.raises(SpecError, match=r"^fix\.tp: 16 is more than the cluster's 8 GPUs; use "
                                        r"one of 1, 2$"):
        planner.plan_prepared(tiny_llama, planner.load_cluster("dgx-h100", nodes=1), training,
                              planner.SearchOptions(fix={"tp": 16}))


TINY_DEEPSEEK = {"model_type": "deepseek_v3", "num_hidden_layers": 2, "hidden_size": 64,
                 "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 32,
                 "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                 "v_head_dim": 16, "first_k_dense_replace": 1, "intermediate_size": 128,
                 "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
                 "moe_intermediate_size": 32, "n_shared_experts": 1, "vocab_size": 128,
                 "max_position_embeddings": 64}


@pytest.mark.parametrize("layers", [0, 1])
def test_multi_token_prediction_layers_a_config_declares_are_priced_and_said(tmp_path, caplog,
                                                                              layers):
    """DeepSeek-V3's config.json declares one MTP depth, which the model transformers builds
    never runs in training: the planner builds it (planner.trace.mtp) and says so."""
    (tmp_path / "config.json").write_text(json.dumps(
        {**TINY_DEEPSEEK, "num_nextn_predict_layers": layers}))
    with caplog.at_level("INFO", logger="planner"):
        prepared = planner.prepare(str(tmp_path / "config.json"), seq_len=16, cache_dir=None)
    assert "mtp_layers_left_out" not in prepared.info
    if layers:
        assert prepared.info["mtp_depths"] == 1
        assert "its 1 multi-token-prediction depth is priced as Megatron-LM trains them " \
            "(--mtp-num-layers 1)" in caplog.text
    else:
        assert "mtp_depths" not in prepared.info and "multi-token-prediction" not in caplog.text


def test_multi_token_prediction_layers_of_other_models_are_named_as_left_out(tmp_path, caplog):
    """A model type whose MTP form the planner does not build (Qwen3-Next's, say) keeps them
    out of the price, with a warning: here a Llama config that declares one."""
    raw = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 64}
    (tmp_path / "config.json").write_text(json.dumps({**raw, "num_nextn_predict_layers": 1}))
    (tmp_path / "bare.json").write_text(json.dumps(raw))
    with caplog.at_level("WARNING", logger="planner"):
        prepared = planner.prepare(str(tmp_path / "config.json"), seq_len=16, cache_dir=None)
    assert prepared.info["mtp_layers_left_out"] == {"num_nextn_predict_layers": 1}
    assert "its config declares 1 multi-token-prediction layer (num_nextn_predict_layers), " \
        "which the model transformers builds does not run in training" in caplog.text
    # what the warning says: the key changes nothing the trace sees
    bare = planner.prepare(str(tmp_path / "bare.json"), seq_len=16, cache_dir=None)
    assert prepared.info["num_params"] == bare.info["num_params"]


def test_an_unknown_model_type_is_answered_with_the_type_its_architectures_name(tmp_path):
    """A new-user check gave Kimi K2's config.json (model_type kimi_k2, hub code built as
    DeepseekV3ForCausalLM): the error listed transformers' known types cut mid-word, no way on."""
    raw = {**TINY_DEEPSEEK, "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(SpecError, match=r"model_type 'kimi_k2' is not a transformers model type; "
                                        r"its architectures name DeepseekV3ForCausalLM, a "
                                        r"transformers class of model type 'deepseek_v3': set "
                                        r"\"model_type\": \"deepseek_v3\""):
        planner.prepare(str(tmp_path / "config.json"), seq_len=16, cache_dir=None)
    (tmp_path / "config.json").write_text(json.dumps({**raw, "architectures": ["KimiK2Model"]}))
    with pytest.raises(SpecError, match=r"is not a transformers model type; give the model_type "
                                        r"of a transformers model"):
        planner.prepare(str(tmp_path / "config.json"), seq_len=16, cache_dir=None)
    # what the error advises plans it
    (tmp_path / "config.json").write_text(json.dumps({**raw, "model_type": "deepseek_v3"}))
    assert planner.prepare(str(tmp_path / "config.json"), seq_len=16, cache_dir=None)


@pytest.mark.parametrize("change, words", [
    ({"num_experts_per_tok": 9}, r"config\.json\.num_experts_per_tok: 9 experts per token, more "
                                 r"than the 8 routed experts \(num_local_experts\)"),
    ({"num_attention_heads": 6, "num_key_value_heads": 4},
     r"config\.json\.num_key_value_heads: 4 key/value heads do not divide the 6 attention heads")])
def test_counts_that_cannot_go_together_are_named_before_the_trace(tmp_path, change, words):
    """A new-user check set more experts per token than experts, and heads that the key/value
    heads do not divide: the trace failed with the kernel's words ("k not in range") and advice
    to make the forward traceable."""
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 48,
         "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 128, "num_local_experts": 8, "num_experts_per_tok": 2, **change}))
    with pytest.raises(SpecError, match=words):
        planner.prepare(str(tmp_path / "config.json"), seq_len=16, cache_dir=None)


def test_a_checkpoint_quantization_is_said_and_the_training_dtype_kept(tmp_path, caplog):
    """DeepSeek-V3's config.json carries quantization_config (fp8 weights in 128 x 128 blocks):
    the checkpoint's storage, not the training precision; a new-user check found it ignored
    without a word."""
    (tmp_path / "config.json").write_text(json.dumps(
        {**TINY_DEEPSEEK, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                                  "weight_block_size": [128, 128]}}))
    with caplog.at_level("INFO", logger="planner"):
        prepared = planner.prepare(str(tmp_path / "config.json"), seq_len=16, cache_dir=None)
    assert prepared.info["checkpoint_quantization"] == "fp8, weight blocks 128x128"
    assert "quantization_config (fp8, weight blocks 128x128) says how the checkpoint is " \
        "stored; training is planned in bf16" in caplog.text


def test_wrong_objects_get_one_line_naming_the_argument(tiny_llama_config):
    """A second new-user check of the API passed the wrong object to each argument: a traceback
    from deep in the search (plan_prepared), a KeyError (prepare's dtype), a 96,000-character
    repr (a Prepared model given as the model) or a misnamed cause (an engine list, a whatif
    dtype) came back."""
    import numpy as np

    prep = planner.prepare(tiny_llama_config, seq_len=128)
    training = planner.TrainingSpec(global_batch=8, seq_len=128)
    with pytest.raises(SpecError, match="dtype: unknown dtype 'bfloat16'; use one of bf16"):
        planner.prepare(tiny_llama_config, dtype="bfloat16")
    with pytest.raises(SpecError, match="two-tower is a recommendation model.*planner.plan$"):
        planner.prepare("two-tower")
    for args, said in (((training, "dgx-h100", training),
                        "prepared: expected what planner.prepare"),
                       ((prep, "dgx-h100", {"global_batch": 8}), "training: expected a planner."
                        r"TrainingSpec\(global_batch=..., seq_len=...\), got a dict"),
                       ((prep, "dgx-h100", training, {}), "options: expected a planner."
                        r"SearchOptions\(...\) or None, got a dict"),
                       ((prep, 8, training), "cluster: expected a preset name")):
        with pytest.raises(SpecError, match=said):
            planner.plan_prepared(*args)
    # a preset name for the cluster, options left out: as planner.plan takes them
    assert planner.plan_prepared(prep, "dgx-h100", training).step_time_s == pytest.approx(
        planner.plan_prepared(prep, planner.load_cluster("dgx-h100"), training,
                              planner.SearchOptions()).step_time_s)
    with pytest.raises(SpecError) as err:
        planner.plan(prep, cluster="dgx-h100", global_batch=8)
    assert "got a Prepared model (pass it to planner.plan_prepared" in str(err.value)
    assert len(str(err.value)) < 300
    with pytest.raises(SpecError, match="engine: expected a preset name.*got a list"):
        planner.plan(tiny_llama_config, cluster="dgx-h100", global_batch=8, seq_len=128,
                     engine=["torchtitan"])
    with pytest.raises(SpecError, match="dtype: unknown dtype 'bfloat16'"):
        planner.whatif(tiny_llama_config, vary={"nodes": [1]}, cluster="dgx-h100",
                       global_batch=8, seq_len=128, dtype="bfloat16")
    with pytest.raises(SpecError, match="vary: unknown key 'tensor_parallel'; did you mean tp"):
        planner.whatif(tiny_llama_config, vary={"tensor_parallel": [1, 2]}, cluster="dgx-h100",
                       global_batch=8, seq_len=128)
    for bad in ({"trace": "jit"}, {"cp_comms_latent": ("foo",)}):
        with pytest.raises(SpecError, match=f"{next(iter(bad))}: "):
            planner.SearchOptions(**bad)
    # numpy's integers (a sweep over np.arange) are counts like any other
    p = planner.plan(tiny_llama_config, cluster="dgx-h100", nodes=np.int64(1),
                     global_batch=np.int64(8), seq_len=np.int64(128), top_k=np.int64(0))
    assert p.training["global_batch"] == 8 and type(p.training["global_batch"]) is int
    rows = planner.whatif(tiny_llama_config, vary={"global_batch": np.arange(8, 17, 8)},
                          cluster="dgx-h100", seq_len=128, workers=1)
    assert [r["global_batch"] for r in rows] == [8, 16]


def test_a_plans_own_parallel_pins_its_configuration(tiny_llama_config):
    """A plan's parallel, less num_microbatches, given back as pins prices the same step (its
    cp_comm p2p at cp=1 was refused)."""
    p = planner.plan(tiny_llama_config, cluster="dgx-h100", global_batch=16, seq_len=128,
                     top_k=0)
    fix = {k: v for k, v in p.parallel.items() if k != "num_microbatches"}
    assert fix["cp"] == 1 and fix["cp_comm"] == "p2p"
    again = planner.plan(tiny_llama_config, cluster="dgx-h100", global_batch=16, seq_len=128,
                         top_k=0, fix=fix)
    assert again.parallel == p.parallel and again.step_time_s == p.step_time_s
    with pytest.raises(SpecError, match="fix.cp_comm: a2a exchanges keys and values"):
        planner.plan(tiny_llama_config, cluster="dgx-h100", global_batch=16, seq_len=128,
                     fix={"cp": 1, "cp_comm": "a2a"})


def test_a_factory_files_own_imports_are_in_its_trace_cache_key(tmp_path):
    """Editing a module the factory file imports from its folder, directly or through another
    of them, traces the model again, from the same Python session too (the cache kept the first
    version's trace; a review: a module between the two kept the old class)."""
    (tmp_path / "cachekey_defs.py").write_text(
        "from torch import nn\nWIDTH = 64\n\nclass Tiny(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.lin = nn.Linear(WIDTH, WIDTH)\n\n"
        "    def forward(self, x):\n        return self.lin(x)\n")
    (tmp_path / "cachekey_model.py").write_text("from cachekey_defs import Tiny, WIDTH\n")
    (tmp_path / "entry.py").write_text(
        "import torch\nfrom cachekey_model import Tiny, WIDTH\n\ndef build():\n"
        "    return Tiny(), (torch.zeros(2, WIDTH),)\n")
    cache = str(tmp_path / "cache")
    spec = f"{tmp_path}/entry.py:build"
    first = planner.prepare(spec, cache_dir=cache).info["num_params"]
    assert first == 64 * 64 + 64
    defs = tmp_path / "cachekey_defs.py"
    defs.write_text(defs.read_text().replace("64", "128"))
    assert planner.prepare(spec, cache_dir=cache).info["num_params"] == 128 * 128 + 128
    from planner.trace.cache import local_sources
    assert local_sources(f"{tmp_path}/entry.py")[1:] == [str(tmp_path / "cachekey_model.py"),
                                                         str(tmp_path / "cachekey_defs.py")]
    # and read so by a new process's cache too (the stored trace is the edited model's)
    from planner.trace import models
    models._IMPORTED.clear()
    assert planner.prepare(spec, cache_dir=cache).info["num_params"] == 128 * 128 + 128


def test_hints_for_a_dense_models_ep_and_a_tensor_on_another_device(tmp_path):
    """A new-user check: ep pinned on gpt2 read 300 characters about grouped GEMMs (a zoo model
    known dense: one line); a factory making its input with device='cpu' was told to make the
    forward traceable on meta tensors (the fix: drop device=)."""
    with pytest.raises(SpecError, match=r"^fix.ep: the model is dense \(no routed experts to "
                                        r"spread\); drop ep$"):
        planner.plan("gpt2", cluster="dgx-h100", global_batch=8, fix={"ep": 2})
    (tmp_path / "on_cpu.py").write_text(
        "import torch\nfrom torch import nn\n\ndef build():\n"
        "    return nn.Linear(64, 64), (torch.zeros(4, 64, device='cpu'),)\n")
    with pytest.raises(planner.TraceError, match="drop any fixed device="):
        planner.prepare(f"{tmp_path}/on_cpu.py:build", cache_dir=None)


def test_a_model_checkpointing_its_own_layers_is_said(tmp_path, caplog):
    """A new-user check: a model wrapping its blocks in torch.utils.checkpoint was planned as if
    it did not, silently; with use_reentrant=True the tracer saw no arithmetic at all and the
    plan broke an internal invariant."""
    (tmp_path / "own_ckpt.py").write_text(
        "import torch\nfrom torch import nn\nfrom torch.utils.checkpoint import checkpoint\n\n"
        "class M(nn.Module):\n    def __init__(self, reentrant):\n        super().__init__()\n"
        "        self.ls = nn.ModuleList(nn.Linear(64, 64) for _ in range(2))\n"
        "        self.reentrant = reentrant\n\n    def forward(self, x):\n"
        "        for layer in self.ls:\n"
        "            x = checkpoint(layer, x, use_reentrant=self.reentrant)\n"
        "        return x.sum()\n\n"
        "def plain():\n    return M(False), (torch.zeros(4, 64),)\n\n"
        "def reentrant():\n    return M(True), (torch.zeros(4, 64, requires_grad=True),)\n")
    with caplog.at_level(logging.WARNING, logger="planner"):
        p = planner.plan(f"{tmp_path}/own_ckpt.py:plain", cluster="dgx-h100", global_batch=8,
                         cache_dir=None)
    assert p.model["own_checkpoints"] == 2
    assert "its forward checkpoints its own layers (torch.utils.checkpoint)" in caplog.text
    with pytest.raises(planner.TraceError, match="does no arithmetic .*reentrant checkpointing"):
        planner.plan(f"{tmp_path}/own_ckpt.py:reentrant", cluster="dgx-h100", global_batch=8,
                     cache_dir=None)


def test_a_factory_model_longer_than_its_learned_positions_is_refused(tmp_path):
    """A new-user check planned a hand-written GPT at 4,096 tokens past its 1,024 learned
    positions (a real run fails on the lookup; the config path refused it); an embedding looked
    up by zeros (token types) is no position table."""
    (tmp_path / "pos.py").write_text(
        "import torch\nfrom torch import nn\n\nclass M(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.wte = nn.Embedding(100, 32)\n"
        "        self.wpe = nn.Embedding(64, 32)\n        self.tt = nn.Embedding(2, 32)\n"
        "        self.lin = nn.Linear(32, 100)\n\n    def forward(self, x):\n"
        "        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)\n"
        "        return self.lin(self.wte(x) + self.wpe(pos) + self.tt(torch.zeros_like(x)))\n\n"
        "def build(seq_len=64):\n    return M(), (torch.zeros(2, seq_len, dtype=torch.long),)\n")
    spec = f"{tmp_path}/pos.py:build"
    assert planner.prepare(spec, seq_len=64, cache_dir=None).seq_len == 64
    with pytest.raises(SpecError, match=r"^seq_len: 128 tokens exceed the 64 learned positions "
                                        r"of wpe \(an embedding looked up by position\)"):
        planner.prepare(spec, seq_len=128, cache_dir=None)


def test_cp_comm_takes_megatrons_spelling_of_the_all_gather_form():
    """The Megatron export writes --cp-comm-type all_gather; a user pinning what it read there
    gets that form, and a misspelling is still refused with the forms."""
    from planner.options import parse_fix
    assert parse_fix("cp=8,cp_comm=all_gather") == {"cp": 8, "cp_comm": "allgather"}
    with pytest.raises(planner.SpecError, match="fix.cp_comm: unknown form 'allgathr'; choose "
                                                "p2p, allgather, a2a, a2a\\+p2p"):
        parse_fix("cp=8,cp_comm=allgathr")
