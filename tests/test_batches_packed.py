"""Packed batches as the pipeline packs them (issue 34): without a `[packing]` section, the packing
stage (OBJ901-OBJ904) runs on the packed rows of `[data] batches`, the documents found from the
batches' own boundaries (position resets, actual_seq_len, EOS), with the pipeline's own labels
and boundary inputs.

Fixtures: `fixtures/batch_pipelines.py:packed_documents` on `fixtures.packing_models:packing_llama`
(an attention that reads position-id resets): `batches_packed` (healthy) passes the batches and
packing stages under ci-gate; the boundary-label bug fails OBJ903, positions that never reset
fail OBJ901. The bugs run through one Context, the batches swapped per case.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from objdebug import api
from objdebug.core.config import load_config
from objdebug.core.findings import Verdict
from objdebug.pipeline.runner import resolve_stages, run_check

from .conftest import TARGETS

SOURCE = "'fixtures.batch_pipelines:packed_documents'"


def test_the_healthy_packer_passes_batches_and_packing_under_ci_gate():
    cfg = load_config(TARGETS / "batches_packed" / "objdebug.toml")
    assert cfg.packing is None
    res = api.run(cfg, stages=["batches", "packing"], profile="ci-gate", compile_cache=False)
    found = {f.code: (f.verdict, f.message) for f in res.findings}
    assert res.exit_code == 0, found
    assert all(found[f"OBJ90{i}"][0] is Verdict.PASS for i in range(1, 5)), found
    assert all(v is Verdict.PASS for c, (v, _) in found.items() if c.startswith("OBJ01")), found
    assert found["OBJ901"][1].startswith(f"the pipeline's batches ({SOURCE}): 4 of 4 rows packed, "
                                         f"documents found from position resets (4), EOS (4)")
    assert "the documents are isolated" in found["OBJ901"][1]


def test_packing_joins_a_run_that_names_its_batches_and_no_stages():
    from objdebug.pipeline.profile import load_profile

    cfg = load_config(TARGETS / "batches_packed" / "objdebug.toml")
    assert resolve_stages(cfg, load_profile("default"), None)[-1] == "packing"
    plain = replace(cfg, data=replace(cfg.data, batches=None))
    assert "packing" not in resolve_stages(plain, load_profile("default"), None)


@pytest.fixture(scope="module")
def ctx():
    from objdebug.engine import runtime
    from objdebug.engine.core import Engine
    from objdebug.engine.target import load_target
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.profile import load_profile

    cfg = load_config(TARGETS / "batches_packed" / "objdebug.toml")
    runtime.setup("CPU", "graph", 0)
    target = load_target(cfg)
    return Context(config=cfg, target=target, engine=Engine(target), profile=load_profile())


def _judge(ctx, target="batches_packed", **data):
    """{code: (verdict, message)} of the packing stage's checks on `target`'s batches."""
    from objdebug.pipeline.packed_batches import pipeline_packing
    from objdebug.pipeline.pipeline_batches import real_batches
    from objdebug.stages import stage_checks
    from objdebug.stages.packing._common import measurement

    base = load_config(TARGETS / target / "objdebug.toml")
    ctx.config = replace(base, data=replace(base.data, **data))
    for provider in (real_batches, pipeline_packing, measurement):
        ctx.forget(provider)
    th = ctx.profile.section("packing")
    return {f.code: (f.verdict, f.message) for check in stage_checks("packing")
            for f in run_check(check, ctx, th).findings}


def test_a_boundary_label_bug_fails_obj903_naming_what_it_saw(ctx):
    found = _judge(ctx, "batches_packed_boundary_label")
    verdict, message = found["OBJ903"]
    assert verdict is Verdict.FAIL
    assert ("2 boundaries train a document's first token as the continuation of the previous one: "
            "'batch 1 row 0 doc 0' -> 'batch 1 row 0 doc 1' (row 0, position 37 trains toward 110, "
            "the next document's first token)") in message
    assert "the pipeline's labels" in message
    # the model keeps the documents apart: only the labels are wrong
    assert found["OBJ901"][0] is Verdict.PASS and found["OBJ902"][0] is Verdict.PASS


def test_positions_that_never_reset_fail_obj901_naming_them(ctx):
    found = _judge(ctx, "batches_packed_no_reset")
    verdict, message = found["OBJ901"]
    assert verdict is Verdict.FAIL
    assert "documents found from EOS (4)" in message  # no position restarts to find them by
    assert "packing leaks into 2 of 2 documents" in message
    assert ("the pipeline's position_ids restart at only 0 of the 2 document boundaries it packs"
            in message)
    assert found["OBJ902"][0] is Verdict.FAIL
    assert found["OBJ903"][0] is Verdict.PASS


def test_a_block_mask_column_is_the_boundary_the_model_is_given(ctx):
    found = _judge(ctx, "batches_packed_block_mask")
    assert all(found[f"OBJ90{i}"][0] is Verdict.PASS for i in range(1, 5)), found
    assert ("documents found from position resets (4), block mask (4), EOS (4)" in found["OBJ901"][1]
            and 'boundary = "attention_mask"' in found["OBJ901"][1])
    # positions that run on leak without the mask (OBJ901 fails above); with it, they do not
    found = _judge(ctx, "batches_packed_block_mask",
                   batches_kwargs={"style": "block_mask", "bug": "no_reset"})
    assert found["OBJ901"][0] is Verdict.PASS, found["OBJ901"]
    assert "documents found from block mask (4), EOS (4)" in found["OBJ901"][1]


def test_batches_without_packed_rows_skip_saying_why(ctx):
    found = _judge(ctx, batches="fixtures.batch_pipelines:healthy_collator",
                   batches_kwargs={"batch_size": 2, "batches": 1})
    assert {c: v for c, (v, _) in found.items()} == {f"OBJ90{i}": Verdict.SKIP for i in range(1, 5)}
    assert found["OBJ901"][1] == (
        "the pipeline's batches ('fixtures.batch_pipelines:healthy_collator') hold no packed rows: "
        "no row of the 2 read has a position_ids restart, an actual_seq_len end, a block-mask "
        "boundary or an EOS (3) "
        "before its last real token")


def test_a_model_config_that_cannot_take_the_boundaries_skips_isolation_saying_so(ctx):
    from objdebug.pipeline.packed_batches import pipeline_packing
    from objdebug.pipeline.pipeline_batches import real_batches
    from objdebug.stages.packing.boundary_labels import PackingBoundaryLabels
    from objdebug.stages.packing.isolation import PackingIsolation
    from objdebug.stages.packing.unpacked import PackingUnpacked

    base = load_config(TARGETS / "batches_packed" / "objdebug.toml")
    ctx.config = replace(base, model=replace(base.model, inputs=["input_ids", "attention_mask"]))
    ctx.forget(real_batches), ctx.forget(pipeline_packing)
    reason = PackingIsolation().skip_reason(ctx)
    assert reason.startswith("the model config gives no way to pass the pipeline's boundaries (the "
                             "batches have position_ids; [model] inputs = ['input_ids', "
                             "'attention_mask'] and construct takes no actual_seq_len)")
    assert PackingUnpacked().skip_reason(ctx) == reason
    assert PackingBoundaryLabels().skip_reason(ctx) is None  # the labels need no boundary input


# --------------------------------------------------------------------------- MindFormers' actual_seq_len
def _seq_len_run(**kwargs):
    cfg = load_config(TARGETS / "batches_packed_seq_len" / "objdebug.toml")
    if kwargs:
        cfg = replace(cfg, data=replace(cfg.data, batches_kwargs=dict(cfg.data.batches_kwargs, **kwargs)))
    res = api.run(cfg, stages=["batches", "packing"], profile="ci-gate", compile_cache=False)
    return res, {f.code: (f.verdict, f.message) for f in res.findings}


def test_mindformers_packed_rows_pass_with_their_actual_seq_len():
    res, found = _seq_len_run()
    assert res.exit_code == 0, found
    assert all(found[f"OBJ90{i}"][0] is Verdict.PASS for i in range(1, 5)), found
    assert "documents found from actual_seq_len (4), EOS (4)" in found["OBJ901"][1]
    assert 'boundary = "actual_seq_len"' in found["OBJ901"][1]


@pytest.mark.slow
def test_a_mindformers_boundary_label_fails_obj903():
    """Unshifted labels: the next document's first token labelled at its own position, which the
    objective pairs with the previous document's last logits."""
    res, found = _seq_len_run(bug="boundary_label")
    verdict, message = found["OBJ903"]
    assert verdict is Verdict.FAIL and res.exit_code == 1
    assert "(row 0, position 37 trains toward 110, the next document's first token)" in message


