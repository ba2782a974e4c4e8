"""What reading and tracing a model found that the user should hear of, said once it is prepared
(planner.api.prepare): ops no formula prices, a sequence length that does not apply, positions
beyond the config's, dimensions left to transformers' defaults, a checkpoint's quantization,
multi-token-prediction layers left out, frozen parameters."""

from __future__ import annotations

import logging

from planner.trace.graph import FROZEN_PRICING, frozen_words, unpriced_words
from planner.units import counted

log = logging.getLogger("planner.api")  # the API's lines, which a sweep holds back together


def say(prepared, seq_len: int | None) -> None:
    """Log what ``prepared`` (a planner.traced.Prepared) found; ``seq_len``: the length asked
    for."""
    if prepared.info.get("own_checkpoints"):
        log.warning("%s: its forward checkpoints its own layers (torch.utils.checkpoint): "
                    "priced as if it did not, its activations kept and nothing run again, while "
                    "the plan's recompute adds the planner's own; turn the model's off to train "
                    "as planned (or read its memory as an upper bound and its step as a lower "
                    "one)", prepared.info["name"])
    unpriced = prepared.info.get("unpriced_ops")
    if unpriced:
        log.warning("%s: %d kind(s) of op no formula prices, costed by their bytes only: %s",
                    prepared.info["name"], len(unpriced), unpriced_words(unpriced))
    if seq_len is not None and prepared.seq_len != seq_len:  # an image model: its patches
        log.warning("%s: --seq-len %d does not apply; a sample is %s (an image's patches and "
                    "the tokens its model prepends, from image_size and patch_size in the "
                    "config; one for an image model without patches)", prepared.info["name"],
                    seq_len, counted(prepared.seq_len, "token"))
    if prepared.info.get("image_input"):
        log.info("%s: its first input is %s, an image's shape: the plan counts one token per "
                 "sample (a model that cuts the image into patches: give seq_len to count them, "
                 "and any tokens it prepends)", prepared.info["name"],
                 prepared.info["image_input"])
    if prepared.info.get("features_input"):
        log.info("%s: its first input is %s, [batch, features]: the plan counts one token per "
                 "sample (a sequence along dim 1: give seq_len to count its tokens)",
                 prepared.info["name"], prepared.info["features_input"])
    positions = prepared.info.get("max_position_embeddings")
    if positions:
        log.warning("%s: %s tokens per sequence, longer than the config's max_position_embeddings "
                    "(%s): planned as asked (training from scratch, set max_position_embeddings "
                    "to the length; a checkpoint trained at %s needs its positions extended, "
                    "RoPE scaling for rotary ones, for longer sequences)", prepared.info["name"],
                    f"{prepared.seq_len:,}",
                    f"{positions:,}", f"{positions:,}")
    defaulted = prepared.info.get("defaulted")
    if defaulted:
        log.warning("%s: its config gives no %s; transformers' defaults for the model type are "
                    "used (%s): add them to the config if the model has other sizes",
                    prepared.info["name"], ", ".join(defaulted),
                    ", ".join(f"{k}={v:,}" for k, v in defaulted.items()))
    stored = prepared.info.get("checkpoint_quantization")
    if stored:
        log.info("%s: its config's quantization_config (%s) says how the checkpoint is stored; "
                 "training is planned in %s (--dtype fp8 prices FP8 GEMMs)",
                 prepared.info["name"], stored, prepared.dtype)
    mtp = prepared.info.get("mtp_layers_left_out")
    if mtp:
        (key, layers), = mtp.items()
        log.warning("%s: its config declares %d multi-token-prediction layer%s (%s), which the "
                    "model transformers builds does not run in training: the plan prices the "
                    "main model only (each MTP depth adds a decoder layer, a projection and an "
                    "output-head pass to the last stage; Megatron-LM trains them with "
                    "--mtp-num-layers)", prepared.info["name"], layers, "" if layers == 1 else "s",
                    key)
    depths = prepared.info.get("mtp_depths")
    if depths:
        log.info("%s: its %d multi-token-prediction depth%s priced as Megatron-LM trains them "
                 "(--mtp-num-layers %d): a decoder layer, a projection and an output-head pass "
                 "each, with the head on the last stage; num_nextn_predict_layers: 0 in the "
                 "config plans the main model alone", prepared.info["name"], depths,
                 " is" if depths == 1 else "s are", depths)
    whole = prepared.info.get("tp_whole_attention")
    if whole:
        log.warning("%s: tensor parallelism would leave the attention of %s whole on every "
                    "rank (%s%s): no pair of Linears around it splits by heads, as a learned "
                    "position bias shared by the layers (T5's, Swin's) or packed projections "
                    "(nn.MultiheadAttention's) keep it apart; priced so, which weighs against tp",
                    prepared.info["name"], counted(len(whole), "module"), whole[0],
                    f" and {len(whole) - 1} more" if len(whole) > 1 else "")
    frozen = prepared.info.get("frozen_params")
    if frozen:
        log.info("%s: %s: %s", prepared.info["name"],
                 frozen_words(frozen, prepared.info["num_params"]), FROZEN_PRICING)
