"""`[chat] template` through a real tokenizer (issue 53, causes 2 and 3): the rows are read as
the text their tokens decode to and split by the template's texts (stages/batches/chat_text.py),
so a sentencepiece dummy prefix, a merge across a header's border and a template-fixed span
(Qwen3's empty `<think>\\n\\n</think>\\n\\n`) sit where the template puts them.

Pipelines: fixtures/chat_tokenized.py (fixtures/chat/tokenizer.json, 512 ids, on the Llama
fixture), the conversation encoded once ("whole", masked by character spans) or piece by piece
("segments", a dummy-prefix space per piece), through the ChatML fixture template or Qwen3's own.
The healthy pipelines pass every role check and OBJ020 (the EOS check agrees with the role audit
on which `<|im_end|>` closes a trained turn); each bug twin FAILs with its code. One Context
(one objective probe) for the module; the chat checks and OBJ020 only.
"""

from __future__ import annotations

import sys
import types
from dataclasses import replace

import numpy as np
import pytest

from objdebug.core.config import load_config
from objdebug.core.findings import Verdict
from objdebug.pipeline.runner import run_check

from .conftest import ROOT, TARGETS

CASE: dict[str, object] = {"make": None}
CHAT_CODES = [f"OBJ0{i}" for i in range(23, 29)]


