"""Load the user's target: model factory + checkpoint + objective Cell, strictly.

`load_param_into_net` does not raise on missing or unexpected names (it returns them), and it
converts dtypes silently; a diagnostic tool must not test a half-loaded model, so every mismatch
is an InputError that lists the names.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from objdebug.core.config import Config
from objdebug.engine import model_inputs
from objdebug.engine import precision
from objdebug.core.errors import InputError
from objdebug.core.findings import listing
from objdebug.engine.exit_guard import user_exits
from objdebug.engine.third_party_logs import held_back

_MAX_LISTED = 12


def _package_root(top: str, base_dir: str, levels: int = 6) -> str:
    """The config's directory, or the nearest parent holding the package `top` (a config kept in
    `configs/` of a repository names `mypkg.models:build`, with `mypkg/` at the repository root)."""
    here = Path(base_dir).resolve()
    for folder in [here, *here.parents][:levels]:
        if (folder / top).is_dir() or (folder / f"{top}.py").is_file():
            return str(folder)
    return str(here)


def import_factory(spec: str, where: str, base_dir: str, key: str | None = None) -> Any:
    """'pkg.module:attr' -> the attribute; importable from the config's directory (or the parent
    that holds the package), then from installed packages. `key`: the config key messages name
    (default `<where>.factory`)."""
    key = key or f"{where}.factory"
    module_name, _, attr = spec.partition(":")
    root = _package_root(module_name.split(".")[0], base_dir)
    if root not in sys.path:
        sys.path.insert(0, root)
    with user_exits(f"For '{key}', importing '{module_name}'"), held_back():
        try:  # what the module prints, warns or logs at import is held back unless --debug
            module = importlib.import_module(module_name)
        except Exception as exc:  # ImportError, or an error raised while importing the user's module
            raise InputError(f"For '{key}', cannot import module '{module_name}': "
                             f"{type(exc).__name__}: {exc}") from None
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InputError(f"For '{key}', module '{module_name}' has no attribute "
                             f"'{attr}'.") from None
    if not callable(obj):
        raise InputError(f"For '{key}', '{spec}' must be callable, but got {type(obj).__name__}.")
    return obj


def _call_factory(spec: str, kwargs: dict, where: str, base_dir: str) -> Any:
    from mindspore import nn

    factory = import_factory(spec, where, base_dir)
    with user_exits(f"For '{where}.factory', '{spec}'"), held_back():  # sys.exit(0) is not a Cell
        try:
            cell = factory(**kwargs)
        except Exception as exc:
            raise InputError(f"For '{where}.factory', calling '{spec}' with kwargs {kwargs} "
                             f"failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(cell, nn.Cell):
        raise InputError(f"For '{where}.factory', '{spec}' must return a mindspore.nn.Cell, "
                         f"but got {type(cell).__name__}.")
    return cell


def load_checkpoint_strict(net: Any, path: str, where: str) -> int:
    """Load `path` into `net`; any missing/unexpected name, shape or dtype mismatch is an InputError."""
    import mindspore as ms

    p = Path(path)
    if not p.is_file():
        raise InputError(f"For '{where}.checkpoint', file not found", source=path)
    if p.stat().st_size == 0:
        raise InputError(f"For '{where}.checkpoint', the file is empty", source=path)
    fmt = "safetensors" if p.suffix == ".safetensors" else "ckpt"
    try:
        params = ms.load_checkpoint(str(p), format=fmt)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"For '{where}.checkpoint', cannot read the checkpoint "
                         f"(truncated or not a {fmt} file?): {first}", source=path) from None
    own = net.parameters_dict()
    missing = sorted(set(own) - set(params))
    unexpected = sorted(set(params) - set(own))
    problems = []
    if missing:
        problems.append(f"missing in checkpoint: {listing(missing, _MAX_LISTED)}")
    if unexpected:
        problems.append(f"unexpected in checkpoint: {listing(unexpected, _MAX_LISTED)}")
    mism = []
    for name in sorted(set(own) & set(params)):
        a, b = own[name], params[name]
        if tuple(a.shape) != tuple(b.shape):
            mism.append(f"{name} shape {tuple(b.shape)} != model {tuple(a.shape)}")
        elif a.dtype != b.dtype:
            mism.append(f"{name} dtype {b.dtype} != model {a.dtype}")
    if mism:
        problems.append(f"mismatched: {listing(mism, _MAX_LISTED)}")
    if problems:
        raise InputError(f"For '{where}.checkpoint', the checkpoint does not match the model: "
                         + "; ".join(problems), source=path)
    not_loaded, _ = ms.load_param_into_net(net, params, strict_load=True)
    if not_loaded:  # pragma: no cover - guarded by the name check above
        raise InputError(f"For '{where}.checkpoint', parameters not loaded: {listing(list(not_loaded), _MAX_LISTED)}",
                         source=path)
    return len(params)


@dataclass
class Target:
    """The loaded objective under test."""

    config: Config
    objective: Any
    model: Any = None
    checkpoint_params: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def end_to_end(self) -> bool:
        return self.model is None

    @property
    def network(self) -> Any:
        """The Cell that owns the trainable parameters."""
        return self.objective if self.model is None else self.model

    def trainable_params(self) -> list:
        params = list(self.network.trainable_params())
        if self.model is not None and self.objective is not None:  # an objective may carry parameters of its own
            seen = {id(p) for p in params}
            params += [p for p in self.objective.trainable_params() if id(p) not in seen]
        return params

    def describe(self) -> dict[str, Any]:
        params = self.trainable_params()
        return {
            "form": "end-to-end" if self.end_to_end else "model+objective",
            "model": None if self.model is None else
            self.info.get("classes", {}).get("model") or type(model_inputs.unwrap(self.model)).__name__,
            "objective": (self.info.get("classes", {}).get("objective") or type(self.objective).__name__
                          if self.objective is not None
                          else self.config.objective.factory.rpartition(":")[2]),
            "trainable_parameters": len(params),
            "trainable_elements": int(sum(int(p.size) for p in params)),
            "checkpoint_params": self.checkpoint_params,
            # one-line notes on how the model is called (a tuple's first element as the logits)
            **({"notes": list(self.info["notes"])} if self.info.get("notes") else {}),
        }


def load_target(cfg: Config) -> Target:
    base = cfg.base_dir
    model = None
    n_loaded = 0
    if cfg.model is not None:
        model = _call_factory(cfg.model.factory, cfg.model.kwargs, "model", base)
        if cfg.model.checkpoint:
            n_loaded = load_checkpoint_strict(model, cfg.model.checkpoint, "model")
        model.set_train(False)
        from objdebug.engine.cells import wrap  # MindSpore at import: only once a target loads

        model = wrap(model, cfg)  # [model] inputs / output: called through ModelCall
        if cfg.packing is not None:  # [packing] inputs go by name too: checked before any work
            from objdebug.engine.packed_call import check_names_of

            check_names_of(model, cfg)
    if cfg.objective.call in ("preference-pairs", "policy-model"):
        # its factory takes the policy (and the reference): the preference / policy stage builds it
        target = Target(config=cfg, objective=None, model=model, checkpoint_params=n_loaded)
        precision.apply(target)  # [run] amp_level: the model at the trained precision
        return target
    objective = _call_factory(cfg.objective.factory, cfg.objective.kwargs, "objective", base)
    if cfg.end_to_end and cfg.objective.checkpoint:
        n_loaded = load_checkpoint_strict(objective, cfg.objective.checkpoint, "objective")
    objective.set_train(False)
    info: dict[str, Any] = {}
    if cfg.end_to_end:  # a library model (labels by keyword, its own loss, its mode): held as it needs
        from objdebug.engine import library_model  # imports MindSpore: not at this module's import

        objective = library_model.wrap(objective, cfg, info)
    target = Target(config=cfg, objective=objective, model=model, checkpoint_params=n_loaded, info=info)
    precision.apply(target)  # [run] amp_level: model (and objective) at the trained precision
    return target


def float32_twin(target):
    """The same target at O0 with the same parameter values: built from the same factories, then
    every parameter copied by name (a target without a checkpoint is a seeded random init, and a
    second factory call draws other numbers)."""
    import mindspore as ms

    twin = load_target(precision.float32_config(target.config))
    for src, dst in ((target.model, twin.model), (target.objective, twin.objective)):
        if src is None or dst is None:
            continue
        have = src.parameters_dict()
        missing = [n for n in dst.parameters_dict() if n not in have]
        if missing:
            raise RuntimeError(f"the float32 twin has parameters the converted target lacks: {missing[:5]}")
        for name, param in dst.parameters_dict().items():
            param.set_data(ms.Tensor(have[name].asnumpy(), param.dtype))
    return twin
