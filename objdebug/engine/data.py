"""Data files, tokenization and label building.

A sample is a prompt and a response. Its `input_ids` are prompt + response; its labels carry the
token to predict on response positions and `label_pad_id` everywhere else (prompt, the last
position, padding) — exactly what a user's data pipeline writes, so the user's own objective
decides what is scored.
"""

from __future__ import annotations

import difflib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from objdebug.core import jsonsafe
from objdebug.core.errors import InputError
from objdebug.engine.model_inputs import mark_padding, marks_padding

BUCKETS = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


# --------------------------------------------------------------------------- tokenizers
class BytesTokenizer:
    """UTF-8 bytes as token ids (vocab 256). Built in, needs nothing."""

    name = "bytes"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def pieces(self, ids: list[int]) -> list[str]:
        """Each token's text in `text_form`'s space: one byte, one character (latin-1)."""
        return [chr(i) if 0 <= i < 256 else "\ufffd" for i in ids]

    def text_form(self, text: str) -> str:
        """A rendered text in the space `pieces` writes: its UTF-8 bytes as latin-1 characters."""
        return text.encode("utf-8").decode("latin-1")

    def specials(self) -> list[str]:
        return []


class HFTokenizer:
    """A local `tokenizer.json` through the `tokenizers` package (optional extra)."""

    def __init__(self, path: str):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise InputError("For 'data.tokenizer', a tokenizer.json needs the 'tokenizers' package: "
                             "pip install 'objdebug[tokenizers]'") from None
        if not Path(path).is_file():
            raise InputError("For 'data.tokenizer', file not found", source=path)
        try:
            self._tok = Tokenizer.from_file(path)
        except Exception as exc:
            raise InputError(f"For 'data.tokenizer', cannot load: {exc}", source=path) from None
        self.name = path
        self.vocab_size = self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        # special tokens are objdebug's to add ([data] bos_id / eos_id), never the tokenizer's template
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)

    def pieces(self, ids: list[int], window: int = 6) -> list[str]:
        """Each token's text as the row decodes it (special tokens kept): the text `window` tokens
        and this one decode to, less what the `window` tokens alone decode to. A decoder's
        context (a sentencepiece dummy-prefix space stripped only at the start, a UTF-8
        character split over byte tokens) is the same in both, so the pieces join into the
        row's text; a token whose text the next one completes is given it there."""
        ids = [int(i) for i in ids]
        out = []
        for k in range(len(ids)):
            s = max(0, k - window)
            before = self._tok.decode(ids[s:k], skip_special_tokens=False) if k > s else ""
            upto = self._tok.decode(ids[s:k + 1], skip_special_tokens=False)
            if upto.startswith(before):
                out.append(upto[len(before):])
            else:  # a character completed by this token: the previous pieces held a stand-in
                common = len(os.path.commonprefix([before, upto]))
                out.append(upto[common:])
        return out

    def text_form(self, text: str) -> str:
        return text

    def specials(self) -> list[str]:
        """The added tokens' texts (`<|im_start|>`): where a sentencepiece tokenizer starts a new
        segment, hence may put a dummy-prefix space."""
        return [t.content for t in self._tok.get_added_tokens_decoder().values() if t.content]

    def special_ids(self) -> dict[str, int]:
        """{"bos": id, "eos": id, "pad": id, "unk": id} as far as the tokenizer tells: the
        post-processor's template (`<s> $A </s>`) first, then the usual special-token names."""
        out: dict[str, int] = {}
        post = json.loads(self._tok.to_str()).get("post_processor") or {}
        single = [p for p in post.get("single", []) if isinstance(p, dict)]
        seq = next((i for i, p in enumerate(single) if "Sequence" in p), None)
        if seq is not None:
            for side, piece in (("bos", single[:seq]), ("eos", single[seq + 1:])):
                for p in piece:
                    tid = self._tok.token_to_id(p.get("SpecialToken", {}).get("id", ""))
                    if tid is not None:
                        out.setdefault(side, tid)
                        break
        for tok in self._tok.get_added_tokens_decoder().values():
            name = tok.content.lower().strip("<>|[]").replace("_", "").replace("of", "")
            kind = next((k for k, names in _SPECIAL_NAMES.items() if name in names), None)
            if kind:
                out.setdefault(kind, self._tok.token_to_id(tok.content))
        return out


