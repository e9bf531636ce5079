"""Preference batches (`[data] batches` with chosen / rejected columns): OBJ030-OBJ035 per pair on
the TRL-style and MindFormers DPO layouts (fixtures/preference_pipelines.py), a failing twin per
bug class, a missing twin column as one-line bad input, and the preference stage on the
pipeline's own pairs. The cases share one Context on the demo model (the objective's probe graph
compiles once)."""

from __future__ import annotations

import sys
import types
from dataclasses import replace

import numpy as np
import pytest

from objdebug.core.config import DataSpec, load_config
from objdebug.core.errors import InputError
from objdebug.core.findings import Verdict
from objdebug.pipeline.runner import run_check

from .conftest import TARGETS

CODES = [f"OBJ03{i}" for i in range(6)]
CASE: dict[str, object] = {"make": None}


@pytest.fixture(scope="module")
def ctx():
    from objdebug.engine import runtime
    from objdebug.engine.core import Engine
    from objdebug.engine.target import load_target
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.profile import load_profile

    mod = types.ModuleType("prefcase_test")
    mod.make = lambda: CASE["make"]()
    sys.modules["prefcase_test"] = mod
    cfg = load_config(TARGETS / "pref_mindformers" / "objdebug.toml")
    runtime.setup("CPU", "graph", 0)
    target = load_target(cfg)
    yield Context(config=cfg, target=target, engine=Engine(target), profile=load_profile("ci-gate"))
    sys.modules.pop("prefcase_test", None)


def _judge(ctx, layout="mindformers", **kwargs):
    import fixtures.preference_pipelines as pp
    from objdebug.pipeline.preference_batches import real_pairs
    from objdebug.stages.batches.audit import audit, real_batches
    from objdebug.stages.batches.pair_checks import CHECKS, pairs_of

    CASE["make"] = lambda: getattr(pp, layout)(**kwargs)
    cfg = load_config(TARGETS / "pref_mindformers" / "objdebug.toml")
    ctx.config = replace(cfg, data=replace(cfg.data, batches="prefcase_test:make", batches_kwargs={}))
    for f in (audit, real_batches, pairs_of, real_pairs):
        ctx.forget(f)
    th = ctx.profile.section("batches")
    return {f.code: (f.verdict, f.message) for c in CHECKS for f in run_check(c(), ctx, th).findings}


@pytest.mark.parametrize("layout,kwargs", [("trl", {}), ("mindformers", {}),
                                           ("mindformers", {"packed": True})])
def test_the_healthy_layouts_pass(ctx, layout, kwargs):
    found = _judge(ctx, layout, **kwargs)
    lens = found.pop("OBJ035")
    assert lens[0] is (Verdict.PASS if kwargs else Verdict.SKIP), lens
    assert all(v is Verdict.PASS for v, _ in found.values()), found
    pairs = 8 if layout == "mindformers" and not kwargs else 16  # packed: two pairs a row
    assert f"in all {pairs} pairs" in found["OBJ030"][1]


BUGS = {  # bug -> (layout kwargs, code, words)
    "rejected_prompt_scored": ({}, "OBJ031", "batch 1 row 0 rejected: 21 prompt tokens scored (from token 1; the other answer from 22)"),
    "doubled_bos": ({}, "OBJ033", "16 answers open with the BOS (1, the id every answer opens with) twice (batch 1 row 0 chosen"),
    "empty_rejected": ({}, "OBJ032", "2 answers have no scored token (batch 1 row 0 rejected (22 real tokens)"),
    "different_prompts": ({}, "OBJ030", "batch 1 row 0: they part at token 1 (chosen [73, 118, 111, 32], rejected [111, 32, 104, 97])"),
    "first_token_dropped": ({}, "OBJ034", "batch 1 row 0 chosen: token 22 (84) unscored, scoring from 23"),
    # the drop only where both answers open alike ("The eel of Ivo" / "The eel of Eva"): they
    # part after the dropped token; the answer's start comes from row 0's prompt (OBJ034)
    "first_token_dropped_alike": ({}, "OBJ034", "batch 1 row 1 chosen: token 22 (84) unscored, scoring from 23"),
    "lens_with_padding": ({"packed": True}, "OBJ035", "batch 1 row 0 pair 2 chosen: lens entry 48, the pair holds 46 real tokens"),
}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_each_bug_twin_fails_with_its_code(ctx, bug):
    kwargs, code, words = BUGS[bug]
    healthy = _judge(ctx, **kwargs)
    found = _judge(ctx, bug=bug, **kwargs)
    assert healthy[code][0] is Verdict.PASS
    verdict, message = found[code]
    assert verdict is Verdict.FAIL and words in message, message


