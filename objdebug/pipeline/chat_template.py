"""`[chat]`: how a conversation's turns sit in a row's tokens, resolved once per run (`chat_roles`).

Two ways, as the config says:
- `template`: an HF `tokenizer_config.json` (or a bare `.jinja` file) whose `chat_template` is
  rendered with jinja2 the way `transformers.apply_chat_template` does (sandboxed, trim_blocks,
  lstrip_blocks, `raise_exception`, `tojson`). Probe conversations with sentinel contents are
  rendered whole and cut short after every message ("prefix rendering"): the text between the end
  of the shorter rendering and a message's content is that role's header; the text between a
  content's end and the end of the rendering that stops after it is the role's closing. No
  `{% generation %}` markers are needed. A closing that is empty for every role means the template
  closes a turn with the next role's header (GLM: "next-role"). Text a template puts between an
  assistant header and the content in some turns only (Qwen3's empty `<think>\\n\\n</think>\\n\\n`)
  is a template-fixed span.
- `markers`: each role's header as an id list or a string (encoded through `[data] tokenizer`),
  and `end_of_turn` (an id, a string, an id list, or "next-role").

A template's texts, and markers given as strings, are matched in each row's decoded text
(`stages/batches/chat_text.py`: a tokenizer's merges and dummy prefixes do not move a turn);
markers given as ids are matched as id sequences.

Texts become ids through `[data] tokenizer`. A template that does not render, jinja2 missing, a
marker id outside the model's vocabulary (engine/vocabulary.py: `[data] vocab_size`, the model's
logits or input embedding, a declared tokenizer): InputError (exit 2, one line). MindSpore-free.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from objdebug.core.config import CHAT_ROLES, NEXT_ROLE
from objdebug.core.errors import InputError

SENTINEL = "QZX{}QZX"  # a message's content in the probe conversations: found back in the text


@dataclass
class ChatRoles:
    """Each role's header and closing as token ids, as the audit matches them in a row."""

    how: str                                   # what the messages say the roles came from
    headers: dict[str, list[int]]              # role -> header ids
    closing: dict[str, list[int]]              # role -> the ids that stop its turn ([]: next-role)
    tail: dict[str, list[int]] = field(default_factory=dict)  # ids after the stop ("\n"): neither
    fixed: list[list[int]] = field(default_factory=list)      # template-fixed spans after a header
    next_role: bool = False                    # a turn is closed by the next role's header (GLM)
    train_on: tuple[str, ...] = ("assistant",)
    last_turn_only: bool = False
    texts: dict[str, str] = field(default_factory=dict)       # role -> header text (messages)
    # the template path: rows are read as text (`stages/batches/chat_text.py`), not id sequences
    tok: Any = None                                            # decodes a row's ids to its text
    header_texts: dict[str, list[str]] = field(default_factory=dict)  # role -> its headers, longest first
    closing_texts: dict[str, str] = field(default_factory=dict)       # role -> its stop's text
    tail_texts: dict[str, str] = field(default_factory=dict)          # role -> the text after the stop
    preamble_text: str = ""

    @property
    def by_text(self) -> bool:
        return bool(self.header_texts) and self.tok is not None and hasattr(self.tok, "pieces")


def chat_roles(cfg: Any, vocab: int | None = None) -> ChatRoles | None:
    """The config's `[chat]` resolved to ids (None without `[chat]`); InputError on bad input."""
    c = getattr(cfg, "chat", None)
    if c is None:
        return None
    try:
        return _resolve(cfg, c, vocab)
    except InputError as exc:  # name the config the [chat] section is in, as every config error does
        if exc.source is not None or getattr(cfg, "source", "<memory>") == "<memory>":
            raise
        raise InputError(str(exc), source=cfg.source) from None


