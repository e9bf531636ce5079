"""With `[data] batches`, grad, invariants and stress take the gradient batch from the pipeline
(its first batch, at the shape it made it), and a convention the batches contradict is replaced by
what they show for every stage after the batches stage (objdebug/pipeline/pipeline_batches.py).

The seed bug (labels padded with 0, ignore_index -100, the believed label_pad_id = -100) passed
OBJ205 while grad measured rows objdebug padded with -100 itself; on the pipeline's batch it fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from objdebug import api
from objdebug.core.config import load_config
from objdebug.core.findings import Verdict
from objdebug.pipeline.runner import run_check

from .conftest import TARGETS, only_checks

# the checks of these stages that read the gradient batch (stress: the others build their own rows)
STAGES = {"grad": None, "invariants": None, "stress": {"long-objective"}}


def _context(target: str, profile: str = "ci-gate"):
    from objdebug.engine import runtime
    from objdebug.engine.core import Engine
    from objdebug.engine.target import load_target
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.profile import load_profile

    cfg = load_config(TARGETS / target / "objdebug.toml")
    runtime.setup("CPU", "graph", 0)
    target = load_target(cfg)
    prof = load_profile(profile)
    return Context(config=cfg, target=target, profile=prof,
                   engine=Engine(target, batch_size=prof.section("engine")["batch_size"]))


def _run(ctx) -> dict[str, list[tuple[Verdict, str]]]:
    from objdebug.stages import stage_checks

    out: dict[str, list[tuple[Verdict, str]]] = {}
    for stage, only in STAGES.items():
        th = ctx.profile.section(stage)
        for check in stage_checks(stage):
            if (only is None or check.name in only) and check.enabled(th):
                for f in run_check(check, ctx, th).findings:
                    out.setdefault(f.code, []).append((f.verdict, f.message))
    return out


@pytest.fixture(scope="module")
def healthy():
    ctx = _context("batches_healthy")
    return ctx, _run(ctx)


def test_the_gradient_batch_is_the_pipelines_first_batch_as_it_is(healthy):
    from fixtures.batch_pipelines import healthy_collator
    from objdebug.pipeline.run_data import grad_batch

    ctx, _ = healthy
    first = next(healthy_collator(batch_size=4, batches=1))
    batch = grad_batch(ctx)
    assert batch.input_ids.shape == first["input_ids"].shape == (4, 37)  # no re-padding
    np.testing.assert_array_equal(batch.labels, first["labels"])
    assert [s.id for s in batch.samples] == [f"batch 1 row {r}" for r in range(4)]
    assert [s.length for s in batch.samples] == first["attention_mask"].sum(axis=1).tolist()
    notes = ctx.target.info["notes"]
    assert any("grad, invariants and stress use the pipeline's first batch as it is (4x37" in n
               and "align" in n and "rows objdebug builds from the JSONL" in n for n in notes)
    assert not any("the batches win" in n for n in notes)  # nothing contradicted


def test_the_healthy_collator_passes_grad_invariants_and_stress_on_its_batch(healthy):
    _, found = healthy
    assert {"OBJ205", "OBJ206", "OBJ209", "OBJ210", "OBJ701", "OBJ703", "OBJ513"} <= set(found)
    bad = {c: v for c, vs in found.items() for v in vs
           if v[0] in (Verdict.FAIL, Verdict.WARN, Verdict.ERROR)}
    assert not bad, bad
    assert "0 of 124 masked positions (label_pad_id=-100)" in found["OBJ205"][0][1]
    assert "24 supervised positions in 4 rows" in found["OBJ209"][0][1]


def test_the_mindrecord_pipeline_passes_grad_invariants_and_stress_on_its_batch():
    """Fixed length 48, no mask, labels = input ids; the objective shifts inside (MindFormers)."""
    ctx = _context("batches_mindrecord")
    found = _run(ctx)
    bad = {c: v for c, vs in found.items() for v in vs
           if v[0] in (Verdict.FAIL, Verdict.WARN, Verdict.ERROR)}
    assert not bad, bad
    assert any("(4x48, from 'healthy.mindrecord')" in n for n in ctx.target.info["notes"])
    assert "every supervised position trains: 24 supervised positions" in found["OBJ209"][0][1]


def test_the_seed_bug_fails_padding_leakage_and_the_batches_win(monkeypatch):
    """Before: grad built its own rows padded with the believed -100 and OBJ205 passed."""
    only_checks(monkeypatch, grad={"padding-leakage"})  # OBJ205's check: the others' findings are not selected
    cfg = load_config(TARGETS / "batches_pad_zero" / "objdebug.toml")
    res = api.run(cfg, stages=["batches", "grad"], profile="ci-gate", compile_cache=False,
                  select=["OBJ012", "OBJ205"])
    found = {f.code: (f.verdict, f.message) for f in res.findings}
    # the batches stage judged the declared value; grad then measured with the batches' value
    assert found["OBJ012"][0] is Verdict.FAIL
    assert "label_pad_id = -100 declared, the batches put 0 on padding" in found["OBJ012"][1]
    verdict, message = found["OBJ205"]
    assert verdict is Verdict.FAIL
    assert message.startswith("35 of 124 masked positions (label_pad_id=0) receive gradient")
    notes = res.target["notes"]
    assert any("the batches win (OBJ012): data.label_pad_id = -100 declared, 0 in the batches" in n
               for n in notes), notes
    assert res.exit_code == 1


def test_without_batches_nothing_changes():
    """No `[data] batches`: no convention adopted, no note, the gradient batch is objdebug's rows."""
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.pipeline_batches import adopt_conventions, first_batch

    cfg = load_config(TARGETS / "tiny" / "objdebug.toml")
    ctx = Context(config=cfg, target=None, engine=None, profile=None)
    assert adopt_conventions(ctx) == [] and ctx.config is cfg
    assert first_batch(ctx) is None