# lower-cased special-token names without brackets, '_' and 'of' ('<|endoftext|>' -> 'endtext')
_SPECIAL_NAMES = {"bos": ("s", "bos", "start", "begintext", "cls"),
                  "eos": ("/s", "eos", "end", "endtext", "sep"),
                  "pad": ("pad",), "unk": ("unk",)}


def make_tokenizer(spec: str, base_dir: str = "."):
    if spec == "bytes":
        return BytesTokenizer()
    path = Path(spec)
    if not path.is_absolute():
        path = Path(base_dir) / path
    return HFTokenizer(str(path))


# --------------------------------------------------------------------------- JSONL
# The fields a row may have; anything else is most likely a typo ("medum" would silently drop the
# medium answer and change OBJ102's verdict), so it is an error. `meta` holds free-form extras.
ROW_FIELDS = {
    "align": ("id", "prompt", "prompt_ids", "good", "good_ids", "medium", "medium_ids", "bad",
              "bad_ids", "meta"),
    "scores": ("id", "prompt", "prompt_ids", "response", "response_ids", "score", "scores", "meta"),
    # "strenght" would silently drop every strength and leave OBJ813 a SKIP (issue 23)
    "preference": ("id", "prompt", "prompt_ids", "chosen", "chosen_ids", "rejected", "rejected_ids",
                   "strength", "meta"),
    "text": ("id", "text", "text_ids", "meta"),
    # the policy stage's groups: one prompt, its sampled completions and their rewards
    "rollouts": ("id", "prompt", "prompt_ids", "completions", "completion_ids", "rewards", "old_logps",
                 "meta"),
    # [task] kind's rows under the same keys (objdebug/engine/tasks.py reads them)
    "classification": ("id", "text", "ids", "text_ids", "label", "score", "meta"),
    "tagging": ("id", "tokens", "ids", "tags", "score", "meta"),
    "embedding": ("id", "anchor", "anchor_ids", "positive", "positive_ids", "negative",
                  "negative_ids", "score", "meta"),
}


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses to inf
        raise ValueError(f"the number {text} is out of range (not finite)")
    return value


def _no_constant(name: str):
    raise ValueError(f"'{name}' is not a number objdebug accepts (non-finite values are not "
                     f"allowed); give a finite number or drop the row")


def _unique_keys(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"field '{key}' appears twice in one object")
        seen[key] = value
    return seen


def _parse_line(line: str) -> Any:
    return jsonsafe.loads(line, parse_float=_finite_float, parse_constant=_no_constant,
                          object_pairs_hook=_unique_keys)


