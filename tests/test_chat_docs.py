"""docs/config.md's `[chat]` examples as a user copies them (issue 53): each block written into a
config beside a pipeline's sections, against a healthy pipeline and a buggy twin of each role-audit
bug class of issue 52, in each marker form the docs show:

- `template` (the ChatML fixture template; Qwen3's own for the reasoning block, GLM's for the
  next-role closer: the user puts their template's path there) through a real tokenizer
  (fixtures/chat/tokenizer.json: sentencepiece-style, 512 ids), the conversation encoded once or
  piece by piece (fixtures/chat_tokenized.py), and GLM's through bytes (fixtures/chat_pipelines.py);
- markers as strings, through the same real tokenizer;
- markers as ids, with one id per special token (fixtures/chat_pipelines.py "chatml_ids"), with no
  `[data] tokenizer` (ids need none: the block as the docs show it, and with the special tokens
  after the byte range, 301 and 302, ids only the model's 512 hold: issue 53 cause 1);
- GLM's next-role closer declared as markers (the docs' blocks with GLM's headers and
  `end_of_turn = "next-role"`, as the docs say to write it), as strings and as ids.

Every twin FAILs with a code its healthy twin lacks (the healthy one passes OBJ020 and
OBJ023-OBJ028). One Context on the Llama fixture (one objective probe); the chat checks and OBJ020.
And each healthy form's whole configuration passes `--profile ci-gate` on the stages the form
changes (batches; align, which reads the tokenizer), with the checkpoint trained on the form's ids.
"""

from __future__ import annotations

import sys
import types

import pytest

from objdebug import api
from objdebug.core.config import load_config
from objdebug.core.findings import Verdict
from objdebug.pipeline.runner import run_check

from .conftest import ROOT, TARGETS
from .doc_snippets import section_blocks

CASE: dict[str, object] = {"make": None}
CODES = ["OBJ020"] + [f"OBJ0{i}" for i in range(23, 29)]
BLOCKS = section_blocks("### Conversations: `[chat]`")  # template, markers as ids, markers as strings
TOKENIZER = {"tok": '"../../chat/tokenizer.json"', "bytes": '"bytes"', "none": None}


def _high_ids(block: str) -> str:
    """The docs' ids block for a pipeline whose <|im_start|> / <|im_end|> are 301 / 302."""
    return block.replace("[1, ", "[301, ").replace("end_of_turn = 2 ", "end_of_turn = 302 ")


def _glm(block: str, ids: bool) -> str:
    """The docs' markers block with GLM's headers and its closer, as the docs say to write it."""
    value = (lambda t: "[" + ", ".join(str(b) for b in t.encode()) + "]") if ids else \
        (lambda t: '"' + t.replace("\n", "\\n") + '"')
    lines = block.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("markers ="))
    lines[at] = "markers = { " + ", ".join(f"{r} = {value(f'<|{r}|>' + chr(10))}"
                                            for r in ("system", "user", "assistant", "tool")) + " }"
    end = next(i for i, line in enumerate(lines) if line.startswith("end_of_turn ="))
    lines[end] = 'end_of_turn = "next-role"'
    return "\n".join(lines) + "\n"


