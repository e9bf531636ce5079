"""invariants: each OBJ7xx rule passes on healthy objectives and fails on the fixture built to break
it (fixtures/invariant_losses.py), with the measured numbers checked against numpy references.

Cost: every target is the demo model + checkpoint (it predicts the demo text, so label alignment
can be judged) on 4-row batches (fixtures/targets/inv_common/profile.toml), loaded once per module;
the objective graphs are compiled once each with dynamic shapes. The fast tests run the whole stage
on the healthy reference and only the rule under test on each broken fixture; that each broken
fixture fails no other rule is the slow test (and the closing note of issue 11).
"""

import re
import subprocess
import sys

import numpy as np
import pytest

from objdebug.engine import runtime
from objdebug.core.config import load_config
from objdebug.pipeline.context import Context
from objdebug.engine.core import Engine
from objdebug.core.errors import InputError
from objdebug.core.findings import Verdict
from objdebug.stages.invariants.probe import constructor_settings, dropout_cells
from objdebug.pipeline.profile import load_profile
from objdebug.rules import get_rule
from objdebug.pipeline.registry import STAGES
from objdebug.stages import invariants
from objdebug.stages.invariants.alignment import shifted_labels
from objdebug.stages.invariants.settings_used import perturbation
from objdebug.stages.invariants.token_weighting import TokenWeighting
from objdebug.stages.invariants.truncation import supervised_after
from objdebug.stages.invariants.upstream import l2_rel
from objdebug.engine.target import load_target

from .conftest import ROOT, TARGETS
from .conftest import cli_exit_2, settings
from objdebug.pipeline.run_data import grad_batch
from objdebug.stages.invariants._common import logits, micro_probes
from objdebug.pipeline.runner import run_check  # the runner reviews verdicts (untrained-model notes)

PROFILE = TARGETS / "inv_common" / "profile.toml"
CHECKS = ["side-effects", "label-alignment", "logit-shift", "upstream-gradient", "ignored-positions",
          "token-weighting", "empty-after-truncation", "settings-used"]


_MODEL = {}


def _shared_model(cfg, target):
    """The inv_* targets name the same demo model and checkpoint: load and compile it once per
    process (MindSpore keeps a Cell's compiled graphs on the Cell)."""
    return _MODEL.setdefault((cfg.model.factory, repr(cfg.model.kwargs), cfg.model.checkpoint), target.model)


class Target:
    """One loaded fixture target; `run(name)` runs one invariants check on it (once, then cached)."""

    def __init__(self, name: str, overrides: dict | None = None):
        self.cfg = load_config(TARGETS / f"inv_{name}" / "objdebug.toml", overrides=overrides)
        self.profile = load_profile(str(PROFILE))
        self.th = self.profile.section("invariants")
        runtime.setup(self.cfg.run.device, self.cfg.run.mode, self.cfg.run.seed)
        target = load_target(self.cfg)
        target.model = _shared_model(self.cfg, target)
        engine = Engine(target, batch_size=self.profile.section("engine")["batch_size"])
        engine.stage = "invariants"
        self.ctx = Context(config=self.cfg, target=engine.target, engine=engine, profile=self.profile)
        self.results = {}

    def run(self, name: str):
        if name not in self.results:
            check = next(c for c in invariants.checks() if c.name == name)
            with runtime.scratch_dir():
                self.results[name] = run_check(check, self.ctx, self.th)
        return self.results[name]

    def verdicts(self, names=CHECKS) -> dict[str, Verdict]:
        out = {}
        for n in names:
            res = self.run(n)
            assert res.error is None, res.error
            out.update({f.code: f.verdict for f in res.findings})
        return out


_TARGETS = {}


def target(name: str) -> Target:
    """The loaded fixture target `name`, once per test session (its results are cached too)."""
    if name not in _TARGETS:
        _TARGETS[name] = Target(name)
    return _TARGETS[name]


@pytest.fixture(scope="module")
def healthy():
    return target("healthy")


