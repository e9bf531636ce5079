"""correlate: per-sample loss vs human score on a byte-bigram LM run in graph mode.

The fixture LM's logits are a table of log bigram probabilities, so the objective's per-sample
losses have an exact numpy float64 reference; every correlation is compared with scipy on the
measured vectors. One loaded target (one compile) serves every scores file of the mean-loss
fixture; the summed-loss, NaN and CLI cases load their own.
"""

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats as sps

from objdebug import api
from objdebug.core import stats
from objdebug.engine import runtime
from objdebug.core.config import load_config
from objdebug.pipeline.context import Context
from objdebug.engine.data import build_labels
from objdebug.engine.core import Engine
from objdebug.core.findings import Verdict
from objdebug.pipeline.profile import load_profile
from objdebug.stages.correlate import ScoreCorrelation, measure_vectors

SCATTER_NAME = "correlate_scatter.png"  # the figure a run with --out writes (report/figures.py)
from objdebug.engine.target import load_target
from objdebug.pipeline.runner import run_check  # the runner reviews verdicts (untrained-model notes)

from .conftest import FIXTURES, ROOT, TARGETS, settings

DATA = FIXTURES / "correlate_data"
DEMO = ROOT / "objdebug" / "demo"


@pytest.fixture(scope="module")
def bigram():
    """The mean-loss bigram target, loaded and compiled once for this module."""
    cfg = load_config(TARGETS / "correlate_bigram" / "objdebug.toml")
    profile = load_profile("default")
    runtime.setup(cfg.run.device, cfg.run.mode, cfg.run.seed)
    with runtime.scratch_dir():
        target = load_target(cfg)
        engine = Engine(target, batch_size=profile.section("engine")["batch_size"])
        engine.stage = "correlate"
        yield cfg, target, engine, profile


def correlate(bigram, scores, out_dir=None):
    cfg, target, engine, profile = bigram
    path = str(DATA / f"{scores}.jsonl") if scores else None
    ctx = Context(config=replace(cfg, data=replace(cfg.data, scores=path)), target=target,
                  engine=engine, profile=profile, out_dir=out_dir)
    result = run_check(ScoreCorrelation(), ctx, profile.section("correlate"))
    assert result.error is None, result.error
    return result, ctx


def by_code(result):
    return {f.code: f for f in result.findings}


def points(value):
    pts = value["points"]
    return (np.array([p["loss"] for p in pts]), np.array([p["score"] for p in pts]),
            np.array([p["length"] for p in pts], dtype=float))


def reference_losses(scores_file):
    """float64 reference: masked mean CE of the bigram table over response positions."""
    from fixtures.correlate_models import bigram_log_probs, corpus_sentences

    table = bigram_log_probs(corpus_sentences()).astype(np.float64)
    logp = table - np.log(np.exp(table).sum(-1, keepdims=True))
    out = []
    for line in open(scores_file, encoding="utf-8"):
        row = json.loads(line)
        prompt, resp = list(row.get("prompt", "").encode()), list(row["response"].encode())
        ids, labels = prompt + resp, build_labels(prompt, resp, -100, True)
        keep = labels != -100
        out.append(float(-logp[np.array(ids)[keep], labels[keep]].mean()) if keep.any() else 0.0)
    return np.array(out)


@pytest.fixture(scope="module")
def healthy(bigram, tmp_path_factory):
    out = tmp_path_factory.mktemp("correlate_out")
    result, ctx = correlate(bigram, "healthy", out_dir=str(out))
    return result, ctx, out


# --------------------------------------------------------------------------- healthy: must pass
def test_healthy_losses_match_numpy_reference(healthy):
    result, _, _ = healthy
    loss, _, _ = points(result.value)
    assert loss == pytest.approx(reference_losses(DATA / "healthy.jsonl"), rel=1e-5, abs=1e-5)


