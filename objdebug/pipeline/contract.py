"""The target contract, probed on one batch before the stages; graph-compile errors in one line.

Every stage assumes that the model returns logits float[B, T, V] and that the objective returns a
scalar loss, or a tuple (total, component, ...) whose components are named in
`objective.components`. A target that breaks this would make every check ERROR with MindSpore's
40-80 line messages; `probe()` runs the user's model and objective once in graph mode and raises
an InputError (exit 2) that says what the contract expects and what came back.

The probe adds no `model.forward` compile of its own: it runs at the shape of the first real
batch ([batch_size, length bucket of the first batch_size data rows], the gradient batch's shape,
`probe_length()`), so the graph it compiles is the one the stages call with real rows, and the
vocabulary it learns is the last dimension of those logits. A graph that MindSpore cannot compile is reported as one line that names the user's
file:line (`compile_error()`); MindSpore's full text is kept for --debug.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from objdebug.core.config import POLICY_CALLS, PREFERENCE_CALLS, REWARD_CALL
from objdebug.core.errors import InputError
from objdebug.engine.compile_errors import ContractError, compile_error, first_line as _first_line

# attributes that name the length of a model's position table (HF/GPT-2 style names)
_POSITION_ATTRS = ("max_position_embeddings", "n_positions", "max_positions", "max_seq_len",
                   "max_seq_length", "max_len", "seq_length")


# --------------------------------------------------------------------------- the probe
def _shape(x) -> str:
    return str(list(getattr(x, "shape", ())))


def _describe(out) -> str:
    import mindspore as ms

    if isinstance(out, ms.Tensor):
        return f"a tensor of shape {_shape(out)} ({out.dtype})"
    if isinstance(out, (tuple, list)):
        return f"a {type(out).__name__} of {len(out)}: ({', '.join(_describe(o) for o in out)})"
    if isinstance(out, dict):
        return f"a dict with keys {sorted(map(str, out))}"
    return f"a {type(out).__name__}"


def _check_logits(out, batch: int, length: int) -> None:
    import mindspore as ms

    expected = f"float logits [B, T, V] = [{batch}, {length}, V]"
    if not isinstance(out, ms.Tensor):
        raise InputError(f"For 'model.factory', the model must return {expected} for input_ids "
                         f"[{batch}, {length}], but got {_describe(out)}; set [model] output to "
                         f"the logits' tuple index or dict key.")
    shape = tuple(out.shape)
    if len(shape) != 3 or shape[:2] != (batch, length):
        raise InputError(f"For 'model.factory', the model must return {expected} for input_ids "
                         f"[{batch}, {length}], but got shape {list(shape)}.")
    if out.dtype not in (ms.float16, ms.float32, ms.float64, ms.bfloat16):
        raise InputError(f"For 'model.factory', the model must return {expected}, but got dtype "
                         f"{out.dtype}.")


def _check_rewards(out, batch: int, length: int) -> str:
    """A reward model's output: a reward per sequence [B] ("sequence") or per position [B, T] ("token")."""
    import mindspore as ms

    shape = tuple(out.shape) if isinstance(out, ms.Tensor) else None
    if shape not in ((batch,), (batch, length)) or out.dtype not in (ms.float16, ms.float32, ms.float64,
                                                                       ms.bfloat16):
        got = f"shape {list(shape)} {out.dtype}" if shape is not None else _describe(out)
        raise InputError(f"For 'model.factory', a reward model must return float rewards [B] = [{batch}] "
                         f"or [B, T] = [{batch}, {length}] for input_ids [{batch}, {length}], but got "
                         f"{got}; set [model] output to the rewards' tuple index or dict key.")
    return "sequence" if len(shape) == 1 else "token"


