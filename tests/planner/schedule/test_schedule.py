"""Per-rank action lists: every schedule valid, the torch notation, grids that round-trip, and
validation errors that show the grid with the failing step marked."""

import pytest

from planner.errors import SpecError
from planner.schedule import Action, Shape, as_actions, as_text, torch_actions
from planner.schedule.builders import BUILDERS, shape_of
from planner.schedule.builders import build as build_actions
from planner.schedule.grid import format_grid, parse_grid, validate


def build(*args, **kw) -> list[list[str]]:
    """A schedule in the text form plan files hold (most checks here read that form)."""
    return as_text(build_actions(*args, **kw))

SIZES = [(1, 1), (1, 3), (2, 1), (2, 4), (3, 5), (4, 2), (4, 4), (4, 8), (8, 16)]


def vpp_for(name):
    return 2 if name == "interleaved-1f1b" else 1


def check(name, p, m, actions):
    validate(actions, stages=p, microbatches=m, vpp=vpp_for(name),
             bidirectional=name == "bidirectional")


@pytest.mark.parametrize("name", sorted(BUILDERS))
@pytest.mark.parametrize("p,m", SIZES)
def test_every_schedule_validates_and_round_trips_through_its_grid(name, p, m):
    actions = build(name, p, m, vpp=vpp_for(name))
    assert len(actions) == p
    check(name, p, m, actions)
    text = format_grid(actions)
    assert text.splitlines()[1].startswith("rank 0 |")
    assert as_text(parse_grid(text)) == actions


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb-h1"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 8), (8, 16)])
def test_each_rank_runs_its_stage_forward_then_backward_once_per_microbatch(name, p, m):
    for s, acts in enumerate(build(name, p, m)):
        parsed = [Action.parse(a) for a in acts]
        assert all(stage == s for stage, _, _ in parsed)
        for kind in ("FBW" if name == "zb-h1" else "FB"):
            assert sorted(mb for _, k, mb in parsed if k == kind) == list(range(m))
        pos = {(k, mb): i for i, (_, k, mb) in enumerate(parsed)}
        assert all(pos[("F", i)] < pos[("B", i)] for i in range(m))


def test_1f1b_keeps_at_most_p_minus_s_in_flight():
    for s, acts in enumerate(build("1f1b", 4, 8)):
        live = peak = 0
        for a in acts:
            live += 1 if "F" in a else -1
            peak = max(peak, live)
        assert peak == 4 - s


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 16)])
def test_unit_time_grid_is_2m_plus_2p_minus_2_slots_with_the_bubble_shown_idle(name, p, m):
    rows = format_grid(build(name, p, m)).splitlines()
    header, ranks = rows[0], rows[1:]
    assert header.split()[-1] == str(2 * (m + p - 1) - 1)  # last slot index
    for row in ranks:
        cells = row.split("|")[1].split()
        assert len(cells) == 2 * (m + p - 1)
        assert cells.count(".") == 2 * (p - 1)


def test_interleaved_places_stage_r_plus_kp_on_rank_r_and_vpp_1_is_1f1b():
    p, m, v = 4, 8, 2
    for r, acts in enumerate(build("interleaved-1f1b", p, m, vpp=v)):
        assert {Action.parse(a)[0] for a in acts} == {r, r + p}
    assert build("interleaved-1f1b", 4, 8, vpp=1) == build("1f1b", 4, 8)
    # torch's depth-first order: rank 0 runs k = p micro-batches of chunk 0, then of chunk 1
    assert build("interleaved-1f1b", p, m, vpp=v)[0][:8] == [f"0F{i}" for i in range(4)] + [
        f"4F{i}" for i in range(4)]


def test_interleaved_needs_whole_rounds_of_micro_batches_as_torch_does():
    validate(build("interleaved-1f1b", 4, 10, vpp=2), stages=4, microbatches=10, vpp=2)
    with pytest.raises(SpecError, match="num_microbatches: .* 2 equal rounds, and 9 is not a "
                       "multiple of 2; try 8 or 10"):
        build("interleaved-1f1b", 4, 9, vpp=2)


def test_zb_h1_runs_w_after_b_and_torch_spells_the_split_backward_i():
    acts = build("zb-h1", 4, 8)
    for r, row in enumerate(acts):
        for i in range(8):
            assert row.index(f"{r}B{i}") < row.index(f"{r}W{i}")
    torch = torch_actions(acts)
    assert "0I0" in torch[0] and "0W0" in torch[0] and "0B0" not in torch[0]
    assert torch_actions(build("1f1b", 2, 2)) == build("1f1b", 2, 2)


