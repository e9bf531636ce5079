"""[task] kind = "tagging" (issue 47): CRFLoss against a brute-force numpy float64 NLL (start /
end transitions included) and its Viterbi, the tagging twins' codes, healthy on ci-gate.
The CRF runs unroll one graph step per position and compile per shape: `slow`."""

import itertools

import numpy as np
import pytest

from .test_tasks_classification import _codes, _run


def _ref_nll(crf, e, tags, ignore=-100):
    """numpy float64 reference: log sum_y exp s(y) - s(tags) by enumerating every path over the
    scored positions of one row, s with start, emissions, transitions, end."""
    a, A, b = (p.asnumpy().astype(np.float64) for p in crf._parts())
    pos = [t for t in range(len(tags)) if tags[t] != ignore]
    if not pos:  # nothing scored: the empty path is the only one
        return 0.0
    k = e.shape[-1]

    def s(path):
        v = a[path[0]] + b[path[-1]] + sum(e[t, y] for t, y in zip(pos, path))
        return v + sum(A[path[i - 1], path[i]] for i in range(1, len(path)))

    scores = np.array([s(p) for p in itertools.product(range(k), repeat=len(pos))])
    log_z = scores.max() + np.log(np.exp(scores - scores.max()).sum())
    return log_z - s([tags[t] for t in pos])


@pytest.mark.parametrize("tags", [[2], [0, 1], [1, 2, 0], [2, 0, -100, -100], [1, -100, 2],
                                  [-100, 1, 2], [-100, -100, 0, -100], [-100, -100]])
def test_crf_loss_equals_brute_force_nll(tags):
    import mindspore as ms

    from objdebug.losses import CRFLoss

    crf = CRFLoss(3, seed=1)
    rng = np.random.default_rng(len(tags))
    e = rng.normal(0, 1.5, (1, len(tags), 3)).astype(np.float32)
    got = float(crf(ms.Tensor(e), ms.Tensor(np.array([tags], np.int32))).asnumpy())
    want = _ref_nll(crf, e[0].astype(np.float64), tags)
    assert got == pytest.approx(want, abs=1e-5) and got >= 0


def test_crf_viterbi_is_the_brute_force_argmax():
    import mindspore as ms

    from objdebug.losses import CRFLoss

    crf = CRFLoss(4, seed=2)
    e = np.random.default_rng(0).normal(0, 1, (2, 3, 4)).astype(np.float32)
    decoded = crf.decode(ms.Tensor(e)).asnumpy()
    for r in range(2):
        paths = list(itertools.product(range(4), repeat=3))
        best = min(paths, key=lambda p: _ref_nll(crf, e[r].astype(np.float64), list(p)))
        assert list(decoded[r]) == list(best)


def test_token_ce_tagging_healthy_passes_and_padding_scored_fails():
    healthy = _run("tag_healthy")
    assert healthy.exit_code == 0, [f.message for f in healthy.findings if f.verdict.value.lower() != "pass"]
    assert {"OBJ111", "OBJ201", "OBJ206", "OBJ220", "OBJ221"} <= _codes(healthy, "pass")
    twin = _run("tag_padding_scored", ["grad.ignored-label"])
    assert "OBJ221" in _codes(twin, "fail") and twin.exit_code == 1


@pytest.mark.slow
def test_crf_healthy_passes_ci_gate():
    r = _run("crf_healthy")
    assert r.exit_code == 0, [f.message for f in r.findings if f.verdict.value.lower() != "pass"]
    assert {"OBJ222", "OBJ223", "OBJ224", "OBJ225", "OBJ221"} <= _codes(r, "pass")
    value = next(x.value for x in r.results if x.check == "crf")
    assert all(abs(e["log_mass"]) < 1e-5 for e in value["enumerated"])


@pytest.mark.slow
@pytest.mark.parametrize("twin, checks, code", [
    ("crf_frozen_transitions", ["grad.crf"], "OBJ222"),
    ("crf_no_start_end", ["grad.crf"], "OBJ223"),
    ("crf_padding_scored", ["grad.ignored-label"], "OBJ221"),
])
def test_crf_twins_fail(twin, checks, code):
    r = _run(twin, checks)
    assert code in _codes(r, "fail"), [f.message for f in r.findings]


@pytest.mark.slow
def test_crf_called_with_a_mask_is_checked_like_the_reference():
    """A CRF layer called (emissions, tags, mask): objdebug derives the mask from the tags
    (label_pad_id) and every check runs on it; its numbers are CRFLoss's; a layer that ignores
    its mask fails OBJ221."""
    checks = ["grad.crf", "grad.ignored-label", "align.tag-ranking"]
    masked, ref = _run("crf_mask_healthy", checks), _run("crf_healthy", checks)
    assert masked.exit_code == 0, [f.message for f in masked.findings if f.verdict.value != "pass"]
    assert {"OBJ111", "OBJ221", "OBJ222", "OBJ223", "OBJ224", "OBJ225"} <= _codes(masked, "pass")
    a, b = (next(x.value for x in r.results if x.check == "tag-ranking") for r in (masked, ref))
    np.testing.assert_allclose([row["loss"] for row in a["table"]], [row["loss"] for row in b["table"]],
                               rtol=1e-6)
    twin = _run("crf_mask_ignored", ["grad.ignored-label"])
    assert "OBJ221" in _codes(twin, "fail") and twin.exit_code == 1