def test_a_chosen_column_without_its_rejected_twin_is_one_line_bad_input():
    from objdebug.pipeline.batches_source import _batch

    batch = next(iter(__import__("fixtures.preference_pipelines", fromlist=["trl"]).trl()))
    del batch["rejected_labels"]
    with pytest.raises(InputError) as err:
        _batch(batch, 1, DataSpec(), "mypipe:collate")
    text = str(err.value)
    assert "\n" not in text
    assert "batch 1 of 'mypipe:collate' has the column 'chosen_labels' but not its twin 'rejected_labels'" in text


def test_the_preference_stage_scores_the_pipelines_own_pairs(ctx):
    """The session's pairs are the batches' (prompt and answers as the pipeline cut them), not
    the target's [data] preference rows."""
    from objdebug.pipeline.preference_batches import real_pairs
    from objdebug.stages.preference.session import no_preference_reason, session

    _judge(ctx)
    ctx.forget(session)
    s = session(ctx)
    assert [p["id"] for p in s.pairs][:2] == ["batch 1 row 0", "batch 1 row 1"]
    assert len(s.pairs) == 8 and s.pairs == [dict(p, truncated=False) for p in real_pairs(ctx)]
    assert bytes(s.pairs[0]["prompt"]) == b"\x01Ivo has a black eel.\n"
    assert bytes(s.pairs[0]["rejected"]) == b"kiwi hens is see fig PEAR."
    ctx.config = replace(ctx.config, data=replace(ctx.config.data, preference=None))
    assert no_preference_reason(ctx) is None  # the batches' pairs are enough


@pytest.mark.parametrize("block", range(3))
def test_the_docs_preference_batch_examples_read_as_pairs(tmp_path, block):
    """docs/config.md's preference-batch examples (TRL, MindFormers DPO, packed), each read as
    the batches stage reads it: every pair found, both answers scored after one shared prompt."""
    from objdebug.pipeline.batches_source import read_batches
    from objdebug.pipeline.preference_batches import pair_facts

    from .conftest import ROOT
    from .doc_snippets import section_blocks

    blocks = section_blocks("### Preference batches: chosen and rejected columns")
    assert len(blocks) == 3
    keys = blocks[block].split("[data]\n", 1)[1]
    base = (TARGETS / "pref_mindformers" / "objdebug.toml").read_text()
    base = "\n".join(line for line in base.splitlines()
                     if not line.startswith(("batches =", "shift =")))
    cfg_path = tmp_path / "objdebug.toml"
    cfg_path.write_text(base.replace("[data]\n", "[data]\n" + keys).replace("../../../", f"{ROOT}/"))
    cfg = load_config(cfg_path)
    got = read_batches(cfg.data, str(ROOT), str(ROOT))
    pairs = pair_facts(got.batches, {-100}, 0)
    assert len(pairs) == (8 if block == 1 else 16)
    for f in pairs:
        assert f.chosen.scored.sum() and f.rejected.scored.sum()
        assert f.common >= f.start("chosen") == f.start("rejected") or f.common == f.start("chosen")


def _trl_session(ctx):
    """The preference session on the TRL-layout pairs (labels = input ids), with the run's
    conventions adopted from the batches as the runner does before the preference stage
    (shift = false: their measured offset 0); the engine's padding restored by the caller."""
    from objdebug.pipeline.pipeline_batches import adopt_conventions
    from objdebug.stages.preference.session import session

    _judge(ctx, "trl")
    for f in (adopt_conventions, session):
        ctx.forget(f)
    adopt_conventions(ctx)
    assert ctx.config.data.shift is False  # the batches' own layout
    return session(ctx)