def test_bidirectional_naming_two_replicas_per_rank_even_down_odd_up():
    p, m = 4, 8
    shape = shape_of("bidirectional", p)
    acts = build("bidirectional", p, m)
    for r, row in enumerate(acts):
        parsed = [Action.parse(a) for a in row]
        assert {s for s, _, _ in parsed} == {r, 2 * p - 1 - r}
        assert all((s >= p) == (i % 2 == 1) for s, _, i in parsed)
    assert [shape.rank_of(s) for s in range(2 * p)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert shape.model_stage(p + 2) == 2 and list(shape.chain(3)) == [4, 5, 6, 7]


def test_shape_infer_tells_interleaved_from_bidirectional():
    assert Shape.infer(build("interleaved-1f1b", 4, 4, vpp=2)) == Shape(ranks=4, vpp=2)
    assert Shape.infer(build("bidirectional", 4, 4)) == Shape(ranks=4, bidirectional=True)


def test_swapped_forward_and_backward_is_caught_with_the_grid_marked():
    acts = build("1f1b", 4, 8)
    row = acts[2]
    f, b = row.index("2F3"), row.index("2B3")
    row[f], row[b] = row[b], row[f]
    with pytest.raises(SpecError) as err:
        validate(acts, stages=4, microbatches=8)
    msg = str(err.value)
    assert "rank 2 runs 2B3 before 2F3" in msg
    assert "[2B3]" in msg and "rank 0 |" in msg and "rank 3 |" in msg
    assert as_text(parse_grid(msg)) == acts  # the marked grid still reads back


def test_deadlock_marks_each_stuck_rank():
    acts = build("gpipe", 2, 4)
    acts[0].remove("0B0")
    acts[0].insert(3, "0B0")  # 0B0 before 0F3: rank 0 waits for 1B0, rank 1 for 0F3
    with pytest.raises(SpecError) as err:
        validate(acts, stages=2, microbatches=4)
    msg = str(err.value)
    assert "deadlock" in msg and "[0B0]" in msg and "[1F3]" in msg
    assert "rank 0 waits at 0B0 for 0F0 and 1B0" in msg


@pytest.mark.parametrize("edit,words", [
    (lambda a: a[0].append("1F0"), "lives on rank 1"),
    (lambda a: a[1].remove("1B2"), "1B2 is missing"),
    (lambda a: a[0].insert(0, "0F0"), "0F0 appears twice"),
    (lambda a: a[1].append("1F9"), "not a stage of micro-batch 9"),
    (lambda a: a.pop(), "rank lists for pp=2"),
])
def test_validation_names_the_problem(edit, words):
    acts = build("1f1b", 2, 4)
    edit(acts)
    with pytest.raises(SpecError, match=words):
        validate(acts, stages=2, microbatches=4)


def test_bidirectional_micro_batch_on_the_wrong_pipeline_is_rejected():
    acts = build("bidirectional", 2, 2)
    acts[0] = [a.replace("0F0", "0F1") for a in acts[0]]
    with pytest.raises(SpecError, match="not a stage of micro-batch 1"):
        validate(acts, stages=2, microbatches=2, bidirectional=True)


def test_build_errors_name_the_field():
    with pytest.raises(SpecError, match="unknown schedule 'zb'"):
        build("zb", 2, 2)
    with pytest.raises(SpecError, match="vpp: gpipe runs one stage per rank"):
        build("gpipe", 2, 2, vpp=2)
    with pytest.raises(SpecError, match="at least 1"):
        build("1f1b", 0, 2)


def test_bad_action_text():
    assert Action.parse("12B3") == (12, "B", 3)
    with pytest.raises(SpecError, match="not an action"):
        Action.parse("F3")
    with pytest.raises(SpecError, match="not an action"):
        parse_grid("rank 0 | 0F0 0X1")
    with pytest.raises(SpecError, match="rows must be"):
        parse_grid("rank 1 | 0F0")


# ---- the typed form ------------------------------------------------------------------------------


def test_actions_print_and_parse_as_plan_files_spell_them():
    a = Action(12, "B", 3)
    assert str(a) == "12B3" and Action.parse("12B3") == a == (12, "B", 3)
    assert Action.parse(a) is a
    typed = build_actions("zb-h1", 3, 5)
    assert all(isinstance(x, Action) for acts in typed for x in acts)
    assert as_actions(as_text(typed)) == typed  # the text round-trips
    assert parse_grid(format_grid(typed)) == typed
    with pytest.raises(SpecError, match="'2X1' is not an action"):
        as_actions([["0F0", "2X1"]])


@pytest.mark.parametrize("name,p,v", [("1f1b", 4, 1), ("interleaved-1f1b", 4, 2),
                                      ("bidirectional", 3, 1)])
def test_chunk_and_peer_of_each_action(name, p, v):
    shape = shape_of(name, p, vpp=v)
    for r, acts in enumerate(build_actions(name, p, 4, vpp=v)):
        for a in acts:
            assert shape.rank_of(a.stage) == r
            chunk = shape.chunk(a)
            assert 0 <= chunk < (2 if shape.bidirectional else v)
            pos = a.stage % shape.depth  # position along the micro-batch's path
            first, last = pos == 0, pos == shape.depth - 1
            peer = shape.peer(a)
            if (a.kind == "F" and first) or (a.kind == "B" and last) or a.kind == "W":
                assert peer is None
            else:
                step = -1 if a.kind == "F" else 1
                assert peer == shape.rank_of(a.stage + step) != r
    assert Shape(ranks=4, vpp=2).chunk(Action(5, "F", 0)) == 1
