"""One-sided paired tests of align's gaps without importing `scipy.stats`.

Why: `import scipy.stats` costs about a second and a half of a cold `objdebug align` on this
machine kind (1.2-4.4 s measured with `python -X importtime`, 2 shared cores), a tenth of the bare
computation's wall (issue 48), while the two p-values align reports need only `scipy.special`
(0.1-0.5 s). These follow SciPy 1.17's own code paths exactly (`scipy.stats.wilcoxon(d,
alternative="greater")` with its defaults: zero_method "wilcox", no continuity correction, method
"auto"; `scipy.stats.ttest_1samp(d, 0, alternative="greater")`), and hand every case they do not
reproduce to SciPy itself: zeros or tied magnitudes (SciPy then runs a permutation test or a
tie-corrected approximation). tests/test_rank_tests.py holds them to SciPy's values.
"""

from __future__ import annotations

import math

import numpy as np

EXACT_MAX = 50  # SciPy's "auto": the exact null distribution up to 50 differences


def _wilcoxon_pmf(n: int) -> np.ndarray:
    """P(R+ = r), r = 0 .. n(n+1)/2, under the null (SciPy's `_get_wilcoxon_distr`)."""
    c = np.ones(1, dtype=np.float64)
    for k in range(1, n + 1):
        prev = c
        c = np.zeros(k * (k + 1) // 2 + 1, dtype=np.float64)
        m = len(prev)
        c[:m] = prev * 0.5
        c[-m:] += prev * 0.5
    return c


def wilcoxon_greater(d) -> float:
    """p-value of the Wilcoxon signed-rank test that the differences `d` lean positive."""
    d = np.asarray(d, dtype=np.float64)
    n = d.size
    if n == 0:
        return float("nan")
    magnitude = np.abs(d)
    if np.any(d == 0) or np.unique(magnitude).size != n or not np.all(np.isfinite(d)):
        from scipy import stats  # zeros, ties or NaN: SciPy's own handling

        return float(stats.wilcoxon(d, alternative="greater").pvalue)
    ranks = np.empty(n, dtype=np.float64)
    ranks[np.argsort(magnitude, kind="stable")] = np.arange(1, n + 1, dtype=np.float64)
    r_plus = float(np.sum((d > 0) * ranks))
    if n > EXACT_MAX:
        from scipy.special import ndtr

        mean = n * (n + 1.0) * 0.25
        se = math.sqrt(n * (n + 1.0) * (2.0 * n + 1.0) / 24)
        return float(ndtr(-((r_plus - mean) / se)))
    pmf = _wilcoxon_pmf(n)
    k = int(math.floor(r_plus))
    if k <= n * (n + 1) / 4:
        return float(pmf[k:].sum())
    return float(1 - pmf[:k].sum())  # 1 - cdf(k - 1), as SciPy takes the upper half


def ttest_greater(d) -> float:
    """p-value of the one-sample t-test that the mean of `d` is above 0."""
    from scipy.special import stdtr

    d = np.asarray(d, dtype=np.float64)
    n = d.size
    if n < 2:
        return float("nan")
    mean = float(np.mean(d))
    var = float(np.var(d, ddof=1))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.divide(mean, np.sqrt(var / n))
    return float(stdtr(n - 1, -t))