def test_healthy_correlations_equal_scipy_and_pass(healthy):
    result, _, _ = healthy
    v = result.value
    loss, score, length = points(v)
    assert v["n"] == 40 and v["nonfinite"] == []
    assert v["pearson_r"] == pytest.approx(sps.pearsonr(loss, score).statistic, abs=1e-12)
    assert v["pearson_p"] == pytest.approx(sps.pearsonr(loss, score).pvalue, rel=1e-9)
    assert v["spearman_rho"] == pytest.approx(sps.spearmanr(loss, score).statistic, abs=1e-12)
    assert v["kendall_tau_b"] == pytest.approx(sps.kendalltau(loss, score, variant="b").statistic,
                                               abs=1e-12)
    # the float64 reference losses give the same r (to float32 precision)
    assert v["pearson_r"] == pytest.approx(
        sps.pearsonr(reference_losses(DATA / "healthy.jsonl"), score).statistic, abs=1e-5)
    ci = v["ci"]
    assert ci["method"] == "bca" and ci["n_resamples"] == 2000 and ci["seed"] == 0
    ref = sps.bootstrap((loss, score), lambda a, b, axis: stats.pearson_rows(a, b), paired=True,
                        vectorized=True, n_resamples=2000, method="BCa",
                        rng=np.random.default_rng(0)).confidence_interval
    assert (ci["low"], ci["high"]) == pytest.approx((ref.low, ref.high), abs=1e-12)
    assert ci["low"] < v["pearson_r"] < ci["high"] < 0
    assert v["pearson_r"] < -0.85  # measured -0.919
    assert v["length"]["partial_r"] == pytest.approx(
        stats.residual_partial_pearson(loss, score, length), abs=1e-12)
    f = by_code(result)
    assert {c: f[c].verdict for c in f} == {"OBJ401": Verdict.PASS, "OBJ402": Verdict.PASS,
                                            "OBJ403": Verdict.PASS, "OBJ404": Verdict.PASS}
    assert f"r(loss, score) = {v['pearson_r']:.3f}" in f["OBJ401"].message
    assert "pass <= -0.6, fail > -0.3" in f["OBJ401"].message


def test_healthy_returns_points_and_draws_nothing(healthy):
    # the check measures; the scatter is drawn once, in report/, from these points
    result, ctx, out = healthy
    v = result.value
    assert "figure" not in v and not list(out.iterdir())
    assert set(v["points"][0]) == {"id", "loss", "score", "length"}
    assert v["points"][0]["id"] == "h00" and v["points"][0]["length"] == 43
    json.dumps(result.to_dict())  # the measurement is JSON-safe


# --------------------------------------------------------------------------- broken: must trigger
def test_reversed_scores_fail(bigram):
    result, _ = correlate(bigram, "reversed")
    f = by_code(result)
    assert f["OBJ401"].verdict == Verdict.FAIL
    assert result.value["pearson_r"] == pytest.approx(0.919, abs=0.01)
    assert f["OBJ404"].verdict == Verdict.SKIP


def test_unrelated_scores_fail_and_interval_contains_zero(bigram):
    result, _ = correlate(bigram, "unrelated")
    v = result.value
    assert by_code(result)["OBJ401"].verdict == Verdict.FAIL
    assert abs(v["pearson_r"]) < 0.3 and v["ci"]["low"] < 0 < v["ci"]["high"]


def test_aspect_rated_at_random_warns(bigram):
    result, _ = correlate(bigram, "aspects")
    f = by_code(result)["OBJ404"]
    asp = result.value["aspects"]
    loss, _, _ = points(result.value)
    rows = [json.loads(line) for line in open(DATA / "aspects.jsonl")]
    polite = [r["scores"]["politeness"] for r in rows]
    assert asp["politeness"]["pearson_r"] == pytest.approx(sps.pearsonr(loss, polite).statistic,
                                                           abs=1e-12)
    assert asp["politeness"]["kendall_tau_b"] == pytest.approx(
        sps.kendalltau(loss, polite, variant="b").statistic, abs=1e-12)
    assert f.verdict == Verdict.WARN and "misses aspect(s) politeness:" in f.message
    assert asp["correctness"]["pearson_r"] < -0.9


