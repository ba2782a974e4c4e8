"""Multi-token-prediction depths built onto DeepSeek-V3-style models (planner.trace.mtp): priced,
with the parameters and work of one more MoE layer, a projection and the head again."""

import json

import pytest
import torch

import planner
from planner.errors import SpecError
from planner.trace import hf, mtp
from tests.conftest import TINY_DEEPSEEK_V3, write_config


def _prepare(tmp_path, name: str, **changes):
    return planner.prepare(write_config(tmp_path / name, {**TINY_DEEPSEEK_V3, **changes}),
                           seq_len=32, cache_dir=None)


def test_an_mtp_depth_adds_one_moe_layer_a_projection_and_three_norms(tmp_path):
    """Counted apart: the model with one more layer (an MoE layer) has the depth's layer; the
    depth adds eh_proj (2h -> h) and enorm, hnorm and its head norm (h each); the embedding
    and the head are the main model's."""
    h = TINY_DEEPSEEK_V3["hidden_size"]
    with_mtp = _prepare(tmp_path, "mtp", num_nextn_predict_layers=1)
    deeper = _prepare(tmp_path, "deeper", num_hidden_layers=TINY_DEEPSEEK_V3["num_hidden_layers"]
                      + 1)  # (no num_nextn_predict_layers key: no depth, as declared)
    assert with_mtp.info["mtp_depths"] == 1 and "mtp_layers_left_out" not in with_mtp.info
    assert with_mtp.info["num_params"] == deeper.info["num_params"] + 2 * h * h + 3 * h


def test_the_depth_is_a_block_between_the_last_layer_and_the_head(tmp_path):
    """As Megatron-Core orders them (m before L): the depth, with the final norm before it, is a
    block of its own holding its routed experts (about a layer and the projection more work);
    the head's block then runs the head twice (the model's and the depth's) and the losses. The
    blocks stay a chain, the two hidden states cross from the depth to the head, and the
    embedding is shared with the depth's block (a tied weight)."""
    bare = _prepare(tmp_path, "bare")
    with_mtp = _prepare(tmp_path, "mtp", num_nextn_predict_layers=1)
    b, m = bare.blocks, with_mtp.blocks
    assert [x.name for x in b.blocks][-1] == "model.norm..lm_head"
    assert [x.name for x in m.blocks] == [x.name for x in b.blocks][:-1] + [
        "model.norm..mtp.0", "lm_head"] and m.is_chain()
    layer, head = b.blocks[-2].work, b.blocks[-1].work
    depth, heads = m.blocks[-2].work, m.blocks[-1].work
    assert head.num_experts == 0 and heads.num_experts == 0
    assert depth.num_experts == layer.num_experts
    assert depth.fwd_flops > layer.fwd_flops * 0.9
    assert heads.fwd_flops == pytest.approx(2 * head.fwd_flops, rel=0.1)
    crossing = [e for e in m.edges if e.src == "model.norm..mtp.0" and e.dst == "lm_head"]
    assert len(crossing) == 2 and crossing[0].nbytes == crossing[1].nbytes
    assert any(s[0] == "model.embed_tokens" and s[1] == "model.norm..mtp.0" for s in m.shared)
    assert not b.shared


def test_the_depths_loss_trains_its_weights_and_the_shared_embedding():
    """On real weights (CPU): the loss with the depth is the main model's plus a tenth of the
    depth's cross entropy, whose gradient reaches the projection, the depth's experts and the
    embedding's rows of the tokens one ahead."""
    import transformers  # noqa: PLC0415  (transformers takes seconds; the trace tests load it)

    config = transformers.DeepseekV3Config(**{k: v for k, v in TINY_DEEPSEEK_V3.items()
                                              if k != "model_type"}, num_nextn_predict_layers=1)
    torch.manual_seed(0)
    built = hf.build(config, "DeepseekV3ForCausalLM", 16, torch.float32, "cpu", 1)
    model = built.module
    assert mtp.has_mtp(model) and len(model.mtp) == 1
    ids = torch.randint(0, config.vocab_size, (2, 16))
    out = model(ids, labels=ids)
    main = type(model).forward(model, ids, labels=ids).loss  # the class's own: no depth
    assert out.loss.item() > main.item()  # a tenth of a positive cross entropy more
    out.loss.backward()
    depth = model.mtp[0]
    assert depth.eh_proj.weight.grad.abs().sum() > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0
               for n, p in depth.layer.named_parameters() if "experts" in n)


def test_other_model_types_keep_their_declared_mtp_layers_left_out():
    """Only the DeepSeek-V3 form is built (MTP_MODEL_TYPES): another model is left as it is."""
    import transformers  # noqa: PLC0415

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, vocab_size=64)
    config.num_nextn_predict_layers = 1
    module = transformers.LlamaForCausalLM(config)
    assert mtp.build(module, 1) == 0 and not mtp.has_mtp(module)


def test_plan_run_refuses_a_model_with_mtp_depths(tmp_path):
    """The runtime trains on logits with its own loss: the depths' loss would be lost."""
    from planner.runtime.model import check_runnable  # noqa: PLC0415
    from planner.trace.models import resolve  # noqa: PLC0415

    path = write_config(tmp_path / "m", {**TINY_DEEPSEEK_V3, "num_nextn_predict_layers": 1})
    with pytest.raises(SpecError, match=r"multi-token-prediction depth\(s\).*"
                                        r"num_nextn_predict_layers: 0"):
        check_runnable(resolve(path, seq_len=16, dtype="fp32"))


def test_the_zoo_has_deepseek_v3_with_and_without_its_mtp_depth():
    from planner.inputs.zoo import ZOO  # noqa: PLC0415

    assert ZOO["deepseek-v3"].config["num_nextn_predict_layers"] == 0
    assert ZOO["deepseek-v3-mtp"].config["num_nextn_predict_layers"] == 1
    same = {**ZOO["deepseek-v3"].config, "num_nextn_predict_layers": 1}
    assert json.dumps(same, sort_keys=True) == json.dumps(ZOO["deepseek-v3-mtp"].config,
                                                          sort_keys=True)
