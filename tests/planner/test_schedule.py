"""Per-rank action lists: every forward before its backward, counts, the torch notation."""

import pytest

from planner.errors import SpecError
from planner.schedule import build, parse_action


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(1, 1), (2, 4), (4, 4), (4, 2), (8, 16)])
def test_each_rank_runs_every_microbatch_forward_then_backward(name, p, m):
    ranks = build(name, p, m)
    assert len(ranks) == p
    for s, acts in enumerate(ranks):
        parsed = [parse_action(a) for a in acts]
        assert all(stage == s for stage, _, _ in parsed)
        assert sorted(mb for _, k, mb in parsed if k == "F") == list(range(m))
        assert sorted(mb for _, k, mb in parsed if k == "B") == list(range(m))
        pos = {(k, mb): i for i, (_, k, mb) in enumerate(parsed)}
        assert all(pos[("F", i)] < pos[("B", i)] for i in range(m))


def test_1f1b_keeps_at_most_p_minus_s_in_flight():
    for s, acts in enumerate(build("1f1b", 4, 8)):
        live = peak = 0
        for a in acts:
            live += 1 if "F" in a else -1
            peak = max(peak, live)
        assert peak == 4 - s


def test_bad_action_text():
    assert parse_action("12B3") == (12, "B", 3)
    with pytest.raises(SpecError, match="not an action"):
        parse_action("F3")
