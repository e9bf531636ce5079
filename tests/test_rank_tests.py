"""core/rank_tests.py: align's p-values without importing scipy.stats, held to SciPy's own values."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from objdebug.core.rank_tests import ttest_greater, wilcoxon_greater

gaps = st.lists(st.floats(-5, 5, allow_nan=False, width=32), min_size=2, max_size=80)
# real loss gaps: distinct magnitudes, no zeros (the branches rank_tests computes itself; ties and
# zeros are SciPy's own permutation test, slow to call many times)
distinct = st.lists(st.floats(0.0009765625, 5, width=32), min_size=2, max_size=80, unique=True).flatmap(
    lambda m: st.lists(st.sampled_from([-1.0, 1.0]), min_size=len(m), max_size=len(m)).map(
        lambda s: [a * b for a, b in zip(m, s)]))


@settings(max_examples=80, deadline=None)
@given(distinct)
def test_wilcoxon_equals_scipy(d):
    d = np.asarray(d, np.float64)
    assert wilcoxon_greater(d) == pytest.approx(stats.wilcoxon(d, alternative="greater").pvalue,
                                                rel=1e-9, abs=1e-15)


@settings(max_examples=80, deadline=None)
@given(gaps)
def test_ttest_equals_scipy(d):
    d = np.asarray(d, np.float64)
    if np.std(d) == 0:
        return  # align does not call it then
    ref = stats.ttest_1samp(d, 0.0, alternative="greater").pvalue
    assert ttest_greater(d) == pytest.approx(ref, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("n", [3, 12, 40, 50, 51, 120])
def test_each_branch_on_distinct_gaps(n):
    """Exact (n <= 50) and normal-approximation (n > 50) branches, no ties: SciPy's values."""
    d = np.random.default_rng(n).normal(0.3, 1.0, n)
    assert wilcoxon_greater(d) == pytest.approx(stats.wilcoxon(d, alternative="greater").pvalue, rel=1e-12)
    assert wilcoxon_greater(-d) == pytest.approx(stats.wilcoxon(-d, alternative="greater").pvalue, rel=1e-12)


def test_ties_and_zeros_go_to_scipy():
    d = np.array([0.0, 1.0, 1.0, -2.0, 3.0, 0.5, 0.5])
    assert wilcoxon_greater(d) == stats.wilcoxon(d, alternative="greater").pvalue