# --------------------------------------------------------------------------- registry
def test_stage_runs_after_grad_with_one_page_per_code():
    assert STAGES.index("invariants") == STAGES.index("grad") + 1
    checks = invariants.checks()
    assert sorted(c.name for c in checks) == sorted(CHECKS)
    codes = [code for c in checks for code in c.codes]
    assert sorted(codes) == [f"OBJ7{i:02d}" for i in range(1, 11)]
    for code in codes:
        rule = get_rule(code)
        assert rule.stage == "invariants" and rule.fix
        for heading in ("## What it does", "## Why it matters", "## Example", "## How to fix"):
            assert heading in rule.doc, (code, heading)
    # every page cites the public report its rule comes from
    cites = {"OBJ701": "lighteval PR 1252", "OBJ702": "mlx PR 4188", "OBJ703": "pytorch issue 73205",
             "OBJ704": "Liger-Kernel", "OBJ705": "ms-swift PR 10167", "OBJ706": "transformers PR 34191",
             "OBJ707": "hyper-parallel PR 140", "OBJ708": "trl issue 2042", "OBJ709": "trl issue 6548",
             "OBJ710": "trl issue 6548"}
    for code, cite in cites.items():
        assert cite in get_rule(code).doc, code


# --------------------------------------------------------------------------- pure helpers
def test_shifted_labels_moves_along_the_sequence():
    labels = np.array([[-100, 5, 6, 7, -100]])
    assert shifted_labels(labels, 0, -100).tolist() == labels.tolist()
    assert shifted_labels(labels, 1, -100).tolist() == [[5, 6, 7, -100, -100]]
    assert shifted_labels(labels, 2, -100).tolist() == [[6, 7, -100, -100, -100]]
    assert shifted_labels(labels, -1, -100).tolist() == [[-100, -100, 5, 6, 7]]


@pytest.mark.parametrize("name, value, expected", [
    ("use_z_loss", False, True), ("label_smoothing", 0.0, 0.1), ("label_smoothing", 0.1, 0.05),
    ("temperature", 2.0, 4.0), ("n_terms", 3, 4), ("reduction", "mean", "sum")])
def test_perturbations_must_matter(name, value, expected):
    assert perturbation(name, value) == (expected, None)


@pytest.mark.parametrize("name, value", [("ignore_index", -100), ("vocab_size", 256),
                                         ("reduction", "none"), ("loss_type", "dpo"), ("weight", None)])
def test_untestable_settings_say_why(name, value):
    new, why = perturbation(name, value)
    assert new is None and why


def test_constructor_settings_read_defaults():
    from objdebug.losses import MaskedCrossEntropy

    assert constructor_settings(MaskedCrossEntropy) == {"ignore_index": -100, "reduction": "mean",
                                                        "label_smoothing": 0.0}


def test_supervised_tokens_after_truncation():
    from objdebug.engine.data import Sample

    s = Sample(id="a", prompt=[1, 2, 3, 4], response=[5, 6, 7])
    assert supervised_after(s, 100, -100, True) == 3   # positions 3, 4, 5 predict 5, 6, 7
    assert supervised_after(s, 5, -100, True) == 1     # only position 3 -> 5 is left
    assert supervised_after(s, 4, -100, True) == 0     # the prompt fills the limit
    assert supervised_after(s, 5, -100, False) == 1


def test_l2_rel_sees_a_dropped_scale():
    g = np.array([[0.5, -0.5], [0.1, -0.1]])
    assert l2_rel(3 * g, 3 * g) == 0.0
    assert l2_rel(g, 3 * g) == pytest.approx(2 / 3)


# --------------------------------------------------------------------------- healthy: every rule
def test_masked_cross_entropy_passes_every_rule(healthy):
    verdicts = healthy.verdicts()
    assert verdicts.pop("OBJ706") == Verdict.INFO      # a per-batch mean: a note, never a failure
    assert verdicts.pop("OBJ709") == Verdict.SKIP      # no max_length in the default profile
    assert set(verdicts.values()) == {Verdict.PASS}, verdicts
    for name in CHECKS:
        for f in healthy.run(name).findings:
            assert any(ch.isdigit() for ch in f.message), f.message


