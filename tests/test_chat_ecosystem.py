"""The role audit on MindFormers' own SFT data handler (issue 45), in the ecosystem venv:
`AlpacaInstructDataHandler` (MindFormers 2.0.0) makes the batches (fixtures/ecosystem/
mindformers_chat.py), `[chat]` declares its template's markers, the batches stage reads them.

A result about the library, recorded as measured: the handler labels the whole assistant message
it tokenizes, "ASSISTANT: " included (`cur_labels = cur_token`), so the role header is trained
(OBJ027 FAILs naming it); the content and the "</s>" stop are trained, the system prompt and the
user turn are not. Marked `ecosystem`: `python -m pytest -m ecosystem -n 0 tests/test_chat_ecosystem.py`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .conftest import ROOT, TARGETS

pytestmark = pytest.mark.ecosystem
ECO = Path(os.environ.get("OBJDEBUG_ECO_PYTHON", "/work/venv-eco/bin/python"))


@pytest.mark.skipif(not ECO.exists(), reason="the ecosystem venv (MindFormers 2.0.0) is not installed")
def test_mindformers_alpaca_handler_trains_its_assistant_header():
    proc = subprocess.run([str(ECO), "-c", "from objdebug.cli import main; main()", "batches",
                           "--config", str(TARGETS / "mf_alpaca_chat" / "objdebug.toml"), "-v"],
                          capture_output=True, text=True, cwd=ROOT, timeout=900,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr[-2000:]
    fails = [line for line in out.splitlines() if line.startswith("FAIL ")]
    assert len(fails) == 1 and fails[0].startswith("FAIL OBJ027"), fails
    assert "batch 1 row 0 turn 2 (assistant header): 11 tokens 'ASSISTANT: '" in fails[0]
    for code in ("OBJ023", "OBJ024", "OBJ025", "OBJ026", "OBJ028"):
        assert f"PASS {code}" in out
    assert "(trained tokens by role: assistant 88, assistant header 44, assistant stop 16)" in out


@pytest.mark.skipif(not ECO.exists(), reason="the ecosystem venv (MindFormers 2.0.0) is not installed")
@pytest.mark.skipif(not Path("/work/.mirror/mindspore-lab+mindformers/repo").exists()
                    and "OBJDEBUG_MINDFORMERS_MIRROR" not in os.environ,
                    reason="no local mirror of the MindFormers repository (its DPO script is on r1.5.0)")
def test_mindformers_dpo_preprocess_pairs_as_objdebug_reads_them():
    """MindFormers r1.5.0 `dpo_preprocess.py` (input_sliced_sig = true): the pairs pass OBJ030-OBJ034
    (one prompt, prompt and padding masked in both, answers scored, one BOS); measured, and
    recorded: each answer it scores opens with the "<|assistant|>\\n" header it puts in the
    answer, and the sliced loss mask starts one token late (the header's "<" unscored)."""
    proc = subprocess.run([str(ECO), "-c", "from objdebug.cli import main; main()", "batches",
                           "--config", str(TARGETS / "mf_dpo" / "objdebug.toml"), "-v"],
                          capture_output=True, text=True, cwd=ROOT, timeout=900,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-2000:]
    for code in ("OBJ030", "OBJ031", "OBJ032", "OBJ033", "OBJ034"):
        assert f"PASS {code}" in out
    probe = ("from fixtures.ecosystem.mindformers_dpo import dpo_batches\n"
             "from objdebug.pipeline.batches_source import _batch\n"
             "from objdebug.pipeline.preference_batches import pair_facts\n"
             "from objdebug.core.config import DataSpec\n"
             "b = [_batch(e, 1, DataSpec(), 'mf') for e in dpo_batches(True)]\n"
             "f = pair_facts(b, {-100}, 0)[0]\n"
             "s = f.start('chosen')\n"
             "print(repr(bytes(f.chosen.ids[s - 1:s + 13].tolist())), int(f.chosen.scored[s - 1]))\n")
    got = subprocess.run([str(ECO), "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=600,
                         env=dict(os.environ, PYTHONPATH=str(ROOT))).stdout.strip().splitlines()[-1]
    assert got == "b'<|assistant|>\\n' 0", got  # the header's 14 tokens from its unscored '<' on
