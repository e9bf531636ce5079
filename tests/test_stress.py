"""stress: each case fails on the fixture built to break it and passes on the healthy target, with
the measured numbers checked against numpy float64 references where one exists.

Fast by construction: a tiny model (vocab 256, d_model 16, 1 layer), the test profile
fixtures/targets/stress_common/profile.toml (batch 4, short inputs of 32 tokens, long inputs of
256 and 512), one loaded target per fixture (module scope), and only the case under test on each
broken fixture.
"""

import math

import numpy as np
import pytest

from objdebug.engine import runtime
from objdebug.core.config import load_config
from objdebug.pipeline.context import Context
from objdebug.engine.data import pack
from objdebug.pipeline.datasets import text_samples
from objdebug.engine.core import Engine
from objdebug.core.errors import InputError
from objdebug.core.findings import Verdict
from objdebug.pipeline.profile import load_profile
from objdebug.rules import get_rule
from objdebug.stages import stress
from objdebug.engine.target import load_target

from .conftest import TARGETS
from .conftest import settings
from objdebug.stages.stress._common import token_stream
from objdebug.stages.stress.garbage_ids import label_batch, random_batch
from objdebug.stages.stress.low_precision import logits_batch
from objdebug.pipeline.runner import run_check  # the runner reviews verdicts (untrained-model notes)

PROFILE = TARGETS / "stress_common" / "profile.toml"


class Target:
    """One loaded fixture target; `run(name)` runs one stress case on it (once, then cached)."""

    def __init__(self, name: str, overrides: dict | None = None):
        self.cfg = load_config(TARGETS / name / "objdebug.toml", overrides=overrides)
        self.profile = load_profile(str(PROFILE))
        self.th = self.profile.section("stress")
        runtime.setup(self.cfg.run.device, self.cfg.run.mode, self.cfg.run.seed)
        engine = Engine(load_target(self.cfg), batch_size=self.profile.section("engine")["batch_size"])
        engine.stage = "stress"
        self.ctx = Context(config=self.cfg, target=engine.target, engine=engine, profile=self.profile)
        self.results = {}

    def run(self, name: str):
        if name not in self.results:
            check = next(c for c in stress.checks() if c.name == name)
            with runtime.scratch_dir():
                self.results[name] = run_check(check, self.ctx, self.th)
        return self.results[name]

    def verdicts(self, name: str) -> dict[str, list[Verdict]]:
        out: dict[str, list[Verdict]] = {}
        for f in self.run(name).findings:
            out.setdefault(f.code, []).append(f.verdict)
        return out


def _log_softmax64(logits):
    x = logits.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _ce64(logits, labels, ignore):
    """Reference masked mean cross-entropy per row, float64."""
    logp = _log_softmax64(logits)
    keep = labels != ignore
    nll = -np.take_along_axis(logp, np.where(keep, labels, 0)[..., None], -1)[..., 0]
    return (nll * keep).sum(-1) / np.maximum(keep.sum(-1), 1)


@pytest.fixture(scope="module")
def healthy():
    return Target("stress_healthy")


@pytest.fixture(scope="module")
def ms_ce():
    return Target("stress_ms_ce")


@pytest.fixture(scope="module")
def summed():
    """A summed loss: loaded once for its long-inputs and long-objective tests."""
    return Target("stress_sum")


# --------------------------------------------------------------------------- healthy: every case
CASES = ["all-padding", "padding-invariance", "random-ids", "out-of-range-ids", "extreme-logits",
         "low-precision", "determinism", "over-smoothing", "long-objective", "long-inputs"]


@pytest.mark.parametrize("case", CASES)
def test_masked_cross_entropy_passes_every_case(healthy, case):
    res = healthy.run(case)
    assert res.error is None, res.error
    for f in res.findings:
        assert get_rule(f.code).stage == "stress"
        if f.code == "OBJ509" and "bfloat16" in f.condition:  # no bfloat16 kernels on CPU
            assert f.verdict in (Verdict.PASS, Verdict.SKIP)
        else:
            assert f.verdict == Verdict.PASS, f.message
        assert any(ch.isdigit() for ch in f.message)
    assert res.seconds > 0