def test_token_weighting_matches_the_token_count_reference(healthy):
    v = healthy.run("token-weighting").value
    # reference: a per-batch mean gives a token of micro-batch k the weight n / (K n_k) relative
    # to one batch, so max/min = max n_k / min n_k; weighting micro-batch k by n_k / n restores 1
    counts = v["tokens_per_micro_batch"]
    labels = healthy.ctx.provided(grad_batch).labels
    assert counts == [int((row != -100).sum()) for row in labels]
    assert v["mean"]["max_min"] == pytest.approx(max(counts) / min(counts), rel=1e-3)
    assert v["token_share"]["max_min"] == pytest.approx(1.0, abs=1e-3)
    assert v["token_share"]["cosine"] == pytest.approx(1.0, abs=1e-6)


@pytest.fixture(scope="module")
def declared():
    """The healthy per-batch mean under a declared accumulation of 2 micro-batches (4-row batch)."""
    return Target("healthy", overrides={"run.grad_accumulation_steps": 2})


def test_declared_accumulation_fails_a_per_micro_batch_mean(declared):
    """[run] grad_accumulation_steps = 2: the loop averages 2 micro-batch means (transformers
    #34191): OBJ706 measures those 2 micro-batches and FAILs, whatever the profile's note."""
    res = declared.run("token-weighting")
    (f,) = res.findings
    v = res.value
    assert v["micro_batches"] == 2 and v["rows_per_micro_batch"] == 2 and v["declared"] == 2
    counts = v["tokens_per_micro_batch"]
    assert v["mean"]["max_min"] == pytest.approx(max(counts) / min(counts), rel=1e-3)  # n_k reference
    assert f.verdict is Verdict.FAIL, f.message
    assert "(run.grad_accumulation_steps = 2: the trainer averages them)" in f.message
    assert "the declared accumulation trains a different objective" in f.message


def test_declared_accumulation_passes_a_loss_over_the_global_token_count():
    """transformers' fixed loss (sum / the accumulated batch's token count,
    fixtures/invariant_losses.py:GlobalCountCE) under the same declaration: every token weighs the
    same, PASS; the same loss without the count (its per-batch mean) FAILs."""
    fixed = Target("global_count")
    (f,) = fixed.run("token-weighting").findings
    assert f.verdict is Verdict.PASS and "tokens weigh equally" in f.message, f.message
    mean = Target("global_count", overrides={"objective.kwargs": {"ignore_index": -100}})
    (g,) = mean.run("token-weighting").findings
    assert g.verdict is Verdict.FAIL, g.message


def test_declared_accumulation_must_be_a_positive_divisor(tmp_path):
    text = (TARGETS / "inv_global_count" / "objdebug.toml").read_text().replace("../../../", f"{ROOT}/")
    cfg = tmp_path / "objdebug.toml"
    cfg.write_text(text.replace("grad_accumulation_steps = 2", "grad_accumulation_steps = 0"))
    with pytest.raises(InputError, match="run.grad_accumulation_steps"):
        load_config(cfg)
    three = Target("global_count", overrides={"run.grad_accumulation_steps": 3})
    with pytest.raises(InputError, match=r"For 'run.grad_accumulation_steps', the value must divide the batch's 4 rows"):
        three.run("token-weighting")


MICRO = {"run.grad_accumulation_steps": None, "run.micro_batch_size": 2}  # the other way to say it


def test_declared_accumulation_as_micro_batch_size_fails_a_per_micro_batch_mean():
    """[run] micro_batch_size = 2 on the 4-row batch: the same loop as grad_accumulation_steps = 2
    (2 micro-batches of 2 rows, their means averaged); OBJ706 FAILs and names the key it read."""
    res = Target("healthy", overrides={"run.micro_batch_size": 2}).run("token-weighting")
    (f,) = res.findings
    v = res.value
    assert v["micro_batches"] == 2 and v["rows_per_micro_batch"] == 2 and v["declared"] == 2
    assert v["declared_as"] == "run.micro_batch_size"
    assert f.verdict is Verdict.FAIL, f.message
    assert "(run.micro_batch_size = 2: the trainer averages them)" in f.message
    assert "the declared accumulation trains a different objective" in f.message