def _resolve(cfg: Any, c: Any, vocab: int | None) -> ChatRoles:
    from objdebug.engine.data import make_tokenizer
    from objdebug.engine.vocabulary import declared

    tok = make_tokenizer(cfg.data.tokenizer, cfg.base_dir)
    # the model's vocabulary (the batches stage passes it); before the model is built, what the
    # config declares: never the byte tokenizer's 256 (ids need no tokenizer)
    vocab = vocab or declared(cfg)[0]
    if c.template is not None:
        roles = _from_template(c.template, tok, cfg.data)
    else:
        roles = _from_markers(c.markers, c.end_of_turn, tok)
    if c.end_of_turn is not None and c.template is not None:  # an explicit stop wins over the derived one
        stop, nxt = _end_of_turn(c.end_of_turn, tok)
        roles.closing = {r: stop for r in roles.headers}
        roles.next_role = nxt
        text = tok.text_form(c.end_of_turn) if isinstance(c.end_of_turn, str) and not nxt else \
            ("".join(tok.pieces(stop)) if stop and hasattr(tok, "pieces") else "")
        roles.closing_texts = {r: text for r in roles.headers}
        roles.tail_texts = {r: "" for r in roles.headers}
    roles.train_on, roles.last_turn_only = tuple(c.train_on), bool(c.last_turn_only)
    _check_vocab(roles, vocab)
    missing = [r for r in c.train_on if r not in roles.headers]
    if missing:
        raise InputError(f"For 'chat.train_on', every role must have a header, but {missing} has "
                         f"none ({roles.how} gives {sorted(roles.headers)}).")
    return roles


def _check_vocab(roles: ChatRoles, vocab: int | None) -> None:
    if not vocab:
        return
    for name, ids in list(roles.headers.items()) + [(f"{r} closing", v) for r, v in roles.closing.items()]:
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise InputError(f"For '[chat]', every marker must be in the vocabulary [0, {vocab}), but "
                             f"the {name} marker {ids} holds {bad} ({roles.how}).")


def _encode(value: Any, tok: Any, key: str) -> list[int]:
    if isinstance(value, int):
        return [int(value)]
    if isinstance(value, list):
        return [int(v) for v in value]
    ids = tok.encode(value)
    if not ids:
        raise InputError(f"For '{key}', the marker must encode to at least one token, but "
                         f"{value!r} encodes to none through data.tokenizer.")
    return ids


def _end_of_turn(value: Any, tok: Any) -> tuple[list[int], bool]:
    if value == NEXT_ROLE:
        return [], True
    return _encode(value, tok, "chat.end_of_turn"), False


def _from_markers(markers: dict[str, Any], end_of_turn: Any, tok: Any) -> ChatRoles:
    headers = {r: _encode(v, tok, f"chat.markers.{r}") for r, v in markers.items()}
    stop, nxt = _end_of_turn(end_of_turn, tok)
    texts = {r: v if isinstance(v, str) else str(v) for r, v in markers.items()}
    roles = ChatRoles("[chat] markers", headers, {r: stop for r in headers}, next_role=nxt, texts=texts)
    if all(isinstance(v, str) for v in markers.values()) and hasattr(tok, "pieces") \
            and (nxt or isinstance(end_of_turn, str) or end_of_turn is None):
        # markers as text: rows are read as text, as with a template (a tokenizer's merges and
        # dummy prefixes do not hide them); markers as ids are id sequences
        roles.tok = tok
        roles.header_texts = {r: [tok.text_form(v)] for r, v in markers.items()}
        eot = "" if nxt or end_of_turn is None else tok.text_form(end_of_turn)
        roles.closing_texts = {r: eot for r in markers}
        roles.tail_texts = {r: "" for r in markers}
    return roles


# --------------------------------------------------------------------------- templates
def load_template(path: str) -> tuple[str, dict[str, Any]]:
    """(chat_template text, the special-token strings a template reads) from a
    tokenizer_config.json, or a .jinja file's text."""
    p = Path(path)
    if not p.is_file():
        raise InputError("For 'chat.template', the file must exist, but it does not.", source=path)
    text = p.read_text(encoding="utf-8")
    if not p.name.endswith(".json"):
        return text, {}
    try:
        conf = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"For 'chat.template', not valid JSON ({exc.msg})", source=path,
                         line=exc.lineno) from None
    template = conf.get("chat_template") if isinstance(conf, dict) else None
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if not isinstance(template, str) or not template:
        raise InputError("For 'chat.template', the file must hold a 'chat_template' string, but it "
                         "has none.", source=path)
    specials = {}
    for key, value in conf.items():
        if key.endswith("_token"):
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                specials[key] = value
    return template, specials