# --------------------------------------------------------------------------- documents found (numpy)
class _Batch:
    def __init__(self, **columns):
        self.number, self.columns = 1, {k: np.asarray(v)[None] for k, v in columns.items()}
        self.input_ids = self.columns["input_ids"]


@pytest.mark.parametrize("columns, found_by", [
    ({"position_ids": [0, 1, 2, 0, 1, 0, 0]}, "position resets"),
    ({"actual_seq_len": [3, 5, 7]}, "actual_seq_len"),
    ({}, "EOS"),
])
def test_the_documents_of_a_row_come_from_its_own_boundaries(columns, found_by):
    from objdebug.pipeline.packed_batches import _row

    ids = [5, 6, 3, 7, 3, 0, 0]
    batch = _Batch(input_ids=ids, labels=[6, 3, -100, 3, -100, -100, -100], **columns)
    padding = np.array([[False] * 5 + [True] * 2])
    row, found, why = _row(batch, 0, padding, 3 if found_by == "EOS" else None, -100)
    assert why is None and found[found_by] == {3}
    assert [d.ids for d in row.docs] == [[5, 6, 3], [7, 3]]
    assert [d.labels.tolist() for d in row.docs] == [[6, 3, -100], [3, -100]]


def test_a_block_mask_is_read_as_one_whichever_value_means_attend():
    from objdebug.pipeline.batches_source import _batch
    from objdebug.pipeline.packed_batches import _row
    from objdebug.core.config import DataSpec

    seg = np.array([0, 0, 0, 1, 1])
    attend = (seg[:, None] == seg[None, :]) & np.tri(5, dtype=bool)
    ids = np.array([[5, 6, 3, 7, 3]])
    for mask in (attend[None].astype(np.int64), (~attend)[None, None].astype(np.float32)):
        batch = _batch({"input_ids": ids, "attention_mask": mask}, 1, DataSpec(), "src")
        assert "attention_mask" not in batch.columns
        assert batch.columns["block_mask"].reshape(5, 5).tolist() == attend.astype(int).tolist()
        row, found, _ = _row(batch, 0, np.zeros((1, 5), bool), None, -100)
        assert found["block mask"] == {3} and [d.ids for d in row.docs] == [[5, 6, 3], [7, 3]]


