"""Mixed precision as the model is trained: `[run] amp_level`, `amp_dtype`, `amp_objective`, `loss_scale`.

`apply(target)` converts the loaded Cells with `mindspore.amp.auto_mixed_precision(cell, amp_level,
dtype)`, the call a training script makes, so every stage runs the model at the trained precision:

- the model always (O2/O3 wrap it so its output is cast back to float32, as `Model(...,
  amp_level="O2")` hands the loss float32 logits);
- the objective too when `amp_objective = true` (the user converts a network-with-loss Cell: the
  objective's inputs arrive in float16 and it computes in float16), and in the end-to-end form,
  where the objective owns the network.

A level the device cannot run (MindSpore 2.10 on CPU: a Llama-style model with float32 RoPE tables
under O2 fails with "For primitive[MatMulExt], the input type must be same") is an InputError on a
one-row probe right after the conversion, so the user reads one line that names `run.amp_level`.

`first_nonfinite(fn, *args)` replays a computation in PyNative mode with a line tracer on the
user's own frames and names the first intermediate that is NaN/Inf (variable, dtype, file:line,
source). It localizes only: the verdicts come from the graph-mode runs.
"""

from __future__ import annotations

import inspect
import linecache
import sys
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from objdebug.core.errors import InputError

# attributes a wrapper copies from the Cell it wraps: what other modules read off the model
# (contract.max_positions reads the position-table size, the model's `config`)
_PLAIN = (int, float, str, bool)
_OURS = str(Path(__file__).resolve().parent.parent)
_MINDSPORE = ("site-packages/mindspore", "/mindspore/")


# OBJ206 (finite differences) at a low precision: float16 rounds the loss to ~1e-3 relative, more
# than any step's difference (measured on the demo at O2: max relative error 0.2 vs 0.01 at O0)
FD_SKIP = ("finite differences need float32: at run.amp_level's low precision the forward's rounding "
           "(~1e-3 relative) exceeds the differences of every step; OBJ515 compares the gradient at the "
           "trained precision with float32 instead (amp_level = \"O0\" runs this check)")


def enabled(cfg) -> bool:
    return cfg.run.amp_level != "O0"


def describe(cfg) -> dict[str, Any]:
    """What the report shows: level, dtype, what was converted, the loss scale."""
    r = cfg.run
    return {"amp_level": r.amp_level, "amp_dtype": r.amp_dtype if enabled(cfg) else "float32",
            "objective_converted": bool(enabled(cfg) and (r.amp_objective or cfg.end_to_end)),
            "loss_scale": r.loss_scale}


def label(cfg) -> str:
    """'O2 (float16)' / 'O0 (float32)'."""
    return f"{cfg.run.amp_level} ({cfg.run.amp_dtype if enabled(cfg) else 'float32'})"


def _first_line(exc: BaseException) -> str:
    for line in str(exc).strip().splitlines():
        line = line.strip(" -")
        if line and any(c.isalpha() for c in line):
            return line[:300]
    return type(exc).__name__


def convert(cell, cfg, what: str):
    """`auto_mixed_precision(cell, amp_level, dtype)`; an error names `run.amp_level`."""
    import mindspore as ms

    level = cfg.run.amp_level
    try:
        out = ms.amp.auto_mixed_precision(cell, level, getattr(ms, cfg.run.amp_dtype))
    except Exception as exc:
        raise InputError(f"For 'run.amp_level', mindspore.amp.auto_mixed_precision cannot convert the "
                         f"{what} to {label(cfg)}: {type(exc).__name__}: {_first_line(exc)}; use the "
                         f"level the model is trained at, or 'O0'", source=cfg.source) from None
    if out is not cell:  # O2/O3 wrap the Cell (_OutputTo32): keep what other modules read off it
        for name, value in vars(cell).items():
            if not name.startswith("_") and (isinstance(value, _PLAIN) or name == "config") \
                    and not hasattr(out, name):
                object.__setattr__(out, name, value)
    return out


def as_trained(cell, cfg, what: str, objective: bool = False):
    """A Cell built apart from the target (the preference stage's reference model, an invariance
    variant of the objective) converted as the target's own are; unchanged at O0."""
    if not enabled(cfg) or (objective and not (cfg.run.amp_objective or cfg.end_to_end)):
        return cell
    return convert(cell, cfg, what)


def apply(target) -> None:
    """Convert the target's Cells to the configured precision (nothing at O0) and check they run."""
    cfg = target.config
    target.info["precision"] = describe(cfg)
    if not enabled(cfg):
        return
    # MindSpore casts graph constants with numpy: a -1e9 attention mask in float16 prints a
    # RuntimeWarning per compile; under float16 that -inf is the expected value
    warnings.filterwarnings("ignore", message="overflow encountered in cast", category=RuntimeWarning)
    target.info["classes"] = {"model": type(target.model).__name__ if target.model is not None else None,
                              "objective": type(target.objective).__name__
                              if target.objective is not None else None}
    if target.model is not None:
        target.model = convert(target.model, cfg, "model")
    if target.objective is not None and (cfg.run.amp_objective or target.model is None):
        target.objective = convert(target.objective, cfg, "objective")
    _probe(target)


