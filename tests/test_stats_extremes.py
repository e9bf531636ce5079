"""Issue 46: extreme but valid numbers are handled, not warned about. Scores of 1e300 gave a correct
verdict with numpy's `RuntimeWarning: overflow` (np.polyfit) and a `RankWarning` on stderr.

The matrix of hostile vectors runs through the correlate measurement, its findings, the align
statistics and the scatter figure with every warning an error; the numbers are checked against
float64 references on the same data at a moderate scale (correlations and p-values are
scale-free; a mean or a slope scales exactly by the power of ten, or is named out of range).
One real CLI run with 1e300 scores asserts an empty stderr.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from objdebug.core import stats
from objdebug.stages.correlate import ScoreCorrelation, measure_vectors

ROOT = Path(__file__).resolve().parent.parent
N = 40
_rng = np.random.default_rng(0)
BASE = _rng.normal(size=N)
LOSSES = 2.0 - 0.5 * BASE + 0.1 * _rng.normal(size=N)
LENGTHS = _rng.integers(5, 50, N).astype(np.float64)
_ALT = np.arange(N) % 3

# name -> (scores, the factor they are BASE-like times, or None when not a pure rescale)
SCORES = {
    "1e300": (BASE * 1e300, 1e300),
    "-1e300": (BASE * -1e300, -1e300),
    "1e-300": (BASE * 1e-300, 1e-300),
    "max": (BASE / np.max(np.abs(BASE)) * 1.7e308, None),
    "subnormal": (BASE * 5e-320, None),
    "mixed": (np.where(_ALT == 0, 1e300, np.where(_ALT == 1, -1e300, 1e-300)) * (1 + 0.01 * BASE), None),
    "one huge": (np.concatenate([[1e300], BASE[1:]]), None),
    "sign flip at +-max": (np.sign(BASE) * 1.7e308, None),
}
LOSS_SCALES = {"1": 1.0, "1e300": 1e300, "1e-300": 1e-300}


def _check():
    return ScoreCorrelation()


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("loss_scale", LOSS_SCALES)
@pytest.mark.parametrize("name", SCORES)
def test_the_correlate_measurement_is_quiet_and_scale_free(name, loss_scale):
    scores, factor = SCORES[name]
    ls = LOSS_SCALES[loss_scale]
    losses = LOSSES * ls
    ids = [f"r{i}" for i in range(N)]
    v = measure_vectors(ids, losses, scores, LENGTHS, [{"a": float(s)} for s in scores])
    # scale-free statistics: the same numbers as on the same scores at a moderate scale
    ref_scores = BASE if factor is not None else scores / np.max(np.abs(scores))
    sign = -1.0 if factor is not None and factor < 0 else 1.0
    ref = measure_vectors(ids, LOSSES, ref_scores, LENGTHS)
    for key in ("pearson_r", "spearman_rho", "kendall_tau_b"):
        assert math.isclose(v[key], sign * ref[key], rel_tol=1e-9, abs_tol=1e-12), (key, v[key], ref[key])
    assert math.isclose(v["length"]["partial_r"], sign * ref["length"]["partial_r"], rel_tol=1e-9, abs_tol=1e-12)
    if sign > 0:
        assert math.isclose(v["ci"]["low"], ref["ci"]["low"], rel_tol=1e-9, abs_tol=1e-12)
        assert math.isclose(v["ci"]["high"], ref["ci"]["high"], rel_tol=1e-9, abs_tol=1e-12)
    assert -1 <= v["ci"]["low"] <= v["ci"]["high"] <= 1
    assert math.isclose(v["mean_loss"], float(np.mean(LOSSES)) * ls, rel_tol=1e-12)
    assert math.isclose(v["std_loss"], float(np.std(LOSSES)) * ls, rel_tol=1e-12)
    slope, intercept = v["fit"]["slope"], v["fit"]["intercept"]
    if factor is not None:  # the line scales exactly: loss = slope * score + intercept
        want = np.polyfit(BASE, LOSSES, 1)
        want_slope = float(want[0]) * ls / factor
        if math.isfinite(want_slope) and abs(want_slope) > 1e-300:
            assert math.isclose(slope, want_slope, rel_tol=1e-9), (slope, want_slope)
        assert math.isclose(intercept, float(want[1]) * ls, rel_tol=1e-9)
    # a value beyond float64 is named, never a silent inf; the finding says so
    assert v["out_of_range"] == [k for k in ("fit.slope", "fit.intercept") if math.isinf(v["fit"][k.split(".")[1]])]
    messages = [message for cond in _check().conditions(_settings())
                for message in [cond.judge(v)[1]] if isinstance(message, str)]
    if v["out_of_range"]:
        assert any("out of range" in m for m in messages), messages


def _settings():
    from objdebug.pipeline.profile import load_profile

    return load_profile("default").section("correlate")


def test_a_slope_beyond_float64_is_named_out_of_range():
    """Losses ~1 against scores ~5e-320: the slope is ~1e319, beyond float64."""
    v = measure_vectors([str(i) for i in range(N)], LOSSES, BASE * 5e-320, LENGTHS)
    assert v["out_of_range"] == ["fit.slope"] and math.isinf(v["fit"]["slope"])
    assert math.isfinite(v["pearson_r"]) and v["pearson_r"] < -0.9


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("scale", [1.0, 1e300, -1e300, 1e-300, 5e-320])
@pytest.mark.parametrize("kind", ["spread", "constant", "ties and zeros", "one pair"])
def test_the_align_statistics_are_quiet_and_scale_free(kind, scale):
    # (few tied differences: scipy's exact Wilcoxon with ties is a permutation test, 2**n calls)
    d = {"spread": 0.3 + 0.2 * BASE[:12], "constant": np.full(6, 0.7),
         "ties and zeros": np.array([0.0, 0.0, 1.0, 1.0, 1.0, -1.0, 2.0, 2.0]),
         "one pair": np.array([0.4])}[kind]
    p_w, p_t = stats.paired_greater(d * scale)
    # the reference: the same (for 5e-320, subnormal: quantized) values at a moderate scale
    ref_w, ref_t = stats.paired_greater((d * scale) / abs(scale) if np.any(d) else d)
    if scale > 0:
        assert math.isclose(p_w, ref_w, rel_tol=1e-12) and math.isclose(p_t, ref_t, rel_tol=1e-9)
    assert 0.0 <= p_w <= 1.0 and 0.0 <= p_t <= 1.0
    if kind == "spread" and scale == 1.0:  # against scipy directly (moderate scale, no ties)
        from scipy import stats as ss

        assert math.isclose(p_w, ss.wilcoxon(d, alternative="greater").pvalue, rel_tol=1e-12)
        assert math.isclose(p_t, ss.ttest_1samp(d, 0.0, alternative="greater").pvalue, rel_tol=1e-12)
    if kind == "constant":  # every pair ordered the same way: the t-test is decided by the sign
        assert p_t == (0.0 if scale > 0 else 1.0)
    mean, _ = stats.mean_std(d * scale)
    assert math.isclose(mean, float(np.mean((d * scale) / abs(scale))) * abs(scale), rel_tol=1e-12)


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("name", ["max", "sign flip at +-max", "1e300", "mixed"])
def test_the_scatter_figure_is_quiet(name):
    from objdebug.report.figures import scatter_png

    scores, _ = SCORES[name]
    png = scatter_png(scores, LOSSES, lengths=LENGTHS, r=-0.5, ci=(-0.6, -0.4),
                      fit=stats.linear_fit(scores, LOSSES))
    assert png.startswith(b"\x89PNG")


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("path", sorted((ROOT / "fixtures" / "correlate_data").glob("*.jsonl")),
                         ids=lambda p: p.stem)
def test_every_correlate_fixture_is_quiet(path):
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    scores = np.array([float(r["score"]) for r in rows])
    losses = 2.0 - 0.1 * scores + 0.01 * np.arange(len(rows))
    measure_vectors([r.get("id", str(i)) for i, r in enumerate(rows)], losses, scores,
                    np.arange(len(rows)) + 5.0, [r.get("scores", {}) for r in rows])


def test_a_cli_run_with_1e300_scores_has_an_empty_stderr(tmp_path):
    """Was exit 0 with `RuntimeWarning: overflow encountered in multiply` and a `RankWarning`
    (np.polyfit) on stderr."""
    import shutil

    (tmp_path / "targets").mkdir()
    shutil.copytree(ROOT / "fixtures" / "targets" / "correlate_bigram", tmp_path / "targets" / "t")
    (tmp_path / "correlate_data").mkdir()
    with open(tmp_path / "correlate_data" / "healthy.jsonl", "w") as out:
        for line in (ROOT / "fixtures" / "correlate_data" / "healthy.jsonl").read_text().splitlines():
            row = json.loads(line)
            row["score"] = row["score"] * 1e300
            out.write(json.dumps(row) + "\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3", OBJDEBUG_NO_CACHE="1")
    proc = subprocess.run([sys.executable, "-m", "objdebug.cli", "correlate", "-q", "--json",
                           str(tmp_path / "r.json")], cwd=tmp_path / "targets" / "t", env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == ""
    r = json.loads((tmp_path / "r.json").read_text())
    value = next(f["value"] for res in r["results"] for f in res["findings"] if f["code"] == "OBJ401")
    assert value < -0.5  # the healthy fixture's correlation, whatever the scores' scale
