"""A real tokenizer.json and [data] bos_id / eos_id (issue 14).

fixtures/tokenizer/tokenizer.json is a BPE tokenizer trained with the `tokenizers` library on the
demo corpus (vocabulary 192 <= the model's); fixtures/tokenizer/bos_model.ckpt is the demo model
architecture trained on `<bos> prompt response <eos>` with it. Ids and labels are checked against a
numpy reference built from the tokenizer directly; losses come from the real model in graph mode.
"""

import dataclasses
import json

import numpy as np
import pytest

from objdebug.core.config import load_config
from objdebug.pipeline.context import Context
from objdebug.engine import runtime
from objdebug.engine.core import Engine
from objdebug.engine.data import frame, make_tokenizer, pack
from objdebug.pipeline.datasets import align_rows, score_rows
from objdebug.engine.target import load_target
from objdebug.core.errors import InputError
from objdebug.pipeline.profile import load_profile

from .conftest import FIXTURES, TARGETS

TOKENIZER = FIXTURES / "tokenizer" / "tokenizer.json"
CONFIG = TARGETS / "tokenizer_bos" / "objdebug.toml"


def test_trained_tokenizer_fits_the_model_and_names_its_special_tokens():
    tok = make_tokenizer(str(TOKENIZER))
    cfg = load_config(CONFIG)
    assert tok.vocab_size == 192 <= cfg.model.kwargs["vocab_size"] == cfg.data.vocab_size
    assert tok.special_ids() == {"pad": 0, "unk": 1, "bos": 2, "eos": 3}
    for line in open(cfg.data.align, encoding="utf-8"):
        row = json.loads(line)
        for field in ("prompt", "good", "medium", "bad"):
            ids = tok.encode(row[field])
            assert ids and all(4 <= i < 192 for i in ids)  # no special token from plain text
            assert tok.decode(ids) == row[field]            # lossless on the demo's text


def test_frame_adds_bos_and_eos_once():
    assert frame([5, 6], [7], 2, 3) == ([2, 5, 6], [7, 3])
    assert frame([2, 5], [7, 3], 2, 3) == ([2, 5], [7, 3])   # written in already: not twice
    assert frame([], [9], 2, None) == ([2], [9])
    assert frame([5], [7], None, None) == ([5], [7])


def _context(cfg, batch_size=4, target=None):
    runtime.setup(cfg.run.device, cfg.run.mode, cfg.run.seed)
    engine = Engine(target or load_target(cfg), batch_size=batch_size)
    return Context(config=cfg, target=engine.target, engine=engine, profile=load_profile("default"))


@pytest.fixture(scope="module")
def ctx():
    with runtime.scratch_dir():
        return _context(load_config(CONFIG))


def test_ids_and_labels_match_a_numpy_reference(ctx):
    tok = make_tokenizer(str(TOKENIZER))
    raw = [json.loads(line) for line in open(ctx.config.data.align, encoding="utf-8")]
    rows = align_rows(ctx)
    for r, row in zip(raw, rows):
        for kind in ("good", "medium", "bad"):
            s = row["samples"][kind]
            assert s.prompt == [2] + tok.encode(r["prompt"])
            assert s.response == tok.encode(r[kind]) + [3]
    samples = [rows[0]["samples"]["good"], rows[1]["samples"]["bad"]]
    ids, labels = pack(samples, 64, 0, -100, True)
    for i, s in enumerate(samples):  # reference: position t predicts token t+1 on the response and EOS
        seq = np.array(s.prompt + s.response)
        want_ids = np.zeros(64, np.int64)
        want_ids[:len(seq)] = seq
        want = np.full(64, -100)
        first = len(s.prompt) - 1
        want[first:len(seq) - 1] = seq[first + 1:]
        assert (ids[i] == want_ids).all() and (labels[i] == want).all()
        assert labels[i][len(seq) - 2] == 3 and ids[i][0] == 2  # EOS is scored, BOS is context
    resp = score_rows(ctx)[0]["sample"]
    assert resp.prompt[0] == 2 and resp.response[-1] == 3


def test_bos_and_eos_ids_are_checked_against_the_vocabulary(ctx):
    cfg = dataclasses.replace(ctx.config, data=dataclasses.replace(ctx.config.data, eos_id=192))
    bad = Context(config=cfg, target=ctx.target, engine=ctx.engine, profile=ctx.profile)
    with pytest.raises(InputError, match=r"data.eos_id.*\[0, 192\)"):
        align_rows(bad)
    with pytest.raises(InputError, match="data.bos_id"):
        load_config(CONFIG, overrides={"data.bos_id": -1})


def test_scoring_without_the_trained_bos_changes_every_loss(ctx):
    """The model was trained with <bos> first: without it every row scores differently, and worse."""
    with runtime.scratch_dir():
        good = [r["samples"]["good"] for r in align_rows(ctx)]
        with_bos = ctx.engine.evaluate(good)[:, 0]
        cfg = dataclasses.replace(ctx.config, data=dataclasses.replace(ctx.config.data, bos_id=None))
        plain = _context(cfg, target=ctx.target)
        plain.engine._cells = ctx.engine._cells  # same graphs: only the ids differ
        no_bos = plain.engine.evaluate([r["samples"]["good"] for r in align_rows(plain)])[:, 0]
    assert len(with_bos) == len(no_bos) == len(good)
    assert np.all(np.abs(with_bos - no_bos) > 1e-4 * np.abs(with_bos))  # every loss changes
    assert no_bos.mean() > with_bos.mean()  # and the model does worse without what it was trained on
