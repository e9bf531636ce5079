"""The vocabulary every input check uses is the model's (objdebug/engine/vocabulary.py), whatever the
model returns and whether or not a tokenizer is declared (issue 52 item 2, issue 53 cause 1): ids
above the byte tokenizer's 256 on the 512-token Llama fixture run in every objective form, ids
outside the model's 512 are still exit 2 in one line naming file and line.

- the input embedding is found by the ids it receives (one PyNative call, no compile) on the
  Llama LM, its reward model and an end-to-end Cell that owns a model;
- a reward model returning one reward per row (no logits to measure V from) with ids-only pairs
  and no tokenizer runs through the CLI; its swapped and padding-read twins FAIL;
- `[chat] markers` as ids above 256, no tokenizer: the config is accepted before the model is
  built, and resolved against the model's vocabulary by the batches stage;
- align rows, preference pairs (each preference form) and rollouts read ids above 256.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from objdebug.core.config import load_config
from objdebug.core.errors import InputError

from .conftest import ROOT, messages

LLAMA_CKPT = ROOT / "fixtures" / "llama" / "llama.ckpt"
REWARD_CKPT = ROOT / "fixtures" / "reward_data" / "llama_reward.ckpt"
DEMO = ROOT / "objdebug" / "demo"
MARK = 317  # a token the byte tokenizer does not have; the Llama fixture's 512 do


@pytest.fixture(scope="module", autouse=True)
def scratch_cwd(tmp_path_factory):
    import os

    old = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("vocab"))  # MindSpore may drop rank_0/ here
    yield
    os.chdir(old)


def _ids(text: str) -> list[int]:
    return list(text.encode())


def _write_pairs(path, extra: dict | None = None) -> None:
    """The demo's preference pairs as ids only, each prompt opened by MARK (a system token)."""
    with open(path, "w") as fh:
        for line in (DEMO / "preference.jsonl").read_text().splitlines():
            r = json.loads(line)
            fh.write(json.dumps({"id": r["id"], "prompt_ids": [MARK] + _ids(r["prompt"]),
                                 "chosen_ids": _ids(r["chosen"]), "rejected_ids": _ids(r["rejected"])}) + "\n")
        if extra:
            fh.write(json.dumps(extra) + "\n")


# --------------------------------------------------------------------------- the resolver
def test_the_input_embedding_is_found_by_the_ids_it_receives():
    """The Llama LM, its reward model (one reward per row) and an end-to-end Cell owning a
    MindFormers-style model: the table that takes the ids, its rows the vocabulary."""
    from objdebug.engine import runtime
    from objdebug.engine.vocabulary import embedding_of_target, find_embedding, probe_ids
    from fixtures.e2e_cells import MindFormersWrapper
    from fixtures.llama.model import build_llama
    from fixtures.llama.reward import build_llama_reward

    runtime.setup("CPU", "graph", 0)
    ids = probe_ids(2, 8)
    lm = build_llama()
    assert find_embedding(lm, lm, ids) == {"vocab": 512, "path": "embed", "parameter": "embed.embedding_table"}
    rm = build_llama_reward(pool="ids")
    assert find_embedding(rm, rm, ids)["vocab"] == 512
    wrapper = MindFormersWrapper(vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, seq_length=8)

    class E2E:  # an end-to-end target: no model, the objective owns one
        model, objective = None, wrapper
    got = embedding_of_target(E2E, 2, 8)
    assert got["vocab"] == 300, got


def test_the_config_alone_never_states_the_byte_tokenizers_256(tmp_path):
    from objdebug.engine.vocabulary import declared

    cfg = tmp_path / "objdebug.toml"
    cfg.write_text('[model]\nfactory = "fixtures.llama.model:build_llama"\n\n[objective]\n'
                   'factory = "objdebug.losses:MaskedCrossEntropy"\n\n[data]\ntokenizer = "bytes"\n')
    assert declared(load_config(cfg)) == (None, "")
    cfg.write_text(cfg.read_text() + "vocab_size = 512\n")
    assert declared(load_config(cfg)) == (512, "data.vocab_size")
    tok = ROOT / "fixtures" / "tokenizer" / "tokenizer.json"
    cfg.write_text(cfg.read_text().replace('tokenizer = "bytes"\nvocab_size = 512', f'tokenizer = "{tok}"'))
    n, where = declared(load_config(cfg))
    assert n == 192 and where == f"the tokenizer {tok}"  # its own size, whatever it is


