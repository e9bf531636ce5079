"""The batches stage on the Llama fixture (issue 34's Done-when: fixtures for the demo model and
the Llama fixture), on the demo rows the fixture was trained on (`corpus = "demo"`):

- `llama_batches_collator`: a healthy HF-style collator (right padding with 0, a mask, labels
  pre-shifted with -100 on prompt and padding) passes the batches, grad and invariants stages
  under ci-gate (grad and invariants on the pipeline's first batch as it is);
- `llama_batches_mindrecord`: a healthy MindFormers-style MindRecord (labels = input_ids, -100 on
  prompt and padding, the objective shifts) passes the batches stage under ci-gate;
- `llama_batches_pad_zero`: the source procedure's bug (labels padded with 0, the objective
  ignores -100, the believed `label_pad_id = -100`) fails OBJ010 naming both values.
"""

from __future__ import annotations

from objdebug import api
from objdebug.core.config import load_config
from objdebug.core.findings import Verdict

from .conftest import TARGETS, without_plain_row_skips


def _run(target, stages):
    cfg = load_config(TARGETS / target / "objdebug.toml")
    res = api.run(cfg, stages=stages, profile="ci-gate", compile_cache=False)
    return res, {f.code: (f.verdict, f.message) for f in res.findings}


def test_the_healthy_collator_passes_batches_grad_and_invariants_under_ci_gate():
    res, found = _run("llama_batches_collator", ["batches", "grad", "invariants"])
    assert res.exit_code == 0, found
    batches = {c: v for c, (v, _) in without_plain_row_skips(found).items() if c.startswith(("OBJ01", "OBJ02"))}
    assert len(batches) == 11  # OBJ010-019 and OBJ021: every check these rows can answer
    assert all(v is Verdict.PASS for v in batches.values()), found
    assert "labels are the inputs 1 position ahead: shifted once (pre-shifted)" in found["OBJ013"][1]
    assert "in all 16 rows whose prompt is known" in found["OBJ017"][1]
    assert not [c for c, (v, _) in found.items() if v in (Verdict.WARN, Verdict.FAIL, Verdict.ERROR)]


def test_the_healthy_mindrecord_passes_the_batches_stage_under_ci_gate():
    res, found = _run("llama_batches_mindrecord", ["batches"])
    assert res.exit_code == 0, found
    assert found["OBJ016"][0] is Verdict.SKIP  # no mask column: padding from the pad run
    assert all(v is Verdict.PASS for c, (v, _) in without_plain_row_skips(found).items() if c != "OBJ016"), found
    assert "labels are the inputs at the same positions: unshifted" in found["OBJ013"][1]
    assert found["OBJ019"][1].startswith("one shift in all: labels are the inputs at the same positions: unshifted")


def test_the_seed_bug_fails_obj010_with_the_believed_config():
    res, found = _run("llama_batches_pad_zero", ["batches"])
    verdict, message = found["OBJ010"]
    assert verdict is Verdict.FAIL and res.exit_code == 1
    assert message.startswith("labels on padding are 0; the objective ignores -100")
    assert found["OBJ012"][0] is Verdict.FAIL
    assert "label_pad_id = -100 declared, the batches put 0 on padding" in found["OBJ012"][1]
