"""Correlation statistics for the correlate stage: pure numpy/scipy, float64, no MindSpore.

- `correlations(x, y)`: Pearson r with its p-value, Spearman rho, Kendall tau-b (scipy's numbers).
- `bootstrap_pearson_ci(x, y, ...)`: a seeded paired bootstrap interval for Pearson r, BCa
  (bias-corrected and accelerated, Efron & Tibshirani 14.3) or plain percentile. Resamples are
  drawn exactly as `scipy.stats.bootstrap(..., paired=True)` draws them, so with the same seed
  and no degenerate resample the interval equals scipy's.
- `partial_pearson(x, y, z)`: r(x, y) controlling for z, by the standard first-order formula;
  `residual_partial_pearson` computes it from regression residuals (the brute-force check).
- `paired_greater(d)`: one-sided Wilcoxon and t-test p-values of paired differences (align).

Scale (issue 46): every input is finite float64 (the data readers refuse NaN/Infinity), but a
human score may be 1e300 or 1e-300. Correlations, ranks and p-values are scale-free, so they are
computed on the values divided by an exact power of two (`_scaled`); a value with a scale (a
mean, a slope) is computed that way and scaled back, and where it is beyond float64 it is
reported as out of range (`linear_fit`), never as a numpy overflow. scipy's warnings about its
own method (a near-constant input, zeros in a Wilcoxon test) are caught: the functions here
check those cases themselves. Nothing reaches stderr (tests/test_stats_extremes.py).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np

CI_METHODS = ("bca", "percentile")
_MAX_BOOT_ELEMENTS = 1 << 24  # resample indices per chunk: bounds memory for large n


def _vectors(x, y) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"For 'correlations', 'x' and 'y' must have the same length, but got "
                         f"{x.size} and {y.size}.")
    return x, y


def _exponent(v: np.ndarray) -> int:
    """e with max |v| in [2**(e-1), 2**e): v / 2**e lies in (-1, 1); 0 for an empty, all-zero or
    non-finite v."""
    top = float(np.max(np.abs(v))) if v.size else 0.0
    if not math.isfinite(top) or top == 0.0:
        return 0
    return int(np.frexp(top)[1])


def _scaled(v: np.ndarray) -> np.ndarray:
    """`v` divided by a power of two near its largest magnitude: exact (no rounding, short of
    values 2**1074 times smaller than the largest, which become 0), and the correlations are
    scale-free, but sums of squares of scores like 1e300 no longer overflow (they gave a CI of
    [0.000, 0.000] and numpy warnings)."""
    e = _exponent(v)
    return np.ldexp(v, -e) if e else v


def _ldexp(x: float, e: int) -> float:
    """x * 2**e, inf (signed) where that is beyond float64 (no OverflowError, no warning)."""
    try:
        return math.ldexp(x, e)
    except OverflowError:
        return math.copysign(math.inf, x)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """scipy's warnings about its method (ConstantInputWarning, NearConstantInputWarning, the
    Wilcoxon's switch to the normal approximation, a t-test's precision loss) and numpy's
    floating-point flags off stderr: the callers check those cases on their own."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def mean_std(v) -> tuple[float, float]:
    """Mean and standard deviation of finite values of any scale (computed on `_scaled` values and
    scaled back: never an overflow); NaN for an empty v."""
    v = np.asarray(v, dtype=np.float64).ravel()
    if not v.size:
        return float("nan"), float("nan")
    e = _exponent(v)
    s = np.ldexp(v, -e) if e else v
    return _ldexp(float(s.mean()), e), _ldexp(float(s.std()), e)


def is_constant(v) -> bool:
    v = np.asarray(v, dtype=np.float64)
    return v.size == 0 or bool(np.all(v == v.flat[0]))


@dataclass
class Correlations:
    n: int
    pearson_r: float
    pearson_p: float
    spearman_rho: float
    spearman_p: float
    kendall_tau_b: float
    kendall_p: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def correlations(x, y) -> Correlations:
    """Pearson, Spearman and Kendall tau-b of x and y; NaN where undefined (n < 3, constant input)."""
    from scipy import stats

    x, y = _vectors(x, y)
    x, y = _scaled(x), _scaled(y)  # scale-free: no overflow for huge scores
    n = int(x.size)
    nan = float("nan")
    if n < 3 or is_constant(x) or is_constant(y):
        return Correlations(n, nan, nan, nan, nan, nan, nan)
    with quiet():  # a near-constant input: scipy's own warning, its r is still the best estimate
        pr = stats.pearsonr(x, y)
        sr = stats.spearmanr(x, y)  # ranks: scale-free by construction
        kt = stats.kendalltau(x, y, variant="b")
    return Correlations(n, float(pr.statistic), float(pr.pvalue), float(sr.statistic),
                        float(sr.pvalue), float(kt.statistic), float(kt.pvalue))