def test_declared_accumulation_as_micro_batch_size_passes_a_loss_over_the_global_token_count():
    (f,) = Target("global_count", overrides=MICRO).run("token-weighting").findings
    assert f.verdict is Verdict.PASS and "tokens weigh equally" in f.message, f.message
    assert "run.micro_batch_size = 2" in f.message


def test_declared_accumulation_said_twice_or_not_dividing_is_an_input_error(tmp_path):
    """Both keys declared: exit 2 naming both (one loop, said once); a micro_batch_size that does
    not divide the batch's rows: an InputError naming the key and the rows."""
    text = (TARGETS / "inv_global_count" / "objdebug.toml").read_text().replace("../../../", f"{ROOT}/")
    cfg = tmp_path / "objdebug.toml"
    cfg.write_text(text.replace("grad_accumulation_steps = 2", "grad_accumulation_steps = 2\nmicro_batch_size = 2"))
    with pytest.raises(InputError, match="declare the accumulation once: 'grad_accumulation_steps' or "
                                         "'micro_batch_size', but got both") as err:
        load_config(cfg)
    assert "\n" not in str(err.value)
    cli_exit_2(["invariants", "--config", cfg], "declare the accumulation once", "but got both")
    cfg.write_text(text.replace("grad_accumulation_steps = 2", "micro_batch_size = 0"))
    with pytest.raises(InputError, match="run.micro_batch_size"):
        load_config(cfg)
    three = Target("global_count", overrides={"run.grad_accumulation_steps": None, "run.micro_batch_size": 3})
    with pytest.raises(InputError, match=r"For 'run.micro_batch_size', the value must divide the batch's 4 rows"):
        three.run("token-weighting")


def test_token_weighting_verdict_follows_the_profile(healthy):
    v = healthy.run("token-weighting").value
    for setting, verdict in (("info", Verdict.INFO), ("warn", Verdict.WARN), ("fail", Verdict.FAIL)):
        cond = TokenWeighting().conditions(settings("invariants", token_weighting=setting))[0]
        assert cond.judge(v)[0] == verdict
    with pytest.raises(InputError, match="token_weighting"):
        TokenWeighting().conditions(settings("invariants", token_weighting="loud"))


def test_alignment_logit_shift_and_ignored_numbers(healthy):
    losses = {r["offset"]: r["loss"] for r in healthy.run("label-alignment").value["offsets"]}
    assert min(losses, key=losses.get) == 0 and min(x for d, x in losses.items() if d) - losses[0] > 1.0
    rows = healthy.run("logit-shift").value["rows"]
    assert [r["shift"] for r in rows] == [1.0, 100.0, 10000.0]
    # the rounding bound grows with the float32 spacing at |x + c|; the measured error stays below
    assert rows[2]["max_rounding"] > 100 * rows[0]["max_rounding"]
    assert all(r["loss_diff"] <= r["loss_tolerance"] for r in rows)
    ign = healthy.run("ignored-positions").value
    assert [r["variant"] for r in ign["rows"]] == ["configured", "reduction=sum", "label_smoothing=0.1"]
    # measured position weights of a token-mean CE: 1/N at each of the N scored positions
    shift = healthy.run("logit-shift").value
    n = int((healthy.ctx.provided(grad_batch).labels != -100).sum())
    assert shift["weight_sum"] == pytest.approx(1.0, rel=1e-4)
    assert shift["max_weight"] == pytest.approx(1.0 / n, rel=1e-4)


