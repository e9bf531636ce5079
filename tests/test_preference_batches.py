"""Preference batches (`[data] batches` with chosen / rejected columns): OBJ030-OBJ035 per pair on
the TRL-style and MindFormers DPO layouts (fixtures/preference_pipelines.py), a failing twin per
bug class, a missing twin column as one-line bad input, and the preference stage on the
pipeline's own pairs. The cases share one Context on the demo model (the objective's probe graph
compiles once)."""

from __future__ import annotations

import sys
import types
from dataclasses import replace

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
    "lens_with_padding": ({"packed": True}, "OBJ035", "batch 1 row 0 chosen: lens [46, 48] sum to 94, the row holds 92 real tokens"),
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