def test_a_block_mask_of_the_wrong_shape_is_one_line():
    from objdebug.core.config import DataSpec
    from objdebug.core.errors import InputError
    from objdebug.pipeline.batches_source import _batch

    with pytest.raises(InputError, match=r"column 'attention_mask' is a block mask of shape "
                                         r"\[1, 4, 4\], but the input ids have \[1, 5\]"):
        _batch({"input_ids": [[1, 2, 3, 4, 5]], "attention_mask": np.ones((1, 4, 4))}, 1,
               DataSpec(), "src")


def test_a_changed_document_keeps_the_pipelines_labels_following_its_tokens():
    from objdebug.pipeline.packed_batches import _row, changed_document

    batch = _Batch(input_ids=[5, 6, 3, 7, 3], labels=[6, 3, 7, 3, -100],
                   position_ids=[0, 1, 2, 0, 1])
    row, _, _ = _row(batch, 0, np.zeros((1, 5), bool), 3, -100)
    new = changed_document([row], 256, 0, 0, 3)[0]
    assert new.ids[2] == 3 and new.ids[3:].tolist() == [7, 3]    # the EOS kept, the rest as it was
    assert new.labels[0] == new.ids[1] and new.labels[1] == 3    # labels follow the new tokens
    assert new.labels[2] == 7  # the boundary label (the next document's first token) stays the pipeline's
