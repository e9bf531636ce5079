"""Preference batches as the ecosystem makes them (issue 53's Done-when), healthy and with the six
pair bugs, in the ecosystem venv:

- MindFormers' own DPO preprocessing (`toolkit/data_preprocess/dpo_preprocess.py`, release branch
  r1.5.0, read from a local mirror and run unchanged: fixtures/ecosystem/mindformers_dpo.py): its
  rows (`_process_sample`, one pair a row, `input_sliced_sig = true`: labels pre-shifted, as the
  demo objective reads them) and its packing path
  (`pack_data` writes a real MindRecord, read back through MindDataset). Measured and recorded:
  its packed layout pads each pair to a slot, writes the slot into the attention mask and
  `index_packed`, and gives `*_lens` as each ANSWER's length (`len(resp_ids)`); objdebug finds
  each pair by its slot and checks the lens against it (before: cut by the lens, every healthy
  packed row failed OBJ035 and mis-read its pairs);
- a TRL-style DPO collator through transformers' tokenizer (fixtures/ecosystem/trl_dpo.py) on the
  Llama fixture (TRL's layout has no lens: five of the six bugs).

Each healthy layout passes every batches-stage check; each twin FAILs with the code its bug names,
one its healthy twin passes. In-process, one Context per target (one objective probe each). Run:
`/work/venv-eco/bin/python -m pytest -q -n 0 -m ecosystem tests/test_preference_ecosystem.py`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest

from objdebug.core.config import load_config
from objdebug.core.findings import Verdict
from objdebug.pipeline.runner import run_check

from .conftest import ROOT, TARGETS

pytestmark = pytest.mark.ecosystem
MIRROR = os.environ.get("OBJDEBUG_MINDFORMERS_MIRROR", "/work/.mirror/mindspore-lab+mindformers/repo")
STUB = ROOT / "fixtures" / "ecosystem" / "hyper_parallel_stub"
needs_mf = pytest.mark.skipif(importlib.util.find_spec("mindformers") is None or not Path(MIRROR).exists(),
                              reason="needs MindFormers 2.0.0 (the ecosystem venv) and a mirror of its "
                                     "repository (the DPO script is on r1.5.0)")
needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                              reason="needs transformers (the ecosystem venv)")
CASE: dict[str, object] = {"make": None}
PAIR_CODES = [f"OBJ03{i}" for i in range(6)]


@pytest.fixture(scope="module", autouse=True)
def _case_module():
    mod = types.ModuleType("prefeco_test")
    mod.make = lambda: CASE["make"]()
    sys.modules["prefeco_test"] = mod
    yield
    sys.modules.pop("prefeco_test", None)


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


@pytest.fixture(scope="module")
def mf_ctx():
    sys.path.insert(0, str(STUB))
    yield _context("mf_dpo")
    sys.path.remove(str(STUB))


@pytest.fixture(scope="module")
def trl_ctx():
    return _context("trl_dpo_hf")


def _judge(ctx, target: str, make, every: bool) -> dict[str, tuple[Verdict, str]]:
    """{code: (verdict, message)} of every batches-stage check (`every`) or the pair checks, on
    `target`'s config with its batches made by `make()`."""
    from objdebug.pipeline.preference_batches import real_pairs
    from objdebug.stages import stage_checks
    from objdebug.stages.batches import pair_checks
    from objdebug.stages.batches.audit import audit, real_batches
    from objdebug.stages.batches.pair_checks import pairs_of

    CASE["make"] = make
    cfg = load_config(TARGETS / target / "objdebug.toml")
    ctx.config = replace(cfg, data=replace(cfg.data, batches="prefeco_test:make", batches_kwargs={}))
    for f in (audit, real_batches, pairs_of, real_pairs):
        ctx.forget(f)
    th = ctx.profile.section("batches")
    checks = stage_checks("batches") if every else [c() for c in pair_checks.CHECKS]
    return {f.code: (f.verdict, f.message) for c in checks for f in run_check(c, ctx, th).findings}


def _bad(found):
    return {c: v for c, v in found.items() if v[0] not in (Verdict.PASS, Verdict.SKIP)}


