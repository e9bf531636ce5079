"""`[chat]` and the batches stage's role audit (OBJ023-OBJ028) on multi-turn pipelines.

The roles come from the fixture templates by prefix rendering (jinja2) or from declared markers;
the healthy pipelines (fixtures/chat_pipelines.py: ChatML as text, GLM's next-role, ChatML with
one id per special token) pass; each bug twin FAILs with a code its healthy twin lacks, naming
the row, the turn and the tokens. The cases run through one real Context on the demo model
(fixtures/chat/chat.ckpt: fine-tuned on other conversations; the objective's probe graph is
shared), the batches and `[chat]` swapped per case.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from objdebug.core.config import ChatSpec, load_config
from objdebug.core.errors import InputError
from objdebug.core.findings import Verdict
from objdebug.pipeline.runner import run_check

from .conftest import TARGETS

ROOT = Path(__file__).resolve().parent.parent
CHAT = ROOT / "fixtures" / "chat"
CODES = [f"OBJ0{i}" for i in range(23, 29)]


class _Cfg:
    def __init__(self, chat, tokenizer="bytes"):
        from types import SimpleNamespace

        self.chat, self.data, self.base_dir = chat, SimpleNamespace(tokenizer=tokenizer), str(ROOT)


def _roles(chat):
    from objdebug.pipeline.chat_template import chat_roles

    return chat_roles(_Cfg(chat), 256)


# --------------------------------------------------------------------------- roles (no MindSpore)
def test_chatml_roles_come_from_the_template_by_prefix_rendering():
    r = _roles(ChatSpec(template=str(CHAT / "chatml_tokenizer_config.json")))
    assert r.texts == {"system": "<|im_start|>system\n", "user": "<|im_start|>user\n",
                       "assistant": "<|im_start|>assistant\n", "tool": "<|im_start|>tool\n"}
    assert {k: bytes(v) for k, v in r.closing.items()} == {k: b"<|im_end|>" for k in r.texts}
    assert bytes(r.tail["assistant"]) == b"\n" and not r.next_role
    assert [bytes(f) for f in r.fixed] == [b"<think>\n\n</think>\n\n"]  # the empty reasoning block


def test_glm_closes_a_turn_with_the_next_role():
    r = _roles(ChatSpec(template=str(CHAT / "glm_tokenizer_config.json")))
    assert r.next_role and r.texts["assistant"] == "<|assistant|>\n"
    assert r.texts["system"] == "<|system|>\n"  # the [gMASK]<sop> preamble is not the header


def test_the_fixture_rows_are_what_the_templates_render():
    """The fixture pipelines mirror their templates (jinja2's rendering, as apply_chat_template)."""
    from fixtures.chat_pipelines import CONVERSATIONS, GLM_EOS, rows
    from objdebug.pipeline.chat_template import load_template, renderer

    for fmt, name in (("chatml", "chatml"), ("glm", "glm")):
        text, specials = load_template(str(CHAT / f"{name}_tokenizer_config.json"))
        render = renderer(text, specials, name)
        got = rows(fmt)
        for r, conv in enumerate(CONVERSATIONS):
            msgs = [{"role": role, "content": c} for role, c in conv]
            last = max(k for k, m in enumerate(msgs) if m["role"] == "assistant")
            msgs[last]["reasoning_content"] = ""
            want = list(render(msgs).encode()) + ([GLM_EOS] if fmt == "glm" else [])
            n = int(got["attention_mask"][r].sum())
            assert got["input_ids"][r, :n].tolist() == want


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", "tool"]),
                          st.text(alphabet="abc xyz.", min_size=1, max_size=12)), min_size=1, max_size=6))
def test_split_row_finds_every_turn_and_its_content(conv):
    """Any conversation rendered as ChatML splits back into its turns, contents and stops."""
    from objdebug.stages.batches.chat_roles import CONTENT, STOP, split_row

    roles = _roles(ChatSpec(markers={"system": "<|im_start|>system\n", "user": "<|im_start|>user\n",
                                     "assistant": "<|im_start|>assistant\n", "tool": "<|im_start|>tool\n"},
                            end_of_turn="<|im_end|>"))
    ids = np.array(list("".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in conv).encode()))
    turns, role, kind, _ = split_row(ids, roles, None)
    assert [(t.role, bytes(ids[t.content[0]:t.content[1]].tolist()).decode()) for t in turns] == conv
    assert all(bytes(ids[t.stop].tolist()) == b"<|im_end|>" for t in turns)
    assert (kind == CONTENT).sum() == sum(len(c) for _, c in conv)
    assert (kind == STOP).sum() == 10 * len(conv)