# --------------------------------------------------------------------------- the text mapping (no MindSpore)
def test_a_token_merged_across_the_header_border_is_content_and_the_header_still_found(tmp_path):
    """A tokenizer that merges the header's last "t\\n" with the answer "The eel." into one token
    (BPE, no pre-split): the merged token is content (it holds the answer), the header's other
    tokens header, the stop found; as an id sequence the header encoded alone is in no row."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from objdebug.core.config import ChatSpec
    from objdebug.engine.data import HFTokenizer
    from objdebug.pipeline.chat_template import chat_roles
    from objdebug.stages.batches.chat_text import CONTENT, HEADER, STOP, TAIL

    text = "<|im_start|>user\nHi.<|im_end|>\n<|im_start|>assistant\nThe eel.<|im_end|>\n"
    tok = Tokenizer(models.BPE(unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    tok.decoder = decoders.Metaspace(prepend_scheme="first", split=False)
    tok.train_from_iterator(["user\nHi.", "\n", "assistant\nThe eel."] * 50,
                            trainers.BpeTrainer(vocab_size=80, special_tokens=["<pad>", "<|im_start|>", "<|im_end|>"],
                                                show_progress=False))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    ids = HFTokenizer(str(path)).encode(text)
    pieces = HFTokenizer(str(path)).pieces(ids)
    assert "t\nThe eel." in pieces and "".join(pieces) == text

    class Cfg:
        chat = ChatSpec(template=str(ROOT / "fixtures" / "chat" / "chatml_tokenizer_config.json"))
        data = types.SimpleNamespace(tokenizer=str(path))
        base_dir = str(ROOT)

    from objdebug.stages.batches.chat_roles import _find, split_row

    roles = chat_roles(Cfg(), 80)
    assert _find(np.array(ids), roles.headers["assistant"]) == []  # the header's own ids: not in the row

    turns, role, kind, _ = split_row(np.array(ids), roles, None)
    assert [t.role for t in turns] == ["user", "assistant"]
    merged = pieces.index("t\nThe eel.")
    assert kind[merged] == CONTENT and kind[merged - 1] == HEADER and role[merged] == "assistant"
    assert kind[merged + 1] == STOP and kind[merged + 2] == TAIL
    assert turns[1].content == (merged, merged + 1) and turns[1].stop == [merged + 1]


def test_a_dummy_prefix_after_a_special_token_stays_in_the_header():
    from objdebug.stages.batches.chat_text import pattern

    p = pattern("<|im_start|>assistant\n", ["<|im_start|>", "<|im_end|>"])
    assert p.match("<|im_start|> assistant\nHi").end() == 23 and p.match("<|im_start|>assistant\n")
    assert not p.match("<|im_start|>  assistant\n")  # one dummy prefix, no more
    tail = pattern("\n", ["<|im_end|>"], lead=True)
    assert tail.match(" \n").end() == 2


# --------------------------------------------------------------------------- the audit on the Llama fixture
@pytest.fixture(scope="module")
def ctx():
    from objdebug.engine import runtime
    from objdebug.engine.core import Engine
    from objdebug.engine.target import load_target
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.profile import load_profile

    mod = types.ModuleType("tokcase_test")
    mod.make = lambda: CASE["make"]()
    sys.modules["tokcase_test"] = mod
    cfg = load_config(TARGETS / "llama_chat_template_tok" / "objdebug.toml")
    runtime.setup("CPU", "graph", 0)
    t = load_target(cfg)
    yield Context(config=cfg, target=t, engine=Engine(t), profile=load_profile("ci-gate"))
    sys.modules.pop("tokcase_test", None)


def _judge(ctx, target: str, style: str, bug: str | None = None) -> dict[str, tuple[Verdict, str]]:
    """{code: (verdict, message)} of OBJ020 and the role checks on `target`'s config, its batches
    from fixtures.chat_tokenized.pipeline(template, style, bug)."""
    from fixtures.chat_tokenized import pipeline
    from objdebug.stages.batches import chat_checks
    from objdebug.stages.batches.audit import audit, real_batches
    from objdebug.stages.batches.chat_roles import roles_of, row_roles
    from objdebug.stages.batches.framing import EosTrained

    cfg = load_config(TARGETS / target / "objdebug.toml")
    template = cfg.data.batches_kwargs["template"]
    CASE["make"] = lambda: pipeline(template, style, bug)
    ctx.config = replace(cfg, data=replace(cfg.data, batches="tokcase_test:make", batches_kwargs={}))
    for f in (audit, real_batches, roles_of, row_roles):
        ctx.forget(f)
    th = ctx.profile.section("batches")
    checks = [EosTrained()] + [c() for c in chat_checks.CHECKS]
    return {f.code: (f.verdict, f.message) for c in checks for f in run_check(c, ctx, th).findings}


HEALTHY = [("llama_chat_template_tok", "whole"), ("llama_chat_template_tok", "segments"),
           ("llama_chat_qwen3", "whole"), ("llama_chat_qwen3", "segments")]


@pytest.mark.parametrize("target,style", HEALTHY)
def test_the_healthy_pipelines_pass_every_role_check_through_a_real_tokenizer(ctx, target, style):
    found = _judge(ctx, target, style)
    assert all(found[c][0] is Verdict.PASS for c in CHAT_CODES), {c: found[c] for c in CHAT_CODES}
    assert "16 assistant, 4 system, 2 tool, 14 user turns" in found["OBJ023"][1]
    if target == "llama_chat_qwen3":  # eos_id = 4 (<|im_end|>): only the trained turns' EOS judged
        assert found["OBJ020"][0] is Verdict.PASS, found["OBJ020"]
        assert "in 8 of 8 rows" in found["OBJ020"][1]


BUGS = {  # (target, style, bug) -> {code: words its message holds}
    ("llama_chat_template_tok", "whole", "header_trained"): {"OBJ027": "80 template tokens are trained (header 80): batch 1 row 0 turn 3 (assistant header): 5 tokens '<|im_start|>assistant⏎'"},
    ("llama_chat_template_tok", "segments", "header_trained"): {"OBJ027": "(assistant header)"},
    ("llama_chat_template_tok", "whole", "all_ones"): {"OBJ026": "system", "OBJ027": "header", "OBJ028": "every token trained in 8 rows"},
    ("llama_chat_template_tok", "whole", "all_zeros"): {"OBJ024": "16 of 16 assistant turns", "OBJ028": "no token trained in 8 rows"},
    ("llama_chat_template_tok", "segments", "stop_masked"): {"OBJ025": "of 16 of 16 assistant turns is not trained"},
    ("llama_chat_template_tok", "whole", "last_only"): {"OBJ024": "only the last assistant turn trains in 8 rows"},
    ("llama_chat_template_tok", "whole", "user_trained"): {"OBJ026": "(user):"},
    ("llama_chat_template_tok", "segments", "system_trained"): {"OBJ026": "(system):"},
    ("llama_chat_template_tok", "whole", "tool_trained"): {"OBJ026": "(tool):"},
    ("llama_chat_template_tok", "whole", "history_eos_trained"): {"OBJ026": "(system 4, tool 2, user 14): batch 1 row 0 turn 1 (system): 1 tokens '<|im_end|>'"},
    ("llama_chat_template_tok", "whole", "no_markers"): {"OBJ023": "no role marker found in 8 of 8 rows"},
    ("llama_chat_qwen3", "whole", "think_trained"): {"OBJ027": "(assistant fixed): 2 tokens '<think>"},
    ("llama_chat_qwen3", "segments", "think_trained"): {"OBJ027": "(assistant fixed)"},
    ("llama_chat_qwen3", "segments", "stop_masked"): {"OBJ025": "of 16 of 16 assistant turns", "OBJ020": "the EOS (4) is not a trained label"},
    ("llama_chat_qwen3", "whole", "tool_trained"): {"OBJ026": "(tool):"},
}


@pytest.mark.parametrize("target,style,bug", sorted(BUGS))
def test_each_bug_twin_fails_through_a_real_tokenizer(ctx, target, style, bug):
    found = _judge(ctx, target, style, bug)
    for code, words in BUGS[(target, style, bug)].items():
        verdict, message = found[code]
        assert verdict is Verdict.FAIL and words in message, (code, found[code])