def check_row(row: dict, what: str, source: str, lineno: int) -> None:
    """Field names of one row: no unknown (misspelled) field, not both `x` and `x_ids`."""
    allowed = ROW_FIELDS.get(what)
    if allowed is None:
        return
    unknown = [k for k in row if k not in allowed]
    if unknown:
        close = difflib.get_close_matches(unknown[0], allowed, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise InputError(f"unknown field '{unknown[0]}'{hint}; a data.{what} row has the fields "
                         f"{list(allowed)}", source=source, line=lineno)
    for name in allowed:
        if f"{name}_ids" in row and name in row:
            raise InputError(f"the row has both '{name}' and '{name}_ids'; keep one (text or token "
                             f"ids)", source=source, line=lineno)
    if what == "align":  # an empty answer scores 0 tokens: an empty 'bad' passes any ordering
        for name in ("good", "medium", "bad"):
            if row.get(name) == "" or row.get(f"{name}_ids") == []:
                raise InputError(f"field '{name}' is empty", source=source, line=lineno)
    if what == "scores":
        if not _finite_number(row.get("score")):
            raise InputError(f"field 'score' must be a finite number, but got {row.get('score')!r}",
                             source=source, line=lineno)
        aspects = row.get("scores", {})
        if not isinstance(aspects, dict) or not all(_finite_number(v) for v in aspects.values()):
            raise InputError("field 'scores' must be an object of finite numbers", source=source,
                             line=lineno)
    if what == "rollouts":
        check_rollout_group(row, source, lineno)


def check_rollout_group(row: dict, source: str, lineno: int) -> None:
    """A `[data] rollouts` group's shape, before any model loads: at least 2 completions (the group
    baseline of their advantages), one finite reward each."""
    if "completion_ids" in row and "completions" in row:
        raise InputError("the row has both 'completions' and 'completion_ids'; keep one (text or token "
                         "ids)", source=source, line=lineno)
    comps = row.get("completion_ids", row.get("completions"))
    if not isinstance(comps, list):
        raise InputError("missing field 'completions' (or 'completion_ids'): a list, one per completion",
                         source=source, line=lineno)
    if len(comps) < 2:
        raise InputError(f"a group needs at least 2 completions of its prompt (the group baseline of "
                         f"its advantages), but got {len(comps)}", source=source, line=lineno)
    rewards = row.get("rewards")
    if not isinstance(rewards, list) or not all(_finite_number(r) for r in rewards):
        shown = rewards if not isinstance(rewards, list) else next(r for r in rewards if not _finite_number(r))
        raise InputError(f"field 'rewards' must be a list of finite numbers, one per completion, but got "
                         f"{shown!r}", source=source, line=lineno)
    if len(rewards) != len(comps):
        raise InputError(f"field 'rewards' has {len(rewards)} values for {len(comps)} completions",
                         source=source, line=lineno)


def _finite_number(x: Any) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:  # an integer beyond float range
        return False


def read_jsonl(path: str | None, what: str, fields: str | None = None) -> list[tuple[int, dict[str, Any]]]:
    """Rows with their 1-based line numbers; a line that is not UTF-8, not a JSON object, holds
    NaN/Infinity or an unknown field names file and line. `fields`: the row kind whose fields
    are allowed, when it is not `what` (a `[task] kind`'s rows under `data.align`)."""
    if not path:
        raise InputError(f"For 'data.{what}', no file is configured; set it in the config or "
                         f"with --set data.{what}=PATH")
    p = Path(path)
    if not p.is_file():
        raise InputError(f"For 'data.{what}', file not found", source=str(p))
    rows = []
    try:
        fh = open(p, "rb")
    except OSError as exc:
        raise InputError(f"For 'data.{what}', cannot read the file: {exc.strerror}",
                         source=str(p)) from None
    with fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at column "
                                 f"{exc.start + 1}; save the file as UTF-8", source=str(p),
                                 line=lineno) from None
            if lineno == 1:
                line = line.removeprefix("\ufeff")  # a byte-order mark from some editors
            if not line.strip():
                continue
            try:
                row = _parse_line(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"not valid JSON: {exc.msg} (column {exc.colno})",
                                 source=str(p), line=lineno) from None
            except ValueError as exc:  # a non-finite number, a repeated field
                raise InputError(f"not valid JSON: {exc}", source=str(p), line=lineno) from None
            if not isinstance(row, dict):
                raise InputError(f"each line must be a JSON object, but got {type(row).__name__}",
                                 source=str(p), line=lineno)
            check_row(row, fields or what, str(p), lineno)
            rows.append((lineno, row))
    if not rows:
        raise InputError(f"For 'data.{what}', the file has no rows", source=str(p))
    return rows