# --------------------------------------------------------------------------- reward form, CLI
REWARD_TOML = """[model]                                    # the reward model: returns float [B] or [B, T]
factory = "fixtures.llama.reward:build_llama_reward"
kwargs = {{ pool = "{pool}" }}
checkpoint = "{ckpt}"
inputs = ["input_ids", "attention_mask"]

[objective]
factory = "fixtures.reward_losses:{loss}"      # construct(chosen_rewards, rejected_rewards)
kwargs = {{ margin = 0.5 }}                  # optional; the zero point reads `margin`
call = "reward"

[data]
preference = "pairs.jsonl"                 # pairs, for a pairwise loss
"""


def _cli(args, cwd, timeout=600):
    import os

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", "import sys; from objdebug.cli import main; sys.exit(main())", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _reward_target(tmp_path, name, pool="mask", loss="BradleyTerryLoss", extra=None):
    folder = tmp_path / name
    folder.mkdir()
    _write_pairs(folder / "pairs.jsonl", extra)
    (folder / "objdebug.toml").write_text(REWARD_TOML.format(pool=pool, ckpt=REWARD_CKPT, loss=loss))
    return folder


@pytest.fixture(scope="module")
def reward_runs(tmp_path_factory):
    """The CLI on the healthy reward model (one reward per row, from the attention mask) and its
    two bug twins, ids-only pairs above 256, no tokenizer: {name: (exit, {code: verdict})}."""
    tmp = tmp_path_factory.mktemp("reward")
    out = {}
    for name, pool, loss in (("healthy", "mask", "BradleyTerryLoss"),
                             ("swapped", "mask", "SwappedBradleyTerryLoss"),
                             ("padding", "last_position", "BradleyTerryLoss")):
        folder = _reward_target(tmp, name, pool, loss)
        proc = _cli(["run", "-c", "objdebug.toml", "--profile", "ci-gate", "--stages", "policy",
                     "--json", "r.json"], folder)
        assert proc.returncode in (0, 1), proc.stderr
        report = json.loads((folder / "r.json").read_text())
        out[name] = (proc.returncode, {f["code"]: f["verdict"] for r in report["results"]
                                        for f in r["findings"]})
    return out


def test_a_reward_model_with_ids_only_pairs_runs_and_its_healthy_loss_passes(reward_runs):
    code, found = reward_runs["healthy"]
    assert code == 0 and "FAIL" not in found.values(), found
    assert found["OBJ851"] == "PASS" and found["OBJ853"] == "PASS"


@pytest.mark.parametrize("twin,fails", [("swapped", "OBJ851"), ("padding", "OBJ853")])
def test_the_reward_bugs_fail_on_ids_only_pairs(reward_runs, twin, fails):
    code, found = reward_runs[twin]
    assert code == 1 and found[fails] == "FAIL", found


def test_an_id_outside_the_reward_models_vocabulary_is_one_line_naming_file_and_line(tmp_path):
    folder = _reward_target(tmp_path, "bad", extra={"id": "x", "prompt_ids": [1, 600],
                                                    "chosen_ids": [3], "rejected_ids": [4]})
    proc = _cli(["run", "-c", "objdebug.toml", "--stages", "policy"], folder)
    lines = messages(proc.stderr)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "pairs.jsonl:73: field 'prompt' has token id 600 outside the vocabulary [0, 512) " \
           "(the model's input embedding 'embed.embedding_table')" in lines[0]


