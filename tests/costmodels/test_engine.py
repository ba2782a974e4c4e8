"""Engine settings: presets of common stacks, overrides after a preset, and the words a plan shows."""

import pytest

from costmodels.engine import PRESETS, EngineSpec, describe, engine_from_mapping
from costmodels.errors import SpecError


def test_presets_expand_and_take_overrides():
    assert engine_from_mapping("megatron-core") == EngineSpec()  # the default is today's Megatron
    titan = engine_from_mapping("torchtitan")
    assert titan.kernels == "eager" and titan.fsdp_copies and titan.attention == "flash"
    old = engine_from_mapping("megatron-2021")
    assert old.attention == "materialized" and not old.overlap_grad_reduce
    mixed = engine_from_mapping("torchtitan,attention=materialized")
    assert mixed.attention == "materialized" and mixed.kernels == "eager"


def test_unknown_presets_and_keys_are_named():
    with pytest.raises(SpecError, match="unknown preset 'titan'"):
        engine_from_mapping("titan")
    with pytest.raises(SpecError, match="engine.kernel: unknown key"):
        engine_from_mapping("megatron-core,kernel=eager")


def test_a_plan_says_which_software_it_assumes():
    for name, kw in PRESETS.items():
        assert describe(EngineSpec(**kw)).endswith(f"(= --engine {name})")
    words = describe(engine_from_mapping("megatron-2021,overlap_grad_reduce=true"))
    assert "attention scores in memory" in words and "overlapped" in words and "=" not in words
