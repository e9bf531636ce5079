"""Figures for the HTML and Markdown reports, drawn from a report dict only.

Each figure is a separate function registered with `@figure(...)`: it declares the stage and the
measurement it needs, finds that measurement in the report (json_report.to_dict / load), and
raises `Missing` with a reason when it is not there — the report then says why the figure is
absent instead of breaking. Figures use a bare Agg `Figure` (no pyplot state) and PNGs are saved
without a timestamp or version, so the same report always gives the same bytes.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from objdebug.report import report_stages, write_atomic

_DPI = 100
_VERDICT_COLOURS = {"PASS": "#2e7d32", "INFO": "#1565c0", "WARN": "#f9a825", "FAIL": "#c62828", "ERROR": "#6a1b9a",
                    "SKIP": "#78909c"}


class Missing(Exception):
    """The report lacks what a figure needs; the message says what."""


@dataclass(frozen=True)
class FigureSpec:
    name: str
    title: str
    stage: str
    requires: str  # what the figure reads, for the "not drawn" note
    draw: Callable[[dict[str, Any]], bytes]
    file: str | None = None  # also written as this PNG into a run's --out directory


@dataclass
class Drawn:
    name: str
    title: str
    stage: str
    png: bytes | None = None
    skipped: str | None = None  # why it was not drawn


FIGURES: list[FigureSpec] = []


def figure(name: str, title: str, stage: str, requires: str, file: str | None = None):
    def register(fn: Callable[[dict[str, Any]], bytes]):
        FIGURES.append(FigureSpec(name, title, stage, requires, fn, file))
        return fn
    return register


# --------------------------------------------------------------------------- helpers
def _canvas(width: float = 6.4, height: float = 3.6, dpi: int = _DPI):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def _png(fig, tight: bool = True) -> bytes:
    buf = io.BytesIO()
    if tight:
        fig.tight_layout()
    fig.savefig(buf, format="png", metadata={"Software": None})  # no version: stable bytes
    return buf.getvalue()


def _num(x: Any) -> float:
    if isinstance(x, bool) or x is None:
        return math.nan
    try:
        return float(x)  # JSON keeps NaN/Inf as strings
    except (TypeError, ValueError):
        return math.nan


def _results(report: dict[str, Any], stage: str) -> list[dict[str, Any]]:
    out = [r for r in report.get("results", []) if r.get("stage") == stage]
    if not out:
        raise Missing(f"stage '{stage}' did not run")
    return out


def _value(report: dict[str, Any], stage: str, keys: tuple[str, ...], check: str | None = None
           ) -> tuple[dict[str, Any], str]:
    """The first measurement of `stage` (optionally of `check`) holding one of `keys`."""
    for res in _results(report, stage):
        if check and res.get("check") != check:
            continue
        value = res.get("value") or {}
        for key in keys:
            if value.get(key) not in (None, [], {}):
                return value, key
    raise Missing(f"no {stage} measurement with {' or '.join(repr(k) for k in keys)}")


def _named_numbers(obj: Any, field: str | None = None) -> dict[str, float]:
    """{name: number} from {name: number}, {name: {field: number}} or [{name|param|component, field}]."""
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out[str(k)] = _num(v.get(field)) if isinstance(v, dict) and field else _num(v)
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            if isinstance(item, dict):
                name = next((item[k] for k in ("name", "layer", "param", "component") if k in item), str(i))
                out[str(name)] = _num(item.get(field)) if field else math.nan
    return out


# --------------------------------------------------------------------------- figures
@figure("summary", "Findings per stage", "summary", "results[].findings[].verdict")
def summary(report: dict[str, Any]) -> bytes:
    stages = report_stages(report)
    if not any(r.get("findings") for r in report.get("results", [])):
        raise Missing("the report has no findings")
    fig = _canvas(6.4, 0.6 + 0.45 * max(len(stages), 2))
    ax = fig.add_subplot(1, 1, 1)
    left = [0] * len(stages)
    for verdict, colour in _VERDICT_COLOURS.items():
        counts = [sum(1 for r in report["results"] if r["stage"] == s for f in r["findings"]
                      if f["verdict"] == verdict) for s in stages]
        if any(counts):
            ax.barh(stages, counts, left=left, color=colour, label=verdict)
            left = [a + b for a, b in zip(left, counts)]
    ax.invert_yaxis()
    ax.set_xlabel("findings")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)  # outside: never over a bar
    return _png(fig)


@figure("align_gaps", "Align: loss(bad) - loss(good) per row", "align", "align/alignment value.rows[].gap")
def align_gaps(report: dict[str, Any]) -> bytes:
    value, _ = _value(report, "align", ("rows",), check="alignment")
    rows = value["rows"]
    settings = report.get("profile", {}).get("settings", {}).get("align", {})
    ids = [str(r.get("id")) for r in rows]
    gaps = [_num(r.get("gap")) for r in rows]
    fig = _canvas(6.4, 3.6)
    ax = fig.add_subplot(1, 1, 1)
    colours = ["#2e7d32" if r.get("ordered") else "#c62828" for r in rows]
    ax.bar(range(len(ids)), [g if math.isfinite(g) else 0.0 for g in gaps], color=colours)
    finite = [g for g in gaps if math.isfinite(g)] or [0.0]
    lo, hi = min(finite + [0.0]), max(finite + [0.0])
    reach = max(2.0 * (hi - lo), 2.0)  # a threshold far from every gap would squash the bars
    for key, style, label in (("gap_pass", "--", "pass"), ("gap_fail", ":", "fail")):
        if key in settings and lo - reach <= float(settings[key]) <= hi + reach:
            ax.axhline(float(settings[key]), color="black", linestyle=style, linewidth=1,
                       label=f"{label} threshold {settings[key]}")
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(ids)))
    ax.set_xticklabels(ids if len(ids) <= 30 else [""] * len(ids), rotation=60, fontsize=7)
    ax.set_ylabel("gap (loss units)")
    ax.set_title("green: ordered bad > medium > good; red: out of order", fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return _png(fig)


_GRAD_KEYS = ("layers", "per_layer", "params", "per_param")  # per layer first: fewer, readable bars


@figure("grad_norms", "Grad: gradient norm per layer", "grad", "grad value.layers[].layer/norm")
def grad_norms(report: dict[str, Any]) -> bytes:
    value, key = _value(report, "grad", _GRAD_KEYS)
    norms = _named_numbers(value[key], field="norm")
    norms = {k: v for k, v in norms.items() if not math.isnan(v)}
    if not norms:
        raise Missing(f"grad measurement '{key}' holds no numbers")
    names = list(norms)
    vals = [norms[n] for n in names]
    fig = _canvas(6.4, max(2.4, 0.18 * len(names) + 1.0))
    ax = fig.add_subplot(1, 1, 1)
    positive = [v if v > 0 and math.isfinite(v) else math.nan for v in vals]
    colours = ["#c62828" if not (v > 0 and math.isfinite(v)) else "#1565c0" for v in vals]
    floor = min((v for v in positive if not math.isnan(v)), default=1.0)
    ax.barh(range(len(names)), [v if not math.isnan(v) else floor / 10 for v in positive], color=colours)
    ax.set_xscale("log")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("gradient L2 norm (log; red: zero or non-finite)")
    return _png(fig)


_SHARE_KEYS = ("shares", "component_shares", "components")


@figure("component_shares", "Decompose: component shares of the loss", "decompose",
        "decompose value: {component: share}")
def component_shares(report: dict[str, Any]) -> bytes:
    value, key = _value(report, "decompose", _SHARE_KEYS)
    shares = _named_numbers(value[key], field="share")
    shares = {k: v for k, v in shares.items() if math.isfinite(v)}
    if not shares:
        raise Missing(f"decompose measurement '{key}' holds no shares")
    fig = _canvas(6.4, 0.8 + 0.4 * max(len(shares), 2))
    ax = fig.add_subplot(1, 1, 1)
    names = list(shares)
    ax.barh(names, [abs(shares[n]) for n in names], color="#00838f")
    for i, n in enumerate(names):
        ax.text(abs(shares[n]), i, f" {shares[n]:.3g}", va="center", fontsize=8)
    nonzero = [abs(v) for v in shares.values() if v]
    if nonzero and max(nonzero) / min(nonzero) > 100:  # terms on different scales: a log axis shows both
        ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("share of the total loss")
    return _png(fig)


@figure("loss_vs_score", "Correlate: per-sample loss vs human score", "correlate",
        "correlate value.points[].score/loss (pearson_r, ci, fit)", file="correlate_scatter.png")
def loss_vs_score(report: dict[str, Any]) -> bytes:
    value, key = _value(report, "correlate", ("points", "rows"))
    rows = [r for r in value[key] if isinstance(r, dict)]
    scores = [_num(r.get("score")) for r in rows]
    losses = [_num(r.get("loss")) for r in rows]
    if not rows or all(math.isnan(x) for x in losses) or all(math.isnan(x) for x in scores):
        raise Missing(f"correlate measurement '{key}' has no paired scores and losses")
    lengths = [_num(r.get("length")) for r in rows] if all("length" in r for r in rows) else None
    r = _num(value.get("pearson_r", value.get("pearson")))
    ci = value.get("ci") if isinstance(value.get("ci"), dict) else {}
    interval = (_num(ci.get("low")), _num(ci.get("high"))) if ci else None
    fit = value.get("fit") if isinstance(value.get("fit"), dict) else {}
    line = (_num(fit.get("slope")), _num(fit.get("intercept"))) if fit else None
    return scatter_png(scores, losses, lengths=lengths, r=r if math.isfinite(r) else None,
                       ci=interval, fit=line, level=_num(ci.get("level", 0.95)) if ci else 0.95,
                       ci_method=str(ci.get("method", "")) if ci else "",
                       title=f"per-sample loss vs human score ({report.get('target', {}).get('objective', '')})")


@figure("stress_results", "Stress: findings and measured values", "stress", "stress findings")
def stress_results(report: dict[str, Any]) -> bytes:
    rows = [(f"{f['code']} {r['check']}", f["verdict"], f.get("value"))
            for r in _results(report, "stress") for f in r.get("findings", [])]
    if not rows:
        raise Missing("the stress stage has no findings")
    fig = _canvas(6.4, 0.6 + 0.32 * len(rows))
    ax = fig.add_subplot(1, 1, 1)
    ax.barh(range(len(rows)), [1] * len(rows), color=[_VERDICT_COLOURS.get(v, "grey") for _, v, _ in rows])
    for i, (label, verdict, value) in enumerate(rows):
        shown = f"{_num(value):.4g}" if value is not None else ""
        ax.text(0.02, i, f"{verdict}  {label}  {shown}", va="center", fontsize=8, color="white")
    ax.set_yticks([])
    ax.set_xticks([])
    ax.set_xlim(0, 1)
    ax.invert_yaxis()
    return _png(fig)


# --------------------------------------------------------------------------- rendering
def write_pngs(report: dict[str, Any], directory: str | Path) -> dict[str, str]:
    """The figures that have a file name, written into `directory` (a run's --out); returns
    {file stem: path} of those drawn. A figure that cannot be drawn is left out, never raised."""
    from objdebug.report import write_atomic

    written = {}
    for spec in FIGURES:
        if spec.file is None:
            continue
        try:
            png = spec.draw(report)
        except Exception:  # Missing, or a crash: the report says why (draw_all); the run goes on
            continue
        path = Path(directory) / spec.file
        write_atomic(path, png)
        written[Path(spec.file).stem] = str(path)
    return written


def draw_all(report: dict[str, Any]) -> list[Drawn]:
    """Every registered figure, drawn or with the reason it was not; never raises for a figure."""
    out = []
    for spec in FIGURES:
        try:
            out.append(Drawn(spec.name, spec.title, spec.stage, png=spec.draw(report)))
        except Missing as exc:
            out.append(Drawn(spec.name, spec.title, spec.stage, skipped=str(exc)))
        except Exception as exc:  # a figure must never sink the report it belongs to
            out.append(Drawn(spec.name, spec.title, spec.stage,
                             skipped=f"could not draw ({type(exc).__name__}: {exc}); needs {spec.requires}"))
    return out


# --------------------------------------------------------------------------- plots from plain numbers
# One function per plot, numbers in, PNG bytes out (`*_png`), or a file written atomically; the
# figures above find the numbers in a report and call these.
_SCATTER_DPI = 110


def scatter_loss_vs_score(scores: Sequence[float], losses: Sequence[float], path: str | Path,
                          **kwargs) -> str:
    """scatter_png written atomically to `path` (no half-written file; creates the folder)."""
    write_atomic(path, scatter_png(scores, losses, **kwargs))
    return str(Path(path))


def _plottable(v: np.ndarray) -> tuple[np.ndarray, int]:
    """(v, 0), or (v / 2**e, e) when v's span (or matplotlib's margins around it) is beyond
    float64."""
    if not v.size:
        return v, 0
    with np.errstate(all="ignore"):
        span = float(v.max()) - float(v.min())
    top = float(np.max(np.abs(v)))
    if math.isfinite(span) and span < 1e300 and top < 1e300:
        return v, 0
    e = int(np.frexp(top)[1])
    return np.ldexp(v, -e), e


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
    # an axis whose span is beyond float64 (scores of +-1e308): matplotlib's limits overflow;
    # shown divided by an exact power of two, the axis label says which
    (x, x_exp), (y, y_exp) = _plottable(x), _plottable(y)
    fig = _canvas(6.4, 4.6, dpi=_SCATTER_DPI)
    ax = fig.add_subplot(1, 1, 1)
    jitter = np.zeros_like(x)
    if x.size and np.all(x == np.round(x)):
        jitter = np.random.default_rng(seed).uniform(-0.12, 0.12, size=x.size)
    points = ax.scatter(x + jitter, y, c=c, cmap="viridis" if c is not None else None, s=22,
                        alpha=0.8, edgecolors="none", color=None if c is not None else "tab:blue")
    if c is not None and c.size:
        fig.colorbar(points, ax=ax, label="response tokens")
    if fit is not None and all(math.isfinite(v) for v in fit) and x.size:
        xs = np.array([x.min(), x.max()])  # the ends: no max - min (scores of +-1e308 overflow it)
        with np.errstate(all="ignore"):
            ys = np.ldexp(fit[0] * np.ldexp(xs, x_exp) + fit[1], -y_exp)  # in the data's units
        if np.all(np.isfinite(ys)):  # else the line is beyond float64 (the finding says so)
            ax.plot(xs, ys, color="tab:red", linewidth=1.5,
                    label=f"fit: loss = {fit[0]:.3g} * score + {fit[1]:.3g}")
            ax.legend(loc="best", fontsize=8)
    head = "\n".join(textwrap.wrap(title, 72)) or " "  # a long objective name must not be clipped
    if r is not None and math.isfinite(r):
        head += f"\nPearson r = {r:.3f}"
        if ci is not None and all(math.isfinite(v) for v in ci):
            head += f", {level:.0%} {ci_method + ' ' if ci_method else ''}CI [{ci[0]:.3f}, {ci[1]:.3f}]"
        head += f", n = {x.size}"
    ax.set_title(head, fontsize=10)
    ax.set_xlabel("human score" + (f" / 2**{x_exp}" if x_exp else "")
                  + (" (jittered)" if np.any(jitter) else ""))
    ax.set_ylabel("per-sample loss" + (f" / 2**{y_exp}" if y_exp else ""))
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return _png(fig, tight=False)