def preflight(cfg) -> None:
    """Read the configured data files before MindSpore starts: encoding, JSON and field errors
    cost no model load. (A missing file is reported by the stage that needs it.)"""
    for what in ("align", "scores", "preference", "text", "rollouts"):
        path = getattr(cfg.data, what, None)
        if what == "text" and path and Path(path).suffix.lower() not in (".jsonl", ".json", ".ndjson"):
            continue  # a plain corpus: one document a line, no fields
        if what in ("align", "scores") and getattr(getattr(cfg, "task", None), "kind",
                                                   "causal-lm") != "causal-lm":
            continue  # a [task] kind's rows: engine/tasks.py reads them (api.prepare)
        if path and Path(path).is_file():
            read_jsonl(path, what)


@dataclass
class Encoder:
    """Turns text or id lists from data rows into token ids, validating the vocabulary."""

    tokenizer: Any
    vocab_size: int | None          # the model's (engine/vocabulary.py); None: unknown, ids only >= 0
    source: str = ""
    vocab_from: str = ""            # where the vocabulary was read, for the messages

    @property
    def id_range(self) -> int:
        """The ids random answers are drawn from: the model's vocabulary, else the tokenizer's."""
        return int(self.vocab_size or self.tokenizer.vocab_size)

    def field(self, row: dict, name: str, lineno: int, required: bool = True) -> list[int] | None:
        """Row field `name` (text) or `name_ids` (list of ints) -> token ids."""
        text_field = False
        if f"{name}_ids" in row:
            ids = row[f"{name}_ids"]
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                    for i in ids):
                raise InputError(f"field '{name}_ids' must be a list of integers", source=self.source,
                                 line=lineno)
        elif name in row:
            text = row[name]
            if not isinstance(text, str):
                raise InputError(f"field '{name}' must be a string, but got {type(text).__name__}",
                                 source=self.source, line=lineno)
            ids, text_field = self.tokenizer.encode(text), True
        elif required:
            raise InputError(f"missing field '{name}' (or '{name}_ids')", source=self.source, line=lineno)
        else:
            return None
        bad = [i for i in ids if i < 0 or (self.vocab_size is not None and i >= self.vocab_size)]
        if bad:
            bound = f"[0, {self.vocab_size})" if self.vocab_size is not None else "(ids are >= 0)"
            where = f" ({self.vocab_from})" if self.vocab_from and self.vocab_size is not None else ""
            how = (f"; the text is encoded by the '{getattr(self.tokenizer, 'name', '?')}' tokenizer "
                   f"([data] tokenizer)") if text_field else ""
            raise InputError(f"field '{name}' has token id {bad[0]} outside the vocabulary "
                             f"{bound}{where}{how}", source=self.source, line=lineno)
        return list(ids)


# --------------------------------------------------------------------------- samples
@dataclass
class Sample:
    """One prompt + response, with the ids that the user's objective will see."""

    id: str
    prompt: list[int]
    response: list[int]
    kind: str = ""          # good / medium / bad / response / synthetic-...
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.response)


def build_labels(prompt: list[int], response: list[int], label_pad_id: int, shift: bool) -> np.ndarray:
    """Labels for prompt+response: the response tokens to predict, label_pad_id elsewhere."""
    ids = prompt + response
    labels = np.full(len(ids), label_pad_id, dtype=np.int64)
    p = len(prompt)
    if shift:  # position t predicts token t+1
        for t in range(max(p - 1, 0), len(ids) - 1):
            labels[t] = ids[t + 1]
    else:      # the model shifts itself: position t carries token t
        # the first token is nobody's next token (no position before it): masked, so the two
        # layouts supervise the same tokens (a shifting objective on a left-padded row would
        # otherwise train the last padding position toward it)
        first = max(p, 1)
        labels[first:] = ids[first:]
    return labels