def test_checks_are_one_per_case_with_rule_pages():
    checks = stress.checks()
    # the trained-precision cases (tests/test_precision.py) skip at amp_level "O0"
    # the out-of-range probes after every check that calls the shared graphs (a rejected probe
    # leaves its graph to compile again); long inputs last: their own graphs, their own process
    order = [c for c in CASES if c not in ("out-of-range-ids", "long-inputs")]
    assert [c.name for c in checks] == order + ["trained-precision", "loss-scale-gradient",
                                                "out-of-range-ids", "long-inputs"]
    assert all(c.stage == "stress" for c in checks)
    codes = [code for c in checks for code in c.codes]
    assert len(codes) == len(set(codes)) == 15
    for code in codes:
        rule = get_rule(code)
        assert rule.fix and "## How to fix" in rule.doc


# --------------------------------------------------------------------------- all padding
def test_all_padding_masked_ce_is_zero_with_zero_gradients(healthy):
    v = healthy.run("all-padding").value
    assert v["loss"] == 0.0 and v["grad_norm"] == 0.0 and v["nonfinite_params"] == 0


def test_all_padding_nn_cross_entropy_is_nan_and_fails(ms_ce):
    res = ms_ce.run("all-padding")
    f = res.findings[0]
    assert f.code == "OBJ503" and f.verdict == Verdict.FAIL
    assert math.isnan(res.value["loss"]) and "loss nan" in f.message
    assert "MaskedCrossEntropy" in f.fix


# --------------------------------------------------------------------------- padding invariance
def test_padding_invariance_fails_when_label_padding_is_scored():
    t = Target("stress_pad_mismatch")  # labels padded with 0, the loss ignores -100
    res = t.run("padding-invariance")
    assert res.findings[0].verdict == Verdict.FAIL
    rows = res.value["rows"]
    assert [r["extra_pad"] for r in rows] == [0, 10, 500]
    # a flat random model prices "predict id 0" near log(V) like any token: small but real shifts
    assert rows[2]["loss_rel_diff"] > 10 * t.th["pad_loss_rtol"]
    assert rows[2]["grad_rel_diff"] > 10 * t.th["pad_grad_rtol"]
    # reference: at +10 the objective scores every position, the padded ones as "predict id 0"
    n = res.value["tokens"]
    sample_ids = np.array(t.ctx.provided(token_stream)[:n])
    ids = np.zeros((1, n + 10), np.int32)
    ids[0, :n] = sample_ids
    labels = np.zeros((1, n + 10), np.int64)
    labels[0, :n - 1] = sample_ids[1:]
    ref = _ce64(t.ctx.engine.logits(ids), labels, ignore=-100)[0]
    assert rows[1]["loss"] == pytest.approx(ref, rel=1e-5)
    # the all-padding batch is scored too: a finite, non-zero loss fails
    pad = t.run("all-padding")
    assert pad.findings[0].verdict == Verdict.FAIL and pad.value["loss"] > 1.0


def test_padding_invariance_healthy_numbers(healthy):
    v = healthy.run("padding-invariance").value
    assert v["max_loss_rel_diff"] <= 1e-6 and v["max_grad_rel_diff"] <= 1e-6


# --------------------------------------------------------------------------- garbage ids
def test_random_ids_losses_match_reference(healthy, ms_ce):
    for t in (healthy, ms_ce):
        v = t.run("random-ids").value
        ids, labels = t.ctx.provided(random_batch)
        ref = _ce64(t.ctx.engine.logits(ids), labels, ignore=-100)
        np.testing.assert_allclose(v["losses"], ref, rtol=1e-5)
    # untrained flat model: log(V); the confident (sharp) model: far above it
    assert ms_ce.run("random-ids").value["mean_loss"] == pytest.approx(math.log(256), rel=0.02)
    assert healthy.run("random-ids").value["mean_loss"] > 1.5 * math.log(256)


