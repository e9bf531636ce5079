"""`objdebug init`: write a commented objdebug.toml for a model factory and an objective factory.

It builds the user's Cells (and loads the checkpoint strictly), runs the contract probe
(objdebug/pipeline/contract.py) in graph mode, and fills in what it can measure or read: the vocabulary (the
logits' width), the longest input that runs, the calling form (flat, else sequence), the
objective's `ignore_index` as `label_pad_id`, the padding id the data most likely uses, whether the
model's construct takes a mask, and BOS/EOS from a tokenizer.json. Everything it could not decide
is printed, and assumed values are marked in the file. With `--batches SRC` it reads one batch of
the user's pipeline and writes the `[data]` keys that batch shows (`batches_keys`). It never
overwrites a config (exit 2).
"""

from __future__ import annotations

import inspect
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from objdebug.core import jsonsafe
from objdebug.core.errors import EXIT_CHECK_FAILED, EXIT_OK, InputError

PROBE_LENGTHS = (128, 512, 2048)   # input lengths tried when the model names no position table
_MASK_WORDS = ("mask",)


@dataclass
class Findings:
    """What init wrote: values with the comment that says where each came from."""

    values: dict[str, dict[str, tuple[Any, str]]] = field(default_factory=dict)
    undecided: list[str] = field(default_factory=list)
    comments: dict[str, list[str]] = field(default_factory=dict)  # section -> extra comment lines
    probe_error: str | None = None
    max_note: str = ""                 # what the length probe found, for the summary
    left_out: list[str] = field(default_factory=list)  # inputs construct takes that did not run
    detected_shift: str | None = None  # the objective's measured label pairing, for the summary

    def set(self, section: str, key: str, value: Any, why: str = "") -> None:
        self.values.setdefault(section, {})[key] = (value, why)

    def get(self, section: str, key: str, default: Any = None) -> Any:
        return self.values.get(section, {}).get(key, (default, ""))[0]


# --------------------------------------------------------------------------- small readers
def _inline_table(text: str) -> dict[str, Any]:
    """`--model-kwargs "{ vocab_size = 192 }"` (a TOML inline table) -> dict."""
    import tomllib

    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"For '--model-kwargs', the value must be a TOML inline table such as "
                         f"'{{ vocab_size = 256 }}', but got {text!r} ({exc}).") from None
    if not isinstance(value, dict):
        raise InputError(f"For '--model-kwargs', the value must be a TOML inline table, but got {text!r}.")
    return value


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }" if value else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def factory_defaults(factory) -> dict[str, Any]:
    """The factory's keyword defaults that TOML can write (None and objects left out)."""
    target = factory.__init__ if inspect.isclass(factory) else factory
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.default is not p.empty
            and isinstance(p.default, (bool, int, float, str)) and p.name != "self"}


def construct_inputs(model) -> list[str]:
    """The names of the model's construct arguments (the wrapped Cell's under amp)."""
    cell = getattr(model, "_backbone", model)
    try:
        params = inspect.signature(cell.construct).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _lines(path: Path):
    """(line number, text) of a `--data` file: a line that is not UTF-8 is exit 2 naming it."""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise InputError(f"For '--data', cannot read the file: {exc.strerror}", source=str(path)) from None
    with fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"For '--data', not UTF-8 text: byte 0x{raw[exc.start]:02x} at column "
                                 f"{exc.start + 1}; save the file as UTF-8", source=str(path),
                                 line=lineno) from None


def _rows(path: Path):
    """(line number, row object) of a JSONL `--data` file, through the one JSON reader
    (`jsonsafe.loads`: too deep a nesting is malformed JSON, exit 2, not a RecursionError)."""
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        try:
            row = jsonsafe.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"For '--data', the row is not JSON: {exc.msg}", source=str(path),
                             line=lineno) from None
        if not isinstance(row, dict):
            raise InputError(f"For '--data', each row must be a JSON object, but got "
                             f"{type(row).__name__}", source=str(path), line=lineno)
        yield lineno, row


