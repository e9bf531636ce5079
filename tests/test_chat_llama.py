"""Post-training data on the Llama fixture (issue 45's Done-when: fixtures on the demo model and the
Llama fixture), as fixtures/targets/llama_batches_collator builds a Llama target on the demo rows:

- `llama_chat_chatml`: a healthy multi-turn ChatML pipeline (fixtures/chat_pipelines.py), roles
  from the template by prefix rendering;
- `llama_chat_glm`: a healthy GLM-style pipeline, the next role's header closing a turn;
- `llama_pref_trl`: a healthy TRL-style preference pipeline (labels = input ids, the SFT
  objective shifts them, shift = false), the preference stage on the batches' own pairs.

The chat targets' checkpoint is the Llama fixture fine-tuned on other conversations
(fixtures/chat/llama_chat.ckpt, `python -m fixtures.chat.train_chat --model llama`), as the demo
chat targets' is. By default each healthy chat pipeline passes the role checks and each bug twin
FAILs with a code its healthy twin lacks, naming the row, the turn and the tokens (the audit
compiles no graph holding the model: one objective probe per module); `slow`: the preference
pipeline's pair checks and twins (a second objective probe; the demo model's run by default in
test_preference_batches.py), the whole batches stage, and every stage on ci-gate.
"""

from __future__ import annotations

import sys
import types
from dataclasses import replace

import pytest

from objdebug import api
from objdebug.core.config import load_config
from objdebug.core.findings import Verdict
from objdebug.pipeline.runner import run_check

from .conftest import TARGETS

CASE: dict[str, object] = {"make": None}


def _context(target: str):
    from objdebug.engine import runtime
    from objdebug.engine.core import Engine
    from objdebug.engine.target import load_target
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.profile import load_profile

    cfg = load_config(TARGETS / target / "objdebug.toml")
    runtime.setup("CPU", "graph", 0)
    t = load_target(cfg)
    return Context(config=cfg, target=t, engine=Engine(t), profile=load_profile("ci-gate"))


@pytest.fixture(scope="module", autouse=True)
def _case_module():
    mod = types.ModuleType("llamacase_test")
    mod.make = lambda: CASE["make"]()
    sys.modules["llamacase_test"] = mod
    yield
    sys.modules.pop("llamacase_test", None)


@pytest.fixture(scope="module")
def chat_ctx():
    return _context("llama_chat_chatml")


@pytest.fixture(scope="module")
def pref_ctx():
    return _context("llama_pref_trl")


def _batches_stage(ctx, target: str, make, every: bool = False) -> dict[str, tuple[Verdict, str]]:
    """{code: (verdict, message)} of the role and pair checks (OBJ023-OBJ028, OBJ030-OBJ035:
    the audit's objective probe only), or of every batches-stage check (`every`: graphs at the
    batches' shape too), on `target`'s config, its batches made by `make()` (the Context's
    target, hence its objective probe, shared)."""
    from objdebug.pipeline.preference_batches import real_pairs
    from objdebug.stages import stage_checks
    from objdebug.stages.batches.audit import audit, real_batches
    from objdebug.stages.batches.chat_roles import roles_of, row_roles
    from objdebug.stages.batches.pair_checks import pairs_of

    CASE["make"] = make
    cfg = load_config(TARGETS / target / "objdebug.toml")
    ctx.config = replace(cfg, data=replace(cfg.data, batches="llamacase_test:make", batches_kwargs={}))
    for f in (audit, real_batches, roles_of, row_roles, pairs_of, real_pairs):
        ctx.forget(f)
    from objdebug.stages.batches import chat_checks, pair_checks

    th = ctx.profile.section("batches")
    checks = stage_checks("batches") if every else [c() for c in chat_checks.CHECKS + pair_checks.CHECKS]
    return {f.code: (f.verdict, f.message) for c in checks for f in run_check(c, ctx, th).findings}


def _chat(ctx, target, bug=None, every=False):
    from fixtures.chat_pipelines import pipeline

    fmt = load_config(TARGETS / target / "objdebug.toml").data.batches_kwargs["fmt"]
    return _batches_stage(ctx, target, lambda: pipeline(fmt, bug), every)


def _pref(ctx, bug=None, every=False):
    from fixtures.preference_pipelines import trl

    return _batches_stage(ctx, "llama_pref_trl", lambda: trl(bug), every)


def _bad(found):
    return {c: v for c, v in found.items() if v[0] not in (Verdict.PASS, Verdict.SKIP)}


@pytest.mark.parametrize("target", ["llama_chat_chatml", "llama_chat_glm"])
def test_the_healthy_chat_pipelines_pass_every_role_check_on_llama(chat_ctx, target):
    found = _chat(chat_ctx, target)
    assert all(found[f"OBJ0{i}"][0] is Verdict.PASS for i in range(23, 29)), found
    assert "16 assistant, 4 system, 2 tool, 14 user turns" in found["OBJ023"][1]  # two batches


