"""objdebug.core.stats: every number against scipy or a brute-force float64 computation."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from objdebug.core import stats


@pytest.fixture(scope="module")
def tied():
    """Loss-like continuous x against 1..5 ratings with many ties (as human scores are)."""
    rng = np.random.default_rng(7)
    score = rng.integers(1, 6, size=50).astype(float)
    loss = 6.0 - 0.8 * score + rng.normal(0, 1.0, size=50)
    return loss, score


def test_correlations_equal_scipy_with_ties(tied):
    x, y = tied
    c = stats.correlations(x, y)
    pr, sr = sps.pearsonr(x, y), sps.spearmanr(x, y)
    kt = sps.kendalltau(x, y, variant="b")
    assert c.n == 50
    assert c.pearson_r == pytest.approx(pr.statistic, abs=1e-12)
    assert c.pearson_p == pytest.approx(pr.pvalue, rel=1e-9)
    assert c.spearman_rho == pytest.approx(sr.statistic, abs=1e-12)
    assert c.spearman_p == pytest.approx(sr.pvalue, rel=1e-9)
    assert c.kendall_tau_b == pytest.approx(kt.statistic, abs=1e-12)
    assert c.kendall_p == pytest.approx(kt.pvalue, rel=1e-9)
    # tau-b differs from tau-c when there are ties: make sure the variant matters here
    assert c.kendall_tau_b != pytest.approx(sps.kendalltau(x, y, variant="c").statistic, abs=1e-6)
    assert c.pearson_r < -0.5


def test_correlations_undefined_are_nan():
    assert math.isnan(stats.correlations([1, 2, 3, 4], [2, 2, 2, 2]).pearson_r)
    assert math.isnan(stats.correlations([1, 2], [2, 1]).kendall_tau_b)
    with pytest.raises(ValueError, match="same length"):
        stats.correlations([1, 2, 3], [1, 2])


def test_pearson_rows_and_jackknife_brute_force(tied):
    x, y = tied
    idx = np.random.default_rng(0).integers(0, x.size, (5, x.size))
    rows = stats.pearson_rows(x[idx], y[idx])
    assert rows == pytest.approx([np.corrcoef(x[i], y[i])[0, 1] for i in idx], abs=1e-12)
    jack = stats._jackknife_pearson(x, y)
    ref = [np.corrcoef(np.delete(x, i), np.delete(y, i))[0, 1] for i in range(x.size)]
    assert jack == pytest.approx(ref, abs=1e-12)


@pytest.mark.parametrize("method,scipy_method", [("bca", "BCa"), ("percentile", "percentile")])
def test_bootstrap_ci_equals_scipy_bootstrap(tied, method, scipy_method):
    x, y = tied
    ci = stats.bootstrap_pearson_ci(x, y, n_resamples=999, seed=11, method=method)
    ref = sps.bootstrap((x, y), lambda a, b, axis: stats.pearson_rows(a, b), paired=True,
                        vectorized=True, n_resamples=999, method=scipy_method,
                        rng=np.random.default_rng(11)).confidence_interval
    assert ci.dropped == 0
    assert (ci.low, ci.high) == pytest.approx((ref.low, ref.high), abs=1e-12)


def test_percentile_ci_brute_force_loop(tied):
    x, y = tied
    ci = stats.bootstrap_pearson_ci(x, y, n_resamples=300, seed=3, method="percentile", level=0.9)
    rng = np.random.default_rng(3)
    idx = rng.integers(0, x.size, (300, x.size))
    rs = [sps.pearsonr(x[i], y[i]).statistic for i in idx]
    assert (ci.low, ci.high) == pytest.approx(tuple(np.percentile(rs, [5, 95])), abs=1e-12)


def test_bootstrap_ci_is_deterministic_and_brackets_r(tied):
    x, y = tied
    r = stats.correlations(x, y).pearson_r
    a = stats.bootstrap_pearson_ci(x, y, n_resamples=2000, seed=0)
    b = stats.bootstrap_pearson_ci(x, y, n_resamples=2000, seed=0)
    c = stats.bootstrap_pearson_ci(x, y, n_resamples=2000, seed=1)
    assert a == b
    assert (a.low, a.high) != (c.low, c.high)
    assert a.low < r < a.high and a.contains(r)
    # agrees with the analytic Fisher-z interval to within bootstrap noise
    lo, hi = stats.fisher_ci(r, x.size)
    assert a.low == pytest.approx(lo, abs=0.06) and a.high == pytest.approx(hi, abs=0.06)


def test_bootstrap_drops_degenerate_resamples():
    x = np.array([1.0, 1.0, 1.0, 1.0, 2.0])
    y = np.array([5.0, 4.0, 5.0, 4.0, 1.0])
    ci = stats.bootstrap_pearson_ci(x, y, n_resamples=500, seed=0)
    assert ci.dropped > 0  # resamples without the one x = 2 have constant x
    assert math.isfinite(ci.low) and math.isfinite(ci.high)
    assert math.isnan(stats.bootstrap_pearson_ci([1, 2], [2, 1]).low)
    with pytest.raises(ValueError, match="'method' must be in"):
        stats.bootstrap_pearson_ci(x, y, method="basic")


def test_fisher_ci_formula():
    lo, hi = stats.fisher_ci(-0.5, 28, 0.95)
    half = 1.959963984540054 / 5.0
    assert (lo, hi) == pytest.approx((math.tanh(math.atanh(-0.5) - half),
                                      math.tanh(math.atanh(-0.5) + half)), abs=1e-12)


def test_partial_correlation_equals_residual_regression_and_ols_t():
    rng = np.random.default_rng(5)
    length = rng.integers(10, 80, size=60).astype(float)
    score = 5 - 0.04 * length + rng.normal(0, 0.7, 60)
    loss = 0.05 * length - 0.3 * score + rng.normal(0, 0.5, 60)
    r, p = stats.partial_pearson(loss, score, length)
    assert r == pytest.approx(stats.residual_partial_pearson(loss, score, length), abs=1e-12)
    # independent p-value: the OLS t statistic of `score` in loss ~ 1 + score + length (n - 3 df)
    design = np.column_stack([np.ones(60), score, length])
    beta, res, *_ = np.linalg.lstsq(design, loss, rcond=None)
    sigma2 = res[0] / (60 - 3)
    se = math.sqrt(sigma2 * np.linalg.inv(design.T @ design)[1, 1])
    p_ref = 2 * sps.t.sf(abs(beta[1] / se), 60 - 3)
    assert p == pytest.approx(p_ref, rel=1e-9)
    # a constant control variable leaves nothing to partial out: undefined, not a number
    assert math.isnan(stats.partial_pearson(loss, score, np.ones(60))[0])


def test_linear_fit_equals_linregress(tied):
    x, y = tied
    slope, intercept = stats.linear_fit(y, x)
    ref = sps.linregress(y, x)
    assert (slope, intercept) == pytest.approx((ref.slope, ref.intercept), abs=1e-10)
    assert all(math.isnan(v) for v in stats.linear_fit([2, 2, 2], [1, 2, 3]))


def test_scatter_plot_writes_png(tmp_path, tied):
    from objdebug.report.figures import scatter_loss_vs_score

    x, y = tied
    loss = x.copy()
    loss[0] = np.nan  # left out, not an error
    path = scatter_loss_vs_score(y, loss, tmp_path / "sub" / "s.png", lengths=np.arange(50), r=-0.7,
                                 ci=(-0.8, -0.6), fit=stats.linear_fit(y[1:], loss[1:]))
    data = open(path, "rb").read()
    assert path.endswith("s.png") and data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_scatter_png_is_byte_stable_and_written_atomically(tmp_path, tied):
    from objdebug.report.figures import scatter_loss_vs_score

    x, y = tied
    a = scatter_loss_vs_score(y, x, tmp_path / "a.png", r=-0.7, ci=(-0.8, -0.6), ci_method="bca")
    b = scatter_loss_vs_score(y, x, tmp_path / "b.png", r=-0.7, ci=(-0.8, -0.6), ci_method="bca")
    data = open(a, "rb").read()
    assert data == open(b, "rb").read()
    assert b"matplotlib" not in data.lower()  # no Software tag with the version in it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.png"]  # no temp files left