def _is_jsonl(path: Path) -> bool:
    return path.suffix.lower() in (".jsonl", ".json", ".ndjson")


def data_kind(path: Path) -> str:
    """'align' / 'scores' / 'preference' / 'text' from the first row's fields."""
    if not _is_jsonl(path):
        return "text"
    for _, row in _rows(path):
        keys = set(row)
        if task_rows(path):  # a [task] kind's rows live under the causal LM's keys (issue 47)
            return "scores" if "score" in keys else "align"
        if keys & {"good", "good_ids"}:
            return "align"
        if keys & {"chosen", "chosen_ids"}:
            return "preference"
        if "score" in keys:
            return "scores"
        if keys & {"text", "text_ids"}:
            return "text"
        raise InputError(f"For '--data', cannot tell what the rows are (fields {sorted(keys)}); "
                         f"expected align (good/bad), scores (response/score), preference "
                         f"(chosen/rejected) or text rows", source=str(path))
    raise InputError("For '--data', the file has no rows", source=str(path))


def task_rows(path: Path) -> str | None:
    """The `[task] kind` whose rows the file holds (its first row's fields), or None (causal LM):
    a `label` is classification, `tags` tagging, an `anchor` embedding."""
    if not _is_jsonl(path):
        return None
    for _, row in _rows(path):
        keys = set(row)
        if "label" in keys and keys & {"text", "ids", "text_ids"}:
            return "classification"
        if "tags" in keys:
            return "tagging"
        if keys & {"anchor", "anchor_ids"}:
            return "embedding"
        return None
    return None


def _task_labels(paths, kind: str) -> list[str]:
    """The class / tag names the rows use, in order of first appearance (names only)."""
    names: list[str] = []
    for p in paths:
        for _, row in _rows(p):
            for v in ([row.get("label")] if kind == "classification" else row.get("tags") or []):
                if isinstance(v, str) and v not in names:
                    names.append(v)
    return names


def _probe_task(cfg, target, found: Findings, kind: str, paths, tokenizer=None) -> str | None:
    """The task kind's contract probe (pipeline/task_kind.py); writes [task] kind and labels
    (the rows' names, as many as the model has classes); the probe's error or None."""
    from objdebug.engine.core import Engine
    from objdebug.pipeline import task_kind

    cfg.task.kind = kind
    found.set("task", "kind", kind, "detected from the rows' fields and the model's output shape")
    try:
        info = task_kind.check_target(target, Engine(target, batch_size=2))
    except InputError as exc:
        return str(exc)
    if kind != "embedding":
        names = _task_labels(paths, kind)
        c = info["classes"]
        if names:
            labels = names + [f"class_{k}" for k in range(len(names), c)]
            ordered = _labels_in_model_order(cfg, target, labels[:c], paths, tokenizer)
            if ordered is not None:
                found.set("task", "labels", ordered[0], ordered[1])
            else:
                found.set("task", "labels", labels[:c], f"the rows' names in order of first appearance; "
                                                        f"the model has {c} classes")
                found.undecided.append("task.labels: the names' index order is the order the rows use "
                                       "them first; put them in the model's class order")
    return None