def _config(tmp_path, block: int, tokenizer: str, template: str | None = None, edit=None):
    """The docs block under the Llama target's sections, written where the target's config sits
    (its relative paths hold) and loaded as `objdebug` loads it (`tokenizer` "none": no `[data]
    tokenizer` line; `edit`: how the user adapts the block to their pipeline's ids). A pipeline
    of byte ids (or ids without a tokenizer: bytes) has the Llama fixture fine-tuned on bytes."""
    base = (TARGETS / "llama_chat_template_tok" / "objdebug.toml").read_text()
    base = base[:base.index("\n[chat]") + 1]
    if tokenizer != "tok":
        base = base.replace('checkpoint = "../../chat/llama_chat_bpe.ckpt"', 'checkpoint = "../../chat/llama_chat.ckpt"')
        assert "llama_chat.ckpt" in base
    if TOKENIZER[tokenizer] is None:
        base = base.replace('tokenizer = "../../chat/tokenizer.json"\n', "")
        assert "tokenizer =" not in base
    else:
        base = base.replace('"../../chat/tokenizer.json"', TOKENIZER[tokenizer])
    base = base.replace('batches = "fixtures.chat_tokenized:pipeline"', 'batches = "doccase_test:make"')
    base = base.replace('batches_kwargs = { template = "chatml", style = "whole" }\n', "")
    chat = BLOCKS[block].replace('"fixtures/chat/chatml_tokenizer_config.json"',
                                 f'"{ROOT}/fixtures/chat/{template or "chatml"}_tokenizer_config.json"')
    chat = edit(chat) if edit else chat
    path = TARGETS / "llama_chat_template_tok" / f"docs_case_{tmp_path.name}.toml"
    path.write_text(base + chat + '\n[run]\ndevice = "CPU"\n')
    try:
        return load_config(path)
    finally:
        path.unlink()


@pytest.fixture(scope="module")
def ctx():
    from objdebug.engine import runtime
    from objdebug.engine.core import Engine
    from objdebug.engine.target import load_target
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.profile import load_profile

    mod = types.ModuleType("doccase_test")
    mod.make = lambda: CASE["make"]()
    sys.modules["doccase_test"] = mod
    cfg = load_config(TARGETS / "llama_chat_template_tok" / "objdebug.toml")
    runtime.setup("CPU", "graph", 0)
    t = load_target(cfg)
    yield Context(config=cfg, target=t, engine=Engine(t), profile=load_profile("ci-gate"))
    sys.modules.pop("doccase_test", None)


def _judge(ctx, cfg, make) -> dict[str, tuple[Verdict, str]]:
    from objdebug.stages.batches import chat_checks
    from objdebug.stages.batches.audit import audit, real_batches
    from objdebug.stages.batches.chat_roles import roles_of, row_roles
    from objdebug.stages.batches.framing import EosTrained

    CASE["make"] = make
    ctx.config = cfg
    for f in (audit, real_batches, roles_of, row_roles):
        ctx.forget(f)
    th = ctx.profile.section("batches")
    checks = [EosTrained()] + [c() for c in chat_checks.CHECKS]
    return {f.code: (f.verdict, f.message) for c in checks for f in run_check(c, ctx, th).findings}


def _tokenized(template, style, bug):
    from fixtures.chat_tokenized import pipeline

    return lambda: pipeline(template, style, bug)


def _bytes(fmt, bug):
    from fixtures.chat_pipelines import pipeline

    return lambda: pipeline(fmt, bug)


# form -> (docs block, tokenizer, template path, pipeline(bug)[, the user's edit of the block])
FORMS = {
    "template/whole": (0, "tok", "chatml", lambda bug: _tokenized("chatml", "whole", bug)),
    "template/segments": (0, "tok", "chatml", lambda bug: _tokenized("chatml", "segments", bug)),
    "template/qwen3": (0, "tok", "qwen3", lambda bug: _tokenized("qwen3", "segments", bug)),
    "template/glm": (0, "bytes", "glm", lambda bug: _bytes("glm", bug)),
    "markers-strings/whole": (2, "tok", None, lambda bug: _tokenized("chatml", "whole", bug)),
    "markers-strings/segments": (2, "tok", None, lambda bug: _tokenized("chatml", "segments", bug)),
    "markers-strings/glm": (2, "bytes", None, lambda bug: _bytes("glm", bug), lambda b: _glm(b, False)),
    "markers-ids": (1, "none", None, lambda bug: _bytes("chatml_ids", bug)),
    "markers-ids/high": (1, "none", None, lambda bug: _bytes("chatml_ids_high", bug), _high_ids),
    "markers-ids/glm": (1, "none", None, lambda bug: _bytes("glm", bug), lambda b: _glm(b, True)),
}
BUGS = {  # bug -> the codes one of which must FAIL (each a code the healthy twin passes)
    "all_ones": {"OBJ028", "OBJ026"}, "all_zeros": {"OBJ028", "OBJ024"}, "stop_masked": {"OBJ025"},
    "last_only": {"OBJ024"}, "user_trained": {"OBJ026"}, "system_trained": {"OBJ026"},
    "tool_trained": {"OBJ026"}, "header_trained": {"OBJ027"}, "no_markers": {"OBJ023"},
    "history_eos_trained": {"OBJ026"}, "think_trained": {"OBJ027"},
}
# which bug twins each form's pipeline builds (chat_pipelines: the issue-45 set; GLM: its closer)
CASES = [(form, bug) for form in ("template/whole", "template/segments", "markers-strings/whole",
                                  "markers-strings/segments")
         for bug in sorted(set(BUGS) - {"think_trained"})]