def _mf(layout: str, bug: str | None = None):
    from fixtures.ecosystem import mindformers_dpo as mf

    if layout == "packed":
        return lambda: mf.dpo_packed_batches(bug=bug)
    return lambda: mf.dpo_batches(layout == "sliced", bug=bug)


MF_HEALTHY: dict[str, dict] = {}


def _mf_healthy(ctx, layout):
    if layout not in MF_HEALTHY:
        MF_HEALTHY[layout] = _judge(ctx, "mf_dpo_packed" if layout == "packed" else "mf_dpo", _mf(layout), True)
    return MF_HEALTHY[layout]


@needs_mf
@pytest.mark.parametrize("layout", ["sliced", "packed"])
def test_mindformers_dpo_layouts_pass_every_batches_check(mf_ctx, layout):
    found = _mf_healthy(mf_ctx, layout)
    assert not _bad(found), _bad(found)
    for code in PAIR_CODES[:5]:
        assert found[code][0] is Verdict.PASS, (code, found[code])
    if layout == "packed":  # group_and_pack starts each group with the last one's pair: 8 pairs
        # -> 8 rows, 7 of 2 pairs and the last of 1 (its lens padded with 0): 15 pairs
        assert found["OBJ035"][0] is Verdict.PASS and "all 30 answers" in found["OBJ035"][1], found["OBJ035"]
        assert "in all 15 pairs" in found["OBJ030"][1], found["OBJ030"]
    else:
        assert found["OBJ035"][0] is Verdict.SKIP


MF_BUGS = {  # bug -> (layout, code)
    "rejected_prompt_scored": ("sliced", "OBJ031"),
    "doubled_bos": ("sliced", "OBJ033"),
    "empty_rejected": ("sliced", "OBJ032"),
    "different_prompts": ("sliced", "OBJ030"),
    "first_token_dropped": ("sliced", "OBJ034"),
    "lens_with_padding": ("packed", "OBJ035"),
}


@needs_mf
@pytest.mark.parametrize("bug", sorted(MF_BUGS))
def test_mindformers_dpo_pair_bugs_fail_with_their_code(mf_ctx, bug):
    layout, code = MF_BUGS[bug]
    healthy = _mf_healthy(mf_ctx, layout)
    target = "mf_dpo_packed" if layout == "packed" else "mf_dpo"
    found = _judge(mf_ctx, target, _mf(layout, bug), False)
    assert healthy[code][0] is Verdict.PASS
    assert found[code][0] is Verdict.FAIL, (code, found[code], _bad(found))


TRL_BUGS = {
    "rejected_prompt_scored": "OBJ031",
    "doubled_bos": "OBJ033",
    "empty_rejected": "OBJ032",
    "different_prompts": "OBJ030",
    "first_token_dropped": "OBJ034",
}
TRL_HEALTHY: dict[str, dict] = {}


def _trl(bug=None):
    from fixtures.ecosystem.trl_dpo import collator

    return lambda: collator(bug)


@needs_hf
def test_a_trl_style_collator_through_a_real_tokenizer_passes_every_batches_check(trl_ctx):
    TRL_HEALTHY["found"] = found = _judge(trl_ctx, "trl_dpo_hf", _trl(), True)
    assert not _bad(found), _bad(found)
    for code in PAIR_CODES[:5]:
        assert found[code][0] is Verdict.PASS, (code, found[code])
    assert "in all 16 pairs" in found["OBJ030"][1]


@needs_hf
@pytest.mark.parametrize("bug", sorted(TRL_BUGS))
def test_a_trl_style_collators_pair_bugs_fail_with_their_code(trl_ctx, bug):
    code = TRL_BUGS[bug]
    healthy = TRL_HEALTHY.get("found") or _judge(trl_ctx, "trl_dpo_hf", _trl(), False)
    found = _judge(trl_ctx, "trl_dpo_hf", _trl(bug), False)
    assert healthy[code][0] is Verdict.PASS
    assert found[code][0] is Verdict.FAIL, (code, found[code], _bad(found))
