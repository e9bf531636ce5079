"""The label pairing (engine/label_pairing.py): which label the objective scores each logit position
against, measured on the real objective, and every position-wise check pairing by it (issue 33).

A causal-LM loss that shifts inside (HF's `ForCausalLMLoss`, MindFormers' layout: logits[:, :-1]
against labels[:, 1:], `[data] shift = false`) is healthy and must pass the gates; the same loss
shifting twice or never must fail OBJ701, as the pre-shifted form's twins do.

Cost: the measurement is one call of the objective's logit-gradient graph per objective (the demo's
256-token vocabulary); one whole grad + invariants + stress run on the HF-style loss (demo model,
right padding) and one packing run; the other fixtures (Llama, left padding, MindFormers' layout)
run in the slow matrix.
"""

import numpy as np
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from objdebug import api
from objdebug.core.config import load_config, parse_override
from objdebug.core.findings import Verdict
from objdebug.engine import label_pairing, runtime
from objdebug.engine.core import Engine
from objdebug.engine.label_pairing import (Pairing, decide, labels_for_targets, pairing_of_gradient,
                                           paired_labels)
from objdebug.engine.target import load_target

from .conftest import TARGETS, only_checks

PAD = -100


# ----------------------------------------------------------------------------- host side (numpy)
@hsettings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(2, 12), st.integers(-2, 2), st.integers(0, 2**31 - 1))
def test_labels_for_targets_is_paired_labels_inverse(rows, length, offset, seed):
    """The labels handed to an objective with pairing `offset` are scored, position by position,
    against the targets asked for (where a logit position has a label at all)."""
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, 50, (rows, length))
    labels = labels_for_targets(targets, offset, PAD)
    back = paired_labels(labels, offset, PAD)
    paired_at = slice(0, length - offset) if offset >= 0 else slice(-offset, length)
    np.testing.assert_array_equal(back[:, paired_at], targets[:, paired_at])
    assert (back[:, :paired_at.start] == PAD).all() and (back[:, paired_at.stop:] == PAD).all()


def test_paired_labels_of_a_shifting_objective():
    labels = np.array([[PAD, PAD, 7, 8, 9, PAD]])
    np.testing.assert_array_equal(paired_labels(labels, 1, PAD), [[PAD, 7, 8, 9, PAD, PAD]])
    np.testing.assert_array_equal(paired_labels(labels, 0, PAD), labels)
    np.testing.assert_array_equal(paired_labels(labels, 1, PAD, positions=4), [[PAD, 7, 8, 9]])