def frame(prompt: list[int], response: list[int], bos_id: int | None, eos_id: int | None
          ) -> tuple[list[int], list[int]]:
    """BOS before the prompt and EOS after the response, as the model was trained ([data] bos_id,
    eos_id); ids that already start with BOS (or end with EOS) are left as they are, so rows
    given as `*_ids` with the special tokens written in are not framed twice."""
    if bos_id is not None and (prompt + response)[:1] != [bos_id]:
        prompt = [bos_id] + prompt
    if eos_id is not None and response[-1:] != [eos_id]:
        response = response + [eos_id]
    return prompt, response


def bucket_length(n: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    for b in buckets:
        if n <= b:
            return b
    return n


# The cost of a bucket set, measured on the demo model (CPU, 2 shared cores): the first call of a
# graph (compile + one run) takes 1-2 s per (graph, shape) on an idle machine (18 s for the 11
# graphs of a demo run) and 6-7.5 s under load 5; under the same load a compiled per-sample
# objective batch [8, T] runs in 66 ms at T=128 and 179 ms at T=512: ~37 us per extra padded
# token. One compile thus buys ~150 000 padded tokens (the ratio is what matters, not the
# machine's speed). A bucket adds at least one graph (the per-sample objective at its length),
# so a few hundred short answers share one bucket, and long, varied data earns more.
COMPILE_SECONDS = 1.5
TOKEN_SECONDS = 1e-5


def choose_buckets(lengths, batch_size: int, cap: int | None = None,
                   compile_seconds: float = COMPILE_SECONDS, token_seconds: float = TOKEN_SECONDS,
                   ladder: tuple[int, ...] = BUCKETS) -> tuple[int, ...]:
    """The bucket set (a subset of the ladder) that minimizes the estimated
    buckets x compile_seconds + padded tokens x token_seconds for these row lengths, where a
    bucket's padded tokens are its batches (ceil(rows / batch_size), each batch_size rows) times
    its length. Candidates are ladder lengths (capped at `cap`, the model's longest input), so
    the shapes stay the ones every other check (stress, the compile cache) uses; the bucket
    holding the longest row is always in the set. Exhaustive over the few ladder lengths a
    data set spans (at most 2^9 subsets)."""
    lengths = [int(n) for n in lengths]
    if not lengths:
        return ()
    top = bucket_length(max(lengths), ladder)
    if cap and max(lengths) <= cap:  # never pad past the model's position table
        top = min(top, cap)
    lower = [b for b in ladder if min(lengths) <= b < top]  # each holds at least one row
    slots = lower + [top]
    rows_at = dict.fromkeys(slots, 0)  # rows per candidate: the smallest one that holds them
    for n in lengths:
        rows_at[next(b for b in slots if b >= n)] += 1
    best, best_cost = (top,), math.inf
    for mask in range(1 << len(lower)):
        chosen = [b for i, b in enumerate(lower) if mask >> i & 1] + [top]
        counts = dict.fromkeys(chosen, 0)
        for b, c in rows_at.items():  # a candidate left out sends its rows to the next one up
            counts[next(x for x in chosen if x >= b)] += c
        tokens = sum(-(-c // batch_size) * batch_size * b for b, c in counts.items() if c)
        used = sum(1 for c in counts.values() if c)
        cost = used * compile_seconds + tokens * token_seconds
        if cost < best_cost - 1e-12:
            best, best_cost = tuple(b for b in chosen if counts[b]), cost
    return best


def pack(samples: list[Sample], length: int, pad_id: int, label_pad_id: int, shift: bool
         ) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad samples to `length` -> (input_ids int32[B, T], labels int32[B, T])."""
    ids = np.full((len(samples), length), pad_id, dtype=np.int32)
    labels = np.full((len(samples), length), label_pad_id, dtype=np.int32)
    for i, s in enumerate(samples):
        seq = s.prompt + s.response
        if len(seq) > length:
            raise ValueError(f"sample {s.id} ({len(seq)} tokens) does not fit length {length}")
        ids[i, :len(seq)] = seq
        labels[i, :len(seq)] = build_labels(s.prompt, s.response, label_pad_id, shift)
    return ids, labels


def pack_for(cfg, samples: list[Sample], length: int, side: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`data.pack` on `[data] padding_side` (or `side`), with padding marks when the model takes a
    mask or positions. Left padding keeps each label on its token; the padding is label_pad_id."""
    d = cfg.data
    side = side or getattr(d, "padding_side", "right")
    ids, labels = pack(samples, length, d.pad_id, d.label_pad_id, d.shift)
    n = np.array([s.length for s in samples], np.int64)
    real = np.arange(length)[None, :] < n[:, None]
    if side == "left":  # move each row's tokens (and labels) to the end
        for i, k in enumerate(n):
            ids[i] = np.roll(ids[i], length - k)
            labels[i] = np.roll(labels[i], length - k)
            real[i] = np.roll(real[i], length - k)
    if marks_padding(cfg):
        ids = mark_padding(ids, real)
    return ids, labels


def padding_batch(cfg, shape: tuple[int, int]) -> np.ndarray:
    """A batch of padding only (pad_id, marked when the model takes a mask: mask all 0)."""
    ids = np.full(shape, cfg.data.pad_id, np.int32)
    return mark_padding(ids, np.zeros(shape, bool)) if marks_padding(cfg) else ids


# --------------------------------------------------------------------------- batches
@dataclass(frozen=True)
class Padding:
    """How a row is padded and labelled: read once from the target's config and held by the engine.

    Every packing of rows goes through `pack` (engine batches, the gradient batch, decompose,
    stress), so `[data] padding_side` and the padding marks of a model that takes a mask or
    positions (`model_inputs`) apply everywhere.
    """

    pad_id: int         # input id after the row's end
    label_pad_id: int   # label of every unscored position (prompt, last position, padding)
    shift: bool         # labels carry the next token (True) or the model shifts itself (False)
    config: Any = field(default=None, repr=False, compare=False)  # the target's Config

    @classmethod
    def of(cls, config: Any) -> Padding:
        data = config.data
        return cls(int(data.pad_id), int(data.label_pad_id), bool(data.shift), config)

    def pack(self, samples: list[Sample], length: int, side: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Rows padded to `length` on `[data] padding_side` (or `side`), marked for the model's mask."""
        from objdebug.engine.data import pack_for

        return pack_for(self.config, samples, length, side=side)

    def only(self, shape: tuple[int, int]) -> np.ndarray:
        """A batch of nothing but padding (marked, mask all 0, when the model takes a mask)."""
        from objdebug.engine.data import padding_batch

        return padding_batch(self.config, shape)


@dataclass
class Batch:
    """One packed batch: input_ids / labels int32[B, T] and the data rows in it.

    `samples` are the data rows (the first `len(samples)` rows of the arrays); `filled` rows after
    them are copies that keep the batch shape (and so the compiled graph); `index` is the position
    of each data row in the list the batch was cut from.
    """

    input_ids: np.ndarray
    labels: np.ndarray
    samples: list[Sample] = field(default_factory=list)
    filled: int = 0
    index: list[int] = field(default_factory=list)

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])


def filled_rows(rows: list[Sample], size: int) -> list[Sample]:
    """The one fill policy: a short batch is completed with its own rows, cycled, so it keeps the
    shape of a full batch. Per-sample results drop the filler; a batch total includes it."""
    return list(rows) + [rows[i % len(rows)] for i in range(size - len(rows))]


def group_by_length(lengths: list[int], bucket, size: int) -> list[tuple[int, list[int]]]:
    """(padded length, indices) per batch: rows grouped by `bucket(length)` (shortest bucket
    first, input order within a bucket) and cut into chunks of `size`."""
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(bucket(n), []).append(i)
    return [(length, idx[k:k + size]) for length, idx in sorted(groups.items())
            for k in range(0, len(idx), size)]