def test_random_ids_warns_below_log_vocab(healthy):
    th = dict(healthy.th, random_ids_min_ratio=5.0)  # the same measurement under a stricter profile
    check = next(c for c in stress.checks() if c.name == "random-ids")
    cond = check.conditions(th)[0]
    verdict, message, ratio = cond.judge(healthy.run("random-ids").value)
    assert verdict == Verdict.WARN and ratio < 5.0 and "log(V=256)" in message


def test_out_of_range_probes_healthy(healthy):
    v = healthy.run("out-of-range-ids").value
    p = v["probes"]
    assert p["label 256"]["rejected"] and p["label -1"]["rejected"] and p["input 256"]["rejected"]
    assert p["input -1"]["rejected"]  # the demo model maps negative ids out of range on purpose
    assert "GatherD" in p["label -1"]["error"]


def test_input_minus_one_read_by_a_wrapping_embedding_is_a_note(ms_ce):
    p = ms_ce.run("out-of-range-ids").value["probes"]
    assert p["input 256"]["rejected"] and "Gather" in p["input 256"]["error"]
    assert not p["input -1"]["rejected"] and math.isfinite(p["input -1"]["value"])
    assert p["input -1"]["wraps"]  # read as id 255: the same loss as the batch with 255 there
    f = next(f for f in ms_ce.run("out-of-range-ids").findings if f.code == "OBJ507")
    assert f.verdict == Verdict.INFO and "wraps a negative id" in f.message
    assert "input_out_of_range = info" in f.message and f.fix  # a note carries its fix


def test_out_of_range_label_minus_one_scored_as_last_class_is_a_note(ms_ce):
    res = ms_ce.run("out-of-range-ids")
    f = next(f for f in res.findings if f.code == "OBJ506")
    assert f.verdict == Verdict.INFO and "GatherD accepts [-V, V)" in f.message and "OBJ105" in f.message
    p = res.value["probes"]
    assert p["label 256"]["rejected"] and not p["label -1"]["rejected"] and p["label -1"]["wraps"]
    assert "(wrapped)" in f.message
    # reference: nn.CrossEntropyLoss scores label -1 as class V-1 (the label probes' batch: the
    # objective alone on the model's logits of one random row)
    ids, labels, _ = ms_ce.ctx.provided(label_batch)
    bad = labels.copy()
    bad[0, res.value["position"]] = 255
    ref = _ce64(ms_ce.ctx.engine.logits(ids)[:1], bad[:1], ignore=-100)[0]
    assert p["label -1"]["value"] == pytest.approx(ref, rel=1e-5)


@pytest.mark.parametrize("setting", ["warn", "fail"])
def test_silent_scoring_verdict_is_configurable(ms_ce, setting):
    check = next(c for c in stress.checks() if c.name == "out-of-range-ids")
    th = dict(ms_ce.th, label_out_of_range=setting, input_out_of_range=setting)
    value = ms_ce.run("out-of-range-ids").value
    for cond in check.conditions(th):
        verdict, message, n = cond.judge(value)
        assert verdict == Verdict(setting.upper()) and n == 1.0 and f"= {setting})" in message


def test_out_of_range_label_giving_nan_fails():
    t = Target("stress_soft_target")  # renormalized one-hot target: an all-zero row, 0/0 = NaN
    res = t.run("out-of-range-ids")
    p = res.value["probes"]
    assert not p["label 256"]["rejected"] and math.isnan(p["label 256"]["value"])
    assert not p["label -1"]["rejected"] and math.isnan(p["label -1"]["value"])
    f = {f.code: f for f in res.findings}
    assert f["OBJ506"].verdict == Verdict.FAIL
    assert "NaN/Inf instead of an error for label 256, label -1" in f["OBJ506"].message
    # even the mildest setting cannot turn NaN/Inf into a note
    check = next(c for c in stress.checks() if c.name == "out-of-range-ids")
    assert check.conditions(dict(t.th, label_out_of_range="info"))[0].judge(res.value)[0] == Verdict.FAIL
    assert f["OBJ507"].verdict == Verdict.PASS  # the demo model rejects both bad input ids


