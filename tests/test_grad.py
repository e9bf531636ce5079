"""The grad stage (OBJ2xx) on tiny fixture targets, against numpy float64 references.

Each target is loaded once per module; broken targets run only the checks they must trigger, so
the file compiles about 20 small graphs in all.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # fixtures.grad_losses is referenced by the fixture configs
    sys.path.insert(0, str(ROOT))

from objdebug.pipeline.context import Context  # noqa: E402
from objdebug.core.errors import InputError  # noqa: E402
from objdebug.core.findings import Verdict  # noqa: E402
from objdebug.engine.gradients import layer_of, reference_mean_ce_grad  # noqa: E402
from objdebug.pipeline.profile import load_profile  # noqa: E402
from objdebug.rules import get_rule  # noqa: E402
from objdebug.stages import grad as G  # noqa: E402
from objdebug.stages import stage_checks  # noqa: E402
from objdebug.pipeline.runner import run_check  # noqa: E402  (the runner reviews verdicts)

from .conftest import target_context  # noqa: E402

PROFILE = load_profile("default")
TH = PROFILE.section("grad")


@pytest.fixture(scope="module", autouse=True)
def scratch_cwd():
    old = os.getcwd()
    tmp = tempfile.mkdtemp(prefix="objdebug-test-grad-")  # MindSpore may drop rank_0/ here
    os.chdir(tmp)
    yield
    os.chdir(old)


@pytest.fixture(scope="module")
def ctx_of():
    cache: dict[str, Context] = {}

    def get(name: str) -> Context:
        if name not in cache:
            cache[name] = target_context(name, PROFILE, "grad")
        return cache[name]
    return get


def findings_of(ctx: Context, cls) -> dict:
    res = run_check(cls(), ctx, TH)
    assert res.error is None, res.error
    return {"value": res.value, **{f.code: f for f in res.findings}}


def run_all(ctx: Context) -> dict:
    out = {}
    for check in stage_checks("grad"):
        res = run_check(check, ctx, TH)
        assert res.error is None, res.error
        out[check.name] = res.value
        out.update({f.code: f for f in res.findings})
    return out


def softmax64(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    x = logits.astype(np.float64) / temperature
    x -= x.max(-1, keepdims=True)
    p = np.exp(x)
    return p / p.sum(-1, keepdims=True)


def ce_grad_sq(logits, labels, scored, temperature=1.0, n=None):
    """Reference: squared norm per position of d mean_CE(logits / T) / d logits, float64."""
    p = softmax64(logits, temperature)
    onehot = np.zeros_like(p)
    np.put_along_axis(onehot, np.where(scored, labels, 0)[..., None].astype(np.int64), 1.0, -1)
    n = n or int(scored.sum())
    g = (p - onehot) / (temperature * n)
    return np.where(scored, (g ** 2).sum(-1), 0.0)


# --------------------------------------------------------------------------- pure helpers
def test_layer_of_groups_by_numbered_prefix():
    assert layer_of("blocks.0.attn.qkv.weight") == "blocks.0"
    assert layer_of("model.layers.11.mlp.w") == "model.layers.11"
    assert layer_of("lm_head.weight") == "lm_head"
    assert layer_of("route") == "route"


def test_reference_mean_ce_grad_matches_numerical_derivative():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 3, 5))
    labels = np.array([[1, -100, 4], [0, 2, -100]])
    scored = labels != -100

    def loss(x):
        logp = np.log(softmax64(x))
        picked = np.take_along_axis(logp, np.where(scored, labels, 0)[..., None], -1)[..., 0]
        return -(picked * scored).sum() / scored.sum()

    num = np.zeros_like(logits)
    for idx in np.ndindex(logits.shape):
        e = np.zeros_like(logits)
        e[idx] = 1e-6
        num[idx] = (loss(logits + e) - loss(logits - e)) / 2e-6
    ref = reference_mean_ce_grad(logits, labels, -100)
    np.testing.assert_allclose(ref, (num ** 2).sum(-1), rtol=1e-6, atol=1e-14)


def test_every_grad_code_has_a_rule_page():
    for code in ("OBJ201", "OBJ202", "OBJ203", "OBJ204", "OBJ205", "OBJ206", "OBJ207"):
        rule = get_rule(code)
        assert rule.stage == "grad" and rule.fix


# --------------------------------------------------------------------------- healthy
def test_healthy_masked_ce_passes_and_matches_host_gradients(ctx_of):
    import mindspore as ms

    from objdebug.engine.cells import BatchObjective

    ctx = ctx_of("grad_healthy")
    probe = G.grad_probe(ctx)
    before = [p.data.asnumpy().copy() for p in probe.params]
    out = run_all(ctx)
    for code in ("OBJ201", "OBJ202", "OBJ203", "OBJ204", "OBJ205", "OBJ206", "OBJ207"):
        assert out[code].verdict == Verdict.PASS, out[code].message
    # FD moved the parameters in place: they are restored bit for bit
    for p, b in zip(probe.params, before):
        assert np.array_equal(p.data.asnumpy(), b)

    # Independent reference: value_and_grad pulled to the host, norms in float64.
    batch = G.grad_batch(ctx)
    fn = ms.value_and_grad(BatchObjective(ctx.target), None, ms.ParameterTuple(probe.params),
                           has_aux=True)
    (total, _), grads = fn(ms.Tensor(batch.input_ids), ms.Tensor(batch.labels))
    host = [g.asnumpy().astype(np.float64) for g in grads]
    norms = np.array([np.sqrt((g ** 2).sum()) for g in host])
    health = out["gradient-health"]
    np.testing.assert_allclose([p["norm"] for p in health["params"]], norms, rtol=1e-5)
    assert health["global_norm"] == pytest.approx(np.sqrt((norms ** 2).sum()), rel=1e-5)
    assert health["mean_param_norm"] == pytest.approx(norms.mean(), rel=1e-5)
    assert health["max_mean_ratio"] == pytest.approx(norms.max() / norms.mean(), rel=1e-5)
    assert [p["zero_share"] for p in health["params"]] == pytest.approx(
        [float((g == 0).mean()) for g in host])
    # embedding rows of bytes absent from the batch get exact zeros, not the whole table
    assert 0 < health["params"][0]["zero_share"] < 1

    # The batch loss is the real objective: it equals float64 CE of the model's logits.
    logits = ctx.engine.logits(batch.input_ids)
    scored = batch.labels != -100
    p = softmax64(logits)
    nll = -np.log(np.take_along_axis(p, np.where(scored, batch.labels, 0)[..., None], -1)[..., 0])
    assert health["loss"] == pytest.approx(float(nll[scored].mean()), rel=1e-5)
    assert float(total.asnumpy()) == pytest.approx(health["loss"], rel=1e-6)

    # Directional derivatives reduced in graph == host g.d; FD agrees with them. The first
    # direction is the normalized gradient: its derivative is |g|, the host gradient's norm.
    dirs = G.fd_directions(ctx)
    host_gdot = [sum(float((g * d[k]).sum()) for g, d in zip(host, dirs)) for k in range(len(dirs[0]))]
    fd = out["finite-differences"]
    rows = fd["directions"]
    assert [r["direction"] for r in rows] == ["gradient", "random 0", "random 1", "random 2"]
    assert rows[0]["autodiff"] == pytest.approx(np.sqrt((norms ** 2).sum()), rel=1e-5)
    np.testing.assert_allclose([r["autodiff"] for r in rows[1:]], host_gdot, rtol=1e-4)
    ghat = probe.gradient_direction(G.param_gradients(ctx))
    gn = np.sqrt(sum((g ** 2).sum() for g in host))
    for a, g in zip(ghat, host):
        np.testing.assert_allclose(a[0], g / gn, rtol=1e-4, atol=1e-7)
    assert fd["typical_gdot"] == pytest.approx(gn / np.sqrt(sum(g.size for g in host)), rel=1e-5)
    assert fd["max_rel_error"] < 1e-2

    # Leakage and scale against numpy.
    leak = out["padding-leakage"]
    assert leak["masked"] == int((batch.labels == -100).sum()) and leak["leaking"] == 0
    assert out["logit-gradient-scale"]["ratio"] == pytest.approx(1.0, abs=1e-4)

    # One compile per graph: the parameter gradient (model.forward -> objective.logit_grad ->
    # model.vjp) once, and the 4 directions x 3 steps x 2 finite-difference totals through
    # model.forward + objective.forward, forward only (each sample's loss's graph, none of their
    # own; moving the parameters recompiles nothing).
    graphs = [r.graph for r in ctx.engine.compiles.records]
    assert [graphs.count(g) for g in ("model.forward", "objective.logit_grad", "model.vjp",
                                      "objective.forward")] == [1, 1, 1, 1]
    assert "objective.param_grad" not in graphs


def test_mindspore_cross_entropy_with_matching_ignore_index_passes(ctx_of):
    out = run_all(ctx_of("grad_ms_ce"))
    for code in ("OBJ201", "OBJ202", "OBJ203", "OBJ204", "OBJ205", "OBJ206", "OBJ207"):
        assert out[code].verdict == Verdict.PASS, out[code].message


# --------------------------------------------------------------------------- broken
def test_ignore_index_mismatch_leaks_into_padding(ctx_of):
    ctx = ctx_of("grad_ignore_mismatch")
    out = findings_of(ctx, G.PaddingLeakage)
    v, f = out["value"], out["OBJ205"]
    batch = G.grad_batch(ctx)
    masked = batch.labels == 0
    assert f.verdict == Verdict.FAIL
    assert v["leaking"] == v["masked"] == int(masked.sum()) > 0
    assert f"{v['leaking']} of {v['masked']} masked positions (label_pad_id=0)" in f.message
    # reference: CE over every position (pads scored as class 0), mean over all positions
    logits = ctx.engine.logits(batch.input_ids)
    everything = np.ones_like(masked)
    sq = ce_grad_sq(logits, batch.labels, everything)
    assert v["leak_share"] == pytest.approx(sq[masked].sum() / sq.sum(), rel=1e-4)
    scale = findings_of(ctx, G.LogitGradientScale)
    n = int((~masked).sum())
    assert scale["value"]["ratio"] == pytest.approx(n / masked.size, rel=1e-4)
    assert "masked ones included" in scale["value"]["cause"]


def test_temperature_scales_logit_gradient_about_tenfold(ctx_of):
    ctx = ctx_of("grad_temperature")
    out = findings_of(ctx, G.LogitGradientScale)
    batch = G.grad_batch(ctx)
    logits = ctx.engine.logits(batch.input_ids)
    scored = batch.labels != -100
    ref = np.sqrt(ce_grad_sq(logits, batch.labels, scored, temperature=0.1).sum()
                  / ce_grad_sq(logits, batch.labels, scored).sum())
    ratio = out["value"]["ratio"]
    assert ratio == pytest.approx(ref, rel=1e-4)
    assert 8 < ratio < 16
    assert out["OBJ207"].verdict == Verdict.FAIL and "temperature" in out["value"]["cause"]


def test_sum_reduction_scales_by_number_of_scored_tokens(ctx_of):
    ctx = ctx_of("grad_sum")
    out = findings_of(ctx, G.LogitGradientScale)
    n = int((G.grad_batch(ctx).labels != -100).sum())
    assert out["value"]["ratio"] == pytest.approx(n, rel=1e-4)
    assert out["OBJ207"].verdict == Verdict.FAIL
    assert "sum instead of a mean" in out["value"]["cause"]


def test_nan_loss_fails_and_blocks_other_judgements(ctx_of):
    ctx = ctx_of("grad_nan")
    out = findings_of(ctx, G.GradientHealth)
    assert out["OBJ203"].verdict == Verdict.FAIL
    assert not np.isfinite(out["value"]["loss"]) and out["value"]["nonfinite_total"] > 0
    assert out["OBJ201"].verdict == out["OBJ202"].verdict == Verdict.SKIP
    assert findings_of(ctx, G.FiniteDifferences)["OBJ206"].verdict == Verdict.SKIP


def test_argmax_and_unused_parameters_are_disconnected(ctx_of):
    out = findings_of(ctx_of("grad_argmax"), G.GradientHealth)
    assert out["OBJ204"].verdict == Verdict.FAIL
    assert out["value"]["disconnected"] == ["route", "unused"]
    assert "route, unused" in out["OBJ204"].message


def test_lying_bprop_disagrees_with_finite_differences(ctx_of):
    out = findings_of(ctx_of("grad_lying_bprop"), G.FiniteDifferences)
    assert out["OBJ206"].verdict == Verdict.FAIL
    for r in out["value"]["directions"]:  # the bprop halves the gradient: autodiff = FD / 2
        assert r["autodiff"] == pytest.approx(0.5 * r["finite_difference"], rel=2e-2)
    assert out["value"]["max_rel_error"] == pytest.approx(0.5, abs=2e-2)
    # along the (reported, halved) gradient direction the error is the full 0.5
    grad_row = out["value"]["directions"][0]
    assert grad_row["direction"] == "gradient" and grad_row["rel_error"] == pytest.approx(0.5, abs=1e-2)


# --------------------------------------------------------------------------- end-to-end form
def test_end_to_end_healthy(ctx_of):
    out = run_all(ctx_of("grad_e2e"))
    for code in ("OBJ201", "OBJ202", "OBJ203", "OBJ204", "OBJ205", "OBJ206"):
        assert out[code].verdict == Verdict.PASS, out[code].message
    assert out["OBJ207"].verdict == Verdict.SKIP
    # same weights and data as grad_healthy: the end-to-end loss is the split form's loss
    assert out["gradient-health"]["loss"] == pytest.approx(
        G.param_gradients(ctx_of("grad_healthy")).loss, rel=1e-6)


def test_end_to_end_padding_changes_loss(ctx_of):
    ctx = ctx_of("grad_e2e_leak")
    out = findings_of(ctx, G.PaddingLeakage)
    v = out["value"]
    assert out["OBJ205"].verdict == Verdict.FAIL
    assert v["form"] == "end-to-end" and v["changed"] == v["rows"] == 8
    assert v["padded_length"] > v["length"]
    assert abs(v["mean_loss_padded"] - v["mean_loss"]) > 1e-3


# --------------------------------------------------------------------------- options and CLI
def test_bad_batch_size_is_an_input_error(ctx_of):
    base = ctx_of("grad_healthy")
    ctx = Context(config=base.config, target=base.target, engine=base.engine, profile=PROFILE,
                  options={"batch_size": 0})
    with pytest.raises(InputError, match="--batch-size"):
        run_check(G.GradientHealth(), ctx, TH)


def test_samples_option_fills_the_batch_with_copies_and_reuses_the_graph(ctx_of):
    base = ctx_of("grad_healthy")
    G.param_gradients(base)  # the probe for [8, 32] is compiled
    before = base.engine.compiles.count
    ctx = Context(config=base.config, target=base.target, engine=base.engine, profile=PROFILE,
                  options={"batch_size": 8, "samples": 3})
    out = findings_of(ctx, G.GradientHealth)
    assert out["value"]["batch"]["data_rows"] == 3 and out["value"]["batch"]["filled_rows"] == 5
    assert out["OBJ203"].verdict == Verdict.PASS
    assert base.engine.compiles.count == before  # same shape, same compiled probe


def test_target_without_trainable_parameters_skips_parameter_checks(ctx_of, monkeypatch):
    base = ctx_of("grad_healthy")
    monkeypatch.setattr(base.target, "trainable_params", lambda: [])  # e.g. everything frozen
    ctx = Context(config=base.config, target=base.target, engine=base.engine, profile=PROFILE)
    out = {}
    for check in stage_checks("grad"):
        res = run_check(check, ctx, TH)
        assert res.error is None, res.error  # was: GradientProbe raised -> four ERRORs
        out.update({f.code: f for f in res.findings})
    for code in ("OBJ201", "OBJ206"):
        assert out[code].verdict == Verdict.SKIP and "no trainable parameters" in out[code].message
    # the logit gradients need no parameters: these still run and judge
    assert out["OBJ205"].verdict == out["OBJ207"].verdict == Verdict.PASS
    with pytest.raises(ValueError, match="trainable parameters"):
        G.grad_probe(ctx).parameters(G.grad_batch(ctx))


def test_loss_at_reuses_one_saved_copy_and_restores_once(ctx_of):
    ctx = ctx_of("grad_healthy")
    probe, batch, dirs = G.grad_probe(ctx), G.grad_batch(ctx), G.fd_directions(ctx)
    before = [p.data.asnumpy().copy() for p in probe.params]
    alone = probe.loss_at(batch, dirs, 1e-3, 0)  # no saved copy: restores by itself
    for p, b in zip(probe.params, before):
        assert np.array_equal(p.data.asnumpy(), b)
    with probe.saved_parameters() as saved:
        assert probe.parameter_norm(saved) == pytest.approx(probe.parameter_norm(), rel=1e-12)
        assert probe.loss_at(batch, dirs, 1e-3, 0, saved) == alone
        minus = probe.loss_at(batch, dirs, -1e-3, 0, saved)  # moved from theta, not from +eps
        assert not np.array_equal(probe.params[0].data.asnumpy(), before[0])  # not restored yet
    assert minus == probe.loss_at(batch, dirs, -1e-3, 0)
    for p, b in zip(probe.params, before):
        assert np.array_equal(p.data.asnumpy(), b)


@pytest.mark.parametrize("name, graphs", [
    ("grad_healthy", ["model.forward", "objective.forward"]),  # split form, float32 logits
    ("grad_e2e", ["objective.param_grad.static"]),  # end-to-end: the gradient's static graph
])
def test_finite_difference_totals_are_the_differentiated_total(ctx_of, monkeypatch, name, graphs):
    """The FD evaluations need the batch total only; in the split form they take it from the
    model's forward + the objective alone, forward only (the per-sample loss's graph, on the
    whole batch), not a forward + backward: the same number the parameter-gradient graph
    differentiates, and no graph of their own."""
    ctx = ctx_of(name)
    probe, batch, dirs = G.grad_probe(ctx), G.grad_batch(ctx), G.fd_directions(ctx)
    (total, _), _ = probe._forward_backward(batch)
    with probe.saved_parameters() as saved:
        probe.loss_at(batch, dirs, 0.0, 0, saved)  # compile what the path needs
        before = ctx.engine.compiles.count
        called, call = [], ctx.engine.call
        monkeypatch.setattr(ctx.engine, "call", lambda n, *a, **k: called.append(n) or call(n, *a, **k))
        assert probe.batch_total(batch) == pytest.approx(float(total.asnumpy()), rel=1e-6)
        assert called == graphs
        moved = probe.loss_at(batch, dirs, 1e-2, 0, saved)
        monkeypatch.undo()
        (moved_total, _), _ = probe._forward_backward(batch)  # at theta + eps d still
        assert moved == pytest.approx(float(moved_total.asnumpy()), rel=1e-6)
        assert moved != pytest.approx(float(total.asnumpy()), rel=1e-9)
    assert ctx.engine.compiles.count == before


def test_finite_difference_totals_of_other_logit_dtypes_come_from_the_gradient_graph(ctx_of, monkeypatch):
    """Logits that are not float32 (a model run in float16) would be scored by the float32 logit
    graph differently from the model's own graph: the total then comes from the gradient's
    graph (its static twin at the batch's shape)."""
    import mindspore as ms

    ctx = ctx_of("grad_healthy")
    probe, batch = G.grad_probe(ctx), G.grad_batch(ctx)
    (total, _), _ = probe._forward_backward(batch)
    called, call = [], ctx.engine.call

    def half_logits(name, *a, **k):
        called.append(name)
        out = call(name, *a, **k)
        return out.astype(ms.float16) if name == "model.forward" else out
    monkeypatch.setattr(ctx.engine, "call", half_logits)
    assert probe.batch_total(batch) == pytest.approx(float(total.asnumpy()), rel=1e-6)
    assert called == ["model.forward", "objective.param_grad.static"]


@pytest.mark.skipif(not (ROOT / "objdebug" / "demo" / "demo.ckpt").is_file(),
                    reason="the demo checkpoint is not built yet")
def test_cli_grad_demo_end_to_end(tmp_path):
    from typer.testing import CliRunner

    from objdebug.cli import app

    report = tmp_path / "grad.json"
    res = CliRunner().invoke(app, ["grad", "--demo", "--json", str(report)])
    assert res.exit_code == 0, res.output
    data = json.loads(report.read_text())
    codes = {f["code"]: f["verdict"] for r in data["results"] for f in r["findings"]}
    assert set(codes) == {"OBJ201", "OBJ202", "OBJ203", "OBJ204", "OBJ205", "OBJ206", "OBJ207", "OBJ208",
                          "OBJ209", "OBJ210"}
    assert set(codes.values()) == {"PASS"}
