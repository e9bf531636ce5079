"""The logit checks on a library model's own loss (issue 22): with the model itself as the
end-to-end target, its output head is probed (objdebug/engine/library_logits.py) and OBJ205-OBJ209,
OBJ701/OBJ702 and OBJ508/OBJ509 run on the library's loss in its own graph.

The numbers are the model + objective form's on the same checkpoint and rows (eco_hf vs eco_hf_e2e,
eco_mf vs eco_mf_e2e): the logit gradient of the library's loss equals the objective's; a
temperature inside the library's loss (the hf_style fixture's `loss_temperature` knob) fails
OBJ208. Contexts are cached per module, so each target loads and compiles once.
"""

import os
import tempfile

import numpy as np
import pytest

from .conftest import TARGETS, only_checks

_CTX: dict = {}


@pytest.fixture(scope="module", autouse=True)
def scratch_cwd():
    old = os.getcwd()
    os.chdir(tempfile.mkdtemp(prefix="objdebug-test-eco-logits-"))  # the MindFormers fixture writes ./output
    yield
    os.chdir(old)


def _profile():
    from objdebug.pipeline.profile import load_profile

    return load_profile("default")


def ctx_of(name, temperature=None, fresh=False):
    """The target's context, cached (`fresh`: a context of its own, no graph run on it yet)."""
    key = (name, temperature, fresh)
    if key not in _CTX:
        from objdebug.core.config import load_config
        from objdebug.engine import runtime
        from objdebug.engine.core import Engine
        from objdebug.engine.target import load_target
        from objdebug.pipeline.context import Context

        overrides = {"objective.kwargs": {"loss_temperature": temperature}} if temperature else None
        cfg = load_config(TARGETS / name / "objdebug.toml", overrides=overrides)
        runtime.setup(cfg.run.device, cfg.run.mode, cfg.run.seed)
        target = load_target(cfg)
        _CTX[key] = Context(config=cfg, target=target, engine=Engine(target, batch_size=8),
                            profile=_profile())
    return _CTX[key]


def findings(ctx, stage, names=None):
    from objdebug.pipeline.runner import run_check
    from objdebug.stages import grad, invariants, stress

    module = {"grad": grad, "invariants": invariants, "stress": stress}[stage]
    out = {}
    for check in module.checks():
        if names is not None and check.name not in names:
            continue
        res = run_check(check, ctx, ctx.profile.section(stage))
        assert res.error is None, res.error
        for f in res.findings:  # the first finding of a code (OBJ509: float16 before bfloat16)
            out.setdefault(f.code, f)
    return out


# --------------------------------------------------------------------------- pure helpers
def test_loss_labels_pair_each_head_position_with_its_label():
    from objdebug.engine.library_logits import loss_labels

    labels = np.array([[-100, 5, 6, 7], [-100, -100, 8, -100]], np.int32)
    # a model that shifts its labels: logits[t] vs labels[t + 1], the last position has none
    assert loss_labels(labels, 4, True, -100).tolist() == [[5, 6, 7, -100], [-100, 8, -100, -100]]
    # MindFormers drops the last token before its head: T - 1 positions
    assert loss_labels(labels, 3, True, -100).tolist() == [[5, 6, 7], [-100, 8, -100]]
    assert loss_labels(labels, 4, False, -100).tolist() == labels.tolist()


def test_the_head_is_the_vocabulary_wide_output_the_loss_reads():
    """A vocabulary-wide tensor the loss does not read (a softmax for a metric) is not the head;
    a model without one names why."""
    import mindspore as ms
    from mindspore import nn, ops

    from objdebug.engine import runtime
    from objdebug.engine.library_logits import find_head
    from objdebug.engine.pynative import pynative

    class Metric(nn.Cell):
        def construct(self, x):
            return ops.softmax(x, -1)

    class Head(nn.Cell):
        def construct(self, x):
            return x * 2.0

    class Model(nn.Cell):
        def __init__(self, read_head=True):
            super().__init__()
            self.metric, self.lm_head, self.read_head = Metric(), Head(), read_head

        def construct(self, x):
            probs = self.metric(x)        # vocabulary-wide, first, but never read by the loss
            logits = self.lm_head(x)
            return (logits if self.read_head else x * 3.0).sum() + 0.0 * probs.shape[0]

    runtime.setup("CPU", "graph", 0)
    x = ms.Tensor(np.ones((2, 5, 7), np.float32))
    with pynative():
        model = Model()
        head = find_head(model, lambda: model(x), 2, 5, 7)
        assert head["path"] == "lm_head" and head["ndim"] == 3 and head["drop"] == 0
        blind = Model(read_head=False)
        why = find_head(blind, lambda: blind(x), 2, 5, 7)["why"]
        assert "the loss does not change when the output of 'metric'" in why and "nor of the 1 after" in why
        assert "no sub-Cell" in find_head(model, lambda: model(x), 2, 5, 9)["why"]