def test_out_of_range_verdict_setting_is_validated(ms_ce):
    check = next(c for c in stress.checks() if c.name == "out-of-range-ids")
    with pytest.raises(InputError, match="label_out_of_range"):
        check.conditions(dict(ms_ce.th, label_out_of_range="maybe"))


# --------------------------------------------------------------------------- logits: scale, precision
def test_extreme_logits_match_reference(healthy):
    v = healthy.run("extreme-logits").value
    logits, labels = healthy.ctx.provided(logits_batch)
    for row in v["rows"]:
        scaled = logits.astype(np.float64) * row["scale"]
        keep = labels != -100
        ref = float((_ce64(scaled, labels, -100) * keep.sum(-1)).sum() / keep.sum())
        assert row["loss"] == pytest.approx(ref, rel=1e-4)
    assert [r["scale"] for r in v["rows"]] == [1.0, 100.0, 10000.0]


def test_fp16_naive_loss_overflows():
    t = Target("stress_fp16")
    ext = t.run("extreme-logits")
    assert ext.findings[0].verdict == Verdict.FAIL
    rows = {r["scale"]: r for r in ext.value["rows"]}
    assert math.isfinite(rows[1.0]["loss"]) and not math.isfinite(rows[100.0]["loss"])
    assert rows[1.0]["loss"] == pytest.approx(rows[1.0]["reference_ce"], rel=1e-2)  # fp16 rounding
    low = t.run("low-precision")
    fp16 = next(f for f in low.findings if "float16" in f.condition and "bfloat16" not in f.condition)
    # trained in float32 (amp_level O0): what float16 would do is a forecast, a note (issue 22)
    assert fp16.verdict == Verdict.INFO and "NaN/Inf in float16" in fp16.message
    assert "a forecast" in fp16.message and "O2/O3" in fp16.message


def test_nn_cross_entropy_is_nan_in_float16(ms_ce):
    low = ms_ce.run("low-precision")
    fp16 = low.value["dtypes"]["float16"]["rows"]
    assert all(math.isnan(r["loss"]) for r in fp16) and all(math.isfinite(r["fp32_loss"]) for r in fp16)
    assert Verdict.INFO in ms_ce.verdicts("low-precision")["OBJ509"]  # a forecast at amp_level O0


def test_nn_cross_entropy_nan_in_float16_fails_when_trained_at_float16():
    t = Target("stress_ms_ce", overrides={"run.amp_level": "O2", "run.amp_dtype": "float16"})
    low = t.run("low-precision")
    fp16 = next(f for f in low.findings if f.condition == "float16_matches_float32")
    assert fp16.verdict == Verdict.FAIL and "forecast" not in fp16.message


def test_low_precision_healthy_within_tolerance(healthy):
    rows = healthy.run("low-precision").value["dtypes"]["float16"]["rows"]
    ran = [r for r in rows if "loss" in r]
    assert len(ran) >= 2 and max(r["rel_diff"] for r in ran) < 1e-3
    assert any("skipped" in r and "65504" in r["skipped"] for r in rows)  # x1e4 exceeds float16


# --------------------------------------------------------------------------- long inputs
def test_long_inputs_healthy_numbers(healthy):
    v = healthy.run("long-inputs").value
    for length in ("256", "512"):
        r = v["lengths"][length]
        assert r["ran"] and math.isfinite(r["loss"]) and r["nonfinite_params"] == 0
        assert r["seconds"] > 0 and r["peak_rss_bytes"] > 0 and r["estimate_bytes"] > 0
        assert 0.5 < r["ratio"] < 2.0
    assert v["model_shape"]["layers"] == 1 and v["model_shape"]["heads"] == 2
    assert v["model_shape"]["width"] == 16


