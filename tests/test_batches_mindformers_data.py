"""Issue 43 on a real library's data path: MindFormers 2.0.0's own `AlpacaInstructDataHandler`
and `PackingHandler` (fixtures/ecosystem/mindformers_sft_data.py, run unchanged with a byte
tokenizer) as `[data] batches`, audited in the split form (the demo model and a loss that pairs
logits[t] with labels[t]) and the end-to-end form (MindFormers' own LlamaForCausalLM, legacy: it
shifts the labels in training mode; and a wrapper Cell calling it), asserting what a correct
reading of the batches gives:

- the handler alone writes labels one ahead (`labels = labels[1:] + [ignore]`): +1, one shift with
  the split loss, two with MindFormers' own model (which shifts again);
- handler then packer (the chain of MindFormers' finetune configs): the packer shifts again
  (`sample['labels'][1:] + [pad_token]`): +2, and each document's last label is the pad id 0,
  which the objective trains (OBJ011).

Marked `ecosystem` (deselected by default): run with the ecosystem venv,
`/work/venv-eco/bin/python -m pytest -m ecosystem -n 0 tests/test_batches_mindformers_data.py`.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from objdebug import api
from objdebug.core.config import load_config
from objdebug.core.findings import Verdict

from .conftest import ROOT, TARGETS

pytestmark = pytest.mark.ecosystem

STUB = ROOT / "fixtures" / "ecosystem" / "hyper_parallel_stub"


@pytest.fixture(scope="module", autouse=True)
def mindformers(tmp_path_factory):
    import os

    sys.path.insert(0, str(STUB))
    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("mindformers"))  # its import writes ./output/log
    try:
        _imports()
    finally:
        os.chdir(here)
    yield
    sys.path.remove(str(STUB))


def _imports():
    pytest.importorskip("mindformers.dataset.handler.packing_handler",
                        reason="MindFormers 2.0.0 is not importable (tests/test_ecosystem_real.py)")
    pytest.importorskip("datasets", reason="the handlers need `datasets`")


def _run(target, pack, monkeypatch, tmp_path, **objective):
    monkeypatch.chdir(tmp_path)  # MindFormers writes ./output/log at import and construction
    cfg = load_config(TARGETS / target / "objdebug.toml")
    cfg = replace(cfg, data=replace(cfg.data, batches_kwargs={"pack": pack}))
    if objective:
        cfg = replace(cfg, objective=replace(cfg.objective, **objective))
    res = api.run(cfg, stages=["batches"], compile_cache=False)
    return {f.code: (f.verdict, f.message) for f in res.findings}, res


def test_the_handler_alone_is_one_shift_in_the_split_form(monkeypatch, tmp_path):
    found, res = _run("eco_mf_sft", False, monkeypatch, tmp_path)
    assert found["OBJ013"][1].startswith("labels are the inputs 1 position ahead: shifted once")
    assert found["OBJ019"][0] is Verdict.PASS and res.exit_code == 0, found


def test_handler_then_packer_shifts_twice_in_the_split_form(monkeypatch, tmp_path):
    found, res = _run("eco_mf_sft", True, monkeypatch, tmp_path)
    assert found["OBJ013"][0] is Verdict.FAIL
    assert found["OBJ013"][1].startswith("labels are the inputs 2 positions ahead: shifted twice (+2 at 99% of 302")
    assert found["OBJ019"][0] is Verdict.FAIL
    assert found["OBJ019"][1].startswith("2 shifts: each position trains toward the token 2 ahead")
    assert "against labels[t] (measured, split form)" in found["OBJ019"][1]
    # each document's last label: the packer's [pad_token] (0), trained by the objective
    assert found["OBJ011"][0] is Verdict.FAIL and "4 prompt positions" in found["OBJ011"][1]
    assert res.exit_code == 1


@pytest.mark.parametrize("pack, shifts", [(False, 2), (True, 3)])
def test_mindformers_own_model_shifts_again(monkeypatch, tmp_path, pack, shifts):
    """End to end: MindFormers' LlamaForCausalLM measured at its head ('lm_head') shifts once
    more; with the handler's +1 that is two shifts, with the packer's +2 three."""
    found, res = _run("eco_mf_sft_e2e", pack, monkeypatch, tmp_path)
    verdict, message = found["OBJ019"]
    assert verdict is Verdict.FAIL and message.startswith(f"{shifts} shifts:"), message
    assert "logits[t] against labels[t+1] (measured, end-to-end form)" in message
    assert any("measured at the output head 'lm_head'" in n for n in res.target["notes"])


def test_a_wrapper_cell_around_mindformers_model_is_measured_too(monkeypatch, tmp_path):
    found, res = _run("eco_mf_sft_e2e", False, monkeypatch, tmp_path,
                      factory="fixtures.e2e_cells:LibraryWrapper",
                      kwargs={"factory": "fixtures.ecosystem.real_mindformers:build_llama",
                              "seq_length": 1100})
    verdict, message = found["OBJ019"]
    assert verdict is Verdict.FAIL and message.startswith("2 shifts:"), message
    assert "(measured, end-to-end form)" in message
