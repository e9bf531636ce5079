"""[task] kind = "embedding" (issue 47): the reference InfoNCE and triplet losses against numpy
float64 closed forms, and the kind's contract probe on a [B, D] encoder."""

import numpy as np
import pytest


def _cos(a, b):
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return a @ b.T


@pytest.mark.parametrize("tau, similarity", [(0.05, "cosine"), (0.7, "cosine"), (1.0, "dot")])
def test_info_nce_equals_the_closed_form(tau, similarity):
    import mindspore as ms

    from objdebug.losses import InfoNCELoss

    rng = np.random.default_rng(3)
    a, p = (rng.normal(0, 1, (6, 8)).astype(np.float32) for _ in range(2))
    s = (_cos(a, p) if similarity == "cosine" else a.astype(np.float64) @ p.T.astype(np.float64)) / tau
    want = -np.mean(np.diag(s) - np.log(np.exp(s).sum(1)))  # numpy float64 reference
    got = float(InfoNCELoss(tau, similarity)(ms.Tensor(a), ms.Tensor(p)).asnumpy())
    assert got == pytest.approx(want, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_triplet_equals_the_closed_form(distance):
    import mindspore as ms

    from objdebug.losses import TripletLoss

    rng = np.random.default_rng(4)
    a, p, n = (rng.normal(0, 1, (5, 8)).astype(np.float32) for _ in range(3))
    if distance == "euclidean":
        d = lambda x, y: np.linalg.norm(x.astype(np.float64) - y, axis=-1)  # noqa: E731
    else:
        d = lambda x, y: 1 - np.diag(_cos(x.astype(np.float64), y.astype(np.float64)))  # noqa: E731
    want = np.maximum(d(a, p) - d(a, n) + 1.0, 0).mean()
    got = float(TripletLoss(1.0, distance)(ms.Tensor(a), ms.Tensor(p), ms.Tensor(n)).asnumpy())
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_embedding_contract_probe(tmp_path):
    """An encoder's [B, D] passes the embedding probe (InfoNCE through `task.objective.pair`);
    the classifier's probe refuses a [B, T, K] output with the kind named."""
    from objdebug import api
    from objdebug.core.errors import InputError
    from objdebug.engine import runtime
    from objdebug.engine.core import Engine
    from objdebug.engine.target import load_target
    from objdebug.pipeline import task_kind

    (tmp_path / "objdebug.toml").write_text('''[task]
kind = "embedding"
[model]
factory = "objdebug.demo.task_models:BagEncoder"
[objective]
factory = "objdebug.losses:InfoNCELoss"
kwargs = { temperature = 0.05 }
''')
    cfg = api.load_config(tmp_path / "objdebug.toml")
    runtime.setup("CPU", "graph", 0)
    target = load_target(cfg)
    info = task_kind.check_target(target, Engine(target, batch_size=4))
    assert info["dim"] == 16 and info["outputs"] == 1
    with pytest.raises(InputError, match=r'task.kind = "classification" the model must return float logits \[B, C\]'):
        task_kind.check_output(np.zeros((4, 8, 5), np.float32) if False else _tensor((4, 8, 5)),
                               "classification", 4, 8, None)


def _tensor(shape):
    import mindspore as ms

    return ms.Tensor(np.zeros(shape, np.float32))


# --------------------------------------------------------------------------- the contrastive checks
from .test_tasks_classification import LazyRuns, _codes  # noqa: E402


_RUNS = LazyRuns(["grad.contrastive"])


@pytest.fixture
def emb_runs():
    """Runs made on first use, kept for the module: the default suite pays for three targets,
    `-m slow` for the other twins."""
    return _RUNS


def test_double_temperature_fails_where_the_healthy_twin_passes(emb_runs):
    assert "OBJ226" in _codes(emb_runs["emb_double_temperature"], "fail")
    assert emb_runs["emb_healthy"].exit_code == 0


@pytest.mark.slow
def test_healthy_contrastive_objectives_pass_ci_gate(emb_runs):
    for name in ("emb_healthy", "triplet_healthy"):
        r = emb_runs[name]
        assert r.exit_code == 0, [f.message for f in r.findings]
        value = r.results[0].value
        # the trained encoder's InfoNCE is 3e-4 nats, a difference of logits near 20: float32
        # agrees with the float64 reference to 1e-6 nats absolute, not 1e-5 relative
        assert value["loss"] == pytest.approx(value["reference"], rel=1e-5, abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("twin, code", [
    ("emb_double_temperature", "OBJ226"), ("emb_no_positive", "OBJ226"),
    ("emb_self_similarity", "OBJ226"), ("emb_unused_temperature", "OBJ227"),
    ("emb_not_normalised", "OBJ228"), ("triplet_unused_margin", "OBJ227"),
])
def test_contrastive_twins_fail_with_a_code_the_healthy_twin_lacks(emb_runs, twin, code):
    r = emb_runs[twin]
    assert code in _codes(r, "fail") and r.exit_code == 1, [f.message for f in r.findings]
    assert code not in _codes(emb_runs["emb_healthy"], "fail") | _codes(emb_runs["triplet_healthy"], "fail")


@pytest.mark.slow
def test_duplicate_positives_are_reported(emb_runs):
    r = emb_runs["emb_duplicates"]
    assert "OBJ229" in _codes(r, "warn") and r.exit_code == 1  # ci-gate: a warning fails
    assert "OBJ229" in _codes(emb_runs["emb_healthy"], "pass")
