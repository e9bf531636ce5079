"""OBJ102 tells the model's ranking from the objective's (objdebug/stages/align/model_ranking.py).

A healthy ChatML pipeline through a real BPE tokenizer on the Llama fixture fine-tuned on it
(fixtures/targets/llama_chat_template_tok) came out WARN OBJ102 under ci-gate, 79% < 80%: the model
gives each word-swapped "medium" answer ("The brown of Ivo is cat.") 9-14 nats per token and word
salad 8-11, and the objective, a mean token cross-entropy, follows it. That is the model's ranking:
every objective on that model sees it. The rows out of order the same way in the model's own
likelihood are a note; a disorder the model does not share (a double shift, here) still fails.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from objdebug import api
from objdebug.core.config import load_config
from objdebug.core.findings import Verdict
from objdebug.stages.align import AlignmentLoss
from objdebug.stages.align.model_ranking import wrong_pairs

from .conftest import TARGETS, settings

TARGET = TARGETS / "llama_chat_template_tok" / "objdebug.toml"


@given(st.floats(allow_nan=True, allow_infinity=True), st.floats(allow_nan=True, allow_infinity=True),
       st.floats(allow_nan=True, allow_infinity=True))
def test_a_row_has_no_wrong_pair_exactly_when_it_is_ordered(good, medium, bad):
    values = {"good": good, "medium": medium, "bad": bad}
    assert (not wrong_pairs(values)) == bool(bad > medium > good)
    assert (not wrong_pairs({"good": good, "bad": bad})) == bool(bad > good)


def _order(**value):
    cond = {c.code: c for c in AlignmentLoss().conditions(settings("align"))}["OBJ102"]
    return cond.judge({"pair_accuracy": 1.0, **value})


def _ranking(excused, rows):
    return {"measured": True, "excused": excused, "rows": [
        {"id": r, "nll": {"good": 0.1, "medium": 9.0, "bad": 8.0}, "objective_pairs": [("medium", "bad")],
         "model_pairs": [("medium", "bad")] if r in excused else [], "excused": r in excused}
        for r in rows]}


def test_rows_the_model_ranks_so_are_a_note_and_the_rest_is_judged():
    # 7 of 10 in order: WARN on the objective's own order
    verdict, message, value = _order(order_accuracy=0.7, violations=["a", "b", "c"],
                                     order_accuracy_vs_model=1.0,
                                     model_ranking=_ranking(["a", "b", "c"], ["a", "b", "c"]))
    assert verdict is Verdict.INFO and value == 0.7
    assert "3 of 3 are out of order the same way in the model's own likelihood" in message
    assert "a bad 8.00 <= medium 9.00" in message  # the model's numbers, pair by pair
    # one of four the model's: 7 of 10 as the model orders them is still a WARN
    verdict, message, _ = _order(order_accuracy=0.6, violations=["a", "b", "c", "d"],
                                 order_accuracy_vs_model=0.7,
                                 model_ranking=_ranking(["a"], ["a", "b", "c", "d"]))
    assert verdict is Verdict.WARN and "1 of 4" in message and "orders 70% of rows" in message
    # none the model's: the plain verdict, unchanged
    verdict, message, _ = _order(order_accuracy=0.4, violations=list("abcdef"), order_accuracy_vs_model=0.4,
                                 model_ranking=_ranking([], list("abcdef")))
    assert verdict is Verdict.FAIL and "model's own likelihood" not in message
    # the model's ranking unreadable: judged on the objective's order, and said why
    verdict, message, _ = _order(order_accuracy=0.7, violations=["a"], order_accuracy_vs_model=0.7,
                                 model_ranking={"measured": False, "reason": "no logits", "rows": [],
                                                "excused": []})
    assert verdict is Verdict.WARN and "could not be read (no logits)" in message


def _alignment(overrides=None):
    res = api.run(load_config(TARGET, overrides=overrides or {}), stages=["align"], profile="ci-gate",
                  compile_cache=False)
    found = {f.code: f for f in res.findings}
    value = next(r.value for r in res.results if r.check == "alignment")
    return res, found, value


def test_a_healthy_chat_pipeline_on_a_confident_model_passes_the_gate():
    res, found, value = _alignment()
    assert res.exit_code == 0, [(f.code, f.verdict, f.message) for f in res.findings]
    f = found["OBJ102"]
    assert f.verdict is Verdict.INFO, f.message
    assert value["model_ranking"]["excused"] == value["violations"] and value["violations"]
    assert value["order_accuracy_vs_model"] == 1.0
    # the model's NLL (numpy float64 from the logits) against the objective's own value: the
    # objective here is a mean token cross-entropy, the same quantity computed in the graph
    rows = {r["id"]: r for r in value["rows"]}
    for r in value["model_ranking"]["rows"]:
        for kind, nll in r["nll"].items():
            assert math.isclose(nll, rows[r["id"]][kind], rel_tol=1e-4, abs_tol=1e-4), (r["id"], kind)


def test_a_double_shift_on_the_same_model_still_fails_the_order():
    """HF's loss, which shifts the labels itself, on this pipeline's labels, which are shifted
    already (`shift = true`): the double shift. The rows it puts out of order the model orders
    well, so they stay the objective's."""
    res, found, value = _alignment({"objective.call": "sequence",
                                    "objective.factory": "fixtures.shift_losses:HFShiftingCE"})
    f = found["OBJ102"]
    assert f.verdict is Verdict.FAIL and res.exit_code == 1, f.message
    assert 0 < len(value["model_ranking"]["excused"]) < len(value["violations"])
    assert value["order_accuracy_vs_model"] < 0.5