def test_double_shift_minimum_is_the_healthy_loss():
    """Reference without numpy: the double-shifting objective at d = -1 scores exactly the pairs the
    same cross-entropy without the extra shift (HandWrittenCE) scores at d = 0."""
    ds = {r["offset"]: r["loss"] for r in target("double_shift").run("label-alignment").value["offsets"]}
    ok = {r["offset"]: r["loss"] for r in target("handwritten").run("label-alignment").value["offsets"]}
    assert ds[-1] == pytest.approx(ok[0], rel=1e-5)
    assert ds[0] == pytest.approx(ok[1], rel=1e-5)  # and configured = one shift too far


def test_labels_never_shifted_fail_alignment_at_plus_one():
    """lighteval PR 1252: nobody shifts (data.shift = false, a model that does not shift): the
    loss is lowest one position later, and the finding says the labels are shifted too few times."""
    t = Target("healthy", overrides={"data.shift": False})
    res = t.run("label-alignment")
    f = res.findings[0]
    assert f.verdict == Verdict.FAIL and "d = +1" in f.message and "too few" in f.message, f.message


def test_smoothing_over_ignored_matches_numpy():
    """Reference (numpy float64): (1 - eps) * token-mean NLL + eps * mean over ALL positions of
    -mean(log p); removing the trailing ignored positions changes only the second term."""
    t = target("smoothing_ignored")
    v = t.run("ignored-positions").value
    x = t.ctx.provided(logits).astype(np.float64)
    labels = t.ctx.provided(grad_batch).labels
    cut = v["cut"]

    def loss(x, y, eps=0.1):
        z = x - x.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        keep = y != -100
        nll = -np.take_along_axis(logp, np.where(keep, y, 0)[..., None], -1)[..., 0]
        return (1 - eps) * nll[keep].mean() + eps * (-logp.mean(-1)).mean()

    row = v["rows"][0]
    assert row["loss"] == pytest.approx(loss(x, labels), rel=1e-4)
    assert row["loss_removed"] == pytest.approx(loss(x[:, :cut], labels[:, :cut]), rel=1e-4)


def test_reference_loss_matches_numpy(healthy):
    """The probe's configured loss on the batch equals a float64 masked mean CE (reference)."""
    from objdebug.stages.invariants._common import base, logits

    x, labels = logits(healthy.ctx).astype(np.float64), healthy.ctx.provided(grad_batch).labels
    x = x - x.max(-1, keepdims=True)
    logp = x - np.log(np.exp(x).sum(-1, keepdims=True))
    keep = labels != -100
    nll = -np.take_along_axis(logp, np.where(keep, labels, 0)[..., None], -1)[..., 0]
    assert base(healthy.ctx).loss == pytest.approx(nll[keep].mean(), rel=1e-4, abs=1e-6)


# --------------------------------------------------------------------------- broken: their own rule
BROKEN = [("double_shift", "label-alignment", "OBJ701", "minimum is at d = -1"),
          ("naive_softmax", "logit-shift", "OBJ702", "softmax overflows"),
          ("smoothing_ignored", "ignored-positions", "OBJ703", "ignored positions count"),
          ("dropped_sens", "upstream-gradient", "OBJ704", "ignores its incoming gradient"),
          ("unused_setting", "settings-used", "OBJ705", "label_smoothing leave(s)"),
          ("label_writer", "side-effects", "OBJ707", "writes into its inputs"),
          ("no_clamp", "empty-after-truncation", "OBJ710", "NaN")]


