"""Packing diagnoses say what was measured before naming a cause (issue 35): which documents reach
which, at which positions, and a cause only where that pattern supports one.

- host side (no MindSpore): `_reach.pattern` on hand-built reach maps (a boundary read late, a
  leak through the next document, a boundary read early, nothing);
- MindSpore: the varlen model that reads the boundary one position late
  (`fixtures/targets/packing_mask_late`: block-mask starts; `packing_seq_len_late`: actual_seq_len
  ends) was reported as "the model does not reset positions" (OBJ902) and as "an attention path
  that ignores it" (OBJ901); now both name the measured leak (the first position of each later
  document sees the previous one) and the late boundary, never the wrong part.
"""

from __future__ import annotations

import numpy as np
import pytest

from .test_packing import _cfg, _run


# --------------------------------------------------------------------------- host side
def _measurement(lengths_per_row, moved_positions, own_positions=()):
    """A stand-in for the shared measurement: rows of documents with the given lengths, `moved[c]`
    maps where the listed (changed document, row, document, relative position) entries moved by 1,
    and `own_moved` where the listed (row, document, relative position) entries moved."""
    from types import SimpleNamespace

    from objdebug.engine.packing import Document, PackedRow

    rows = [PackedRow([Document(f"r{i}d{k}", [5] * n, np.zeros(n, np.int32))
                       for k, n in enumerate(lengths)], sum(lengths) + 2)
            for i, lengths in enumerate(lengths_per_row)]
    per_row = len(lengths_per_row[0])
    moved = [np.zeros((len(rows), rows[0].length)) for _ in range(per_row - 1)]
    for c, i, k, p in moved_positions:
        moved[c][i, rows[i].span(k)[0] + p] = 1.0
    own = np.zeros((len(rows), rows[0].length))
    for i, k, p in own_positions:
        own[i, rows[i].span(k)[0] + p] = 1.0
    return SimpleNamespace(rows=rows, moved=moved, own_moved=own)


def _pattern(lengths_per_row, moved_positions):
    from objdebug.stages.packing._reach import pattern, reaches

    m = _measurement(lengths_per_row, moved_positions)
    return pattern(reaches(m, 1e-5), m)


def test_a_leak_into_the_first_position_after_every_boundary_is_a_late_boundary():
    late = [(0, i, 1, 0) for i in range(2)] + [(1, i, 2, 0) for i in range(2)]
    assert _pattern([[4, 5, 6], [6, 4, 5]], late) == \
        {"kind": "late", "positions": 1, "boundaries": 4, "reached": 4}
    two = [(0, i, 1, p) for i in range(2) for p in (0, 1)] + [(1, i, 2, p) for i in range(2) for p in (0, 1)]
    assert _pattern([[4, 5, 6], [6, 4, 5]], two)["positions"] == 2


@pytest.mark.parametrize("moved, kind", [
    ([], "none"),
    # through the whole next document (and beyond): attention crosses the boundary
    ([(0, 0, 1, p) for p in range(5)] + [(0, 0, 2, 3)] + [(1, 0, 2, p) for p in (1, 5)], "crosses"),
    # the first position at one boundary only: not every boundary, no cause
    ([(0, 0, 1, 0)], "irregular"),
    # the first position and one further in: not confined to the start
    ([(0, 0, 1, 0), (0, 0, 1, 3), (1, 0, 2, 0)], "irregular"),
    # the first position of the document after next too: not only the previous document
    ([(0, 0, 1, 0), (1, 0, 2, 0), (0, 0, 2, 0)], "irregular"),
])
def test_other_patterns_name_their_kind(moved, kind):
    assert _pattern([[4, 5, 6]], moved)["kind"] == kind


def test_the_measured_clause_names_documents_rows_and_positions():
    from objdebug.stages.packing._reach import measured, pattern, positions_text, reaches

    m = _measurement([[4, 5, 6]], [(0, 0, 1, 0), (1, 0, 2, 0)])
    found = reaches(m, 1e-5)
    text = measured(found, pattern(found, m))
    assert "the first 1 position(s) of each later document see the previous document" in text
    assert "'r0d0' -> 'r0d1' (row 0): the first 1 position(s) of 5, up to 1 nats" in text
    assert positions_text([0, 1, 2, 3, 7, 9, 10], 12) == "7 of 12 positions (0-3, 7, 9-10)"
    assert positions_text(list(range(5)), 5) == "every position (5)"