def _row_scaled(c: np.ndarray) -> np.ndarray:
    """Each row divided by a power of two near its largest magnitude (exact): a row whose values
    are all tiny next to the input's scale (a resample without the one score of 1e300) keeps its
    squares above float64's underflow, so its r is defined as it is mathematically."""
    top = np.max(np.abs(c), axis=-1, keepdims=True)
    e = np.where(np.isfinite(top) & (top > 0), np.frexp(top)[1], 0)
    return np.ldexp(c, -e)


def pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r of each row pair of x[B, n], y[B, n]; NaN for a row where either is constant."""
    xc = _row_scaled(x - x.mean(axis=-1, keepdims=True))
    yc = _row_scaled(y - y.mean(axis=-1, keepdims=True))
    den = np.sqrt((xc * xc).sum(axis=-1) * (yc * yc).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(den > 0, (xc * yc).sum(axis=-1) / den, np.nan)
    return np.clip(r, -1.0, 1.0)


@dataclass
class BootstrapCI:
    low: float
    high: float
    level: float
    method: str
    n_resamples: int
    seed: int
    dropped: int = 0   # resamples where r is undefined (a constant resample), left out

    def contains(self, value: float) -> bool:
        return bool(self.low <= value <= self.high)

    def to_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def _bootstrap_rs(x: np.ndarray, y: np.ndarray, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    n = x.size
    chunk = max(1, _MAX_BOOT_ELEMENTS // n)
    out = []
    for start in range(0, n_resamples, chunk):
        idx = rng.integers(0, n, (min(chunk, n_resamples - start), n))
        out.append(pearson_rows(x[idx], y[idx]))
    return np.concatenate(out)


def _jackknife_pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r with each pair left out in turn, each computed afresh (`pearson_rows`, chunked
    like the bootstrap): running sums lose a left-out value of 1e300's whole influence to
    cancellation (issue 46), a direct r per row does not."""
    n = x.size
    keep = ~np.eye(n, dtype=bool)
    chunk = max(1, _MAX_BOOT_ELEMENTS // max(n, 1))
    out = []
    for start in range(0, n, chunk):
        rows = keep[start:start + chunk]
        idx = np.nonzero(rows)[1].reshape(rows.shape[0], n - 1)
        out.append(pearson_rows(x[idx], y[idx]))
    return np.concatenate(out)


def bootstrap_pearson_ci(x, y, *, n_resamples: int = 2000, level: float = 0.95, seed: int = 0,
                         method: str = "bca") -> BootstrapCI:
    """Paired bootstrap interval for Pearson r; deterministic for a seed. NaN bounds when n < 3."""
    from scipy.special import ndtr, ndtri

    if method not in CI_METHODS:
        raise ValueError(f"For 'bootstrap_pearson_ci', the 'method' must be in {list(CI_METHODS)}, "
                         f"but got '{method}'.")
    if not 0 < level < 1:
        raise ValueError(f"For 'bootstrap_pearson_ci', the 'level' must be in (0, 1), but got {level}.")
    if int(n_resamples) < 1:
        raise ValueError(f"For 'bootstrap_pearson_ci', the 'n_resamples' must be >= 1, but got "
                         f"{n_resamples}.")
    x, y = _vectors(x, y)
    x, y = _scaled(x), _scaled(y)  # scale-free: no overflow for huge scores
    n = x.size
    nan = float("nan")
    if n < 3 or is_constant(x) or is_constant(y):
        return BootstrapCI(nan, nan, level, method, int(n_resamples), seed, int(n_resamples))
    rng = np.random.default_rng(seed)
    boot = _bootstrap_rs(x, y, int(n_resamples), rng)
    finite = boot[np.isfinite(boot)]
    dropped = int(boot.size - finite.size)
    if finite.size == 0:
        return BootstrapCI(nan, nan, level, method, int(n_resamples), seed, dropped)
    alpha = (1.0 - level) / 2.0
    lo_q, hi_q = alpha, 1.0 - alpha
    if method == "bca":
        r_hat = float(pearson_rows(x[None, :], y[None, :])[0])
        # bias correction: where r_hat sits among the resampled r's (ties count half)
        share = (np.count_nonzero(finite < r_hat) + np.count_nonzero(finite <= r_hat)) / (2 * finite.size)
        z0 = float(ndtri(share))
        # acceleration from the jackknife (leave one pair out)
        jack = _jackknife_pearson(x, y)
        jack = jack[np.isfinite(jack)]
        u = jack.mean() - jack if jack.size else np.zeros(1)
        den = (u * u).sum() ** 1.5
        a = float((u ** 3).sum() / (6.0 * den)) if den > 0 else 0.0
        if math.isfinite(z0):
            z_lo, z_hi = float(ndtri(alpha)), float(ndtri(1.0 - alpha))
            lo_q = float(ndtr(z0 + (z0 + z_lo) / (1.0 - a * (z0 + z_lo))))
            hi_q = float(ndtr(z0 + (z0 + z_hi) / (1.0 - a * (z0 + z_hi))))
        # else every resample sits on one side of r_hat: fall back to the percentile interval
    low, high = np.percentile(finite, [100.0 * lo_q, 100.0 * hi_q])
    return BootstrapCI(float(low), float(high), level, method, int(n_resamples), seed, dropped)


def fisher_ci(r: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """The analytic Fisher-z interval for Pearson r (a cross-check of the bootstrap one)."""
    from scipy.special import ndtri

    if n < 4 or not math.isfinite(r):
        return float("nan"), float("nan")
    z = math.atanh(max(min(r, 1 - 1e-15), -1 + 1e-15))
    half = float(ndtri(1 - (1 - level) / 2)) / math.sqrt(n - 3)
    return math.tanh(z - half), math.tanh(z + half)


def partial_pearson(x, y, z) -> tuple[float, float]:
    """Pearson r of x and y controlling for z, with its two-sided p-value (t test, n - 3 df)."""
    from scipy import stats

    x, y = _vectors(x, y)
    z = np.asarray(z, dtype=np.float64).ravel()
    n = x.size
    if n < 4 or is_constant(x) or is_constant(y) or is_constant(z):
        return float("nan"), float("nan")
    x, y, z = _scaled(x), _scaled(y), _scaled(z)  # scale-free: no overflow for huge scores
    rxy, rxz, ryz = (float(pearson_rows(a[None, :], b[None, :])[0]) for a, b in ((x, y), (x, z), (y, z)))
    if not all(math.isfinite(r) for r in (rxy, rxz, ryz)):
        return float("nan"), float("nan")  # a variable constant once scaled (values 2**1074 apart)
    den = math.sqrt(max((1 - rxz * rxz) * (1 - ryz * ryz), 0.0))
    if den == 0:
        return float("nan"), float("nan")  # x or y is a linear function of z: nothing is left
    r = float(np.clip((rxy - rxz * ryz) / den, -1.0, 1.0))
    df = n - 3
    if abs(r) >= 1:
        return r, 0.0
    t = r * math.sqrt(df / (1 - r * r))
    with quiet():
        return r, float(2 * stats.t.sf(abs(t), df))


def residual_partial_pearson(x, y, z) -> float:
    """Partial r by brute force: Pearson r of the residuals of x ~ z and y ~ z (least squares)."""
    x, y = _vectors(x, y)
    z = np.asarray(z, dtype=np.float64).ravel()
    design = np.column_stack([np.ones_like(z), z])
    rx = x - design @ np.linalg.lstsq(design, x, rcond=None)[0]
    ry = y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
    return float(np.corrcoef(rx, ry)[0, 1])


def linear_fit(x, y) -> tuple[float, float]:
    """Least-squares line y = slope * x + intercept; NaN when x is constant. Fitted on `_scaled`
    values and scaled back exactly: a slope beyond float64 (losses ~1 against scores ~1e-300
    give ~1e300; against 5e-324, ~1e323) is inf, for the caller to call out of range."""
    x, y = _vectors(x, y)
    if x.size < 2 or is_constant(x):
        return float("nan"), float("nan")
    ex, ey = _exponent(x), _exponent(y)
    xs, ys = np.ldexp(x, -ex), np.ldexp(y, -ey)
    xc = xs - xs.mean()
    sxx = float((xc * xc).sum())
    if sxx == 0.0:  # x constant once scaled (values 2**1074 apart): no line
        return float("nan"), float("nan")
    slope = float((xc * (ys - ys.mean())).sum()) / sxx
    intercept = float(ys.mean()) - slope * float(xs.mean())
    return _ldexp(slope, ey - ex), _ldexp(intercept, ey)


def paired_greater(d) -> tuple[float, float]:
    """One-sided p-values that paired differences `d` are > 0: (Wilcoxon signed-rank, t-test).
    Scale-free (on `_scaled` values); 1.0 for both with fewer than two differences or all zero;
    a t-test of differences that do not vary (relative spread below float64's resolution, where
    scipy's moment loses all precision) is 0.0 or 1.0 by the sign of their mean."""
    # SciPy's own tests without importing scipy.stats (a cold align's second largest import)
    from objdebug.core.rank_tests import ttest_greater, wilcoxon_greater

    d = _scaled(np.asarray(d, dtype=np.float64).ravel())
    if d.size < 2 or not np.any(d != 0):
        return 1.0, 1.0
    with quiet():  # zeros or ties: scipy switches to the normal approximation and says so
        p_wilcoxon = wilcoxon_greater(d)
        mean, std = float(d.mean()), float(d.std())
        if std > 1e-12 * abs(mean):
            p_ttest = ttest_greater(d)
        else:
            p_ttest = 0.0 if mean > 0 else 1.0
    return p_wilcoxon, p_ttest