CASES += [("template/qwen3", b) for b in ("think_trained", "stop_masked", "header_trained", "tool_trained")]
CASES += [("template/glm", "stop_masked"), ("template/glm", "all_ones")]
CASES += [(form, b) for form in ("markers-ids", "markers-ids/high") for b in sorted(set(BUGS) - {"think_trained"})]
# GLM's closer (the next role's header) untrained, in each form that declares it
CASES += [(form, b) for form in ("markers-strings/glm", "markers-ids/glm")
          for b in ("stop_masked", "all_ones", "user_trained", "header_trained")]
HEALTHY: dict[str, dict] = {}


def _healthy(ctx, tmp_path, form):
    if form not in HEALTHY:
        block, tok, template, make, *edit = FORMS[form]
        HEALTHY[form] = _judge(ctx, _config(tmp_path, block, tok, template, *edit), make(None))
    return HEALTHY[form]


@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_docs_chat_examples_pass_a_healthy_pipeline(ctx, tmp_path, form):
    found = _healthy(ctx, tmp_path, form)
    bad = {c: v for c, v in found.items() if c in CODES and v[0] not in (Verdict.PASS, Verdict.SKIP)}
    assert not bad, bad
    assert all(found[c][0] is Verdict.PASS for c in CODES[1:]), found
    if form == "template/qwen3":  # eos_id undeclared here: OBJ020 has no EOS to judge
        assert found["OBJ020"][0] is Verdict.SKIP


@pytest.mark.parametrize("form,bug", CASES)
def test_the_docs_chat_examples_fail_each_bug_twin(ctx, tmp_path, form, bug):
    healthy = _healthy(ctx, tmp_path, form)
    block, tok, template, make, *edit = FORMS[form]
    found = _judge(ctx, _config(tmp_path, block, tok, template, *edit), make(bug.removeprefix("glm_")))
    failed = {c for c, (v, _) in found.items() if v is Verdict.FAIL and healthy[c][0] is Verdict.PASS}
    assert failed & BUGS[bug], (form, bug, {c: found[c] for c in CODES})


@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_docs_chat_examples_pass_the_gate_on_a_healthy_pipeline(ctx, tmp_path, form):
    """The whole configuration as a user writes it, through `objdebug run --profile ci-gate` on the
    stages the form changes: no WARN, FAIL or ERROR (issue 53: two real-tokenizer forms were WARN
    OBJ102 on the model's own ranking of two wrong answers)."""
    block, tok, template, make, *edit = FORMS[form]
    cfg = _config(tmp_path, block, tok, template, *edit)
    CASE["make"] = make(None)
    res = api.run(cfg, stages=["batches", "align"], profile="ci-gate", compile_cache=False)
    bad = [(f.code, f.verdict.value, f.message) for f in res.findings
           if f.verdict in (Verdict.WARN, Verdict.FAIL, Verdict.ERROR)]
    assert res.exit_code == 0 and not bad, bad
    assert {f.code for f in res.findings if f.verdict is Verdict.PASS} >= {"OBJ023", "OBJ025", "OBJ101", "OBJ103"}