def test_contradicted_conventions_are_replaced_by_the_batches_with_a_note(monkeypatch):
    """A pipeline padding on the left with id 2 and labelling its padding 0, against the declared
    right / 0 / -100: all three replaced in the config and the engine's padding, both values named."""
    import sys
    import types
    from dataclasses import replace

    from objdebug.pipeline.context import Context
    from objdebug.pipeline.pipeline_batches import adopt_conventions

    ids = np.array([[2, 2, 5, 6, 7], [2, 5, 6, 7, 8]], np.int64)
    batch = {"input_ids": ids, "attention_mask": (ids != 2).astype(np.int64),
             "labels": np.where(ids == 2, 0, np.roll(ids, -1, axis=1))}
    mod = types.ModuleType("leftpad_pipeline")
    mod.make = lambda: iter([batch])
    monkeypatch.setitem(sys.modules, "leftpad_pipeline", mod)
    cfg = load_config(TARGETS / "batches_healthy" / "objdebug.toml")
    cfg = replace(cfg, data=replace(cfg.data, batches="leftpad_pipeline:make", batches_kwargs={}))
    target, engine = types.SimpleNamespace(info={}, config=cfg), types.SimpleNamespace(padding=None)
    ctx = Context(config=cfg, target=target, engine=engine, profile=None)
    notes = adopt_conventions(ctx)
    assert notes[0].startswith("the batches win (OBJ012): data.pad_id = 0 declared, 2 in the "
                               "batches; data.padding_side = 'right' declared, 'left' in the "
                               "batches; data.label_pad_id = -100 declared, 0 in the batches")
    d = ctx.config.data
    assert (d.pad_id, d.padding_side, d.label_pad_id) == (2, "left", 0)
    assert target.config is ctx.config and engine.padding.label_pad_id == 0
    assert engine.padding.pad_id == 2 and target.info["notes"] == notes
    assert adopt_conventions(ctx) is notes  # once per run


def test_a_pipeline_without_labels_keeps_objdebugs_rows_and_says_so(monkeypatch):
    import sys
    import types
    from dataclasses import replace

    from objdebug.pipeline.context import Context
    from objdebug.pipeline.pipeline_batches import first_batch

    mod = types.ModuleType("nolabels_pipeline")
    mod.make = lambda: iter([{"input_ids": np.array([[5, 6, 7, 0]], np.int64)}])
    monkeypatch.setitem(sys.modules, "nolabels_pipeline", mod)
    cfg = load_config(TARGETS / "batches_healthy" / "objdebug.toml")
    cfg = replace(cfg, data=replace(cfg.data, batches="nolabels_pipeline:make", batches_kwargs={}))
    target = types.SimpleNamespace(info={}, config=cfg)
    ctx = Context(config=cfg, target=target, engine=types.SimpleNamespace(padding=None), profile=None)
    assert first_batch(ctx) is None
    assert target.info["notes"] == ["[data] batches: 'nolabels_pipeline:make' has no labels column: "
                                    "grad, invariants and stress use rows objdebug builds from the "
                                    "JSONL, as every other stage"]
