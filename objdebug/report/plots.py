"""Plots from plain numbers: one function per plot, numbers in, PNG bytes out (`*_png`), or a
file written atomically (the others). report/figures.py finds the numbers in a report and calls
these; no check draws anything (a check returns its points in its measurement).

Figures are drawn on a bare `matplotlib.figure.Figure` with the Agg canvas, so no global backend
or pyplot state is touched (safe in a headless CI job and inside a user's own process).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np

_DPI = 110


def _canvas(width: float = 6.4, height: float = 4.6):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=_DPI)
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> bytes:
    """The PNG, byte-stable (no matplotlib version in it)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def scatter_loss_vs_score(scores: Sequence[float], losses: Sequence[float], path: str | Path,
                          **kwargs) -> str:
    """scatter_png written atomically to `path` (no half-written file; creates the folder)."""
    from objdebug.report import write_atomic

    write_atomic(path, scatter_png(scores, losses, **kwargs))
    return str(Path(path))


def scatter_png(scores: Sequence[float], losses: Sequence[float], *,
                lengths: Sequence[float] | None = None, r: float | None = None,
                ci: tuple[float, float] | None = None, fit: tuple[float, float] | None = None,
                level: float = 0.95, ci_method: str = "", title: str = "loss vs human score",
                seed: int = 0) -> bytes:
    """Per-sample loss (y) against human score (x), with the least-squares line and r in the title.

    Integer scores are jittered horizontally (seeded, +-0.12) so tied ratings stay visible; the
    fitted line is drawn on the un-jittered scores. `lengths` colours the points (response
    tokens), which shows a length confound at a glance. Non-finite losses are left out.
    """
    x = np.asarray(scores, dtype=np.float64)
    y = np.asarray(losses, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"For 'scatter_png', 'scores' and 'losses' must have the same "
                         f"length, but got {x.size} and {y.size}.")
    keep = np.isfinite(x) & np.isfinite(y)
    c = np.asarray(lengths, dtype=np.float64)[keep] if lengths is not None else None
    x, y = x[keep], y[keep]
    fig = _canvas()
    ax = fig.add_subplot(1, 1, 1)
    jitter = np.zeros_like(x)
    if x.size and np.all(x == np.round(x)):
        jitter = np.random.default_rng(seed).uniform(-0.12, 0.12, size=x.size)
    points = ax.scatter(x + jitter, y, c=c, cmap="viridis" if c is not None else None, s=22,
                        alpha=0.8, edgecolors="none", color=None if c is not None else "tab:blue")
    if c is not None and c.size:
        fig.colorbar(points, ax=ax, label="response tokens")
    if fit is not None and all(math.isfinite(v) for v in fit) and x.size:
        xs = np.linspace(x.min(), x.max(), 2)
        ax.plot(xs, fit[0] * xs + fit[1], color="tab:red", linewidth=1.5,
                label=f"fit: loss = {fit[0]:.3g} * score + {fit[1]:.3g}")
        ax.legend(loc="best", fontsize=8)
    head = "\n".join(textwrap.wrap(title, 72)) or " "  # a long objective name must not be clipped
    if r is not None and math.isfinite(r):
        head += f"\nPearson r = {r:.3f}"
        if ci is not None and all(math.isfinite(v) for v in ci):
            head += f", {level:.0%} {ci_method + ' ' if ci_method else ''}CI [{ci[0]:.3f}, {ci[1]:.3f}]"
        head += f", n = {x.size}"
    ax.set_title(head, fontsize=10)
    ax.set_xlabel("human score" + (" (jittered)" if np.any(jitter) else ""))
    ax.set_ylabel("per-sample loss")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return _png(fig)