def test_mean_loss_on_length_rated_data_is_not_confounded(bigram):
    result, _ = correlate(bigram, "length")
    f = by_code(result)
    assert f["OBJ401"].verdict == Verdict.FAIL  # the raters judged length, not quality
    assert f["OBJ403"].verdict == Verdict.PASS
    assert abs(result.value["length"]["loss_pearson_r"]) < 0.5


def test_too_few_rows_is_error(bigram):
    result, _ = correlate(bigram, "few")
    f = by_code(result)
    assert f["OBJ401"].verdict == Verdict.ERROR and "min_samples = 10" in f["OBJ401"].message
    assert f["OBJ403"].verdict == Verdict.SKIP


def test_no_scores_file_skips(bigram):
    result, _ = correlate(bigram, None)
    assert [f.verdict for f in result.findings] == [Verdict.SKIP]


def test_summed_loss_tracks_length():
    cfg = load_config(TARGETS / "correlate_bigram_sum" / "objdebug.toml")
    result = api.run(cfg, stages=["correlate"])
    res = next(r for r in result.results if r.stage == "correlate")
    v = res.value
    loss, score, length = points(v)
    f = by_code(res)
    assert f["OBJ401"].verdict == Verdict.PASS  # r alone looks healthy ...
    assert f["OBJ403"].verdict == Verdict.WARN  # ... but it is length
    assert "tracks length more than quality" in f["OBJ403"].message
    assert v["length"]["loss_pearson_r"] == pytest.approx(sps.pearsonr(loss, length).statistic,
                                                          abs=1e-12)
    assert v["length"]["loss_pearson_r"] > 0.8
    assert v["length"]["partial_r"] == pytest.approx(
        stats.residual_partial_pearson(loss, score, length), abs=1e-12)
    assert abs(v["length"]["partial_r"]) < 0.1
    # contract probe (the model, also the vocab probe, and the objective alone) + one per-sample
    # graph, one bucket + the model's logits at that bucket for the model state (OBJ004), which
    # the OBJ403 warning asks for
    assert result.compiles["count"] <= 4


def test_nonfinite_losses_fail_with_ids():
    cfg = load_config(TARGETS / "correlate_bigram_nan" / "objdebug.toml")
    res = next(r for r in api.run(cfg, stages=["correlate"]).results if r.stage == "correlate")
    f = by_code(res)
    assert f["OBJ402"].verdict == Verdict.FAIL and f["OBJ402"].message.endswith(": n1, n2")
    assert res.value["nonfinite"] == ["n1", "n2"] and res.value["n"] == 12
    assert "2 non-finite losses left out" in f["OBJ401"].message
    assert math.isfinite(res.value["pearson_r"])


# --------------------------------------------------------------------------- conditions directly
def judge(value, th=None):
    th = settings("correlate", **(th or {}))   # default.toml's section, `th` over it
    return {c.code: c.judge(value) for c in ScoreCorrelation().conditions(th)}


def test_interval_containing_zero_cannot_pass():
    # one near-perfect answer with near-zero loss drives r; the other ten are noise
    loss = [0.0, 3.14, 2.38, 2.68, 2.81, 3.1, 3.4, 3.09, 2.87, 3.14, 2.93]
    score = [5, 1, 5, 3, 3, 2, 2, 2, 4, 4, 2]
    v = measure_vectors([f"x{i}" for i in range(11)], loss, score, [20] * 11)
    assert v["pearson_r"] <= -0.6 and v["ci"]["low"] < 0 < v["ci"]["high"]
    verdict, message, key = judge(v)["OBJ401"]
    assert verdict == Verdict.WARN and "the interval contains 0" in message
    assert key == pytest.approx(v["pearson_r"])
    # the same r with an interval clear of 0 passes
    v2 = {**v, "ci": {**v["ci"], "low": -0.9, "high": -0.3}}
    assert judge(v2)["OBJ401"][0] == Verdict.PASS


def test_too_few_samples_synthetic_is_error():
    v = measure_vectors([str(i) for i in range(9)], np.linspace(3, 1, 9), np.arange(9), np.arange(9))
    verdict, message, _ = judge(v)["OBJ401"]
    assert verdict == Verdict.ERROR and "only 9 scored samples" in message
    assert judge(v, {"min_samples": 5})["OBJ401"][0] == Verdict.PASS