def _reference_logps(logits, pairs, key):
    """numpy float64 reference: sum over the answer's tokens of log softmax(logits[t - 1])[token t]."""
    out = []
    for x, p in zip(logits, pairs):
        seq, start = p["prompt"] + p[key], len(p["prompt"])
        x = x.astype(np.float64)
        logp = x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(-1, keepdims=True)
        out.append(sum(logp[t - 1, seq[t]] for t in range(start, len(seq))))
    return np.array(out)


def test_a_trl_layout_is_scored_on_the_next_token_as_the_pipeline_shifts_it(ctx):
    """The false alarm of a TRL-layout target (shift = false): objdebug's own log-prob reduction
    paired logits[t] with the token at t (log p of a token the model already sees), so OBJ809
    warned on ci-gate and OBJ812 found 5 of 16 pairs preferred. Its labels now carry the next
    token whatever the pipeline's layout: the log-probs equal a numpy float64 reference and the
    MindFormers layout's (pre-shifted) for the same pairs, and the stage's checks pass."""
    from objdebug.stages.preference import checks
    from objdebug.stages.preference.session import session

    padding = ctx.engine.padding
    try:
        s = _trl_session(ctx)
        assert s.label_offset == 1  # form "preference": objdebug's reduction reads the labels
        got = s.logps("policy")
        b = s.batches[0]
        ref = _reference_logps(ctx.engine.logits(b.c_ids), b.rows, "chosen")
        np.testing.assert_allclose(got.c_sum[:b.n], ref, rtol=1e-4)
        th = ctx.profile.section("preference")
        found = {f.code: f for c in checks() if c.name in ("length", "agreement")
                 for f in run_check(c, ctx, th).findings}
        for code in ("OBJ809", "OBJ812"):
            assert found[code].verdict is Verdict.PASS, found[code].message
        assert "16 of 16 pairs" in found["OBJ812"].message
        trl = got.c_sum[:8].copy()
    finally:
        ctx.engine.padding = padding
    _judge(ctx)  # the same first 8 pairs, MindFormers' pre-shifted layout (shift = true)
    ctx.forget(session)
    np.testing.assert_allclose(session(ctx).logps("policy").c_sum, trl, rtol=1e-4)


def _trl_target(tmp_path, objective: str | None = None, pairs: str | None = None):
    """fixtures/targets/pref_trl's config with its SFT `[objective]` factory replaced, or its
    preference objective as a "preference-pairs" Cell (`pairs`: a factory in
    fixtures/preference_losses.py) in place of `[objective]` and `[preference]`."""
    from .conftest import ROOT

    text = (TARGETS / "pref_trl" / "objdebug.toml").read_text().replace("../../../", f"{ROOT}/")
    if objective:
        text = text.replace('factory = "fixtures.shift_losses:HFShiftingCE"', f'factory = "{objective}"')
    if pairs:
        head, rest = text.split("[objective]", 1)
        rest = rest.split("[data]", 1)[1]
        pref, rest = rest.split("[preference]", 1)
        rest = rest.split("[reference]", 1)[1]
        text = (head + f'[objective]\nfactory = "fixtures.preference_losses:{pairs}"\n'
                'kwargs = { beta = 0.1 }\ncall = "preference-pairs"\nloss_type = "sigmoid"\n'
                'logps = "sum"\n\n[data]' + pref + "[reference]" + rest)
    path = tmp_path / "objdebug.toml"
    path.write_text(text)
    return load_config(path)


@pytest.mark.slow
def test_a_healthy_trl_target_passes_every_stage_on_ci_gate():
    """fixtures/targets/pref_trl (labels = input ids, an objective that shifts them, shift =
    false): every stage passes on ci-gate (before: OBJ809 warned, the preference stage scored
    logits[t] against the token at t)."""
    from objdebug import api

    res = api.run(load_config(TARGETS / "pref_trl" / "objdebug.toml"), profile="ci-gate",
                  compile_cache=False)
    bad = [(f.code, f.verdict, f.message) for f in res.findings
           if f.verdict in (Verdict.FAIL, Verdict.WARN, Verdict.ERROR)]
    assert res.exit_code == 0 and not bad, bad
    found = {f.code: f for f in res.findings}
    assert found["OBJ013"].verdict is Verdict.PASS and found["OBJ019"].verdict is Verdict.PASS
    assert "16 of 16 pairs" in found["OBJ812"].message