def test_a_trained_head_that_gives_class_0_no_probability_is_found():
    """A trained head gives a class it never saw ~no probability (class 0 here: logit - 30): a
    probe that moved class 0 only left the float32 loss bit-identical and lost the head (issue 37).
    The probe moves every class (a seeded random direction over the vocabulary)."""
    import mindspore as ms
    from mindspore import nn, ops

    from objdebug.engine import runtime
    from objdebug.engine.library_logits import find_head
    from objdebug.engine.pynative import pynative

    offset = np.zeros(7, np.float32)
    offset[0] = -30.0

    class Head(nn.Cell):
        def construct(self, x):
            return x + ms.Tensor(offset)

    class Model(nn.Cell):
        def __init__(self):
            super().__init__()
            self.lm_head = Head()

        def construct(self, x, labels):
            logp = ops.log_softmax(self.lm_head(x), -1)
            return -ops.gather_elements(logp, 2, labels.reshape((2, 5, 1))).mean()

    runtime.setup("CPU", "graph", 0)
    rng = np.random.default_rng(1)
    x = ms.Tensor(rng.standard_normal((2, 5, 7)).astype(np.float32))
    labels = ms.Tensor(rng.integers(1, 7, (2, 5)).astype(np.int32))
    with pynative():
        model = Model()
        head = find_head(model, lambda: model(x, labels), 2, 5, 7)
    assert head.get("path") == "lm_head", head


# grad's checks that read the library's head (logit gradients, padding by the head or by padding
# more); gradient-health and finite-differences differentiate w.r.t. the parameters only
HEAD_CHECKS = {"padding-leakage", "supervision-coverage", "logit-gradient-scale", "likelihood-shape"}


def test_lost_logit_checks_are_one_warn_that_names_them(monkeypatch):
    """A library model whose head the probe cannot find (the hf_style fixture's loss computed
    without its lm_head Cell): its logit checks skip, and OBJ006 WARNs naming each one."""
    from objdebug import api
    from objdebug.core.config import load_config
    from objdebug.core.findings import Verdict

    cfg = load_config(TARGETS / "eco_hf_e2e" / "objdebug.toml",
                      overrides={"objective.kwargs": {"loss_reads_head": False}})
    only_checks(monkeypatch, grad=HEAD_CHECKS)  # a parameter-gradient check never needs the head
    result = api.run(cfg, stages=["grad"], profile="default", compile_cache=False)
    lost = [f for f in result.findings if f.code == "OBJ006"]
    assert len(lost) == 1 and lost[0].verdict is Verdict.WARN, lost
    skipped = sorted({f.code for f in result.findings if f.verdict is Verdict.SKIP
                      and "no output head the loss reads" in f.message})
    assert {"OBJ207", "OBJ208", "OBJ209"} <= set(skipped)
    assert f"{len(skipped)} logit check(s) could not run" in lost[0].message
    assert f"({', '.join(skipped)})" in lost[0].message and "lm_head" in lost[0].message
    # a library model whose head was found loses nothing: no OBJ006
    from objdebug.pipeline.coverage import lost_logit_checks

    found = {"head": {"path": "model.lm_head"}}
    assert lost_logit_checks(found, result.results) is None
    assert lost_logit_checks(None, result.results) is None  # not a library model