def _model_logits(target, engine, ids, info: dict[str, Any]):
    """The model's logits on the probe batch, through `[model] inputs` / `output`
    (objdebug/engine/model_inputs.py). The model's own result is inspected first, so a wrong
    `output` is one line; a tuple without `output` is scored by its first element, with a note."""
    import mindspore as ms

    from objdebug.engine import model_inputs as mi
    from objdebug.engine.cells import ModelCall, wrap

    cfg = target.config
    if mi.is_wrapped(target.model):
        raw_cell = ModelCall(mi.unwrap(target.model), mi.model_inputs(cfg), cfg.model.mask_dtype, mi.RAW)
        from objdebug.engine.pynative import pynative  # its structure only: no graph (a mapping
                                                        # output cannot enter the compile cache)
        with pynative():
            raw = raw_cell(ids)
    else:  # the default path: the graph every stage shares, as before
        raw = engine.forward(ids)
        if isinstance(raw, ms.Tensor):
            return raw
    _select_output(raw, cfg.model.output)  # InputError when `output` does not fit
    if cfg.model.output is None and isinstance(raw, (tuple, list)):
        info["model_output"] = (f"the model returns {_describe(raw)}; objdebug scores its first "
                                f"element as the logits (set [model] output = 0 to say so)")
        target.info.setdefault("notes", []).append(info["model_output"])
        if not mi.is_wrapped(target.model):  # from now on every Cell calls it through ModelCall
            target.model = wrap(target.model, cfg, output=mi.FIRST)  # engine.forward: a new graph on it
    return engine.forward(ids)


def _select_output(raw, output):
    """What `[model] output` picks from the model's result (default: the tensor, or a tuple's
    first element); InputError (exit 2) when it does not fit what the model returns."""
    import mindspore as ms

    got = _describe(raw)
    if output is None:
        if isinstance(raw, dict):
            raise InputError(f"For 'model.output', the model returns {got}: set [model] output to "
                             f"the key of the logits, e.g. output = \"logits\".")
        if isinstance(raw, (tuple, list)) and raw:
            return raw[0]
        return raw
    if isinstance(output, int):
        if not isinstance(raw, (tuple, list)):
            raise InputError(f"For 'model.output', a tuple index needs a model that returns a tuple, "
                             f"but the model returns {got}"
                             + ("; give the key instead." if isinstance(raw, dict) else
                                "; remove the key."))
        if output >= len(raw):
            raise InputError(f"For 'model.output', the index must be in [0, {len(raw)}) (the model "
                             f"returns {got}), but got {output}.")
        return raw[output]
    if isinstance(raw, dict):
        if output not in raw:
            raise InputError(f"For 'model.output', the key must be one of {sorted(map(str, raw))}, "
                             f"but got {output!r}.")
        return raw[output]
    if isinstance(raw, ms.Tensor) or isinstance(raw, (tuple, list)) or not hasattr(raw, output):
        hint = "; give the tuple index instead." if isinstance(raw, (tuple, list)) else "."
        raise InputError(f"For 'model.output', the model's result must have a key or attribute "
                         f"{output!r}, but it is {got}{hint}")
    return getattr(raw, output)


def _scalar(x) -> bool:
    import mindspore as ms

    return isinstance(x, ms.Tensor) and int(np.prod(x.shape)) == 1


def _check_objective(out, components: list[str], form: str) -> None:
    expected = ("a scalar loss, or a tuple (total, component, ...) with the components named in "
                "objective.components")
    if isinstance(out, (tuple, list)):
        if not out or not all(_scalar(o) for o in out):
            raise InputError(f"For 'objective.factory', the objective ({form}) must return "
                             f"{expected}, but got {_describe(out)}.")
        k = len(out) - 1
        if k != len(components):
            noun = "component" if k == 1 else "components"
            raise InputError(f"For 'objective.components', the objective returns a tuple of "
                             f"{len(out)} (total + {k} {noun}), so the config must name {k} "
                             f"{noun}, but got {len(components)}: {components}.")
        return
    if _scalar(out):
        return
    hint = " (reduction='none'? reduce to the mean over scored tokens)" \
        if hasattr(out, "shape") and len(out.shape) >= 1 else ""
    raise InputError(f"For 'objective.factory', the objective ({form}) must return {expected}, "
                     f"but got {_describe(out)}{hint}.")