def renderer(template: str, specials: dict[str, Any], path: str):
    """A function messages -> text, as apply_chat_template renders (InputError when jinja2 is
    missing or the template does not compile)."""
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise InputError("For 'chat.template', rendering a chat template needs jinja2: pip install "
                         "'objdebug[chat]' (or use [chat] markers).") from None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: "26 Jul 2024"  # fixed: the probe must not vary by day
    try:
        compiled = env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise InputError(f"For 'chat.template', the chat_template does not compile: {exc.message} "
                         f"(template line {exc.lineno})", source=path) from None

    def render(messages: list[dict], add_generation_prompt: bool = False) -> str:
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               tools=None, documents=None, **specials)
    return render


def _probe(with_tool: bool, with_system: bool) -> list[dict]:
    roles = (["system"] if with_system else []) + ["user", "assistant", "user", "assistant"]
    if with_tool:
        roles += ["tool", "assistant"]
    msgs = [{"role": r, "content": SENTINEL.format(k)} for k, r in enumerate(roles)]
    msgs[-1]["reasoning_content"] = ""  # an empty reasoning field: a template may render a fixed span
    return msgs


def _render_probe(render) -> list[dict]:
    """The richest probe conversation the template renders (tool and system turns are optional)."""
    errors = []
    for with_tool, with_system in ((True, True), (False, True), (True, False), (False, False)):
        msgs = _probe(with_tool, with_system)
        try:
            render(msgs)
            return msgs
        except Exception as exc:  # noqa: BLE001 - a template may refuse a role: try without it
            errors.append(f"{type(exc).__name__}: {exc}")
    raise InputError(f"For 'chat.template', the chat_template must render a conversation of "
                     f"system, user and assistant turns, but it raised {errors[-1]}")


def _from_template(path: str, tok: Any, data: Any) -> ChatRoles:
    template, specials = load_template(path)
    render = renderer(template, specials, path)
    msgs = _render_probe(render)
    full = render(msgs)
    headers: dict[str, list[str]] = {}
    closings: dict[str, list[str]] = {}
    gaps = []  # (k, the text between message k-1's content and message k's): closing + header
    done = 0  # where the text of the messages before k ends in `full`
    for k, m in enumerate(msgs):
        content = m["content"]
        at = full.find(content, done)
        if at < 0:
            raise InputError(f"For 'chat.template', a message's content must appear in the rendered "
                             f"text, but the {m['role']} content {content!r} does not", source=path)
        try:
            before = render(msgs[:k]) if k else ""
        except Exception:  # noqa: BLE001 - a template that refuses the shorter conversation
            before = None
        if before is not None and full.startswith(before) and len(before) <= at:
            if k:  # the previous message's closing: its content's end to where the short rendering ends
                closings.setdefault(msgs[k - 1]["role"], []).append(full[done:len(before)])
            headers.setdefault(m["role"], []).append(full[max(len(before), done):at])
        else:  # the shorter rendering differs (Qwen3 writes a reasoning block into a last turn)
            gaps.append((k, full[done:at]))
        done = at + len(content)
    last = msgs[-1]
    closings.setdefault(last["role"], []).append(full[done:])
    for k, gap in gaps:  # a gap that opens with the previous role's known closing: the rest is the header
        prev = msgs[k - 1]["role"] if k else None
        known = sorted((c for c in closings.get(prev, []) if c.strip() and gap.startswith(c)), key=len)
        if k and known:
            headers.setdefault(msgs[k]["role"], []).append(gap[len(known[-1]):])
        elif not k:
            headers.setdefault(msgs[k]["role"], []).append(gap)
    if "assistant" not in headers:
        raise InputError("For 'chat.template', the assistant header must be found by prefix "
                         "rendering, but the template renders no stable prefix", source=path)
    # a bos_token or preamble before the first message's header is not the header
    pre = render([]) if _renders_empty(render) else ""
    pre = pre or specials.get("bos_token") or ""
    first = msgs[0]["role"]
    headers[first] = [h[len(pre):] if pre and h.startswith(pre) and len(h) > len(pre) else h
                      for h in headers[first]]
    roles = ChatRoles(f"the chat_template of '{Path(path).name}'", {}, {}, tok=tok)
    roles.preamble_text = pre
    for role, found in headers.items():
        found = [h for h in found if h]
        if not found:
            continue
        base = min(found, key=len)
        roles.texts[role] = base
        roles.headers[role] = tok.encode(base)
        variants = {base}
        for h in found:  # a longer header of the same role: the template's fixed span after it
            extra = h[len(base):] if h.startswith(base) else ""
            if extra.strip():
                variants.add(h)
                ids = tok.encode(extra)
                if ids not in roles.fixed:
                    roles.fixed.append(ids)
        roles.header_texts[role] = sorted(variants, key=len, reverse=True)
    for role, found in closings.items():
        text = min((c for c in found if c.strip()), key=len, default="")
        stop = text.rstrip()  # the stop the model must learn; whitespace after it is neither
        roles.closing[role] = tok.encode(stop) if stop else []
        rest = text[len(stop):]
        roles.tail[role] = tok.encode(rest) if rest else []
        roles.closing_texts[role], roles.tail_texts[role] = stop, rest
    for role in roles.headers:
        roles.closing.setdefault(role, roles.closing.get("user", []))
        roles.closing_texts.setdefault(role, roles.closing_texts.get("user", ""))
        roles.tail_texts.setdefault(role, roles.tail_texts.get("user", ""))
    roles.next_role = not any(roles.closing.get(r) for r in roles.headers)
    if hasattr(tok, "text_form"):  # the texts rows are read in (a byte tokenizer's: latin-1 bytes)
        form = tok.text_form
        roles.header_texts = {r: [form(v) for v in vs] for r, vs in roles.header_texts.items()}
        roles.closing_texts = {r: form(v) for r, v in roles.closing_texts.items()}
        roles.tail_texts = {r: form(v) for r, v in roles.tail_texts.items()}
        roles.preamble_text = form(roles.preamble_text)
    return roles