def test_bad_chat_sections_are_one_line_input_errors(tmp_path):
    broken = tmp_path / "tokenizer_config.json"
    broken.write_text('{"chat_template": "{% for m in messages %}{{ m.content }"}')
    with pytest.raises(InputError, match=r"does not compile: .*template line 1"):
        _roles(ChatSpec(template=str(broken)))
    with pytest.raises(InputError, match=r"must be in the vocabulary \[0, 256\), but the user marker \[1, 300\] holds \[300\]"):
        _roles(ChatSpec(markers={"user": [1, 300], "assistant": [1, 97]}, end_of_turn=2))
    no_template = tmp_path / "plain.json"
    no_template.write_text('{"eos_token": "</s>"}')
    with pytest.raises(InputError, match="must hold a 'chat_template' string"):
        _roles(ChatSpec(template=str(no_template)))
    base = (TARGETS / "chat_ids" / "objdebug.toml").read_text()
    for bad, message in ((('end_of_turn = 2', 'end_of_turn = true'), "For 'chat.end_of_turn', the value must be"),
                         (('end_of_turn = 2', 'end_of_turn = 2\ntrain_on = ["bot"]'), "For 'chat.train_on'"),
                         (('markers = {', 'template = "x.json"\nmarkers = {'), "exactly one of 'template'")):
        cfg = tmp_path / "objdebug.toml"
        cfg.write_text(base.replace(*bad).replace("../../../", str(ROOT) + "/"))
        with pytest.raises(InputError, match=message):
            load_config(cfg)


def test_a_template_without_jinja2_says_which_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "jinja2", None)
    with pytest.raises(InputError, match=r"needs jinja2: pip install 'objdebug\[chat\]'"):
        _roles(ChatSpec(template=str(CHAT / "chatml_tokenizer_config.json")))


def test_the_cli_exits_2_on_a_template_that_does_not_render(tmp_path):
    """`objdebug batches` (in-process CLI): a template that raises is exit 2, one line naming the
    key and the template's own message, before any stage runs."""
    from typer.testing import CliRunner

    from objdebug.cli import app

    broken = tmp_path / "tokenizer_config.json"
    broken.write_text('{"chat_template": "{{ raise_exception(\'no system role\') }}"}')
    text = (TARGETS / "chat_chatml" / "objdebug.toml").read_text()
    cfg = tmp_path / "objdebug.toml"
    cfg.write_text(text.replace("../../chat/chatml_tokenizer_config.json", str(broken))
                   .replace("../../../", str(ROOT) + "/"))
    res = CliRunner().invoke(app, ["batches", "--config", str(cfg)])
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if "chat.template" in line]
    assert len(errors) == 1 and "must render a conversation" in errors[0] and "no system role" in errors[0]
    assert "Traceback" not in res.output and "batches (1/1): started" not in res.output


# --------------------------------------------------------------------------- the audit, one Context
CASE: dict[str, list] = {"batches": []}


@pytest.fixture(scope="module")
def ctx():
    import types

    from objdebug.engine import runtime
    from objdebug.engine.core import Engine
    from objdebug.engine.target import load_target
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.profile import load_profile

    mod = types.ModuleType("chatcase_test")
    mod.make = lambda: iter(CASE["batches"])
    sys.modules["chatcase_test"] = mod
    cfg = load_config(TARGETS / "chat_chatml" / "objdebug.toml")
    runtime.setup("CPU", "graph", 0)
    target = load_target(cfg)
    yield Context(config=cfg, target=target, engine=Engine(target), profile=load_profile("ci-gate"))
    sys.modules.pop("chatcase_test", None)


