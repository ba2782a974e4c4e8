"""Every part of the step has the knobs behind it (planner.report.compare.PART_KNOBS)."""

from planner.options import KNOBS
from planner.planfile.breakdown import BREAKDOWN_WORDS
from planner.report.compare import PART_KNOBS


def test_every_part_of_the_step_names_known_knobs():
    assert set(PART_KNOBS) == set(BREAKDOWN_WORDS)
    assert all(k in KNOBS for knobs in PART_KNOBS.values() for k in knobs)