# --------------------------------------------------------------------------- language-model forms
LM_TOML = f"""[model]
factory = "fixtures.llama.model:build_llama"
checkpoint = "{LLAMA_CKPT}"

[objective]
factory = "fixtures.llama.objectives:MaskedMeanCE"
kwargs = {{ ignore_index = -100 }}

[data]
align = "align.jsonl"
"""


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """One Llama target without a tokenizer; the forms' configs share its engine (the vocabulary
    is measured once on the model's logits: 512)."""
    from objdebug.engine import runtime
    from objdebug.engine.core import Engine
    from objdebug.engine.target import load_target
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.profile import load_profile

    tmp = tmp_path_factory.mktemp("lm")
    with open(tmp / "align.jsonl", "w") as fh:
        for line in (DEMO / "align.jsonl").read_text().splitlines()[:4]:
            r = json.loads(line)
            fh.write(json.dumps({"id": r["id"], "prompt_ids": [MARK] + _ids(r["prompt"]),
                                 **{f"{k}_ids": _ids(r[k]) for k in ("good", "medium", "bad")}}) + "\n")
    _write_pairs(tmp / "pairs.jsonl")
    with open(tmp / "rollouts.jsonl", "w") as fh:
        for line in (DEMO / "rollouts.jsonl").read_text().splitlines()[:2]:
            r = json.loads(line)
            fh.write(json.dumps({**r, "prompt_ids": [MARK] + r["prompt_ids"]}) + "\n")
    (tmp / "objdebug.toml").write_text(LM_TOML)
    cfg = load_config(tmp / "objdebug.toml")
    runtime.setup("CPU", "graph", 0)
    target = load_target(cfg)
    engine = Engine(target)
    assert engine.vocab_size() == 512 and engine.vocab_source == "the model's logits"
    return tmp, Context(config=cfg, target=target, engine=engine, profile=load_profile("ci-gate"))


CE = '[objective]\nfactory = "fixtures.llama.objectives:MaskedMeanCE"\nkwargs = { ignore_index = -100 }\n'
PREFERENCE_FORMS = {  # docs/config.md "Preference objectives": each form as a user writes it
    "preference": ('[objective]\nfactory = "objdebug.losses:SigmoidDPOLoss"\nkwargs = { beta = 0.1 }\n'
                   'call = "preference"\nloss_type = "sigmoid"\nlogps = "sum"\n'),
    "preference-pairs": ('[objective]\nfactory = "fixtures.preference_losses:PairsDPO"\nkwargs = { beta = 0.1 }\n'
                         'call = "preference-pairs"\nloss_type = "sigmoid"\nlogps = "sum"\n'),
    "[preference]": ('[objective]\nfactory = "fixtures.llama.objectives:MaskedMeanCE"\n\n[preference]\n'
                     'factory = "objdebug.losses:SigmoidDPOLoss"\nkwargs = { beta = 0.1 }\n'
                     'loss_type = "sigmoid"\nlogps = "sum"\n'),
}


def _form(lm, objective: str, data: str):
    tmp, ctx = lm
    from objdebug.pipeline import datasets

    text = LM_TOML.split("[objective]")[0] + objective + "\n[data]\n" + data
    (tmp / "form.toml").write_text(text)
    for f in (datasets.encoder, datasets.align_rows, datasets.preference_rows):
        ctx.forget(f)
    ctx.config = load_config(tmp / "form.toml")
    return ctx


def test_align_rows_read_ids_above_256_without_a_tokenizer(lm):
    from objdebug.pipeline.datasets import align_rows

    rows = align_rows(_form(lm, CE, 'align = "align.jsonl"\n'))
    assert len(rows) == 4 and rows[0]["samples"]["good"].prompt[0] == MARK


@pytest.mark.parametrize("form", sorted(PREFERENCE_FORMS))
def test_preference_pairs_read_ids_above_256_in_each_form(lm, form):
    from objdebug.pipeline.datasets import preference_rows

    pairs = preference_rows(_form(lm, PREFERENCE_FORMS[form], 'preference = "pairs.jsonl"\n'))
    assert len(pairs) == 72 and pairs[0]["prompt"][0] == MARK