@pytest.mark.slow
def test_a_model_pynative_cannot_run_is_probed_in_graph_mode(monkeypatch):
    """mindone's own loss on CPU: PyNative mode lacks a kernel its loss path uses (the hf_style
    fixture's `pynative_kernel_missing` knob imitates it), graph mode has it. The setup probe falls
    back to graph mode: the loss, the shift and the head are found there (no hooks), and the logit
    checks run. Before: exit 2, "the model fails ... The kernel ConstantPadND unregistered"."""
    from objdebug import api
    from objdebug.core.config import load_config
    from objdebug.core.findings import Verdict

    cfg = load_config(TARGETS / "eco_hf_e2e" / "objdebug.toml",
                      overrides={"objective.kwargs": {"pynative_kernel_missing": True}})
    # gradient-health stays (a graph-mode probe that left the model changed would break its
    # parameter gradient); finite-differences runs on that same graph: left out
    only_checks(monkeypatch, grad=HEAD_CHECKS | {"gradient-health"})
    result = api.run(cfg, stages=["grad"], profile="default", compile_cache=False)
    assert not [f for f in result.findings if f.verdict is Verdict.ERROR]
    ran = {f.code: f.verdict for f in result.findings}
    assert "OBJ006" not in ran, [f.message for f in result.findings if f.code == "OBJ006"]
    assert all(ran.get(code) not in (None, Verdict.SKIP) for code in ("OBJ207", "OBJ208", "OBJ209")), ran
    note = " ".join(result.target["notes"])
    assert "read in graph mode (PyNative mode has no ConstantPadND kernel here)" in note, note
    assert "'model.lm_head', probed" in note and "it shifts the labels itself" in note, note


def test_a_cell_returning_a_tuple_is_not_taken_for_logits():
    """MindFormers 2.0's Cells return tuples: the hook's shape test must not read a tuple of
    tensors as a shape (before: exit 3, "Only one element tensors can be converted")."""
    import mindspore as ms

    from objdebug.engine.library_logits import _shape_fits, _vocab_shaped

    logits = ms.Tensor(np.zeros((2, 5, 7), np.float32))
    assert _vocab_shaped(logits, 2, 5, 7) == (3, 0)
    assert _vocab_shaped((logits, logits), 2, 5, 7) is None
    assert _vocab_shaped(ms.Tensor(np.zeros((2, 5, 7), np.int32)), 2, 5, 7) is None
    assert _shape_fits((8, 7), 2, 5, 7) == (2, 1) and _shape_fits((2, 5, 6), 2, 5, 7) is None


def test_the_graph_head_search_names_what_it_lost():
    """No vocabulary-wide output the loss reads, found in graph mode: a reason OBJ006 can name."""
    import mindspore as ms
    from mindspore import nn, ops

    from objdebug.engine.library_logits import find_head_graph

    class Model(nn.Cell):
        def __init__(self):
            super().__init__()
            self.side = nn.Dense(3, 7)  # first in the model's order: tried first
            self.lm_head = nn.Dense(3, 7)

        def construct(self, x):
            return (ops.softmax(self.side(x), -1) * 0).sum() + (self.lm_head(x) ** 2).mean()

    model = Model()
    x = ms.Tensor(np.random.default_rng(0).standard_normal((2, 5, 3)).astype(np.float32))
    old = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        def call():
            class Whole(nn.Cell):
                def __init__(self):
                    super().__init__(auto_prefix=False)
                    self.model = model

                def construct(self, x):
                    return self.model(x)
            return Whole()(x)
        head = find_head_graph(model, call, 2, 5, 7)
        assert head.get("path") == "lm_head", head  # 'side' is vocabulary-wide, the loss ignores it
        head = find_head_graph(model, call, 2, 5, 9)
        assert "no sub-Cell of the model returns logits" in head["why"], head
    finally:
        ms.set_context(mode=old)


