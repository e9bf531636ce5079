"""Issue 35: `[packing]` mistakes are exit 2 naming the key before the stage's work, and the
boundary inputs reach construct by name (fixtures/targets/packing_position_ids, vocabulary 256,
the demo's 24 align rows):

- `separator = 2**40` wrapped to int32 0 (the pad id) and passed 4 checks; `separator = 256` gave
  4 ERRORs from Gather (exit 1);
- `documents = 1000` on 24 rows was a check ERROR (exit 1);
- a boundary input construct does not take was a TypeError ERROR naming no key (exit 1);
- `[packing] inputs = ["input_ids", "position_ids"]` on an HF-style `construct(input_ids,
  attention_mask=None, position_ids=None)` went by position: the positions arrived as the mask and
  OBJ901/OBJ902 failed a healthy model (exit 1).
"""

from __future__ import annotations

import pytest

from objdebug.core.config import load_config
from objdebug.core.errors import InputError

from .conftest import TARGETS, cli_exit_2

CONFIG = TARGETS / "packing_position_ids" / "objdebug.toml"


@pytest.mark.parametrize("value", [2 ** 40, 2 ** 31])
def test_a_separator_beyond_int32_is_refused_when_the_config_loads(value):
    with pytest.raises(InputError, match=r"For 'packing.separator', the value must be in "
                                         r"\[0, 2147483647\], but got " + str(value)):
        load_config(CONFIG, overrides={"packing.separator": value})


@pytest.mark.parametrize("key", ["data.pad_id", "data.label_pad_id", "data.bos_id", "data.eos_id",
                                 "packing.separator"])
def test_every_id_valued_key_must_fit_int32(key):
    with pytest.raises(InputError, match=rf"For '{key}', the value must be in \[-?\d+, 2147483647\]"):
        load_config(CONFIG, overrides={key: 2 ** 40})


def test_a_separator_outside_the_vocabulary_is_exit_2_before_the_stage():
    out = cli_exit_2(["run", "-c", CONFIG, "--no-cache", "--set", "packing.separator=256"],
                     "For 'packing.separator', the value must be a token id below the model's "
                     "vocabulary of 256, but got 256.", str(CONFIG))
    assert "Gather" not in out and "packing-isolation" not in out


def test_more_documents_than_rows_is_exit_2_naming_the_row_count():
    cli_exit_2(["run", "-c", CONFIG, "--no-cache", "--set", "packing.documents=1000"],
               "For 'packing.documents', the value must be at most the 24 data rows with a scored "
               "token", "but got 1000.")


@pytest.mark.parametrize("overrides, key", [
    (["packing.boundary=attention_mask"], "packing.boundary"),  # inputs derived: + attention_mask
    (["packing.boundary=attention_mask", 'packing.inputs=["input_ids", "attention_mask"]'],
     "packing.inputs"),
])
def test_a_boundary_input_construct_does_not_take_is_exit_2_naming_the_key(overrides, key):
    args = [a for o in overrides for a in ("--set", o)]
    cli_exit_2(["run", "-c", CONFIG, "--no-cache", *args],
               f"For '{key}', every name must be a parameter of PositionsLlama.construct, which "
               "takes ['input_ids', 'position_ids'], but got 'attention_mask'.")


def test_packed_inputs_go_to_construct_by_name():
    """HF-style construct(input_ids, attention_mask=None, position_ids=None) given only the
    positions: they must arrive as position_ids (by position they were the mask: OBJ901 and
    OBJ902 failed a model that isolates documents)."""
    from .test_packing import _run

    cfg = load_config(CONFIG, overrides={
        "model.kwargs": {"signature": "mask_positions", "attention": "varlen"},
        "packing.inputs": ["input_ids", "position_ids"]})
    _, _, f = _run(cfg)
    verdicts = {c: f[c].verdict.value for c in ("OBJ901", "OBJ902", "OBJ903", "OBJ904")}
    assert verdicts == dict.fromkeys(verdicts, "PASS"), {c: x.message for c, x in f.items()}
    assert f["OBJ901"].value == 0.0
