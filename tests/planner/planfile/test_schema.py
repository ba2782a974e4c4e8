"""The plan file's schema and the planner's lists of choices say the same thing."""

import json
from importlib import resources

import pytest

from planner.errors import SpecError
from planner.options import DTYPES, OPTIMIZERS, RECOMPUTE, ZERO_STAGES
from planner.planfile.document import clean
from planner.planfile.schema import schema, validate


def test_schema_enums_are_the_options_lists():
    text = resources.files("planner.planfile").joinpath("plan.v1.json").read_text()
    props = json.loads(text)["properties"]
    assert tuple(props["training"]["properties"]["dtype"]["enum"]) == DTYPES
    assert tuple(props["training"]["properties"]["optimizer"]["enum"]) == OPTIMIZERS
    assert tuple(props["parallel"]["properties"]["recompute"]["enum"]) == RECOMPUTE
    assert tuple(props["parallel"]["properties"]["zero"]["enum"]) == ZERO_STAGES
    assert schema()["properties"] == props


def test_wrong_schema_id_and_rounding():
    with pytest.raises(SpecError, match="schema is 'x'"):
        validate({"schema": "x"}, "p.json")
    assert clean({"a": 1.23456789, "b": [0.0, 3], "c": True}) == {"a": 1.23457, "b": [0.0, 3],
                                                                  "c": True}