@pytest.mark.parametrize("fixture, check, code, words", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_objective_fails_its_rule_and_no_other(fixture, check, code, words):
    t = target(fixture)
    res = t.run(check)
    assert res.error is None, res.error
    f = next(f for f in res.findings if f.code == code)
    assert f.verdict == Verdict.FAIL and words in f.message, f.message
    assert f.fix == get_rule(code).fix
    verdicts = t.verdicts()
    assert {c for c, v in verdicts.items() if v in (Verdict.FAIL, Verdict.WARN, Verdict.ERROR)} == {code}, \
        verdicts
    assert verdicts["OBJ706"] == Verdict.INFO  # every fixture is a per-batch mean: a note


def test_objective_that_changes_in_training_mode_warns():
    t = target("train_only")
    verdicts = t.verdicts()
    assert {c for c, v in verdicts.items() if v in (Verdict.FAIL, Verdict.WARN, Verdict.ERROR)} == {"OBJ708"}
    f = next(f for f in t.run("side-effects").findings if f.code == "OBJ708")
    assert f.verdict == Verdict.WARN and "something else in training mode" in f.message


@pytest.mark.parametrize("fixture", ["handwritten", "row_loop"])
def test_hand_written_masked_ce_passes_every_rule(fixture):
    verdicts = target(fixture).verdicts()
    assert not {c for c, v in verdicts.items() if v in (Verdict.FAIL, Verdict.WARN, Verdict.ERROR)}


def test_dynamic_shape_graph_equals_static_graphs():
    """The probe compiles once with dynamic batch and length; for a per-row Python loop too, its
    results equal a static graph's at every shape (bit for bit)."""
    import mindspore as ms

    from fixtures.invariant_losses import RowLoopCE
    from objdebug.engine.gradients import ObjectiveLogitGrad as _LogitGrad

    runtime.setup("CPU", "graph", 0)
    rng = np.random.default_rng(0)
    dyn = _LogitGrad(RowLoopCE(), False)
    dyn.set_inputs(ms.Tensor(shape=[None, None, 16], dtype=ms.float32),
                   ms.Tensor(shape=[None, None], dtype=ms.int32), ms.Tensor(shape=[], dtype=ms.float32))
    for b, t in [(4, 8), (1, 8), (3, 5)]:
        x = rng.normal(size=(b, t, 16)).astype(np.float32)
        y = rng.integers(0, 16, (b, t)).astype(np.int32)
        y[:, :2] = -100
        args = (ms.Tensor(x), ms.Tensor(y), ms.Tensor(np.float32(2.0)))
        (o1, g1, sq1, _), (o2, g2, sq2, _) = dyn(*args), _LogitGrad(RowLoopCE(), False)(*args)
        assert np.array_equal(o1.asnumpy(), o2.asnumpy()) and np.array_equal(g1.asnumpy(), g2.asnumpy())
        assert float(sq1.asnumpy()) == pytest.approx(float((g1.asnumpy().astype(np.float64) ** 2).sum()), rel=1e-5)


def test_objective_that_cannot_compile_dynamically_falls_back_to_static(healthy, monkeypatch):
    """Forced here by declaring dynamic inputs of the wrong rank: the first call fails to compile,
    the probe builds a static graph under `<name>.static` and answers the same numbers."""
    import mindspore as ms

    from objdebug.engine.gradients import ObjectiveLogitGrad as _LogitGrad
    from objdebug.stages.invariants.probe import InvarianceProbe

    def wrong_rank(self, *inputs):
        nn_set_inputs(self, ms.Tensor(shape=[None], dtype=ms.float32), *inputs[1:])

    healthy.run("token-weighting")  # the reference: the first micro-batch through the dynamic graph
    ref = healthy.ctx.provided(micro_probes)[0]
    nn_set_inputs = _LogitGrad.set_inputs
    monkeypatch.setattr(_LogitGrad, "set_inputs", wrong_rank)
    engine = Engine(healthy.ctx.target, batch_size=4)
    x, y = healthy.ctx.provided(logits)[:1], healthy.ctx.provided(grad_batch).labels[:1]
    with runtime.scratch_dir():
        p = InvarianceProbe(engine).run(x, y)
    assert [r.graph for r in engine.compiles.records] == ["objective.logit_grad.static"]
    assert p.loss == pytest.approx(ref.loss, rel=1e-6)


def test_dropout_cells_are_found():
    from mindspore import nn

    net = nn.SequentialCell([nn.Dense(2, 2), nn.Dropout(p=0.1), nn.Dropout(p=0.0)])
    found = dropout_cells(net)
    assert len(found) == 1 and "p=0.1" in found[0]


@pytest.mark.slow
def test_dropout_kept_on_purpose_is_a_note():
    """A model with dropout: its training loss differs from its evaluation loss; by default a note
    (INFO) that says so with both numbers, a WARN where the profile asks for it."""
    from objdebug.stages.invariants.side_effects import SideEffects

    t = Target("dropout")
    res = t.run("side-effects")
    f = next(f for f in res.findings if f.code == "OBJ708")
    assert f.verdict == Verdict.INFO and "drop (p=0.1)" in f.message, f.message
    v = res.value
    assert v["train_eval_diff"] == 0.0 and v["model_train_diff"] > 0.1  # the objective alone: same
    cond = SideEffects().conditions(settings("invariants", dropout="warn"))[1]
    assert cond.judge(v)[0] == Verdict.WARN


def test_empty_rows_are_named_under_max_length(healthy):
    """max_length 20: demo rows whose prompt has >= 20 tokens keep no supervised token."""
    from objdebug.pipeline.datasets import text_samples
    from objdebug.stages.invariants.truncation import EmptyAfterTruncation

    healthy.profile.data["invariants"]["max_length"] = 20
    try:
        res = EmptyAfterTruncation().run(healthy.ctx, healthy.profile.section("invariants"))
    finally:
        healthy.profile.data["invariants"]["max_length"] = 0
    expected = [s.id for s in text_samples(healthy.ctx) if len(s.prompt) >= 20]
    v = res.value
    assert [e.split("/")[0] for e in v["empty"]] == expected and expected
    f = next(f for f in res.findings if f.code == "OBJ709")
    assert f.verdict == Verdict.WARN and f"{len(expected)} of {v['rows']} rows" in f.message


# --------------------------------------------------------------------------- CLI
@pytest.mark.slow
def test_cli_invariants_demo_exits_0(tmp_path):
    out = subprocess.run([sys.executable, "-m", "objdebug.cli", "invariants", "--demo",
                          "--json", str(tmp_path / "r.json")], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^invariants +\d+ pass", out.stdout, re.M), out.stdout  # counted per stage
    assert "OBJ706" in (tmp_path / "r.json").read_text()


def test_cli_explain_prints_the_page():
    out = subprocess.run([sys.executable, "-m", "objdebug.cli", "explain", "OBJ704"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Liger-Kernel" in out.stdout


# --------------------------------------------------------------------------- reports
def test_every_report_format_renders_the_stage_in_pipeline_order():
    from fixtures.reports_data import synthetic_result
    from objdebug.core.findings import CheckResult, Finding
    from objdebug.report import html, json_report, junit, markdown, terminal

    result = synthetic_result()
    result.stages = ["align", "grad", "invariants", "decompose", "correlate", "stress"]
    res = CheckResult("invariants", "token-weighting", seconds=0.5, value={"micro_batches": 8})
    res.findings = [Finding("OBJ706", Verdict.INFO, "effective token weight max/min 1.59",
                            "token-weighting", "invariants", "token_weights_equal", fix="fix", value=1.59)]
    result.results.insert(next(i for i, r in enumerate(result.results) if r.stage == "decompose"), res)
    report = json_report.to_dict(result)
    for text in (terminal.render(report, colour=False, verbose=True), junit.dumps(report),
                 markdown.render(report), html.render(report)):
        assert "OBJ706" in text
        assert text.index("invariants") < text.index("decompose"), text[:200]


def test_end_to_end_form_is_skipped_with_a_reason():
    cfg = load_config(TARGETS / "grad_e2e" / "objdebug.toml")
    profile = load_profile(str(PROFILE))
    runtime.setup(cfg.run.device, cfg.run.mode, cfg.run.seed)
    engine = Engine(load_target(cfg), batch_size=4)
    ctx = Context(config=cfg, target=engine.target, engine=engine, profile=profile)
    for check in invariants.checks():
        res = run_check(check, ctx, profile.section("invariants"))
        assert [f.verdict for f in res.findings] == [Verdict.SKIP] and "end-to-end" in res.findings[0].message
    assert engine.compiles.count == 0