def _labels_in_model_order(cfg, target, names: list[str], paths, tokenizer) -> tuple[list[str], str] | None:
    """The class names in the model's index order, read off its predictions on the rows: the
    assignment of names to output indices that agrees with the most rows' (tokens') labels
    (scipy's linear_sum_assignment on the confusion counts). None when the model agrees with no
    order better than chance (an untrained head: the order is then the user's to give)."""
    import copy

    import numpy as np

    from scipy.optimize import linear_sum_assignment

    from objdebug.engine import tasks
    from objdebug.engine.core import Engine

    c = len(names)
    counts = np.zeros((c, c))
    probe = copy.deepcopy(cfg)
    probe.task.labels = names
    probe.data.tokenizer = tokenizer or "bytes"
    engine = Engine(target, batch_size=1)
    try:
        for p in paths:
            probe.data.align = str(p)
            for row in tasks.read_rows(probe, "align")[:64]:
                out = tasks.forward(engine, np.asarray([row.ids], np.int32)).asnumpy()[0]
                target_ = np.atleast_1d(np.asarray(row.target))
                pred = np.atleast_1d(out.argmax(-1))
                for t, q in zip(target_, pred):
                    if 0 <= t < c:
                        counts[t, q] += 1
    except Exception:  # noqa: BLE001 - rows the kind cannot read: their error is the run's to say
        return None
    total = counts.sum()
    rows, cols = linear_sum_assignment(-counts)
    agree = counts[rows, cols].sum() / max(total, 1)
    if total == 0 or agree <= 1.5 / c:
        return None
    order = [""] * c
    for r, q in zip(rows, cols):
        order[q] = names[r]
    return order, (f"the model's class order, read off its predictions: {agree:.0%} of "
                   f"{int(total)} labels agree")


def _task_rows_for_every_stage(found: Findings, kinds: dict[str, Path], out: Path) -> None:
    """A task kind's stages draw on two files: `align` (align, grad, stress, decompose) and
    `scores` (correlate). Rows with a `score` serve as both (the kind's rows carry their label
    either way); a missing one is said, with the stage that cannot run without it."""
    if "scores" in kinds and "align" not in kinds:
        found.set("data", "align", _rel(kinds["scores"], out.parent),
                  "the scores rows, also the rows align, grad and stress draw on (no other rows given)")
    elif "align" in kinds and "scores" not in kinds:
        found.undecided.append("data.scores: no rows with a human 'score' given: correlate "
                               "(OBJ401-OBJ404) skips; pass --data with {..., \"score\"} rows")


