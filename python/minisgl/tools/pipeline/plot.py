"""A simulated step's timeline as a PNG: one row per attention lane and one for the expert workers,
items coloured by role and layer kind, bubbles shaded. matplotlib is optional (`pip install -e .[plot]`)."""
from __future__ import annotations

from minisgl.tools.pipeline.sim import EXPERT, FULL, StepResult

_COLOURS = {
    ("attn", "gdn"): "#4c78a8", ("attn", "full"): "#f58518", ("shared", "gdn"): "#9ecae9",
    ("shared", "full"): "#ffbf79", ("expert", "gdn"): "#54a24b", ("expert", "full"): "#2e6b2a",
}
_OTHER = "#bab0ac"  # head, tail, finish


def plot_timeline(result: StepResult, kinds: tuple[str, ...], path: str, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as e:
        raise SystemExit("--png needs matplotlib: pip install -e .[plot]") from e
    rows = sorted({s.who for s in result.spans if s.who != EXPERT}) + [EXPERT]
    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.7 * len(rows)))
    for y, who in enumerate(rows):
        for s in (s for s in result.spans if s.who == who):
            kind = kinds[s.layer] if 0 <= s.layer < len(kinds) else None
            if s.what == "idle":
                ax.broken_barh([(s.start / 1e3, (s.end - s.start) / 1e3)], (y - 0.4, 0.8),
                               facecolors="#e45756", alpha=0.35, hatch="//", edgecolor="#e45756", linewidth=0)
                continue
            colour = _COLOURS.get((s.what, kind), _OTHER)
            ax.broken_barh([(s.start / 1e3, (s.end - s.start) / 1e3)], (y - 0.35, 0.7), facecolors=colour,
                           edgecolor="black" if kind == FULL else "none", linewidth=0.3)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title(title)
    legend = [Patch(color=c, label=f"{what} ({kind})") for (what, kind), c in _COLOURS.items()]
    legend += [Patch(color=_OTHER, label="head / tail"), Patch(color="#e45756", alpha=0.35, label="idle (bubble)")]
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
