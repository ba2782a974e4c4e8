"""Gantt charts: written as PNG or SVG, F/B/W drawn in their colours, bubbles left blank, and a
width at which micro-batch numbers fit their blocks."""

import numpy as np
import pytest

from planner.report import gantt as plots
from planner.errors import SpecError
from planner.schedule.builders import build
from planner.schedule.simulator import simulate


def sim_of(name, p=4, m=8, **kw):
    times = {"fwd_s": 1.0, "bwd_s": 1.0, "wgrad_s": 1.0} if name == "zb-h1" else {
        "fwd_s": 1.0, "bwd_s": 2.0}
    return simulate(build(name, p, m, vpp=kw.get("vpp", 1)), microbatches=m, **times, **kw)


def colours_in(path):
    import matplotlib.image as mpimg

    rgb = (mpimg.imread(path)[..., :3] * 255).round().astype(int)
    return {"#%02x%02x%02x" % tuple(px) for px in np.unique(rgb.reshape(-1, 3), axis=0)}


@pytest.mark.parametrize("name,kinds", [("1f1b", "FB"), ("zb-h1", "FBW")])
def test_png_shows_each_kind_in_its_colour(tmp_path, name, kinds):
    path = str(tmp_path / "g.png")
    plots.gantt(sim_of(name), path, title=name)
    seen = colours_in(path)
    for kind, colour in plots.COLOURS.items():
        assert (colour.lower() in seen) == (kind in kinds), kind


def test_bubble_is_blank_where_a_rank_waits(tmp_path):
    import matplotlib.image as mpimg

    sim = sim_of("gpipe", p=4, m=4)  # F=1, B=2: rank 0 forwards [0,4], idles [4,12]
    path = str(tmp_path / "g.png")
    fig = plots.gantt(sim, path)
    img = mpimg.imread(path)[..., :3]
    to_px = fig.axes[0].transData

    def pixel(t, rank):
        x, y = to_px.transform((t, rank))
        return img[img.shape[0] - int(round(y)), int(round(x))]

    assert (pixel(8.0, 0) > 0.95).all()  # rank 0 waits: blank
    assert not (pixel(2.5, 0) > 0.95).all()  # rank 0 runs 0F2
    assert not (pixel(8.0, 3) > 0.95).all()  # rank 3 runs 3B0 meanwhile


def test_svg_by_extension_and_other_extensions_refused(tmp_path):
    path = tmp_path / "g.svg"
    plots.gantt(sim_of("interleaved-1f1b", vpp=2), str(path), title="interleaved")
    assert path.read_text().lstrip().startswith("<?xml") and "<svg" in path.read_text()
    with pytest.raises(SpecError, match="must end in .png or .svg"):
        plots.gantt(sim_of("1f1b"), str(tmp_path / "g.pdf"))


@pytest.mark.parametrize("name,p,m", [("1f1b", 8, 16), ("zb-h1", 8, 16), ("gpipe", 4, 32)])
def test_default_width_leaves_room_for_the_widest_micro_batch_number(name, p, m):
    sim = sim_of(name, p=p, m=m)
    dpi = 150
    width = plots._width_in(sim, dpi)
    shortest = min(iv.end_s - iv.start_s for iv in sim.timeline)
    px = shortest / sim.step_time_s * width * plots.AXES_WIDTH * dpi
    assert px >= plots._label_px(str(m - 1), dpi)
    assert 10 <= width <= 40


def test_rows_name_each_ranks_group_on_a_plan_over_groups(tmp_path):
    """A new-user check: a plan over an H100 and an A100 group drew rows `rank 0`, `rank 1`."""
    from types import SimpleNamespace

    plan = SimpleNamespace(parallel={"pp": 2}, stages=[
        {"index": 0, "pipeline_rank": 0, "group": "h100s"},
        {"index": 1, "pipeline_rank": 1, "group": "a100s"}])
    labels = plots.rank_labels(plan)
    assert labels == ["rank 0 (h100s)", "rank 1 (a100s)"]
    fig = plots.gantt(sim_of("1f1b", p=2, m=4), str(tmp_path / "g.png"), labels=labels)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == labels
    plain = SimpleNamespace(parallel={"pp": 2}, stages=[{"index": 0}, {"index": 1}])
    assert plots.rank_labels(plain) is None