def test_long_inputs_summed_loss_grows_with_length(summed):
    t = summed
    res = t.run("long-inputs")
    verdicts = t.verdicts("long-inputs")
    assert verdicts["OBJ501"] == [Verdict.PASS, Verdict.PASS] and verdicts["OBJ502"] == [Verdict.FAIL]
    ref_len = res.value["reference"]["length"]
    for length in (256, 512):
        ratio = res.value["lengths"][str(length)]["ratio"]
        # a flat random model scores every token near log(V): the sum grows with the token count
        assert ratio == pytest.approx((length - 1) / (ref_len - 1), rel=0.05)


def test_long_inputs_skip_when_memory_would_not_fit(healthy):
    th = dict(healthy.th, long_lengths=[1 << 20])  # 1M tokens: the T^2 attention alone is TiBs
    check = next(c for c in stress.checks() if c.name == "long-inputs")
    healthy.ctx.profile.data["stress"]["long_lengths"] = th["long_lengths"]
    try:
        res = check.run(healthy.ctx, th)
    finally:
        healthy.ctx.profile.data["stress"]["long_lengths"] = healthy.th["long_lengths"]
    finding = next(f for f in res.findings if f.code == "OBJ501")
    assert finding.verdict == Verdict.SKIP and "available" in finding.message
    assert res.value["lengths"][str(1 << 20)]["ran"] is False


def test_long_inputs_calibrate_memory_from_measured_peaks(healthy):

    v = healthy.run("long-inputs").value
    cal = v["calibration"]
    if v["reference"]["memory_method"] != "vmhwm-reset":
        assert cal is None  # no resettable peak: the static estimate decides
        return
    assert cal["lengths"] == [32, 256, 512] and len(cal["peaks"]) == 3
    assert min(cal["a"], cal["b"], cal["c"]) >= 0 and v["longest_fitting"] > 512
    for length in ("256", "512"):
        r = v["lengths"][length]
        assert r["estimate_from"] == "calibration" and r["static_estimate_bytes"] > 0


def test_peak_fit_recovers_a_quadratic_and_inverts():
    from objdebug.stages.stress import memory

    a, b, c = 5e8, 3e5, 400.0
    lengths = [128, 256, 512]
    fit = memory.fit_peaks(lengths, [int(a + b * t + c * t * t) for t in lengths])
    assert (fit["a"], fit["b"], fit["c"]) == pytest.approx((a, b, c), rel=1e-3)
    assert memory.predict_bytes(fit, 2048) == pytest.approx(a + b * 2048 + c * 2048 ** 2, rel=1e-3)
    longest = memory.longest_fitting(fit, memory.predict_bytes(fit, 3000))
    assert abs(longest - 3000) <= 1
    # a peak that falls with length (pool reuse, rounding) cannot bend the curve down
    flat = memory.fit_peaks([128, 256, 512], [900, 800, 700])
    assert min(flat["a"], flat["b"], flat["c"]) >= 0
    assert memory.fit_peaks([128, 128], [1, 2]) is None


# --------------------------------------------------------------------------- objective alone, long
def test_long_objective_summed_loss_fails_and_matches_numpy(summed):
    from objdebug.stages.stress.long_objective import real_rows, resampled

    t = summed
    res = t.run("long-objective")
    assert t.verdicts("long-objective")["OBJ513"] == [Verdict.FAIL]
    v = res.value
    rows, labels = real_rows(t.ctx)
    nll = -np.take_along_axis(_log_softmax64(rows), labels[:, None].astype(np.int64), -1)[:, 0]
    assert v["reference"]["length"] == len(rows)  # every real row once
    assert v["reference"]["loss"] == pytest.approx(nll.sum(), rel=1e-4)
    x, y = resampled(rows, labels, 2048, int(t.th["seed"]))
    ref = -np.take_along_axis(_log_softmax64(x[0]), y[0][:, None].astype(np.int64), -1).sum()
    r = v["lengths"]["2048"]
    assert r["ran"] and r["loss"] == pytest.approx(ref, rel=1e-4)  # the sum over T resampled tokens
    assert r["ratio"] == pytest.approx(2048 / len(rows), rel=0.2)  # a sum grows ~T