def _single_input(model) -> bool:
    """Whether the model's construct takes input_ids alone (other contracts: the contract probe
    reports a failure, without the precision named)."""
    cell = getattr(model, "_backbone", model)
    try:
        params = list(inspect.signature(cell.construct).parameters.values())
    except (TypeError, ValueError):
        return False
    required = [p for p in params if p.default is p.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(required) == 1


def _probe(target) -> None:
    """One [1, 8] row of token 0 through the converted model (and the objective, when converted):
    a precision MindSpore cannot run here is an InputError that names `run.amp_level`."""
    import mindspore as ms

    from objdebug.engine.compile_errors import ContractError, compile_error

    cfg = target.config
    ids = ms.Tensor(np.zeros((1, 8), np.int32))
    labels = ms.Tensor(np.zeros((1, 8), np.int32))
    what = "model"
    try:
        if target.model is None:
            what = "objective (end-to-end)"
            target.objective(ids, labels)
            return
        if not _single_input(target.model):
            return
        logits = target.model(ids)
        if cfg.run.amp_objective and target.objective is not None and cfg.objective.call in ("flat", "sequence"):
            what = "objective"
            from objdebug.engine.cells import call_on_logits

            call_on_logits(target.objective, cfg.objective.call == "flat", logits, labels)
    except Exception as exc:
        err = compile_error(exc, target)
        why = str(err) if err is not None else f"{type(exc).__name__}: {_first_line(exc)}"
        raise ContractError(f"{cfg.source}: For 'run.amp_level', the {what} does not run at "
                            f"{label(cfg)} on {cfg.run.device}: {why}; use the level the model is "
                            f"trained at, or 'O0'", detail=str(exc)) from None


def float32_config(cfg):
    """The same target at O0 and without a loss scale: the float32 reference of the stress checks."""
    return replace(cfg, run=replace(cfg.run, amp_level="O0", amp_objective=False, loss_scale=None))


# --------------------------------------------------------------------------- localization
def _user_frame(frame) -> bool:
    path = frame.f_code.co_filename
    if path.startswith("<") or any(m in path for m in _MINDSPORE):
        return False
    return not path.startswith(_OURS)  # objdebug's own wrapper Cells are not the user's code


def _nonfinite(value) -> dict[str, Any] | None:
    import mindspore as ms

    if not isinstance(value, ms.Tensor) or value.dtype not in (ms.float16, ms.float32, ms.float64,
                                                                ms.bfloat16):
        return None
    a = value.astype(ms.float32).asnumpy()
    bad = ~np.isfinite(a)
    if not bad.any():
        return None
    return {"dtype": str(value.dtype).lower(), "shape": list(a.shape), "nan": int(np.isnan(a).sum()),
            "inf": int(np.isinf(a).sum()), "size": int(a.size)}


def first_nonfinite(fn, *args) -> dict[str, Any] | None:
    """Replay `fn(*args)` in PyNative mode, tracing the user's frames line by line; the first local
    Tensor that holds NaN/Inf -> {name, dtype, file, line, source, function, nan, inf, size}.
    None when no user-visible intermediate is non-finite (or the replay does not reproduce it)."""
    import mindspore as ms

    found: list[dict[str, Any]] = []

    def tracer(frame, event, arg):
        if found or not _user_frame(frame):
            return None
        seen: dict[str, int] = {}
        last = [frame.f_lineno]

        def local(frame, event, arg):
            if found:
                return None
            for name, value in list(frame.f_locals.items()):
                if isinstance(value, ms.Tensor) and seen.get(name) != id(value):
                    seen[name] = id(value)
                    bad = _nonfinite(value)
                    if bad is not None and name != "self":
                        path = frame.f_code.co_filename
                        owner = frame.f_locals.get("self")
                        fname = (f"{type(owner).__name__}.{frame.f_code.co_name}" if owner is not None
                                 else frame.f_code.co_name)
                        found.append({"name": name, "file": path, "line": last[0], "function": fname,
                                      "source": linecache.getline(path, last[0]).strip(), **bad,
                                      "is_argument": name in frame.f_code.co_varnames[:frame.f_code.co_argcount]})
                        return None
            last[0] = frame.f_lineno
            return local
        return local

    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        fn(*args)
    except Exception:  # the replay is a diagnosis: if it fails, say nothing rather than guess
        pass
    finally:
        sys.settrace(old)
        ms.set_context(mode=mode)
    return found[0] if found else None


def where_text(hit: dict[str, Any] | None) -> str:
    """'`exp_logits` (float16, 12 inf of 1024) = ops.exp(x) at file.py:28 in Loss.construct'."""
    if hit is None:
        return "no intermediate of the user's code found non-finite in a PyNative replay"
    counts = ", ".join(f"{hit[k]} {k}" for k in ("inf", "nan") if hit[k])
    what = "argument" if hit.get("is_argument") else "intermediate"
    src = hit["source"] if hit["source"] and not hit.get("is_argument") else ""
    src = f" in `{src}`" if src else ""
    return (f"first non-finite {what} `{hit['name']}` ({hit['dtype']}, {counts} of {hit['size']}){src} "
            f"at {hit['file']}:{hit['line']} in {hit['function']}")