def _data_ids(paths: dict[str, Path], tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    """(token lists of text fields encoded with the tokenizer, lists given as *_ids)."""
    texts, given = [], []
    for kind, path in paths.items():
        if kind == "text" and not _is_jsonl(path):
            texts += [tokenizer.encode(line.rstrip("\r\n")) for _, line in _lines(path) if line.strip()]
            continue
        for _, row in _rows(path):
            for key, value in row.items():
                if key.endswith("_ids") and isinstance(value, list):
                    given.append([int(v) for v in value if isinstance(v, int)])
                elif isinstance(value, str) and key in ("prompt", "good", "medium", "bad", "response",
                                                        "chosen", "rejected", "text", "anchor",
                                                        "positive", "negative"):
                    texts.append(tokenizer.encode(value))
                elif key == "tokens" and isinstance(value, list):  # a tagging row's words
                    texts.append(tokenizer.encode(" ".join(str(v) for v in value)))
    return texts, given


def padding_id(found: Findings, specials: dict[str, int], texts, given, vocab: int | None) -> None:
    """The padding id the data most likely uses: the tokenizer's <pad>; else the id that ends
    `*_ids` rows in runs; else the smallest id that never occurs in the data (0 for text)."""
    if "pad" in specials:
        found.set("data", "pad_id", specials["pad"], "the tokenizer's pad token")
        return
    tails = Counter(ids[-1] for ids in given if len(ids) >= 2 and ids[-1] == ids[-2])
    if tails:
        pad, n = tails.most_common(1)[0]
        found.set("data", "pad_id", pad, f"ends {n} of the data's *_ids rows in a run")
        return
    used = {i for ids in texts + given for i in ids}
    pad = next(i for i in range(max(used | {0}) + 2) if i not in used)
    why = ("never occurs in the data's tokens" if used else "assumed: no data given")
    found.set("data", "pad_id", pad, why)
    if not used:
        found.undecided.append(f"data.pad_id: no data to read; {pad} assumed (pass --data FILE)")
    if vocab is not None and pad >= vocab:
        found.undecided.append("data.pad_id: every id below the vocabulary occurs in the data; "
                               "set the padding id your pipeline uses")


# --------------------------------------------------------------------------- probes
def _probe_contract(cfg, target) -> tuple[dict[str, Any] | None, str | None]:
    """contract.check_target with call = flat, then sequence -> (info, error of the last try)."""
    from objdebug.pipeline import contract
    from objdebug.engine.core import Engine

    error = None
    for call in ("flat", "sequence"):
        cfg.objective.call = call
        engine = Engine(target, batch_size=2)
        try:
            contract.check_target(target, engine)
            return {**target.info["contract"], "call": call, "engine": engine}, None
        except InputError as exc:
            error = str(exc)
    cfg.objective.call = "flat"
    return None, error


def _longest_input(target, engine, found: Findings, max_length: int) -> None:
    """The longest input that runs: the model's position table when it names one (checked), else
    forward passes at PROBE_LENGTHS up to `max_length`, batch 1, stopping at the first failure."""
    import numpy as np

    from objdebug.pipeline.contract import max_positions

    named = max_positions(target)
    lengths = [named] if named else [n for n in PROBE_LENGTHS if n <= max_length]
    ran = None
    for n in lengths:
        try:
            engine.logits(np.zeros((1, n), np.int32))
            ran = n
        except Exception as exc:  # the model refuses this length: the one before is the limit
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
            if named:
                found.undecided.append(f"data.max_length: the model names {named} positions but fails "
                                       f"there ({first}); set the longest input it takes")
            elif ran:
                found.set("data", "max_length", ran, f"runs at {ran} tokens, fails at {n}")
                found.max_note = f"{ran} (fails at {n})"
            else:
                found.undecided.append(f"data.max_length: fails already at {n} tokens ({first})")
            return
    if named:
        found.max_note = f"{named} (the model's position table; runs)"
        found.comments.setdefault("data", []).append(
            f"max_length = {named}   # the model's position table (read from the model; runs)")
    else:
        found.max_note = f"not set: the model ran at every length tried, up to {ran} tokens"
        found.comments.setdefault("data", []).append(
            f"max_length: not set - the model ran at {ran} tokens, the longest tried "
            f"(--max-probe-length); set it if longer inputs cannot run")


# --------------------------------------------------------------------------- writing
_HEADER = """\
# objdebug.toml written by `objdebug init`. Values marked "assumed" were not measured: check them.
# Every key is documented in docs/config.md; `objdebug run` validates this file (exit 2 on a typo).
"""


def render(found: Findings) -> str:
    order = {"task": ["kind", "labels"], "model": ["factory", "kwargs", "checkpoint", "inputs", "output"],
             "objective": ["factory", "kwargs", "call"],
             "data": ["tokenizer", "bos_id", "eos_id", "pad_id", "label_pad_id", "shift", "vocab_size",
                      "max_length", "align", "scores", "preference", "text"],
             "chat": ["template", "markers", "end_of_turn"],
             "run": ["device", "mode", "seed"]}
    out = [_HEADER]
    for section, keys in order.items():
        values = found.values.get(section, {})
        if not values and not found.comments.get(section):
            continue
        out.append(f"[{section}]")
        for key in keys + sorted(set(values) - set(keys)):
            if key in values:
                value, why = values[key]
                out.append(f"{key} = {_toml(value)}" + (f"   # {why}" if why else ""))
        out += [f"# {line}" for line in found.comments.get(section, [])]
        out.append("")
    return "\n".join(out)


def _rel(path: Path, base: Path) -> str:
    """Relative to the config's folder (how config paths are read), unless that climbs out of
    the tree by more than one level: then absolute."""
    rel = os.path.relpath(path.resolve(), base)
    return str(path.resolve()) if rel.startswith(os.path.join("..", "..")) else rel


# --------------------------------------------------------------------------- the command
def batches_keys(found: Findings, source: str, base: Path, out_dir: Path) -> None:
    """`--batches SRC`: one batch of the user's pipeline read (as the batches stage reads it),
    and the `[data]` keys it shows written over the guesses: `batches`, `pad_id`,
    `padding_side`, `label_pad_id` (the label on padding) and `shift` (the labels' layout)."""
    from objdebug.core.config import DataSpec, batches_file
    from objdebug.pipeline.batches_source import read_batches
    from objdebug.pipeline.pipeline_batches import find_padding
    from objdebug.stages.batches.layout import PRE_SHIFTED, UNSHIFTED, label_layout, layout_of

    written = _rel(Path(source).resolve(), out_dir) if batches_file(source) else source
    got = read_batches(DataSpec(batches=str(Path(source).resolve()) if batches_file(source)
                                else source, max_batches=1), str(base), str(base))
    batch, why = got.batches[0], f"read from one batch of '{got.source}'"
    found.set("data", "batches", written, f"the pipeline's own batches ({batch.input_ids.shape[0]} "
                                           f"x {batch.input_ids.shape[1]}, columns "
                                           f"{', '.join(batch.columns)})")
    padding, pad, side = find_padding(batch, int(found.get("data", "pad_id", 0)), None)
    if pad is not None:
        found.set("data", "pad_id", pad, why)
        found.set("data", "padding_side", side, why)
    if batch.labels is None:
        found.undecided.append("data.label_pad_id / shift: the batch has no labels column (the "
                               "model or objective derives them)")
        return
    on_pad = Counter(batch.labels[padding].tolist()).most_common(1)
    if on_pad:
        ignore = found.get("objective", "kwargs", {}).get("ignore_index")
        found.set("data", "label_pad_id", int(on_pad[0][0]), why)
        if ignore is not None and ignore != on_pad[0][0]:
            found.undecided.append(f"data.label_pad_id: the batch puts {on_pad[0][0]} on padding but "
                                   f"the objective ignores {ignore}: the batches stage (OBJ010) "
                                   f"will say whether it trains on padding")
    layout, _, _ = label_layout([layout_of(batch, pad if pad is not None else 0, None)], 0.9)
    if layout in (PRE_SHIFTED, UNSHIFTED):
        found.set("data", "shift", layout == PRE_SHIFTED, f"{why}: its labels are {layout}")
        found.detected_shift = f"{str(layout == PRE_SHIFTED).lower()} ({why}: its labels are {layout})"
        found.undecided = [u for u in found.undecided if not u.startswith("data.shift")]


def chat_keys(found: Findings, source: str, base: Path, out_dir: Path, tokenizer: str | None) -> None:
    """`--batches SRC`: a `[chat]` section proposed when the batch looks like conversations (a
    tokenizer_config.json with a chat_template beside the tokenizer, or recurring header and
    stop sequences around the trained spans: pipeline/chat_template.propose)."""
    from objdebug.core.config import DataSpec, batches_file
    from objdebug.pipeline.batches_source import read_batches
    from objdebug.pipeline.chat_template import propose

    got = read_batches(DataSpec(batches=str(Path(source).resolve()) if batches_file(source)
                                else source, max_batches=1), str(base), str(base))
    tok = str((base / tokenizer).resolve()) if tokenizer and tokenizer != "bytes" else None
    chat = propose(got.batches[0], int(found.get("data", "label_pad_id", -100)), tok)
    if chat is None:
        return
    why = chat.pop("why")
    for key, value in chat.items():
        found.set("chat", key, _rel(Path(value), out_dir) if key == "template" else value, why)


def init_config(model: str, objective: str, checkpoint: str | None = None, data: list[str] | None = None,
                tokenizer: str | None = None, output: str = "objdebug.toml", device: str = "CPU",
                max_probe_length: int = 2048, model_kwargs: str | None = None,
                batches: str | None = None, echo=print) -> int:
    """Write `output`; returns the exit code (0 written and probed, 1 written but the probe failed)."""
    from objdebug.core.config import (INPUTS, Config, DataSpec, ModelSpec, ObjectiveSpec, RunSpec,
        load_config)
    from objdebug.engine import runtime
    from objdebug.engine.data import make_tokenizer
    from objdebug.engine.target import import_factory, load_target

    pairing = None  # the objective's measured label pairing (split form, once the probe ran)
    if isinstance(max_probe_length, bool) or not isinstance(max_probe_length, int) \
            or max_probe_length < 1:
        raise InputError(f"For '--max-probe-length', the value must be an integer >= 1, but got "
                         f"{max_probe_length!r}.")
    out = Path(output).resolve()
    if out.exists():
        raise InputError(f"For '--output', '{output}' already exists; objdebug init never overwrites "
                         f"a config: remove it or pass --output OTHER.toml")
    if not out.parent.is_dir():
        raise InputError(f"For '--output', the folder '{out.parent}' does not exist")
    for flag, spec in (("--model", model), ("--objective", objective)):
        if ":" not in spec:
            raise InputError(f"For '{flag}', the value must be 'module:callable', but got '{spec}'.")
    base = Path.cwd()
    files = [Path(p).resolve() for p in (data or [])]
    for p in files + ([Path(checkpoint)] if checkpoint else []):
        if not Path(p).is_file():
            raise InputError("file not found", source=str(p))
    kinds: dict[str, Path] = {}
    for p in files:
        kind = data_kind(p)
        if kind in kinds:
            raise InputError(f"For '--data', two {kind} files: {kinds[kind]} and {p}; pass one of each kind")
        kinds[kind] = p
    tok = make_tokenizer(tokenizer or "bytes", str(base))

    found = Findings()
    given = _inline_table(model_kwargs) if model_kwargs else {}
    if checkpoint:
        checkpoint = str(Path(checkpoint).resolve())  # before the scratch directory below
        found.set("model", "checkpoint", _rel(Path(checkpoint), out.parent), "loaded strictly: every name and shape matches")
    found.set("model", "factory", model)
    found.set("objective", "factory", objective)
    runtime.setup(device, "graph", 0)
    # the factories are imported in the scratch directory too, as the stage commands load the
    # target: a library that writes at import (MindFormers' ./output/log/) leaves nothing here
    with runtime.scratch_dir():
        model_kwargs = {**factory_defaults(import_factory(model, "model", str(base))), **given}
        objective_defaults = factory_defaults(import_factory(objective, "objective", str(base)))
        found.set("model", "kwargs", model_kwargs, "--model-kwargs over the factory's defaults"
                  if given else "the factory's defaults: the architecture of the checkpoint")
        cfg = Config(objective=ObjectiveSpec(factory=objective), model=ModelSpec(
            factory=model, kwargs=model_kwargs, checkpoint=checkpoint),
            data=DataSpec(), run=RunSpec(device=device), source=str(out), base_dir=str(base))
        target = load_target(cfg)  # InputError (exit 2): import, factory or checkpoint problems
        from objdebug import init_model_io
        from objdebug.engine import model_inputs

        # the user's model, not objdebug's wrapper: its construct and what it returns
        io = init_model_io.read(model_inputs.unwrap(target.model))
        left_out: list[str] = []
        if io["inputs"]:  # only the inputs that run are written (each probed, see init_model_io)
            kept, left_out = init_model_io.runnable(model_inputs.unwrap(target.model), io["inputs"],
                                                    io["output"])
            io["inputs"] = kept if len(kept) > 1 else None
        cfg.model.inputs, cfg.model.output = io["inputs"], io["output"]
        from objdebug.engine.cells import wrap

        target.model = wrap(model_inputs.unwrap(target.model), cfg)
        task = next((k for k in map(task_rows, files) if k), None)
        info, error = (None, _probe_task(cfg, target, found, task, files, tokenizer)) if task else \
            _probe_contract(cfg, target)
        if info is None and not task and error and "[B, T, V]" in error:  # a classifier's [B, C]
            task, error = "classification", _probe_task(cfg, target, found, "classification", files, tokenizer)
        ignore = getattr(target.objective, "ignore_index", objective_defaults.get("ignore_index"))
        kwargs = {"ignore_index": ignore} if isinstance(ignore, int) and not isinstance(ignore, bool) else {}
        found.set("objective", "kwargs", kwargs, "" if kwargs else "assumed: no ignore_index found")
        if task:  # the causal LM's calling form, length and label pairing do not apply
            found.probe_error = error
            found.values.get("objective", {}).pop("call", None)
            vocab = None
        elif info is None:
            found.probe_error = error
            found.set("objective", "call", "flat", "assumed: the contract probe failed")
            vocab = None
        else:
            found.set("objective", "call", info["call"], "the contract probe ran this calling form")
            vocab = info.get("vocab")
            _longest_input(target, info["engine"], found, max_probe_length)
            if not target.end_to_end:  # which label the objective scores each position against
                from objdebug.engine import label_pairing

                pairing = label_pairing.measure(info["engine"])
        inputs = io["parameters"] or construct_inputs(model_inputs.unwrap(target.model))

    if tokenizer:
        found.set("data", "tokenizer", _rel(Path(tokenizer), out.parent) if tokenizer != "bytes" else "bytes")
    else:
        found.set("data", "tokenizer", "bytes", "assumed: UTF-8 bytes (pass --tokenizer tokenizer.json)")
    specials = tok.special_ids() if hasattr(tok, "special_ids") else {}
    for key in ("bos", "eos"):
        if key in specials:
            found.set("data", f"{key}_id", specials[key], "from the tokenizer; delete if the model was "
                                                          "trained without it")
    if tokenizer and tokenizer != "bytes" and "bos" not in specials:
        found.undecided.append("data.bos_id / eos_id: the tokenizer names none; set them if the model "
                               "was trained with them")
    texts, given = _data_ids(kinds, tok)
    padding_id(found, specials, texts, given, vocab)
    from objdebug.engine import kinds as task_kinds

    kind_spec = task_kinds.of(task or "causal-lm")
    if kwargs:
        found.set("data", "label_pad_id", kwargs["ignore_index"], "the objective's ignore_index")
    elif kind_spec.ignored != task_kinds.ALWAYS:
        pass  # a classifier's rows are never ignored, an embedding row has no label: nothing to ask
    else:
        found.set("data", "label_pad_id", -100, "assumed: the objective has no ignore_index attribute")
        found.undecided.append("data.label_pad_id: the objective has no `ignore_index`; -100 assumed: "
                               "set the label your data pipeline writes on prompt and padding")
    if pairing is not None and pairing.measured and pairing.standard:
        # the layout under which this objective learns the next token (engine/label_pairing.py);
        # a pipeline that writes the other layout is then OBJ701's (or the batches stage's) finding
        layout = ("the labels must be the next tokens" if pairing.offset == 0 else
                  "the labels are the input ids, the objective shifts them itself")
        found.set("data", "shift", pairing.offset == 0,
                  f"measured: the objective scores {pairing.describe()}: {layout}")
        found.detected_shift = f"{str(pairing.offset == 0).lower()} (the objective scores {pairing.describe()})"
    elif not task:
        found.set("data", "shift", True, "assumed: labels are the next token (false if the model shifts itself)")
        found.undecided.append("data.shift: true assumed (position t predicts token t+1); false if the "
                               "model shifts the labels itself")
    if vocab is not None:
        found.set("data", "vocab_size", vocab, "the model's logits width (contract probe)")
        if tok.vocab_size > vocab:
            found.undecided.append(f"data.tokenizer: {tok.vocab_size} tokens but the model has {vocab}: "
                                   f"not the model's tokenizer?")
    for kind, path in kinds.items():
        found.set("data", kind, _rel(path, out.parent))
    if task:
        _task_rows_for_every_stage(found, kinds, out)
    if not kinds:
        found.undecided.append("data.align / scores / text: no --data file; add at least one")
    masks = [n for n in inputs[1:] if any(w in n for w in _MASK_WORDS)]
    if io["inputs"]:  # what objdebug can build, bound by name
        found.set("model", "inputs", io["inputs"], f"construct takes {len(inputs)} parameters; these "
                                                   f"are the ones objdebug builds (bound by name)")
    if left_out:  # written as comments (and printed): what init left out and why
        found.left_out = left_out
        found.comments.setdefault("model", []).extend(f"inputs: {line}" for line in left_out)
    elif io["inputs"]:
        pass
    elif masks:
        found.undecided.append(f"model inputs: the model's construct takes {inputs}; objdebug builds "
                               f"only {list(INPUTS)}")
    elif len(inputs) > 1:
        found.comments.setdefault("model", []).append(
            f"construct takes {inputs}: no mask argument; objdebug passes input_ids only")
    if io["output"] is not None:
        found.set("model", "output", io["output"], f"the logits of what construct returns: {io['described']}")
    if io["labels"]:
        found.comments.setdefault("model", []).extend(init_model_io.end_to_end_offer(
            model, found.get("model", "checkpoint")))
    if batches is not None:
        batches_keys(found, batches, base, out.parent)
        chat_keys(found, batches, base, out.parent, tokenizer)
    found.set("run", "device", device)
    found.set("run", "mode", "graph")
    found.set("run", "seed", 0)

    create_exclusively(out, render(found), output)
    load_config(out)  # what init writes must load: a failure here is objdebug's bug
    _report(found, out, masks, inputs, echo)
    return EXIT_OK if found.probe_error is None else EXIT_CHECK_FAILED


def create_exclusively(out: Path, text: str, output: str) -> None:
    """Write the new config where no file is: the check before the probe is not enough (a file
    created while init ran was overwritten). The whole text goes to a temporary beside it, which
    is then hard-linked into place: the link fails if `out` exists by then, and a reader never sees
    half a config. A filesystem without hard links gets an O_EXCL create instead."""
    import tempfile

    taken = InputError(f"For '--output', '{output}' was created while objdebug init ran; it never "
                       f"overwrites a config: remove it or pass --output OTHER.toml")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    except OSError as exc:
        raise InputError(f"For '--output', cannot write '{output}': {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; a config is an ordinary file
        try:
            os.link(tmp, out)
        except FileExistsError:
            raise taken from None
        except OSError:  # no hard links here (some network and FAT filesystems)
            try:
                fh = open(out, "x", encoding="utf-8")
            except FileExistsError:
                raise taken from None
            try:
                with fh:
                    fh.write(text)
            except OSError:
                os.unlink(out)  # ours, and half written
                raise
    except InputError:
        raise
    except OSError as exc:
        raise InputError(f"For '--output', cannot write '{output}': {exc.strerror or exc}; no file "
                         f"was left there") from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _report(found: Findings, out: Path, masks: list[str], inputs: list[str], echo) -> None:
    echo(f"wrote {out}")
    detected = [("vocabulary", found.get("data", "vocab_size")),
                ("calling form", found.get("objective", "call")),
                ("label_pad_id (objective's ignore_index)", found.get("objective", "kwargs", {}).get("ignore_index")),
                ("pad_id", f"{found.get('data', 'pad_id')} ({found.values['data']['pad_id'][1]})"),
                ("max_length", found.max_note or None),
                ("takes a mask", f"yes ({', '.join(masks)})" if masks else f"no (construct takes {inputs})"),
                ("bos_id / eos_id", f"{found.get('data', 'bos_id')} / {found.get('data', 'eos_id')}"
                 if found.get("data", "bos_id") is not None or found.get("data", "eos_id") is not None
                 else "none (the tokenizer names none)"),
                ("shift", found.detected_shift)]
    for name, value in detected:
        if value is not None:
            echo(f"  detected {name}: {value}")
    for line in found.left_out:
        echo(f"  input {line}")
    if found.probe_error:
        echo(f"  contract probe FAILED: {found.probe_error}")
    for line in found.undecided:
        echo(f"  not decided: {line}")
