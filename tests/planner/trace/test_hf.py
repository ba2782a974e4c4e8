"""Hugging Face configs as planner.trace.hf reads them: the sequence their learned positions take
(RoBERTa's start after the padding token's; CLIP's sit in its text_config), the dimensions a
config leaves to transformers' defaults, and the inputs of a vision encoder-decoder."""

import json
import logging

import pytest

import planner
from planner.errors import SpecError
from planner.inputs.zoo import learned_positions
from planner.search.feasibility import length_note
from planner.search.space import SP_SEQ

TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            vocab_size=128)


def _config(tmp_path, cfg: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_roberta_style_positions_start_after_the_padding_tokens_row():
    """RoBERTa's 514 rows hold 512 tokens: its first token's position is pad_token_id + 1."""
    assert learned_positions({"model_type": "roberta", "max_position_embeddings": 514,
                              "pad_token_id": 1}) == 512
    assert learned_positions({"model_type": "xlm-roberta", "max_position_embeddings": 514,
                              "pad_token_id": 1}) == 512
    assert learned_positions({"model_type": "roberta", "max_position_embeddings": 34,
                              "pad_token_id": 3}) == 30
    # BERT's positions start at 0; ESM-1b's table is learned (1026 rows, 1024 tokens), ESM-2's
    # positions are rotary; MPNet adds relative buckets to learned positions
    assert learned_positions({"model_type": "bert", "max_position_embeddings": 512}) == 512
    assert learned_positions({"model_type": "esm", "max_position_embeddings": 1026,
                              "pad_token_id": 1, "position_embedding_type": "absolute"}) == 1024
    assert learned_positions({"model_type": "esm", "max_position_embeddings": 1026,
                              "pad_token_id": 1, "position_embedding_type": "rotary"}) is None
    assert learned_positions({"model_type": "mpnet", "max_position_embeddings": 514,
                              "pad_token_id": 1, "relative_attention_num_buckets": 32}) == 512



def test_an_encoder_decoders_limit_is_the_least_of_its_text_models():
    """A review: a TrOCR decoder's 512 learned positions went unchecked, and a text
    encoder-decoder (BERT's 512 and GPT-2's 1,024) was given the decoder's alone; both its
    halves read the planned length. A vision encoder reads none."""
    assert learned_positions({"model_type": "trocr", "max_position_embeddings": 512}) == 512
    assert learned_positions({"model_type": "trocr", "max_position_embeddings": 512,
                              "use_learned_position_embeddings": False}) is None
    bert = {"model_type": "bert", "max_position_embeddings": 512}
    gpt2 = {"model_type": "gpt2", "n_positions": 1024}
    assert learned_positions({"model_type": "encoder-decoder", "encoder": bert,
                              "decoder": gpt2}) == 512
    assert learned_positions({"model_type": "vision-encoder-decoder",
                              "encoder": {"model_type": "vit"}, "decoder": gpt2}) == 1024

def test_a_roberta_config_plans_the_tokens_its_positions_take_and_refuses_more(tmp_path):
    """A new-user check: a RoBERTa config was planned at max_position_embeddings tokens, and
    ``plan run`` then failed on the position lookup (index 34 out of bounds for size 34)."""
    path = _config(tmp_path, {"model_type": "roberta", "architectures": ["RobertaForMaskedLM"],
                              **TEXT, "max_position_embeddings": 34, "pad_token_id": 1,
                              "type_vocab_size": 1})
    prepared = planner.prepare(path, cache_dir=None)
    assert prepared.seq_len == 32
    assert prepared.info["learned_positions"] == 32
    with pytest.raises(SpecError, match=r"^seq_len: 34 exceeds roberta's learned positions "
                                        r"\(32: max_position_embeddings 34 less 2, as its "
                                        r"positions start after pad_token_id 1\); use --seq-len "
                                        r"32 or less$"):
        planner.prepare(path, seq_len=34, cache_dir=None)


CLIP = {"model_type": "clip", "architectures": ["CLIPModel"], "projection_dim": 32,
        "text_config": {**TEXT, "max_position_embeddings": 77},
        "vision_config": {**TEXT, "image_size": 32, "patch_size": 8}}


def test_a_dual_towers_text_positions_are_checked_before_the_trace(tmp_path):
    """A new-user check: CLIP at --seq-len 256 past its text tower's 77 positions failed in the
    trace, with advice to make the forward traceable; BART's limit was named before it."""
    path = _config(tmp_path, CLIP)
    with pytest.raises(SpecError, match=r"^seq_len: 256 exceeds clip's learned positions "
                                        r"\(77\); use --seq-len 77 or less$"):
        planner.prepare(path, seq_len=256, cache_dir=None)
    prepared = planner.prepare(path, cache_dir=None)
    assert prepared.seq_len == 77 and prepared.info["learned_positions"] == 77


def test_the_length_hint_offers_no_length_past_the_learned_positions():
    """The hint offered CLIP 256 tokens (a multiple that splits over tp), which it cannot take."""
    assert length_note(77, {SP_SEQ: 1}, positions=77).endswith(
        "no multiple of 256 (which splits over tp up to 8 with cp up to 16) fits the model's 77 "
        "learned positions")
    assert length_note(300, {SP_SEQ: 1}, positions=300).endswith("a multiple of 256 (256) "
                                                                  "splits over tp up to 8 with "
                                                                  "cp up to 16")
    assert length_note(300, {SP_SEQ: 1}).endswith("(256) splits over tp up to 8 with cp up to 16")
    assert length_note(400, {SP_SEQ: 1}, positions=600).endswith("(512) splits over tp up to 8 "
                                                                  "with cp up to 16")


@pytest.mark.parametrize("config,said", [
    ({"model_type": "swin", "architectures": ["SwinForImageClassification"], "image_size": 224,
      "patch_size": 4, "embed_dim": 96, "depths": [1, 1, 1, 1], "num_heads": [2, 2, 2, 2],
      "window_size": 7, "num_labels": 10}, "num_layers"),
    ({"model_type": "convnext", "architectures": ["ConvNextForImageClassification"],
      "image_size": 32, "hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1],
      "num_labels": 10}, "num_stages")])
def test_a_count_the_config_gives_by_its_list_of_stages_is_not_called_a_default(
        config, said, tmp_path, caplog):
    """A new-user check: Swin and ConvNeXt configs with four depths were warned that they give
    no num_layers (num_stages) and that the default, 4, is used. Swin derives it (and
    hidden_size, from embed_dim 96, here equal to the default's 768) from the keys given."""
    from transformers import AutoConfig

    from planner.trace.hf import defaulted_dimensions
    raw = {k: v for k, v in config.items() if k != "model_type"}
    cfg = AutoConfig.for_model(config["model_type"], **raw)
    assert defaulted_dimensions(raw, cfg) == {}
    with caplog.at_level(logging.WARNING, logger="planner"):
        planner.prepare(_config(tmp_path, config), cache_dir=None)
    assert "gives no" not in caplog.text and said not in caplog.text


def test_a_stage_count_its_lists_disagree_with_is_still_called_a_default():
    """ConvNeXt builds num_stages' default of 4 stages whatever its depths hold: five depths
    without num_stages are a model of another size."""
    from transformers import AutoConfig

    from planner.trace.hf import defaulted_dimensions
    five = {"depths": [1, 1, 1, 1, 1], "hidden_sizes": [8, 16, 32, 64, 64]}
    assert defaulted_dimensions(five, AutoConfig.for_model("convnext", **five)) == {
        "num_stages": 4}


VISION_ENCODER_DECODER = {
    "model_type": "vision-encoder-decoder", "architectures": ["VisionEncoderDecoderModel"],
    "encoder": {"model_type": "vit", **TEXT, "image_size": 32, "patch_size": 8},
    "decoder": {"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 2,
                "vocab_size": 128, "n_positions": 48, "add_cross_attention": True,
                "is_decoder": True, "bos_token_id": 0, "eos_token_id": 0},
    "decoder_start_token_id": 0, "pad_token_id": 0}


def test_a_vision_encoder_decoder_reads_pixels_and_its_decoders_tokens(tmp_path):
    """A new-user check: a ViT encoder with a GPT-2 decoder was fed a class label and failed in
    the trace (IndexError in shift_tokens_right), blamed on the model."""
    path = _config(tmp_path, VISION_ENCODER_DECODER)
    prepared = planner.prepare(path, cache_dir=None)
    assert prepared.seq_len == 48  # the decoder's learned positions
    assert prepared.info["encoder_tokens"] == 16 + 1  # 4 x 4 patches and the class token
    assert "image_tokens" not in prepared.info
    with pytest.raises(SpecError, match=r"^seq_len: 64 exceeds vision-encoder-decoder's learned "
                                        r"positions \(48\)"):
        planner.prepare(path, seq_len=64, cache_dir=None)
    # without architectures: the composite's own class (no auto class maps it)
    bare = {k: v for k, v in VISION_ENCODER_DECODER.items() if k != "architectures"}
    assert planner.prepare(_config(tmp_path, bare), seq_len=16, cache_dir=None).seq_len == 16


def test_a_roberta_module_is_checked_against_its_learned_positions():
    """A review: a RoBERTa given as a module (or built by a factory) at 514 tokens was planned,
    and a real forward failed; its position ids are a cumulative sum, which the trace does not
    see as a lookup by position, so its config says the limit."""
    import torch
    from transformers import RobertaConfig, RobertaForMaskedLM

    cfg = RobertaConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=34)
    with torch.device("meta"):
        model = RobertaForMaskedLM(cfg)
    with pytest.raises(SpecError, match=r"^seq_len: 33 exceeds .*'s learned positions \(32: "
                                        r"max_position_embeddings 34 less 2"):
        planner.prepare(model, example_inputs=(torch.randint(3, 128, (1, 33)),), cache_dir=None)
    assert planner.prepare(model, example_inputs=(torch.randint(3, 128, (1, 32)),),
                           cache_dir=None).seq_len == 32
