"""The target contract: `objdebug.toml` (or `[tool.objdebug]` in pyproject.toml) -> Config.

Every key can be overridden from the CLI with a dotted path (`data.label_pad_id=0`). Paths in the
file are relative to the file's directory and resolved to absolute paths here, because the
engine runs MindSpore in a scratch working directory.
"""

from __future__ import annotations

import copy
import os
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from objdebug.errors import InputError

CONFIG_NAMES = ("objdebug.toml", "pyproject.toml")
DEMO_CONFIG = Path(__file__).parent / "demo" / "objdebug.toml"

DEVICES = ("CPU", "GPU", "Ascend")
MODES = ("graph", "pynative")
CALLS = ("flat", "sequence")


@dataclass
class ModelSpec:
    factory: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None


@dataclass
class ObjectiveSpec:
    factory: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    call: str = "flat"
    components: list[str] = field(default_factory=list)
    primary: str | None = None     # the task component (OBJ305); default: the first of components
    checkpoint: str | None = None  # end-to-end form: the objective owns the network


@dataclass
class DataSpec:
    tokenizer: str = "bytes"
    pad_id: int = 0
    label_pad_id: int = -100
    shift: bool = True
    vocab_size: int | None = None
    align: str | None = None
    scores: str | None = None


@dataclass
class RunSpec:
    device: str = "CPU"
    mode: str = "graph"
    seed: int = 0
    profile: str = "default"
    stages: list[str] | None = None
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    compile_cache: str | None = None  # opt-in MindSpore compile cache directory (--compile-cache)


@dataclass
class Config:
    objective: ObjectiveSpec
    model: ModelSpec | None = None
    data: DataSpec = field(default_factory=DataSpec)
    run: RunSpec = field(default_factory=RunSpec)
    source: str = "<memory>"
    base_dir: str = "."

    @property
    def end_to_end(self) -> bool:
        """True when the objective owns its network: construct(input_ids, labels) -> loss."""
        return self.model is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_SECTIONS = {"model": ModelSpec, "objective": ObjectiveSpec, "data": DataSpec, "run": RunSpec}
_PATH_KEYS = {("model", "checkpoint"), ("objective", "checkpoint"), ("data", "align"), ("data", "scores"),
              ("run", "compile_cache")}