# --------------------------------------------------------------------------- the library's own loss
@pytest.mark.parametrize("split, e2e", [("eco_hf", "eco_hf_e2e"), ("eco_mf", "eco_mf_e2e")])
def test_library_logit_gradient_equals_the_model_plus_objective_form(split, e2e):
    from objdebug.pipeline.run_data import logit_gradients

    a, b = logit_gradients(ctx_of(split)), logit_gradients(ctx_of(e2e))
    n = b["labels"].shape[1]  # MindFormers' head sees T - 1 positions, the HF-style one T
    assert n == a["labels"].shape[1] - (1 if "mf" in e2e else 0)
    assert np.array_equal(a["labels"][:, :n], b["labels"])
    assert (a["labels"][:, n:] == -100).all()
    assert b["outputs"][0] == pytest.approx(a["outputs"][0], rel=1e-6)
    scale = float(np.abs(a["grad"]).max())
    assert scale > 1e-4
    assert float(np.abs(a["grad"][:, :n] - b["grad"]).max()) <= 1e-6 * scale
    assert np.allclose(b["sq"], a["sq"][:, :n], rtol=1e-5, atol=1e-12)
    real = a["labels"][:, :n] != -100  # logits at padded positions may differ (no mask passed)
    assert np.allclose(a["logits"][:, :n][real], b["logits"][real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["eco_hf_e2e", pytest.param("eco_mf_e2e", marks=pytest.mark.slow)])
def test_logit_checks_pass_on_the_library_loss(name):
    from objdebug.core.findings import Verdict

    ctx = ctx_of(name)
    got = {**findings(ctx, "grad", ["padding-leakage", "supervision-coverage", "logit-gradient-scale",
                                    "likelihood-shape"]),
           **findings(ctx, "invariants", ["label-alignment", "logit-shift"])}
    for code in ("OBJ205", "OBJ207", "OBJ208", "OBJ209", "OBJ210", "OBJ701", "OBJ702"):
        assert got[code].verdict is Verdict.PASS, (code, got[code].message)
    assert "masked positions" in got["OBJ205"].message  # measured on the logit gradient, not by padding
    assert "consistent with a mean cross-entropy" in got["OBJ207"].message


def test_the_probe_leaves_the_model_as_the_user_built_it():
    import mindspore as ms

    from objdebug.engine.cells import BatchObjective
    from objdebug.pipeline.run_data import grad_batch, library_logits, logit_gradients

    ctx = ctx_of("eco_hf_e2e", fresh=True)
    target = ctx.target
    names = [p.name for p in target.trainable_params()]
    b = grad_batch(ctx)
    before = float(BatchObjective(target)(ms.Tensor(b.input_ids), ms.Tensor(b.labels))[0].asnumpy())
    lg = logit_gradients(ctx)
    handle = library_logits(ctx)
    assert handle.parent._cells["lm_head"] is handle.original  # noqa: SLF001
    assert [p.name for p in target.trainable_params()] == names
    assert not [n for n in target.objective.parameters_dict() if n.startswith("objdebug_")]
    after = float(BatchObjective(target)(ms.Tensor(b.input_ids), ms.Tensor(b.labels))[0].asnumpy())
    assert after == before == pytest.approx(float(lg["outputs"][0]), rel=1e-6)


def test_a_temperature_in_the_library_loss_fails_the_likelihood_shape():
    from objdebug.core.findings import Verdict

    got = findings(ctx_of("eco_hf_e2e", temperature=2.0), "grad", ["logit-gradient-scale", "likelihood-shape"])
    assert got["OBJ208"].verdict is Verdict.FAIL, got["OBJ208"].message
    assert "not a pure rescaling: likely a temperature" in got["OBJ207"].message


def test_invariants_that_need_other_shapes_say_so():
    from objdebug.core.findings import Verdict

    got = findings(ctx_of("eco_hf_e2e"), "invariants", ["upstream-gradient", "ignored-positions"])
    for code in ("OBJ703", "OBJ704"):
        assert got[code].verdict is Verdict.SKIP
        assert "runs on its own logits and batch only (OBJ701/OBJ702 run on them)" in got[code].message


def test_a_plain_end_to_end_cell_skips_with_its_reason():
    from objdebug.core.findings import Verdict

    got = findings(ctx_of("grad_e2e"), "grad", ["logit-gradient-scale"])
    assert got["OBJ207"].verdict is Verdict.SKIP
    assert "a plain construct(input_ids, labels) Cell" in got["OBJ207"].message


@pytest.mark.parametrize("split, e2e", [("eco_hf", "eco_hf_e2e"),
                                        pytest.param("eco_mf", "eco_mf_e2e", marks=pytest.mark.slow)])
def test_low_precision_runs_on_the_library_loss(split, e2e):
    from objdebug.core.findings import Verdict

    names = ["extreme-logits", "low-precision"]
    a, b = findings(ctx_of(split), "stress", names), findings(ctx_of(e2e), "stress", names)
    assert b["OBJ508"].verdict is Verdict.PASS and b["OBJ509"].verdict is not Verdict.SKIP
    # the same losses at every scale and dtype (a MindFormers head sees T - 1 positions, all scored ones)
    assert b["OBJ508"].message.split(":", 1)[1] == a["OBJ508"].message.split(":", 1)[1]
    assert b["OBJ509"].message == a["OBJ509"].message  # float16


def test_over_smoothing_reads_the_library_head():
    from objdebug.core.findings import Verdict

    a = findings(ctx_of("eco_hf"), "stress", ["over-smoothing"])["OBJ512"]
    b = findings(ctx_of("eco_hf_e2e"), "stress", ["over-smoothing"])["OBJ512"]
    assert b.verdict is Verdict.PASS and b.message == a.message  # the same top-5 mean over the same positions