def test_long_objective_healthy_numbers(healthy):
    v = healthy.run("long-objective").value
    r = v["lengths"]["2048"]
    assert r["ran"] and 0.5 < r["ratio"] < 2.0 and r["nonfinite_grad"] == 0
    assert r["logits_bytes"] == 2048 * v["vocab"] * 4 and r["copies_from"].startswith("profile")


def test_long_objective_skips_what_would_not_fit(healthy):
    check = next(c for c in stress.checks() if c.name == "long-objective")
    th = dict(healthy.th, objective_long_lengths=[1 << 36])  # 2^36 x 256 x 4 bytes: 64 TiB
    healthy.ctx.profile.data["stress"]["objective_long_lengths"] = th["objective_long_lengths"]
    try:
        res = check.run(healthy.ctx, th)
    finally:
        healthy.ctx.profile.data["stress"]["objective_long_lengths"] = healthy.th["objective_long_lengths"]
    assert res.value["lengths"][str(1 << 36)]["ran"] is False
    assert res.findings[0].verdict == Verdict.SKIP and "available" in res.findings[0].message


# --------------------------------------------------------------------------- determinism, smoothing
def test_determinism_numbers(healthy):
    v = healthy.run("determinism").value
    np.testing.assert_array_equal(v["repeat_first"], v["repeat_second"])
    np.testing.assert_allclose(v["alone"], v["in_batch"], rtol=1e-6)


def test_determinism_judges_differences(healthy):
    check = next(c for c in stress.checks() if c.name == "determinism")
    v = dict(healthy.run("determinism").value)
    v["alone"] = v["in_batch"] * 1.05
    v["batch_max_rel"] = 0.05
    verdict, message, _ = check.conditions(healthy.th)[1].judge(v)
    assert verdict == Verdict.FAIL and "depends on the other rows" in message


def test_over_smoothing_matches_reference_and_warns_on_flat_model(healthy, ms_ce):
    # ms_ce's model is random and flat: measured untrained (OBJ004), so its warning is a note
    for t, expect in ((healthy, Verdict.PASS), (ms_ce, Verdict.INFO)):
        res = t.run("over-smoothing")
        assert res.findings[0].verdict == expect
        assert expect != Verdict.INFO or "(would be WARN)" in res.findings[0].message
        samples = text_samples(t.ctx, 6)
        tops = []
        for s in samples:
            length = t.ctx.engine.bucket(s.length)
            ids, labels = pack([s] * 4, length, 0, -100, True)
            p = np.exp(_log_softmax64(t.ctx.engine.logits(ids)[0]))[labels[0] != -100]
            tops.append(np.sort(p, -1)[:, -5:].sum(-1))
        assert res.value["mean_topk"] == pytest.approx(np.concatenate(tops).mean(), rel=1e-6)
    assert ms_ce.run("over-smoothing").value["mean_topk"] < 0.3 < healthy.run("over-smoothing").value["mean_topk"]


def test_end_to_end_form_skips_logit_cases(healthy):
    saved = healthy.ctx.target.model
    healthy.ctx.target.model = None  # the end-to-end form: no model, no logits
    try:
        for case in ("extreme-logits", "low-precision", "over-smoothing"):
            res = next(c for c in stress.checks() if c.name == case).run(healthy.ctx, healthy.th)
            assert [f.verdict for f in res.findings] == [Verdict.SKIP]
            assert "end-to-end" in res.findings[0].message
    finally:
        healthy.ctx.target.model = saved


def test_padding_invariance_nan_in_a_later_row_is_not_hidden(monkeypatch):
    """max() over [0.0, 0.0, nan] is 0.0: a NaN loss at +500 padding must still fail OBJ504."""
    from types import SimpleNamespace

    from objdebug.stages.stress import padding_invariance as pi

    losses = iter([1.0, 1.0, float("nan")])
    monkeypatch.setattr(pi, "text_sample", lambda ctx, n, name: None)
    monkeypatch.setattr(pi, "packed", lambda ctx, rows, length: (None, None))
    monkeypatch.setattr(pi, "flat_grads", lambda grads: np.ones(3))
    monkeypatch.setattr(pi, "loss_and_grad",
                        lambda ctx, ids, labels: {"loss": next(losses), "grad_norm": 1.0, "grads": None})
    ctx = SimpleNamespace(profile=load_profile("default"),
                          config=SimpleNamespace(model=None))  # no attention mask: no mask rows
    check = pi.PaddingInvariance()
    v = check.measure(ctx, settings("stress"))
    assert math.isnan(v["max_loss_rel_diff"])
    (cond,) = check.conditions(settings("stress"))
    assert cond.judge(v)[0] == Verdict.FAIL


