"""A factory's image model: given --seq-len, its tokens are the caller's count of patches, which
it cannot change (the length note says so instead of proposing a multiple of 256), and exports
that write token sequences refuse it (a new-user check)."""

import torch
from torch import nn

from planner.api import plan, prepare
from planner.report import compare
from planner.report.diff import diff
from planner.report.summary import summary
from planner.search.feasibility import length_note
from planner.search.space import SP_SEQ


class Patches(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, 16, 8, 8)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.patch(x).flatten(2).transpose(1, 2)).mean(1)


def test_an_image_factory_with_a_length_counts_its_patches():
    image = (torch.randn(2, 3, 32, 32),)
    counted = prepare(Patches(), example_inputs=image, seq_len=17, cache_dir=None).info
    assert counted.get("image_tokens") and "image_input" not in counted
    one = prepare(Patches(), example_inputs=image, cache_dir=None).info
    assert one.get("image_input") and not one.get("image_tokens")
    note = length_note(197, {SP_SEQ: 1}, counted["image_tokens"])
    assert "an image's 197 tokens" in note and "multiple of" not in note


def test_a_plan_of_one_token_per_image_speaks_of_images(tmp_path):
    """A convolutional network traced at one token per image: `plan show` said "256 x 1 token"
    and gave tokens/s beside samples/s (the same number) and FLOPs per token; it speaks of
    images. With a length (patches) it keeps tokens."""
    image = (torch.randn(2, 3, 32, 32),)
    kw = dict(cluster="dgx-h100", nodes=1, global_batch=16, cache_dir=None)
    one = plan(Patches(), example_inputs=image, **kw)
    text = " ".join(summary(one).split())
    assert "global batch 16 images," in text and "images/s," in text
    assert "tokens/s" not in text and "per image for MFU" in text and "per token" not in text
    # plan diff too: images/s, also where the batches differ
    more = plan(Patches(), example_inputs=image, **{**kw, "global_batch": 32})
    assert compare.headline(one, more).startswith("at ") and "the images/s" in \
        compare.headline(one, more)
    table = diff(one, more)
    assert "images/s" in table and "tokens/s" not in table
    patches = " ".join(summary(plan(Patches(), example_inputs=image, seq_len=17, **kw)).split())
    assert "global batch 16 x 17 tokens" in patches and "tokens/s" in patches