def _renders_empty(render) -> bool:
    try:
        render([])
        return True
    except Exception:  # noqa: BLE001
        return False


# --------------------------------------------------------------------------- objdebug init --batches
def propose(batch: Any, label_pad_id: int, tokenizer_path: str | None) -> dict[str, Any] | None:
    """A `[chat]` section for `objdebug init --batches` when one batch looks like conversations:
    {"template": path} when a tokenizer_config.json with a chat_template sits beside the
    tokenizer, else {"markers": {"assistant": ids}, "end_of_turn": id} from recurring sequences:
    the tokens every trained span of the batch follows (the assistant header) and the id every
    trained span ends on (the stop), when rows hold two or more trained spans on average. None
    when the rows do not look like conversations. The proposal says why (key "why")."""
    if tokenizer_path:
        conf = Path(tokenizer_path).parent / "tokenizer_config.json"
        if conf.is_file():
            try:
                load_template(str(conf))
                return {"template": str(conf), "why": f"the chat_template of '{conf.name}' beside the tokenizer"}
            except InputError:
                pass
    labels, ids = batch.labels, batch.input_ids
    if labels is None:
        return None
    heads, stops, spans = [], [], 0
    for r in range(len(ids)):
        trained = (labels[r] != label_pad_id) & (labels[r] != -100)
        edges = np.flatnonzero(np.diff(trained.astype(int)))
        starts = [int(e) + 1 for e in edges if trained[e + 1]]
        ends = [int(e) for e in edges if trained[e]]
        spans += len(starts)
        heads += [ids[r, max(0, s - 24):s + 1].tolist() for s in starts]
        stops += [labels[r, max(0, e - 15):e + 1].tolist() for e in ends]  # each span's last labels
    if len(ids) == 0 or spans < 2 * len(ids):
        return None  # one answer per row: a prompt and a response, not a conversation
    stop = _common_suffix(stops) if stops else []  # the stop the trained spans end on: an id or a few
    if not stop:
        return None
    # pre-shifted labels: the span starts on the header's last token; unshifted: on the content
    header = _common_suffix(heads) or _common_suffix([h[:-1] for h in heads])
    for k in range(len(header) - len(stop), -1, -1):  # what follows the previous turn's stop
        if header[k:k + len(stop)] == stop:
            header = header[k + len(stop):]
            break
    if len(header) < 2:  # one shared token ("\n") is no header
        return None
    end = int(stop[0]) if len(stop) == 1 else [int(i) for i in stop]
    return {"markers": {"assistant": [int(i) for i in header]}, "end_of_turn": end,
            "why": f"{spans} trained spans in {len(ids)} rows, each after {header} and ending on "
                   f"{end}: add the user / system headers"}


def _common_suffix(seqs: list[list[int]]) -> list[int]:
    common = seqs[0]
    for h in seqs[1:]:
        k = 0
        while k < min(len(common), len(h)) and common[-1 - k] == h[-1 - k]:
            k += 1
        common = common[len(common) - k:] if k else []
    return common