def test_low_precision_dtypes_run_on_graphs_of_their_own(healthy, monkeypatch):
    """A float16 kernel that raises poisons its graph: bfloat16 must not run on that graph."""
    from objdebug.stages.stress import low_precision as precision

    calls, poisoned = [], set()

    def fake(ctx, logits, labels, name=precision.OBJECTIVE_ON_LOGITS):
        calls.append(name)
        if name in poisoned:
            raise RuntimeError("An error occurred in the previous step of this model execution")
        if "float16" in name and "bfloat16" not in name:
            poisoned.add(name)
            raise RuntimeError("Unsupported data type float16 on this device")
        return 1.0

    monkeypatch.setattr(precision, "objective_on_logits", fake)
    check = precision.LowPrecision()
    v = check.measure(healthy.ctx, healthy.th)
    assert "float16" in v["dtypes"]["float16"]["skipped"]
    assert [r["loss"] for r in v["dtypes"]["bfloat16"]["rows"]] == [1.0] * 3
    assert len({n for n in calls}) == 2 and precision.OBJECTIVE_ON_LOGITS not in calls


def test_garbage_ids_skip_when_vocabulary_is_unknown(healthy, monkeypatch):
    monkeypatch.setattr(healthy.ctx.engine, "vocab_size", lambda: None)
    for case in ("random-ids", "out-of-range-ids"):
        res = next(c for c in stress.checks() if c.name == case).run(healthy.ctx, healthy.th)
        assert res.error is None
        assert [f.verdict for f in res.findings] == [Verdict.SKIP]
        assert "data.vocab_size" in res.findings[0].message


def test_over_smoothing_without_scored_positions_skips(healthy):
    check = next(c for c in stress.checks() if c.name == "over-smoothing")
    v = dict(healthy.run("over-smoothing").value, positions=0, mean_topk=float("nan"))
    verdict, message, key = check.conditions(healthy.th)[0].judge(v)
    assert verdict == Verdict.SKIP and "no scored positions" in message and key is None


@pytest.mark.slow
def test_out_of_range_probes_compile_no_graph_of_their_own():
    """The probes run on graphs the checks before them compiled; a rejected probe retires its
    graph, which compiles again (counted) and answers the same when called again."""
    import mindspore as ms

    from objdebug.engine.gradients import objective_logit_grad

    t = Target("stress_healthy")
    t.run("random-ids")  # model.forward + objective.forward at the random batch, the VJP chain
    ids, labels, logits = label_batch(t.ctx)
    one = ms.Tensor(np.float32(1.0))
    with runtime.scratch_dir():  # the grad stage's graph, at the label probes' shape
        objective_logit_grad(t.ctx.engine, t.ctx.target.objective, False, logits[:1],
                             ms.Tensor(labels[:1]), one)
        before = t.ctx.engine.compiles.count
        loss = float(t.ctx.engine.per_sample_raw(ids, labels)[0, 0])
        res = t.run("out-of-range-ids")
        assert res.error is None and all(r["rejected"] for r in res.value["probes"].values())
        assert t.ctx.engine.compiles.count == before
        retired = [r["graph"] for r in t.ctx.engine.compiles.retired]
        assert retired == ["model.forward", "model.vjp", "objective.forward", "objective.logit_grad"]
        assert float(t.ctx.engine.per_sample_raw(ids, labels)[0, 0]) == loss  # compiled again
    assert t.ctx.engine.compiles.count == before + 2