def test_a_first_position_cut_off_from_its_document_is_measured():
    from objdebug.stages.packing._reach import cut

    rows = [[4, 5, 6], [6, 4, 5]]
    whole = [(i, k, p) for i, ls in enumerate(rows) for k, n in enumerate(ls) for p in range(n)]
    assert cut(_measurement(rows, [], whole), 1e-5)["kind"] == "none"  # each sees its first token
    firsts = [(i, 0, p) for i, ls in enumerate(rows) for p in range(ls[0])]
    later = [(i, k, 0) for i, ls in enumerate(rows) for k in (1, 2)]
    assert cut(_measurement(rows, [], firsts + later), 1e-5) == \
        {"kind": "cut", "positions": 1, "documents": 4, "first_reach": 4}
    # the first documents cut too: nothing tells a cut at the boundary from a short reach
    assert cut(_measurement(rows, [], [(i, k, 0) for i in range(2) for k in range(3)]), 1e-5)["kind"] == "none"


def _judge(check, value):
    from objdebug.pipeline.profile import load_profile

    th = load_profile("default").section("packing")
    return check.conditions(th)[0].judge(value)


def test_a_leak_into_unscored_positions_passes_and_is_named():
    """OBJ901 judges the scored tokens; a leak into the first (prompt) position of each document is
    said as measured, with the late boundary it supports, never 'the documents are isolated'."""
    from objdebug.stages.packing._reach import cut, pattern, reaches
    from objdebug.stages.packing.isolation import PackingIsolation

    m = _measurement([[4, 5, 6]], [(0, 0, 1, 0), (1, 0, 2, 0)])
    found = reaches(m, 1e-5)
    docs = [{"row": 0, "document": d, "changed": "r0d0", "loss_diff": 0.0, "grad_rel_diff": 0.0}
            for d in ("r0d1", "r0d2")]
    verdict, msg, _ = _judge(PackingIsolation(), {
        "boundary": "attention_mask", "inputs": ["input_ids", "attention_mask"], "length": 17,
        "reaches": found, "pattern": pattern(found, m), "cut": cut(m, 1e-5), "rows": 1,
        "documents_per_row": 3, "documents": docs, "max_loss_diff": 0.0, "max_grad_rel_diff": 0.0,
        "first_document_change": 5.0})
    assert verdict.value == "PASS"
    assert "the scored tokens of the later documents do not move, their predictions at unscored " \
           "positions do" in msg and "isolated" not in msg
    assert "'r0d0' -> 'r0d1' (row 0): the first 1 position(s) of 5" in msg
    assert "it takes the block mask's document starts 1 position(s) late" in msg


# --------------------------------------------------------------------------- MindSpore
# the parts issue 35 saw blamed for a boundary read one position late
WRONG = ("does not reset positions", "an attention path that ignores it",
         "does not apply the block-diagonal mask", "attention crosses the boundary",
         "the leak runs through the whole next document", "the packed call itself")


@pytest.mark.slow
def test_a_block_mask_read_one_position_late_is_named_as_measured():
    _, _, f = _run(_cfg("packing_mask_late"))
    # the varlen path also reads the position-id resets: no other document reaches the first
    # position, which is cut off from the rest of its document instead
    isolation = f["OBJ901"]
    assert isolation.verdict.value == "PASS"
    assert "the documents are isolated; within a document, changing each document's first token " \
           "moves only the first 1 position(s) of each of the 4 later documents" in isolation.message
    unpacked = f["OBJ902"]
    assert unpacked.verdict.value == "FAIL"
    msg = unpacked.message
    assert "'a002' (row 0, offset 45: 0.757, mean 7.471 packed vs 7.614 alone; its predictions " \
           "differ at 40 of 41 positions (1-40))" in msg
    assert "no change reaches another document at any position" in msg
    assert "moves only the first 1 position(s) of each of the 4 later documents (in a row's first " \
           "document, at least 45 positions)" in msg
    assert "the first 1 position(s) of each later document are cut off from the rest of it and no " \
           "other document reaches them: one of the boundary inputs the model reads " \
           "(attention_mask, position_ids) gives each document start 1 position(s) late" in msg
    # what was measured comes before the cause
    assert msg.index("moves only the first 1") < msg.index("are cut off from the rest")
    assert not [w for w in WRONG if w in msg + isolation.message], msg
    assert f["OBJ903"].verdict.value == "PASS" and f["OBJ904"].verdict.value == "PASS"


def test_actual_seq_len_cut_one_position_late_is_named_as_measured():
    _, _, f = _run(_cfg("packing_seq_len_late"))
    for code in ("OBJ901", "OBJ902"):  # plain text: the first position of a document is scored
        assert f[code].verdict.value == "FAIL", f[code].message
        msg = f[code].message
        assert "the first 1 position(s) of each later document see the previous document" in msg
        assert "'doc00' -> 'doc01' (row 0): the first 1 position(s) of 76" in msg
        assert "it cuts attention 1 position(s) after each actual_seq_len end" in msg
        assert msg.index("see the previous document") < msg.index("cuts attention")
        assert not [w for w in WRONG if w in msg], msg
    assert "packing leaks into 2 of 4 documents: 'doc01' (row 0, after 'doc00'" in f["OBJ901"].message