@pytest.mark.slow
def test_a_wrongly_shifted_trl_twin_still_fails(tmp_path):
    """The same TRL batches (labels = input ids) with an objective that does not shift: the
    batches stage fails it (OBJ019: the labels' offset 0 + the objective's pairing 0)."""
    from objdebug import api

    cfg = _trl_target(tmp_path, objective="objdebug.losses:MaskedCrossEntropy")
    res = api.run(cfg, stages=["batches"], profile="ci-gate", compile_cache=False)
    found = {f.code: f for f in res.findings}
    assert found["OBJ019"].verdict is Verdict.FAIL, found["OBJ019"].message
    assert res.exit_code == 1


@pytest.mark.slow
@pytest.mark.parametrize("cell,verdict", [("ShiftingPairsDPO", Verdict.PASS), ("PairsDPO", Verdict.FAIL)])
def test_a_pairs_cell_on_trl_batches_is_judged_in_their_layout(tmp_path, cell, verdict):
    """Form "preference-pairs" on the TRL batches: the Cell gets the labels in the pipeline's
    layout (offset 0, measured), and OBJ807 maps each label to the logit that predicts it. A Cell
    that shifts them itself (TRL's concatenated_forward) passes; one that does not (pre-shifted
    labels expected) reads the last answer token's logits, past the answer: FAIL."""
    from objdebug import api

    cfg = _trl_target(tmp_path, pairs=cell)
    res = api.run(cfg, stages=["preference"], profile="ci-gate", compile_cache=False,
                  select=["OBJ807", "OBJ812"])
    found = {f.code: f for f in res.findings}
    assert found["OBJ807"].verdict is verdict, found["OBJ807"].message
    if verdict is Verdict.PASS:
        assert found["OBJ812"].verdict is Verdict.PASS, found["OBJ812"].message
    else:
        assert "padding positions" in found["OBJ807"].message


def test_a_packed_row_in_slots_is_read_by_its_segments():
    """MindFormers' own packing (dpo_preprocess.py r1.5.0 `_process_data_group`, measured in
    tests/test_preference_ecosystem.py): each pair padded to a slot, the slot + 1 in the attention
    mask, the slot in `index_packed`, `*_lens` each answer's length. The pairs are found by the
    slots (the lens would cut the row wrong), each lens entry read against its own pair."""
    from fixtures.preference_pipelines import mindformers
    from objdebug.pipeline.batches_source import _batch
    from objdebug.pipeline.preference_batches import pair_facts

    rows = next(iter(mindformers(batch_size=4, batches=1)))  # one pair a row, each padded to 64
    packed = {}
    for side in ("chosen", "rejected"):
        cols = {k: rows[f"{side}_{k}"] for k in ("input_ids", "labels", "loss_mask", "attention_mask")}
        slots = [(0, 1), (2, 3)]  # two rows, two pairs each
        for k, v in cols.items():
            joined = np.stack([np.concatenate([v[a], v[b]]) for a, b in slots])
            if k == "attention_mask":
                joined = joined * np.concatenate([np.ones(64, np.int64), np.full(64, 2)])
            packed[f"{side}_{k}"] = joined
        packed[f"{side}_index_packed"] = np.tile(np.repeat([0, 1], 64), (2, 1))
        starts = [int(np.argmax(m != 0)) + 1 for m in cols["loss_mask"]]  # the first scored token
        real = cols["attention_mask"].sum(1)
        packed[f"{side}_lens"] = np.array([[real[a] - starts[a], real[b] - starts[b]] for a, b in slots])
    facts = pair_facts([_batch(packed, 1, DataSpec(), "slots")], {-100}, 0)
    single = pair_facts([_batch(rows, 1, DataSpec(), "rows")], {-100}, 0)
    assert [f.where for f in facts] == ["batch 1 row 0 pair 1", "batch 1 row 0 pair 2",
                                        "batch 1 row 1 pair 1", "batch 1 row 1 pair 2"]
    for f, g in zip(facts, single):
        assert f.chosen.ids.tolist() == g.chosen.ids.tolist() and f.rejected.ids.tolist() == g.rejected.ids.tolist()
        assert f.chosen.scored.tolist() == g.chosen.scored.tolist() and f.common == g.common
        assert f.chosen.lens_entry == len(g.chosen.ids) - g.start("chosen")  # the answer's length