def find_config(start: Path | None = None) -> Path | None:
    """The first objdebug.toml, or pyproject.toml with [tool.objdebug], in the working directory."""
    start = Path(start or os.getcwd())
    for name in CONFIG_NAMES:
        path = start / name
        if not path.is_file():
            continue
        if name == "pyproject.toml":
            try:
                if "objdebug" not in _read_toml(path).get("tool", {}):
                    continue
            except InputError:
                continue
        return path
    return None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise InputError("config file not found", source=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"not valid TOML: {exc}", source=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read config: {exc.strerror}", source=str(path)) from None


def parse_override(text: str) -> tuple[str, Any]:
    """`data.label_pad_id=0` -> ("data.label_pad_id", 0); the value is parsed as TOML when it can be."""
    if "=" not in text:
        raise InputError(f"For '--set', the value must look like 'section.key=value', but got '{text}'.")
    key, raw = text.split("=", 1)
    key = key.strip()
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key, value


def load_config(path: Path | str | None = None, overrides: dict[str, Any] | None = None,
                demo: bool = False) -> Config:
    """Read and validate a target config; apply dotted-key overrides; resolve paths."""
    if demo:
        path = DEMO_CONFIG
    elif path is None:
        path = find_config()
        if path is None:
            raise InputError(
                "no objdebug.toml (or pyproject.toml with [tool.objdebug]) in the working directory; "
                "pass --config PATH, or --demo for the bundled demo target")
    path = Path(path).resolve()
    raw = _read_toml(path)
    if path.name == "pyproject.toml" and "objdebug" in raw.get("tool", {}):
        raw = raw["tool"]["objdebug"]
    raw = copy.deepcopy(raw)
    for key, value in (overrides or {}).items():
        _apply_override(raw, key, value, path)
    return _build(raw, path)


def _apply_override(raw: dict, key: str, value: Any, path: Path) -> None:
    parts = key.split(".")
    if len(parts) < 2 or parts[0] not in _SECTIONS:
        raise InputError(f"For '--set', the key must be 'section.key' with section in "
                         f"{sorted(_SECTIONS)}, but got '{key}'.")
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise InputError(f"cannot override '{key}': '{part}' is not a table", source=str(path))
    node[parts[-1]] = value


def _build(raw: dict, path: Path) -> Config:
    src = str(path)
    unknown = set(raw) - set(_SECTIONS)
    if unknown:
        raise InputError(f"unknown section(s) {sorted(unknown)}; expected {sorted(_SECTIONS)}", source=src)
    if "objective" not in raw:
        raise InputError("missing [objective] section (factory = 'module:callable')", source=src)
    sections: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        if name not in raw:
            continue
        table = raw[name]
        if not isinstance(table, dict):
            raise InputError(f"[{name}] must be a table", source=src)
        allowed = set(cls.__dataclass_fields__)
        bad = set(table) - allowed
        if bad:
            raise InputError(f"unknown key(s) {sorted(bad)} in [{name}]; allowed: {sorted(allowed)}", source=src)
        try:
            sections[name] = cls(**table)
        except TypeError as exc:  # a required key is missing
            raise InputError(f"[{name}]: {exc}", source=src) from None
    cfg = Config(objective=sections["objective"], model=sections.get("model"),
                 data=sections.get("data", DataSpec()), run=sections.get("run", RunSpec()),
                 source=src, base_dir=str(path.parent))
    _validate(cfg, src)
    for section, key in _PATH_KEYS:
        spec = getattr(cfg, section)
        if spec is not None and getattr(spec, key):
            setattr(spec, key, str((path.parent / getattr(spec, key)).resolve()))
    if cfg.run.profile.endswith(".toml"):  # a profile file is relative to the config, like data
        cfg.run.profile = str((path.parent / cfg.run.profile).resolve())
    return cfg


def _check_type(value: Any, types: type | tuple, where: str, src: str) -> None:
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        ok = False
    else:
        ok = isinstance(value, types)
    if not ok:
        expected = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise InputError(f"For '{where}', the value must be {expected}, but got {value!r}.", source=src)


def _validate(cfg: Config, src: str) -> None:
    for where, spec in (("model", cfg.model), ("objective", cfg.objective)):
        if spec is None:
            continue
        _check_type(spec.factory, str, f"{where}.factory", src)
        if ":" not in spec.factory:
            raise InputError(f"For '{where}.factory', the value must be 'module:callable', "
                             f"but got '{spec.factory}'.", source=src)
        _check_type(spec.kwargs, dict, f"{where}.kwargs", src)
    if cfg.objective.call not in CALLS:
        raise InputError(f"For 'objective.call', the value must be in {list(CALLS)}, "
                         f"but got '{cfg.objective.call}'.", source=src)
    _check_type(cfg.objective.components, list, "objective.components", src)
    if cfg.objective.primary is not None:
        _check_type(cfg.objective.primary, str, "objective.primary", src)
        if cfg.objective.primary not in cfg.objective.components:
            raise InputError(f"For 'objective.primary', the value must be one of objective.components "
                             f"{cfg.objective.components}, but got '{cfg.objective.primary}'.", source=src)
    if not cfg.end_to_end and cfg.objective.checkpoint is not None:
        raise InputError("objective.checkpoint is only for the end-to-end form (no [model]); "
                         "put the checkpoint under [model]", source=src)
    d = cfg.data
    _check_type(d.pad_id, int, "data.pad_id", src)
    _check_type(d.label_pad_id, int, "data.label_pad_id", src)
    _check_type(d.shift, bool, "data.shift", src)
    if d.vocab_size is not None:
        _check_type(d.vocab_size, int, "data.vocab_size", src)
    r = cfg.run
    if r.device not in DEVICES:
        raise InputError(f"For 'run.device', the value must be in {list(DEVICES)}, but got '{r.device}'.",
                         source=src)
    if r.mode not in MODES:
        raise InputError(f"For 'run.mode', the value must be in {list(MODES)}, but got '{r.mode}'.",
                         source=src)
    _check_type(r.seed, int, "run.seed", src)
    _check_type(r.profile, str, "run.profile", src)
    if r.compile_cache is not None:
        _check_type(r.compile_cache, str, "run.compile_cache", src)