def _planned_rows(target) -> tuple[list[int], list[int]]:
    """(lengths of every row the stages batch, lengths of the rows the first batch takes), read
    with the tokenizer alone (the model's vocabulary is what the probe is about to learn) and
    framed as the datasets frame them ([data] bos_id / eos_id; the corpus cut at text_max_tokens):
    the lengths `datasets.plan_buckets` plans from, in the order `datasets.text_samples` takes
    them (align 'good', scores 'response', then data.text)."""
    from objdebug.engine.data import Encoder, frame, make_tokenizer, read_jsonl
    from objdebug.pipeline.datasets import KINDS, _text_documents

    cfg = target.config
    d = cfg.data
    enc = Encoder(tokenizer=make_tokenizer(d.tokenizer, cfg.base_dir), vocab_size=1 << 62)

    def framed(prompt, response) -> int:
        p, r = frame(list(prompt), list(response), d.bos_id, d.eos_id)
        return len(p) + len(r)

    every, first = [], []
    if d.align:
        for lineno, row in read_jsonl(d.align, "align"):
            prompt = enc.field(row, "prompt", lineno, required=False) or []
            answers = {k: enc.field(row, k, lineno, required=(k == "good")) for k in KINDS}
            every += [framed(prompt, a) for a in answers.values() if a is not None]
            first.append(framed(prompt, answers["good"]))
    if d.scores:
        for lineno, row in read_jsonl(d.scores, "scores"):
            n = framed(enc.field(row, "prompt", lineno, required=False) or [],
                       enc.field(row, "response", lineno))
            every.append(n)
            first.append(n)
    if d.text:
        for lineno, row in _text_documents(d.text):
            n = framed([], enc.field(row, "text", lineno))
            pieces = [min(d.text_max_tokens, n - k) for k in range(0, n, d.text_max_tokens)]
            pieces = [p for p in pieces if p >= 2]
            every += pieces
            first += pieces
    return every, first


def probe_length(target, engine) -> int:
    """The probe's length: the bucket the first real batch (the gradient batch: the first
    batch_size rows) gets under the bucket plan of all rows (`datasets.plan_buckets`), so the
    stages reuse the probe's `model.forward` and per-sample graphs instead of compiling them
    again at another length.

    The smallest bucket when the data cannot tell (no rows, a row longer than the model takes, an
    unreadable file: the stages name those errors, file:line, after the probe)."""
    from objdebug.engine.data import choose_buckets

    try:
        every, first = _planned_rows(target)
    except Exception:  # the data's own errors are reported where the data is loaded
        every, first = [], []
    first = first[:engine.batch_size]
    if not first or (engine.max_length and max(every) > engine.max_length):
        return engine.bucket(1)
    longest = max(first)
    if getattr(engine, "static_rows", False):  # the fused static graphs' own lengths
        from objdebug.engine.row_scoring import plan as static_plan

        plan = static_plan(every, engine.batch_size, cap=engine.max_length)
    else:
        plan = choose_buckets(every, engine.batch_size, cap=engine.max_length)
    return next((b for b in plan if b >= longest), engine.bucket(longest))


def _per_sample_outputs(engine, logits, labels) -> tuple[int | None, str]:
    """The objective through the engine's per-sample graph on the probe logits: (its number of
    outputs (total + components), "") or (None, the error) when the graph fails; the probe then
    calls the objective on its own (`RawObjective`) for the message."""
    try:
        return int(engine.per_sample_of(logits, labels).shape[-1]), ""
    except Exception as exc:  # the objective's own result is inspected next, for a clear message
        return None, f"{type(exc).__name__}: {exc}"