def _judge(ctx, target="chat_chatml", fmt=None, bug=None, chat="keep", **data):
    """{code: (verdict, message)} of the batches stage's checks on `target`'s config, its batches
    made by `fixtures.chat_pipelines.rows(fmt, bug)`."""
    from fixtures.chat_pipelines import rows
    from objdebug.stages import stage_checks
    from objdebug.stages.batches.audit import audit, real_batches
    from objdebug.stages.batches.chat_roles import roles_of, row_roles

    cfg = load_config(TARGETS / target / "objdebug.toml")
    fmt = fmt or cfg.data.batches_kwargs["fmt"]
    CASE["batches"] = [rows(fmt, bug)]
    cfg = replace(cfg, data=replace(cfg.data, batches="chatcase_test:make", batches_kwargs={}, **data))
    if chat != "keep":
        cfg = replace(cfg, chat=chat)
    ctx.config = cfg
    for f in (audit, real_batches, roles_of, row_roles):
        ctx.forget(f)
    th = ctx.profile.section("batches")
    out = {}
    for check in stage_checks("batches"):
        for f in run_check(check, ctx, th).findings:
            out[f.code] = (f.verdict, f.message)
    return out


@pytest.mark.parametrize("target", ["chat_chatml", "chat_glm", "chat_ids"])
def test_the_healthy_pipelines_pass_every_role_check(ctx, target):
    found = _judge(ctx, target)
    bad = {c: v for c, v in found.items() if v[0] not in (Verdict.PASS, Verdict.SKIP)}
    assert not bad, bad
    assert all(found[c][0] is Verdict.PASS for c in CODES), found
    assert "8 assistant, 2 system, 1 tool, 7 user turns" in found["OBJ023"][1]


def test_the_eos_after_a_user_turn_is_no_longer_a_false_alarm(ctx):
    """OBJ020 on ChatML rows whose <|im_end|> is the EOS: without [chat] every row fails (the EOS
    after each user and system turn is rightly untrained); with it, only trained turns count."""
    without = _judge(ctx, "chat_ids", chat=None)
    assert without["OBJ020"][0] is Verdict.FAIL and "in 4 of 4 rows" in without["OBJ020"][1]
    assert _judge(ctx, "chat_ids")["OBJ020"][0] is Verdict.PASS
    masked = _judge(ctx, "chat_ids", bug="stop_masked")  # a real miss still fails
    assert masked["OBJ020"][0] is Verdict.FAIL and masked["OBJ025"][0] is Verdict.FAIL


BUGS = {  # bug -> (target, the codes that must FAIL, words each message must hold)
    "all_ones": ("chat_chatml", {"OBJ026": "batch 1 row 0 turn 1 (system): 29 tokens 'You answer briefly.<|im_end|>'",
                                 "OBJ027": "batch 1 row 0 turn 3 (assistant header): 22 tokens", "OBJ028": "every token trained in 4 rows"}),
    "all_zeros": ("chat_chatml", {"OBJ024": "8 of 8 assistant turns", "OBJ025": "8 of 8",
                                  "OBJ028": "no token trained in 4 rows"}),
    "stop_masked": ("chat_chatml", {"OBJ025": "batch 1 row 0 turn 3 (assistant): '<|im_end|>'"}),
    "last_only": ("chat_chatml", {"OBJ024": "only the last assistant turn trains in 4 rows"}),
    "header_trained": ("chat_chatml", {"OBJ027": "(assistant header): 22 tokens '<|im_start|>assistant⏎'"}),
    "think_trained": ("chat_chatml", {"OBJ027": "batch 1 row 0 turn 5 (assistant fixed): 19 tokens '<think>⏎⏎</think>⏎⏎'"}),
    "user_trained": ("chat_chatml", {"OBJ026": "batch 1 row 0 turn 4 (user): 33 tokens 'Reverse: pear fig peach<|im_end|>'"}),
    "no_markers": ("chat_chatml", {"OBJ023": "no role marker found in 4 of 4 rows"}),
    "glm_stop_masked": ("chat_glm", {"OBJ025": "the stop token (the next role's header: next-role) of 8 of 8 assistant turns"}),
}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_each_bug_twin_fails_with_a_code_its_healthy_twin_lacks(ctx, bug):
    target, expected = BUGS[bug]
    found = _judge(ctx, target, bug=bug.removeprefix("glm_"))
    for code, words in expected.items():
        verdict, message = found[code]
        assert verdict is Verdict.FAIL, (code, found[code])
        assert words in message, message