@pytest.mark.slow
@pytest.mark.parametrize("target", ["llama_chat_chatml", "llama_chat_glm"])
def test_the_healthy_chat_pipelines_pass_the_batches_stage_on_llama(chat_ctx, target):
    found = _chat(chat_ctx, target, every=True)
    assert not _bad(found), _bad(found)
    assert all(found[f"OBJ0{i}"][0] is Verdict.PASS for i in range(23, 29)), found
    assert "16 assistant, 4 system, 2 tool, 14 user turns" in found["OBJ023"][1]  # two batches


CHAT_BUGS = {  # (target, bug) -> {code: words its message must hold}
    ("llama_chat_chatml", "stop_masked"): {"OBJ025": "batch 1 row 0 turn 3 (assistant): '<|im_end|>'"},
    ("llama_chat_chatml", "user_trained"): {
        "OBJ026": "batch 1 row 0 turn 4 (user): 33 tokens 'Reverse: pear fig peach<|im_end|>'"},
    ("llama_chat_chatml", "think_trained"): {
        "OBJ027": "batch 1 row 0 turn 5 (assistant fixed): 19 tokens '<think>⏎⏎</think>⏎⏎'"},
    ("llama_chat_glm", "stop_masked"): {
        "OBJ025": "the stop token (the next role's header: next-role) of 16 of 16 assistant turns"},
}


@pytest.mark.parametrize("target,bug", sorted(CHAT_BUGS))
def test_each_chat_bug_twin_fails_on_llama_with_a_code_its_healthy_twin_lacks(chat_ctx, target, bug):
    healthy = _chat(chat_ctx, target)
    found = _chat(chat_ctx, target, bug)
    for code, words in CHAT_BUGS[(target, bug)].items():
        assert healthy[code][0] is Verdict.PASS, healthy[code]
        verdict, message = found[code]
        assert verdict is Verdict.FAIL and words in message, (code, message)


@pytest.mark.slow  # the pair checks' twins run by default on the demo model (test_preference_batches.py)
def test_the_healthy_preference_pipeline_passes_every_pair_check_on_llama(pref_ctx):
    found = _pref(pref_ctx)
    assert all(found[f"OBJ03{i}"][0] is Verdict.PASS for i in range(5)), found
    assert "in all 16 pairs" in found["OBJ030"][1]


@pytest.mark.slow
def test_the_healthy_preference_pipeline_passes_the_batches_stage_on_llama(pref_ctx):
    found = _pref(pref_ctx, every=True)
    assert not _bad(found), _bad(found)
    assert all(found[f"OBJ03{i}"][0] is Verdict.PASS for i in range(5)), found
    assert "labels are the inputs at the same positions: unshifted" in found["OBJ013"][1]


PREF_BUGS = {  # bug -> (code, words)
    "rejected_prompt_scored": ("OBJ031", "batch 1 row 0 rejected: 21 prompt tokens scored (from token 1; the other answer from 22)"),
    "first_token_dropped_alike": ("OBJ034", "batch 1 row 1 chosen: token 22 (84) unscored, scoring from 23"),
}


@pytest.mark.slow
@pytest.mark.parametrize("bug", sorted(PREF_BUGS))
def test_each_preference_bug_twin_fails_on_llama(pref_ctx, bug):
    code, words = PREF_BUGS[bug]
    assert _pref(pref_ctx)[code][0] is Verdict.PASS
    verdict, message = _pref(pref_ctx, bug)[code]
    assert verdict is Verdict.FAIL and words in message, message


# --------------------------------------------------------------------------- every stage (slow)
@pytest.mark.slow
@pytest.mark.parametrize("target", ["llama_chat_chatml", "llama_chat_glm", "llama_pref_trl",
                                    "llama_chat_template_tok", "llama_chat_qwen3"])
def test_the_healthy_llama_pipelines_pass_every_stage_on_ci_gate(target):
    """The real-tokenizer targets too (issue 53): their model gives two wrong answers of a row
    the order a mean CE then follows, OBJ102's note (tests/test_align_model_ranking.py)."""
    res = api.run(load_config(TARGETS / target / "objdebug.toml"), profile="ci-gate", compile_cache=False)
    bad = [(f.code, f.verdict, f.message) for f in res.findings
           if f.verdict in (Verdict.FAIL, Verdict.WARN, Verdict.ERROR)]
    assert res.exit_code == 0 and not bad, bad
    found = {f.code: f for f in res.findings}
    assert found["OBJ013"].verdict is Verdict.PASS
    if target == "llama_pref_trl":  # the reference is the policy's checkpoint: every margin 0
        assert found["OBJ807"].verdict is Verdict.PASS and found["OBJ805"].verdict is Verdict.PASS
        assert found["OBJ812"].verdict is Verdict.SKIP and "every margin is 0" in found["OBJ812"].message
    else:
        assert found["OBJ025"].verdict is Verdict.PASS
        # OBJ020 judges the EOS of trained turns: GLM declares its EOS (3), ChatML as text none
        if target in ("llama_chat_chatml", "llama_chat_glm"):
            assert found["OBJ020"].verdict is (Verdict.PASS if target == "llama_chat_glm" else Verdict.SKIP)
