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