def test_show_marks_each_turn_by_role(ctx):
    """`objdebug batches --show`: each turn's role where it starts, coloured by role in a terminal."""
    from objdebug.stages.batches import audit, show
    from objdebug.stages.batches.chat_roles import row_roles

    _judge(ctx, "chat_glm")
    th = ctx.profile.section("batches")
    roles = show.chat_rows(ctx, th)
    assert roles is row_roles(ctx, th)
    text = show.render(audit.audit(ctx, th), 1, show.decoder(ctx.config), 400, roles=roles)
    assert "turns: system user assistant user assistant" in text
    assert "⟦system⟧<|system|>⏎You answer briefly.⟦user⟧<|user|>⏎Ivo has a black eel.⟦assistant⟧" in text
    painted = show.render(audit.audit(ctx, th), 1, show.decoder(ctx.config), 400, colour=True, roles=roles)
    assert "\x1b[0;1;36m⟦assistant⟧" in painted and "\x1b[0;1;34m⟦user⟧" in painted


def test_the_html_report_colours_each_turn_by_role():
    """The HTML report's row display (report/batch_rows.py, from a report dict only): each turn's
    tokens underlined in its role's colour from its ⟦role⟧ label on, padding not; a view without
    roles has no role key."""
    from objdebug.report import batch_rows

    view = {"source": "s", "ignored": [-100], "pairing": None, "total": 1, "rows": [{
        "title": "batch 1 row 0", "segments": [
            ["ignored", ["⟦user⟧<", "u", ">", "Hi"]], ["trained", ["⟦assistant⟧<", "a", ">", "Yo"]],
            ["padding", ["⟨0⟩×4 "]]]}]}
    page = batch_rows.html(view)
    assert '<span class="role role-label role-user">⟦user⟧</span>&lt;' in page
    assert '<span class="role-user">Hi</span>' in page and '<span class="role-assistant">Yo</span>' in page
    assert "each turn's tokens underlined in its role's colour" in page
    assert '<span class="tag">[padding]</span>⟨0⟩×4 </span>' in page  # padding: no role
    plain = dict(view, rows=[{"title": "t", "segments": [["trained", ["a", "b"]]]}])
    page = batch_rows.html(plain)
    assert "role-" not in page.split("</ul>", 1)[1] and ">ab</span>" in page


def test_init_batches_proposes_a_chat_section_for_conversation_rows(tmp_path):
    """`objdebug init --batches SRC` (its `chat_keys` step): rows with several trained spans, each
    after the same header and ending on the same stop, get a [chat] proposal that loads; rows of
    one prompt and one answer get none."""
    from objdebug.init import Findings, chat_keys, render

    found = Findings()
    found.set("objective", "factory", "objdebug.losses:MaskedCrossEntropy")
    chat_keys(found, "fixtures.chat_pipelines:pipeline_ids", ROOT, tmp_path, None)
    out = tmp_path / "objdebug.toml"
    out.write_text(render(found))
    chat = load_config(out).chat
    assert chat.markers == {"assistant": [10, 1, 97, 115, 115, 105, 115, 116, 97, 110, 116, 10]}
    assert chat.end_of_turn == 2  # <|im_end|>, the id every assistant turn's trained span ends on
    assert "8 trained spans in 4 rows" in out.read_text()
    single = Findings()
    chat_keys(single, "fixtures.batch_pipelines:healthy_collator", ROOT, tmp_path, None)
    assert "chat" not in single.values


@pytest.mark.parametrize("block,fmt", [(0, "chatml"), (1, "chatml_ids"), (2, "chatml")])
def test_the_docs_chat_examples_find_every_turn(tmp_path, block, fmt):
    """docs/config.md's [chat] examples (template; markers) load and split the fixture rows into
    every turn of every conversation."""
    from fixtures.chat_pipelines import CONVERSATIONS, rows
    from objdebug.pipeline.chat_template import chat_roles
    from objdebug.stages.batches.chat_roles import split_row

    from .doc_snippets import section_blocks

    blocks = section_blocks("### Conversations: `[chat]`")
    assert len(blocks) == 3
    base = (TARGETS / "chat_ids" / "objdebug.toml").read_text()
    base = base[:base.index("[chat]")] + blocks[block] + "\n[run]\ndevice = \"CPU\"\n"
    cfg_path = tmp_path / "objdebug.toml"
    cfg_path.write_text(base.replace("../../../", f"{ROOT}/").replace('"fixtures/', f'"{ROOT}/fixtures/'))
    roles = chat_roles(load_config(cfg_path), 256)
    got = rows(fmt)
    for r, conv in enumerate(CONVERSATIONS):
        n = int(got["attention_mask"][r].sum())
        turns = split_row(got["input_ids"][r, :n], roles, None)[0]
        assert [t.role for t in turns] == [role for role, _ in conv]