@pytest.mark.parametrize("r,expected", [(-0.6, Verdict.PASS), (-0.45, Verdict.WARN),
                                        (-0.3, Verdict.WARN), (-0.29, Verdict.FAIL),
                                        (float("nan"), Verdict.FAIL)])
def test_band_edges(r, expected):
    base = measure_vectors([str(i) for i in range(20)], np.linspace(3, 1, 20), np.arange(20),
                           np.arange(20))
    v = {**base, "pearson_r": r, "ci": {**base["ci"], "low": -0.95, "high": -0.05}}
    assert judge(v)["OBJ401"][0] == expected


def test_constant_loss_fails_and_constant_score_errors():
    ids = [str(i) for i in range(12)]
    flat = measure_vectors(ids, [2.5] * 12, np.arange(12) % 5 + 1, np.arange(12) + 10)
    verdict, message, _ = judge(flat)["OBJ401"]
    assert verdict == Verdict.FAIL and "same loss" in message
    same = measure_vectors(ids, np.arange(12.0), [3] * 12, np.arange(12) + 10)
    assert judge(same)["OBJ401"][0] == Verdict.ERROR


def test_profile_thresholds_are_honoured(healthy):
    result, _, _ = healthy
    assert judge(result.value, {"r_pass": -0.95, "r_fail": -0.5})["OBJ401"][0] == Verdict.WARN
    strict = judge(result.value, {"length_corr_warn": 0.2, "partial_ratio": 1.01})["OBJ403"]
    assert strict[0] == Verdict.WARN  # |corr(loss, length)| = 0.255 and partial 0.914 < 1.01 * 0.919


# --------------------------------------------------------------------------- CLI
def test_cli_exit_code_and_json(tmp_path):
    from typer.testing import CliRunner

    from objdebug.cli import app

    out = tmp_path / "out"
    report = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["correlate", "-c", str(TARGETS / "correlate_bigram" / "objdebug.toml"),
                                   "--set", f"data.scores=\"{DATA / 'reversed.jsonl'}\"",
                                   "--out", str(out), "--json", str(report)])
    assert res.exit_code == 1, res.output
    assert "FAIL OBJ401" in res.output
    data = json.loads(report.read_text())
    # the model-state result (OBJ004) comes first when a quality finding asked for it
    value = next(r for r in data["results"] if r["stage"] == "correlate")["value"]
    assert "figure" not in value
    assert data["extra"]["figures"]["correlate_scatter"] == str(out / SCATTER_NAME)
    assert (out / SCATTER_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(value["points"]) == 40


@pytest.mark.skipif(not (DEMO / "demo.ckpt").is_file() or not (DEMO / "scores.jsonl").is_file(),
                    reason="the demo checkpoint/scores are not built")
def test_demo_correlates(tmp_path):
    from typer.testing import CliRunner

    from objdebug.cli import app

    res = CliRunner().invoke(app, ["correlate", "--demo", "--out", str(tmp_path), "--json",
                                   str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    v = json.loads((tmp_path / "r.json").read_text())["results"][0]["value"]
    assert v["pearson_r"] <= -0.6 and v["ci"]["high"] < 0  # measured -0.907 [-0.940, -0.848]
    assert (tmp_path / SCATTER_NAME).is_file()


def test_bad_profile_setting_is_input_error(bigram, tmp_path):
    from objdebug.core.errors import InputError

    cfg, target, engine, _ = bigram
    prof = tmp_path / "p.toml"
    prof.write_text('extends = "default"\n[correlate]\nci_method = "basic"\n')
    message = r"For '\[correlate\] ci_method', the value must be in \['bca', 'percentile'\], but got 'basic'"
    with pytest.raises(InputError, match=message):  # when the profile is read (issue 35) ...
        load_profile(str(prof))
    ctx = Context(config=cfg, target=target, engine=engine, profile=load_profile("default"))
    with pytest.raises(InputError, match=message):  # ... and from settings given to the check itself
        run_check(ScoreCorrelation(), ctx, ctx.profile.section("correlate").replace(ci_method="basic"))