def _ce_grad(logits, targets):
    """Reference: d(mean CE)/d(logits) at the positions that have a target (>= 0)."""
    z = logits - logits.max(-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    keep = targets >= 0
    onehot = np.zeros_like(p)
    np.put_along_axis(onehot, np.where(keep, targets, 0)[..., None], 1.0, -1)
    return np.where(keep[..., None], p - onehot, 0.0) / max(int(keep.sum()), 1)


@pytest.mark.parametrize("offset", [0, 1, 2])
def test_the_gradient_shows_the_pairing(offset):
    """A cross-entropy that scores logits[t] against labels[t + offset] (numpy reference): the
    measurement finds that offset at every position that has a gradient."""
    logits, labels = label_pairing.measurement_batch(64, {0})
    targets = paired_labels(labels, offset, -1)
    positions, matches = pairing_of_gradient(_ce_grad(logits.astype(np.float64), targets), labels)
    assert positions == int((targets >= 0).sum())
    assert dict(matches)[offset] == positions
    assert all(h < positions for d, h in matches if d != offset)  # no neighbour repeats a label
    p = decide(positions, matches, shift=True)
    assert (p.offset, p.measured, p.standard) == (offset, True, offset in (0, 1))


def test_nothing_measured_falls_back_to_the_layout():
    """No logit gradient (an argmax cuts it) or no offset agreeing: what data.shift implies."""
    assert decide(0, ((0, 0), (1, 0)), shift=True) == Pairing(
        0, False, why="the objective gives no logit gradient on the measurement batch")
    p = decide(32, ((0, 10), (1, 12), (2, 0), (-1, 0), (-2, 0)), shift=False)
    assert (p.offset, p.measured) == (1, False)
    assert "no offset explains 90% of the 32 positions" in p.why and "labels[t+1]: 12" in p.why


# ----------------------------------------------------------------------------- on the real objective
_DEMO = TARGETS / "shift_hf" / "objdebug.toml"


@pytest.fixture(scope="module")
def measure():
    """The pairing of an objective factory on the demo model (one logit-gradient graph each)."""
    def run(factory, call="sequence", shift=False):
        cfg = load_config(_DEMO, overrides=dict([parse_override(f"objective.factory={factory}"),
                                                 parse_override(f"objective.call={call}"),
                                                 parse_override(f"data.shift={str(shift).lower()}"),
                                                 # known: no model forward compiled to read it
                                                 parse_override("data.vocab_size=256")]))
        runtime.setup(cfg.run.device, cfg.run.mode, cfg.run.seed)
        with runtime.scratch_dir():
            target = load_target(cfg)
            engine = Engine(target, batch_size=2)
            found = label_pairing.of(engine)
            return found, target.describe().get("notes", [])
    return run


@pytest.mark.parametrize("factory,call,offset", [
    ("fixtures.shift_losses:HFShiftingCE", "sequence", 1),
    ("fixtures.shift_losses:MindFormersShiftingCE", "sequence", 1),
    ("fixtures.shift_losses:NeverShiftsCE", "sequence", 0),
    ("objdebug.losses:MaskedCrossEntropy", "flat", 0),
    ("fixtures.llama.objectives:SmoothedCE", "flat", 0),
])
def test_measured_on_the_objective(measure, factory, call, offset):
    p, notes = measure(factory, call)
    assert (p.offset, p.measured) == (offset, True)
    assert dict(p.matches)[offset] == p.positions > 0
    shifted = [n for n in notes if "shifts the labels itself" in n]
    assert bool(shifted) == (offset == 1)
    if shifted:
        assert "logits[t] against labels[t+1] (measured: 30 of 30 positions" in shifted[0]


def test_a_custom_alignment_is_a_note_and_a_skip_reason(measure):
    p, notes = measure("fixtures.shift_losses:ShiftsTwiceCE")
    assert (p.offset, p.measured, p.standard) == (2, True, False)
    assert any("a custom alignment" in n and "labels[t+2]" in n for n in notes)
    assert "labels[t+2]" in label_pairing.custom_reason(p)


def test_no_gradient_is_the_declared_pairing(measure):
    """An argmax cuts the logit gradient: nothing to measure, the layout's pairing, said so."""
    p, notes = measure("fixtures.pitfall_objectives:ArgmaxErrorRate", shift=True)
    assert (p.offset, p.measured) == (0, False)
    assert any("not measured" in n for n in notes)


# ----------------------------------------------------------------------------- the gates
def _verdicts(result):
    return {f.code: f.verdict for r in result.results for f in r.findings}


def _problems(result):
    return [(f.code, f.verdict.name, f.message[:160]) for r in result.results for f in r.findings
            if f.verdict in (Verdict.FAIL, Verdict.WARN, Verdict.ERROR)]


def test_a_loss_that_shifts_inside_passes_the_gate():
    """HF's causal-LM loss on the demo model: no position-wise false alarm (OBJ205 / OBJ207 /
    OBJ208 / OBJ209 / OBJ513 failed before the pairing was measured), the exit code of a pass."""
    result = api.run(load_config(_DEMO), stages=["grad", "invariants", "stress"],
                     profile=str(_DEMO.parent / "profile.toml"))  # ci-gate, long input at 256 tokens
    assert _problems(result) == []
    v = _verdicts(result)
    for code in ("OBJ205", "OBJ207", "OBJ208", "OBJ209", "OBJ701", "OBJ504", "OBJ513"):
        assert v[code] == Verdict.PASS, code
    assert result.exit_code == 0
    assert any("shifts the labels itself" in n for n in result.target["notes"])


@pytest.mark.slow
def test_packed_rows_with_a_loss_that_shifts_inside():
    result = api.run(load_config(TARGETS / "shift_packing_hf" / "objdebug.toml"), profile="ci-gate")
    assert _problems(result) == []
    assert {c: _verdicts(result)[c] for c in ("OBJ901", "OBJ902", "OBJ903", "OBJ904")} == dict.fromkeys(
        ("OBJ901", "OBJ902", "OBJ903", "OBJ904"), Verdict.PASS)


@pytest.mark.parametrize("name,best", [("shift_twice", -1), ("shift_never", 1)])
def test_its_buggy_twins_fail_alignment(name, best, monkeypatch):
    """The same loss shifting twice or never fails OBJ701 (on real text), naming the measured
    pairing. (The twice-shifted one's position-wise checks skip as a custom alignment:
    test_a_custom_alignment_is_a_note_and_a_skip_reason.)"""
    only_checks(monkeypatch, invariants={"label-alignment"})  # OBJ701's check alone
    result = api.run(load_config(TARGETS / name / "objdebug.toml"), stages=["invariants"])
    f = next(f for r in result.results for f in r.findings if f.code == "OBJ701")
    assert f.verdict == Verdict.FAIL
    assert f"the minimum is at d = {best:+d}" in f.message
    assert "measured: the objective scores logits[t] against " in f.message
    assert result.exit_code == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["shift_hf", "shift_hf_left", "shift_mf", "shift_llama_hf", "shift_llama_mf_left",
                                  "shift_packing_mf"])
def test_the_matrix_passes_the_gate(name):
    """Both fixtures (demo, Llama), both padding sides, both layouts (HF, MindFormers), packed."""
    cfg = load_config(TARGETS / name / "objdebug.toml")
    stages = None if cfg.packing is not None else ["grad", "invariants", "stress"]
    result = api.run(cfg, stages=stages, profile="ci-gate")
    assert _problems(result) == []
    assert result.exit_code == 0