def probe(target, engine, length: int | None = None, per_sample: bool = False) -> dict[str, Any]:
    """Run model and objective once on a [batch, length] batch (default: `probe_length`);
    InputError when the contract is broken.

    per_sample (split form): a stage will score rows one by one, so the objective is checked
    through that stage's `objective.per_sample` graph, called on the probe's logits at the
    first batch's shape, instead of a graph of the probe's own. It proves what the probe asks
    (scalar or (total, components...) with the components the config names); when it fails, or
    the count differs, the objective's raw result is inspected as without it, so the exit-2
    message is the same."""
    import mindspore as ms

    from objdebug.engine.cells import RawObjective

    cfg = target.config
    batch, length = engine.batch_size, length or probe_length(target, engine)
    ids = np.zeros((batch, length), np.int32)       # token 0: in every vocabulary
    labels = np.zeros((batch, length), np.int32)    # class 0 everywhere: valid, nothing masked
    info: dict[str, Any] = {"batch": batch, "length": length}
    try:
        if target.model is not None:
            logits = _model_logits(target, engine, ms.Tensor(ids, ms.int32), info)
            if cfg.objective.call == REWARD_CALL:  # a reward model: its loss is probed by its stage
                info["reward_output"] = _check_rewards(logits, batch, length)
                return info
            _check_logits(logits, batch, length)
            info["vocab"] = int(logits.shape[-1])
            info["logits_dtype"] = str(logits.dtype)
            if cfg.objective.call in PREFERENCE_CALLS + POLICY_CALLS:  # no loss(logits, labels): the
                return info          # preference / policy stage probes its own contract
            form = f"call = '{cfg.objective.call}'"
            k, per_sample_error = (_per_sample_outputs(engine, logits, ms.Tensor(labels, ms.int32))
                                   if per_sample else (None, ""))
            if k is not None and k == 1 + len(cfg.objective.components):
                info["outputs"] = k
                return info
            cell = RawObjective(target, on_logits=True)
            out = engine.call("contract.objective", cell, logits, ms.Tensor(labels, ms.int32))
        else:
            form = "end-to-end"
            cell = RawObjective(target, on_logits=False)
            out = engine.call("contract.objective", cell, ms.Tensor(ids, ms.int32),
                              ms.Tensor(labels, ms.int32))
    except InputError:
        raise
    except Exception as exc:  # a graph that does not compile, or an error raised at run time
        err = compile_error(exc, target)
        if err is not None:
            raise err from None
        raise ContractError(f"the target fails on a [{batch}, {length}] probe batch of token 0: "
                            f"{type(exc).__name__}: {_first_line(str(exc))} (run with --debug for "
                            f"the full message)", detail=str(exc)) from None
    _check_objective(out, list(cfg.objective.components), form)
    info["outputs"] = len(out) if isinstance(out, (tuple, list)) else 1
    if per_sample and target.model is not None:
        # the objective keeps the contract on a batch but its per-sample graph failed (or gave
        # another number of outputs): every stage that scores rows would fail the same way
        per_sample_error = per_sample_error or f"{k} outputs per row instead of {info['outputs']}"
        raise ContractError(f"the objective ({form}) returns {_describe(out)} on a [{batch}, {length}] "
                            f"probe batch, but fails when objdebug calls it on one row at a time, "
                            f"as the stages that score rows do: "
                            f"{_first_line(per_sample_error)} (run with --debug for the full "
                            f"message)", detail=per_sample_error)
    return info


def max_positions(target) -> int | None:
    """The longest input the model takes: data.max_length, else a position-table size the model
    names (max_position_embeddings, n_positions, ...; on the model or its `config`)."""
    return position_table(target)[0]


def position_table(target) -> tuple[int | None, str | None]:
    """(max_positions, where it was read: 'data.max_length', 'config.seq_length', ...)."""
    cfg = target.config.data
    if getattr(cfg, "max_length", None):
        return int(cfg.max_length), "data.max_length"
    from objdebug.engine.model_inputs import unwrap

    net = unwrap(target.network)  # the user's model, not objdebug's ModelCall around it
    if type(net).__name__ == "LibraryModelLoss":  # the library model as the end-to-end target
        net = net.model
    for prefix, holder in (("", net), ("config.", getattr(net, "config", None))):
        for attr in _POSITION_ATTRS:
            value = getattr(holder, attr, None) if holder is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value, f"{type(net).__name__}.{prefix}{attr}"
    return None, None


def check_target(target, engine, per_sample: bool = False) -> None:
    """probe() before the stages (`per_sample`: through the per-sample graph a stage will use);
    records what it saw and the model's longest input on the target."""
    limit, source = position_table(target)
    engine.max_length = limit  # first: the probe batch must fit the position table too
    info = probe(target, engine, per_sample=per_sample)
    if engine._vocab is None and "vocab" in info:
        engine._vocab, engine.vocab_source = info["vocab"], "the model's logits (contract probe)"
    info["max_length"] = limit
    if source:
        info["max_length_source"] = f"{source} = {limit}"
    target.info["contract"] = info


def planned_buckets(target, engine) -> tuple[int, ...]:
    """The lengths the stages' rows would be scored at through fused static graphs
    (`row_scoring.plan`, from the lengths `datasets.plan_buckets` plans), read before the probe;
    () when the data cannot tell."""
    from objdebug.engine.row_scoring import plan

    try:
        every, _ = _planned_rows(target)
    except Exception:  # the data's own errors are reported where the data is loaded
        return ()
    if not every:
        return ()
    return plan(every, engine.batch_size, cap=engine.max_length)
