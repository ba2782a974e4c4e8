"""A Gantt chart of a simulated pipeline schedule (planner.simulate).

matplotlib is imported inside the function and drawn on a bare ``Figure`` with the Agg canvas,
so importing this module costs nothing and no global pyplot state or backend is touched.
"""

from __future__ import annotations

from planner.errors import SpecError
from planner.simulate import SimResult

FORMATS = (".png", ".svg")
COLOURS = {"F": "#0072B2", "B": "#E69F00", "W": "#009E73"}
"""Forward blue, backward orange, weight-gradient green (Okabe-Ito, readable when colour-blind)."""
WORDS = {"F": "forward (F)", "B": "backward (B)", "W": "weight gradient (W)"}
FONT_PT = 7.0
"""Size of the micro-batch numbers inside blocks."""
AXES_WIDTH = 0.84
"""Share of the figure's width the time axis takes."""


def _shade(colour: str, chunk: int) -> str:
    """The colour for a rank's ``chunk``-th stage (0: as is; later chunks mixed with white)."""
    mix = min(0.6, 0.4 * chunk)
    rgb = [int(colour[k:k + 2], 16) for k in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * mix):02x}" for c in rgb)


def _label_px(label: str, dpi: int) -> float:
    """Pixels a block needs to show ``label`` (a digit is about 0.62 em wide, plus margins)."""
    return (len(label) * 0.62 + 0.6) * FONT_PT * dpi / 72


def _width_in(sim: SimResult, dpi: int) -> float:
    """A figure width (10 to 40 inches) at which a typical block of the shortest kind has room
    for the widest micro-batch number."""
    blocks = {}
    for iv in sim.timeline:
        if iv.end_s > iv.start_s:
            blocks.setdefault(iv.kind, []).append(iv.end_s - iv.start_s)
    if not blocks or sim.step_time_s <= 0:
        return 10.0
    typical = min(sorted(d)[len(d) // 2] for d in blocks.values())
    axes_px = 1.15 * _label_px(str(sim.microbatches - 1), dpi) * sim.step_time_s / typical
    return min(40.0, max(10.0, axes_px / dpi / AXES_WIDTH))


def gantt(sim: SimResult, path: str, *, title: str = "pipeline schedule",
          width_in: float | None = None, dpi: int = 150):
    """Draw ``sim`` as a Gantt chart and write it to ``path`` (``.png`` or ``.svg``).

    One row per rank (rank 0 on top), one block per action coloured by kind (F/B/W), blank where
    the rank idles; a block shows its micro-batch number when wide enough to read. A rank's later
    virtual stages (interleaved) or its up-pipeline stage (bidirectional) are drawn lighter. The
    right margin gives each rank's idle share; the x axis is in seconds. Returns the matplotlib
    Figure (one axes: time in data x, rank in data y)."""
    if not path.lower().endswith(FORMATS):
        raise SpecError(f"gantt: '{path}' must end in {' or '.join(FORMATS)}")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    ranks, step = sim.ranks, sim.step_time_s
    width_in = width_in or _width_in(sim, dpi)
    fig = Figure(figsize=(width_in, 1.6 + 0.42 * ranks), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.07, 0.2 if ranks < 6 else 0.14, AXES_WIDTH, 0.7 if ranks < 6 else 0.76))
    ax.set_xlim(0, step * 1.002 or 1.0)
    ax.set_ylim(ranks - 0.5, -0.5)
    px_per_s = width_in * AXES_WIDTH * dpi / (step or 1.0)
    kinds = sorted({iv.kind for iv in sim.timeline}, key="FBW".index)
    chunks = max((iv.stage // max(ranks, 1) for iv in sim.timeline), default=0)
    for iv in sim.timeline:
        width = iv.end_s - iv.start_s
        colour = _shade(COLOURS[iv.kind], iv.stage // ranks)
        ax.broken_barh([(iv.start_s, width)], (iv.rank - 0.4, 0.8), facecolors=colour,
                       edgecolor="white", linewidth=0.4)
        label = str(iv.microbatch)
        if width * px_per_s >= _label_px(label, dpi):
            ax.text(iv.start_s + width / 2, iv.rank, label, ha="center", va="center",
                    fontsize=FONT_PT, color="white" if iv.kind != "B" else "black")
    for r in range(ranks):
        ax.text(1.005, r, f"idle {sim.idle_s[r] / step:.0%}" if step else "", va="center",
                fontsize=8, transform=ax.get_yaxis_transform())
    ax.set_yticks(range(ranks), [f"rank {r}" for r in range(ranks)])
    ax.set_xlabel("time (s)")
    ax.grid(axis="x", color="#dddddd", linewidth=0.5)
    ax.set_axisbelow(True)
    ax.set_title(f"{title}\nstep {step:.4g} s, bubble {sim.bubble_fraction:.1%}, "
                 f"{sim.microbatches} micro-batches; numbers are micro-batches", fontsize=10)
    handles = [Patch(color=COLOURS[k], label=WORDS[k]) for k in kinds]
    if chunks:
        handles.append(Patch(color=_shade("#666666", 1), label="lighter: rank's next stage"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.1 if ranks >= 6
              else -0.25), ncol=len(handles), fontsize=8, frameon=False)
    fig.savefig(path)
    return fig