def test_ids_outside_the_models_vocabulary_name_file_and_line(lm):
    from objdebug.pipeline.datasets import preference_rows

    tmp, _ = lm
    _write_pairs(tmp / "bad.jsonl", {"id": "x", "prompt_ids": [1], "chosen_ids": [512], "rejected_ids": [4]})
    ctx = _form(lm, PREFERENCE_FORMS["preference"], 'preference = "bad.jsonl"\n')
    with pytest.raises(InputError) as err:
        preference_rows(ctx)
    assert str(err.value).endswith("bad.jsonl:73: field 'chosen' has token id 512 outside the "
                                   "vocabulary [0, 512) (the model's logits)")


def test_rollouts_read_ids_above_256_without_a_tokenizer(lm):
    from objdebug.pipeline.datasets import encoder
    from objdebug.stages.policy.rollouts import read_rollouts

    tmp, ctx = lm
    ctx = _form(lm, CE, "")
    groups = read_rollouts(str(tmp / "rollouts.jsonl"), encoder(ctx), None, None, "")
    assert len(groups) == 2 and groups[0][0].prompt[0] == MARK


# --------------------------------------------------------------------------- [chat] markers as ids
CHAT_IDS = {1: 301, 2: 302}  # <|im_start|>, <|im_end|> (= EOS) moved above the byte range


def remapped_chat(bug=None):
    """fixtures.chat_pipelines' one-id-per-special-token ChatML rows with those ids above 256."""
    from fixtures.chat_pipelines import pipeline

    for batch in pipeline("chatml_ids", bug):
        out = dict(batch)
        for key in ("input_ids", "labels"):
            col = np.array(batch[key]).copy()
            for old, new in CHAT_IDS.items():
                col[np.array(batch[key]) == old] = new
            out[key] = col
        yield out


CHAT_TOML = f"""[model]
factory = "fixtures.llama.model:build_llama"
checkpoint = "{ROOT / 'fixtures' / 'chat' / 'llama_chat.ckpt'}"

[objective]
factory = "fixtures.llama.objectives:MaskedMeanCE"
kwargs = {{ ignore_index = -100 }}

[data]
pad_id = 0
label_pad_id = -100
eos_id = 302
batches = "tests.test_model_vocabulary:remapped_chat"
{{kwargs}}
[chat]
markers = {{ system = [301, 115, 121, 115, 116, 101, 109, 10], user = [301, 117, 115, 101, 114, 10], assistant = [301, 97, 115, 115, 105, 115, 116, 97, 110, 116, 10], tool = [301, 116, 111, 111, 108, 10] }}
end_of_turn = 302
"""


def test_chat_markers_as_ids_above_256_need_no_tokenizer(lm, tmp_path):
    """Accepted before the model is built (api.prepare's check); resolved against the model's 512
    by the batches stage; the healthy rows pass the role checks, a twin training the assistant
    header fails OBJ027; a marker outside the model's vocabulary is one line."""
    from objdebug.api import Request, prepare
    from objdebug.pipeline.runner import run_check
    from objdebug.stages.batches import chat_checks
    from objdebug.stages.batches.audit import audit, real_batches
    from objdebug.stages.batches.chat_roles import roles_of, row_roles

    path = tmp_path / "objdebug.toml"
    path.write_text(CHAT_TOML.replace("{kwargs}", ""))
    prepare(Request(config=str(path)))  # the early [chat] check: no 256 from the byte tokenizer
    _, ctx = lm
    th = ctx.profile.section("batches")
    found = {}
    for bug in (None, "header_trained"):
        path.write_text(CHAT_TOML.replace("{kwargs}", f'batches_kwargs = {{ bug = "{bug}" }}' if bug else ""))
        ctx.config = load_config(path)
        for f in (audit, real_batches, roles_of, row_roles):
            ctx.forget(f)
        found[bug] = {f.code: f.verdict.name for c in chat_checks.CHECKS
                      for f in run_check(c(), ctx, th).findings}
    assert set(found[None].values()) == {"PASS"}, found[None]
    assert found["header_trained"]["OBJ027"] == "FAIL"
    path.write_text(CHAT_TOML.replace("{kwargs}", "").replace("user = [301,", "user = [512,"))
    ctx.config = load_config(path)
    ctx.forget(roles_of)
    with pytest.raises(InputError, match=r"every marker must be in the vocabulary \[0, 512\), but the user marker"):
        roles_of(ctx)
