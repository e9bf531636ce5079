"""The target contract: `objdebug.toml` (or `[tool.objdebug]` in pyproject.toml) -> Config.

Every key can be overridden from the CLI with a dotted path (`data.label_pad_id=0`). Paths in the
file are relative to the file's directory and resolved to absolute paths here, because the
engine runs MindSpore in a scratch working directory.
"""

from __future__ import annotations

import copy
import math
import os
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from objdebug.core.errors import InputError

CONFIG_NAMES = ("objdebug.toml", "pyproject.toml")
DEMO_CONFIG = Path(__file__).resolve().parent.parent / "demo" / "objdebug.toml"
# `objdebug demo --task KIND`: the task kinds' demos (objdebug/demo/tasks/, issue 47)
DEMO_TASKS = {"classification": DEMO_CONFIG.parent / "tasks" / "classification.toml",
              "tagging": DEMO_CONFIG.parent / "tasks" / "tagging_crf.toml",
              "embedding": DEMO_CONFIG.parent / "tasks" / "embedding.toml"}

DEVICES = ("CPU", "GPU", "Ascend")
# what `[model] inputs` may name and `[model] mask_dtype` / `[data] padding_side` may be (the
# engine builds them: objdebug/engine/model_inputs.py)
INPUTS = ("input_ids", "attention_mask", "position_ids")
MASK_DTYPES = ("int32", "int64", "bool", "float32", "float16", "bfloat16")
PADDING_SIDES = ("right", "left")
MODES = ("graph", "pynative")
CALLS = ("flat", "sequence")
# Preference objectives (the `preference` stage): "preference" takes the four sequence log-prob
# vectors, "preference-pairs" owns policy and reference (see docs/config.md).
PREFERENCE_CALLS = ("preference", "preference-pairs")
# The reward model's loss (the `reward` checks): construct(chosen_rewards, rejected_rewards) or
# (rewards, scores) on the model's scalar reward per sequence ([reward], docs/config.md).
REWARD_CALL = "reward"
REWARD_POSITIONS = ("last", "first")
LOGPS = ("sum", "mean")
from objdebug.core.policy_config import POLICY_CALLS, PolicySpec, validate_policy  # noqa: E402  (the policy stage's forms)
LOSS_TYPES = ("sigmoid", "ipo", "simpo", "hinge")
# [task] kind: what the model returns and the objective scores (objdebug/engine/tasks.py)
TASK_KINDS = ("causal-lm", "classification", "tagging", "embedding")


@dataclass
class ModelSpec:
    factory: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None
    inputs: list[str] | None = None  # construct's arguments in order; default ["input_ids"]
    mask_dtype: str = "int32"        # dtype of the attention_mask objdebug builds
    output: int | str | None = None  # the logits: tuple index, or dict key / attribute name


@dataclass
class ObjectiveSpec:
    factory: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    call: str = "flat"
    components: list[str] = field(default_factory=list)
    primary: str | None = None     # the task component (OBJ305); default: the first of components
    checkpoint: str | None = None  # end-to-end form: the objective owns the network
    logps: str | None = None       # preference calls: "sum" or "mean" over response tokens
    loss_type: str | None = None   # preference calls: "sigmoid", "ipo", "simpo" or "hinge"


@dataclass
class ReferenceSpec:
    checkpoint: str | None = None  # the frozen reference model; default: the policy's checkpoint


@dataclass
class RewardSpec:
    """[reward]: where a model that returns a reward per position [B, T] is read (a [B] one is used as it is)."""

    position: str = "last"          # "last": each row's last real token | "first": its first


@dataclass
class DataSpec:
    tokenizer: str = "bytes"
    pad_id: int = 0
    label_pad_id: int = -100
    shift: bool = True
    vocab_size: int | None = None
    max_length: int | None = None  # longest input the model takes (default: its position table, if named)
    align: str | None = None
    scores: str | None = None
    preference: str | None = None  # JSONL of {"id", "prompt", "chosen", "rejected", "strength"?}
    rollouts: str | None = None    # JSONL of {"id", "prompt", "completions", "rewards"}: the policy stage
    text: str | None = None        # a plain corpus: JSONL {id, text} rows or a text file, one document a line
    text_max_tokens: int = 256     # a longer document is cut into pieces of at most this many tokens
    padding_side: str = "right"    # where objdebug pads a row: "right" or "left"
    bos_id: int | None = None      # prepended to every scored text, as the model was trained
    eos_id: int | None = None      # appended to every response (not to a prompt)
    # the user's own batches (objdebug/pipeline/batches_source.py; the `batches` stage audits them)
    batches: str | None = None     # "pkg.module:factory", a .mindrecord file or a pre-tokenized .jsonl
    batches_kwargs: dict[str, Any] = field(default_factory=dict)  # the factory's kwargs, as written
    batch_columns: list[str] | None = None  # the names of a tuple batch's elements, in order
    columns: dict[str, str] = field(default_factory=dict)  # our column name -> the pipeline's
    batch_size: int | None = None  # rows per MindRecord batch (None: row by row)
    max_batches: int = 8           # batches read at most (a large dataset is never read whole)


@dataclass
class PackingSpec:
    """[packing]: how the training pipeline packs several documents into one sequence and how
    the model sees their boundaries (objdebug/engine/packing.py; off unless the section is set)."""

    boundary: str = ""              # "position_ids" | "attention_mask" | "actual_seq_len" | "none"
    separator: int | str | None = None  # an id between documents, "eos" ([data] eos_id), or none
    labels: str = "document"        # "document": each labelled alone | "row": shifted over the row
    inputs: list[str] | None = None # construct's arguments when packed; default: [model] inputs + the boundary's
    mask_shape: str = "B1TT"        # the block mask: "BTT" ([B, T, T]) or "B1TT" ([B, 1, T, T])
    mask_ones: str = "attend"       # what a 1 in the block mask means: "attend" or "masked"
    documents: int = 3              # documents per packed row


@dataclass
class ChatSpec:
    """[chat]: how a row's tokens split into turns (objdebug/pipeline/chat_template.py; the batches
    stage's role audit, objdebug/stages/batches/chat_checks.py): an HF `chat_template` or the markers."""

    template: str | None = None        # a tokenizer_config.json (or .jinja) whose chat_template is rendered
    markers: dict[str, Any] | None = None  # role -> its header: an id list or a string ([data] tokenizer)
    end_of_turn: int | str | list | None = None  # an id, a string, an id list, or "next-role" (GLM)
    train_on: list[str] = field(default_factory=lambda: ["assistant"])  # roles whose turns train
    last_turn_only: bool = False       # only the last turn of a train_on role trains


# [task] formula: the embedding closed forms OBJ226 compares with (stages/grad/contrastive.py)
TASK_FORMULAS = ("infonce", "symmetric-infonce", "triplet", "contrastive-margin")


@dataclass
class TaskSpec:
    """[task]: the kind of objective (issue 47). "causal-lm" (the default) is next-token
    prediction; the other kinds are read and checked by objdebug/engine/tasks.py."""

    kind: str = "causal-lm"
    labels: list[str] | None = None  # class / tag names, index order (classification, tagging)
    # the weight each class should get, by name ({"spam": 4.0}) or index order: what the
    # objective's gradient is measured against (default: the objective's kwargs or its `weight`)
    class_weight: dict[str, float] | list[float] | None = None
    # the closed form an embedding objective implements (OBJ226 fails a loss that leaves it);
    # unset, a loss that matches none of the family's forms is a note: one form of many
    formula: str | None = None


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
    # mixed precision as trained (objdebug/engine/precision.py): mindspore.amp.auto_mixed_precision
    amp_level: str = "O0"             # "O0" (float32) | "O1" | "O2" | "O3"
    amp_dtype: str = "float16"        # the low precision: "float16" | "bfloat16"
    amp_objective: bool = False       # the objective converted too (amp applied to model + loss)
    loss_scale: float | None = None   # static loss scale of training: gradients of scale * loss
    # the trainer averages the losses (gradients) of this many micro-batches per step (OBJ706)
    grad_accumulation_steps: int | None = None
    # ... or the trainer's micro-batch size (rows per micro-batch), the other way trainers say it
    micro_batch_size: int | None = None


@dataclass
class Config:
    objective: ObjectiveSpec
    model: ModelSpec | None = None
    data: DataSpec = field(default_factory=DataSpec)
    run: RunSpec = field(default_factory=RunSpec)
    source: str = "<memory>"
    base_dir: str = "."
    preference: ObjectiveSpec | None = None  # [preference]: a preference objective beside a CE one
    reference: ReferenceSpec | None = None
    packing: PackingSpec | None = None  # [packing]: the packing stage runs only when it is set
    chat: ChatSpec | None = None  # [chat]: the rows are conversations (the batches stage's role audit)
    policy: PolicySpec | None = None    # [policy]: how the policy stage builds its inputs (call = "policy...")
    reward: RewardSpec | None = None    # [reward]: only with [objective] call = "reward"
    task: TaskSpec = field(default_factory=TaskSpec)  # [task]: causal-lm unless set

    @property
    def end_to_end(self) -> bool:
        """True when the objective owns its network: construct(input_ids, labels) -> loss."""
        return self.model is None

    @property
    def preference_objective(self) -> ObjectiveSpec | None:
        """The preference objective the `preference` stage checks: `[preference]`, or the
        `[objective]` itself when its call is a preference call."""
        if self.preference is not None:
            return self.preference
        return self.objective if self.objective.call in PREFERENCE_CALLS else None

    @property
    def policy_objective(self) -> ObjectiveSpec | None:
        """The policy-gradient objective the `policy` stage checks (`[objective] call` = "policy"
        or "policy-model"), else None: the key that switches the opt-in policy stage on."""
        if self.policy is not None and self.policy.factory is not None:  # beside a CE [objective]
            return ObjectiveSpec(factory=self.policy.factory, kwargs=self.policy.kwargs, call=self.policy.call)
        return self.objective if self.objective.call in POLICY_CALLS else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        # preference keys appear only when set, so reports of other targets keep their shape
        for key in ("preference", "reference", "packing", "chat", "policy", "reward"):
            if out[key] is None:
                del out[key]
        if out["task"] == asdict(TaskSpec()):  # a causal-LM report keeps its shape
            del out["task"]
        for section, key in (("objective", "logps"), ("objective", "loss_type"), ("data", "preference"),
                             ("data", "rollouts")):
            if out[section].get(key) is None:
                del out[section][key]
        # model inputs/output keys appear only when set (not at their defaults), likewise
        for section, key, default in (("model", "inputs", None), ("model", "mask_dtype", "int32"),
                                      ("model", "output", None), ("data", "padding_side", "right")):
            if out.get(section) is not None and out[section].get(key) == default:
                del out[section][key]
        # precision and BOS/EOS keys too: a report of a target that does not set them keeps its shape
        for section, key, default in _QUIET_DEFAULTS:
            if out[section].get(key, default) == default:
                out[section].pop(key, None)
        return out


# (section, key, default): left out of Config.to_dict() at their default
_QUIET_DEFAULTS = (("run", "amp_level", "O0"), ("run", "amp_dtype", "float16"),
                   ("run", "amp_objective", False), ("run", "loss_scale", None),
                   ("run", "grad_accumulation_steps", None), ("run", "micro_batch_size", None),
                   ("data", "bos_id", None), ("data", "eos_id", None),
                   ("data", "batches", None), ("data", "batches_kwargs", {}),
                   ("data", "batch_columns", None), ("data", "columns", {}),
                   ("data", "batch_size", None), ("data", "max_batches", 8))
AMP_LEVELS = ("O0", "O1", "O2", "O3")
AMP_DTYPES = ("float16", "bfloat16")

_SECTIONS = {"model": ModelSpec, "objective": ObjectiveSpec, "data": DataSpec, "run": RunSpec,
             "preference": ObjectiveSpec, "reference": ReferenceSpec, "packing": PackingSpec,
             "chat": ChatSpec, "policy": PolicySpec, "reward": RewardSpec, "task": TaskSpec}
_PATH_KEYS = {("model", "checkpoint"), ("objective", "checkpoint"), ("data", "align"), ("data", "scores"),
              ("run", "compile_cache"), ("data", "preference"), ("reference", "checkpoint"),
              ("data", "text"), ("chat", "template"), ("data", "rollouts")}


def find_config(start: Path | None = None) -> Path | None:
    """The first objdebug.toml, or pyproject.toml with [tool.objdebug], in the working directory."""
    start = Path(start or os.getcwd())
    for name in CONFIG_NAMES:
        path = start / name
        if not path.is_file():
            continue
        if name == "pyproject.toml":
            # a broken pyproject.toml is reported as such (naming the file), not as "no config":
            # it may well hold the [tool.objdebug] the user means
            if not isinstance(_tool_objdebug(_read_toml(path), path), dict):
                continue
        return path
    return None


def _tool_objdebug(raw: dict[str, Any], path: Path) -> Any:
    """pyproject.toml's [tool.objdebug], or None; `tool = 5` is an InputError naming the file."""
    tool = raw.get("tool", {})
    if not isinstance(tool, dict):
        raise InputError(f"For 'tool', the value must be a table ([tool.objdebug]), but got "
                         f"{tool!r}.", source=str(path))
    section = tool.get("objdebug")
    if section is not None and not isinstance(section, dict):
        raise InputError(f"For 'tool.objdebug', the value must be a table, but got {section!r}.",
                         source=str(path))
    return section


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
        # a byte-order mark (Windows editors write one) is not TOML; the data files accept it too
        return tomllib.loads(data.removeprefix(b"\xef\xbb\xbf").decode("utf-8"))
    except FileNotFoundError:
        raise InputError("config file not found", source=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"not valid TOML: {exc}", source=str(path)) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"not valid TOML: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
                         f"offset {exc.start})", source=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read config: {exc.strerror}", source=str(path)) from None


def parse_override(text: str) -> tuple[str, Any]:
    """`data.label_pad_id=0` -> ("data.label_pad_id", 0); the value is parsed as TOML when it can be."""
    if "=" not in text:
        raise InputError(f"For '--set', the value must look like 'section.key=value', but got '{text}'.")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not raw.strip():
        raise InputError(f"For '--set {text}', the value is empty; give one (a quoted '' for an "
                         f"empty string).", source="command line")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key, value


def load_config(path: Path | str | None = None, overrides: dict[str, Any] | None = None,
                demo: bool = False, origins: dict[str, str] | None = None) -> Config:
    """Read and validate a target config; apply dotted-key overrides; resolve paths.

    `origins`: override key -> the command-line text it came from (`--mode fast`); an error in
    such a key names the command line, not the config file."""
    if isinstance(demo, str):  # demo --task KIND
        if demo not in DEMO_TASKS:
            raise InputError(f"For '--task', the value must be in {sorted(DEMO_TASKS)}, but got "
                             f"{demo!r}.", source="command line")
        path = DEMO_TASKS[demo]
    elif demo:
        path = DEMO_CONFIG
    elif path is None:
        path = find_config()
        if path is None:
            raise InputError(
                "no objdebug.toml (or pyproject.toml with [tool.objdebug]) in the working directory; "
                "pass --config PATH, or --demo for the bundled demo target")
    path = Path(path).resolve()
    raw = _read_toml(path)
    if path.name == "pyproject.toml" and _tool_objdebug(raw, path) is not None:
        raw = raw["tool"]["objdebug"]
    raw = copy.deepcopy(raw)
    origins = {k: origins.get(k, f"--set {k}=...") for k in (overrides or {})} if origins is not None \
        else {k: f"--set {k}=..." for k in (overrides or {})}
    for key, value in (overrides or {}).items():
        _apply_override(raw, key, value, origins[key])
    return _build(raw, path, origins)


def _apply_override(raw: dict, key: str, value: Any, origin: str) -> None:
    parts = key.split(".")
    if len(parts) < 2 or parts[0] not in _SECTIONS:
        raise InputError(f"For '--set', the key must be 'section.key' with section in "
                         f"{sorted(_SECTIONS)}, but got '{key}'.")
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise InputError(f"cannot override '{key}': '{part}' is not a table",
                             source=f"command line ({origin})")
    node[parts[-1]] = value


def _build(raw: dict, path: Path, origins: dict[str, str] | None = None) -> Config:
    src = _Sources(str(path), origins or {})
    unknown = set(raw) - set(_SECTIONS)
    if unknown:
        raise InputError(f"unknown section(s) {sorted(unknown)}; expected {sorted(_SECTIONS)}", source=str(src))
    if "objective" not in raw:
        raise InputError("missing [objective] section (factory = 'module:callable')", source=str(src))
    sections: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        if name not in raw:
            continue
        table = raw[name]
        if not isinstance(table, dict):
            raise InputError(f"[{name}] must be a table", source=str(src))
        allowed = set(cls.__dataclass_fields__)
        bad = set(table) - allowed
        if bad:
            raise InputError(f"unknown key(s) {sorted(bad)} in [{name}]; allowed: {sorted(allowed)}",
                             source=src.of(*(f"{name}.{k}" for k in bad)))
        try:
            sections[name] = cls(**table)
        except TypeError as exc:  # a required key is missing
            raise InputError(f"[{name}]: {exc}", source=str(src)) from None
    cfg = Config(objective=sections["objective"], model=sections.get("model"),
                 data=sections.get("data", DataSpec()), run=sections.get("run", RunSpec()),
                 source=str(path), base_dir=str(path.parent), preference=sections.get("preference"),
                 reference=sections.get("reference"), packing=sections.get("packing"),
                 chat=sections.get("chat"), policy=sections.get("policy"), reward=sections.get("reward"),
                 task=sections.get("task", TaskSpec()))
    _validate(cfg, src)
    for section, key in _PATH_KEYS:
        spec = getattr(cfg, section)
        if spec is not None and getattr(spec, key):
            setattr(spec, key, str((path.parent / getattr(spec, key)).resolve()))
    if batches_file(cfg.data.batches):  # a file is relative to the config; a factory is not a path
        cfg.data.batches = str((path.parent / cfg.data.batches).resolve())
    if cfg.run.profile.endswith(".toml"):  # a profile file is relative to the config, like data
        cfg.run.profile = str((path.parent / cfg.run.profile).resolve())
    return cfg


class _Sources:
    """Where a key's value came from: the config file, or the command line that overrode it."""

    def __init__(self, path: str, origins: dict[str, str]):
        self.path, self.origins = path, origins

    def of(self, *keys: str) -> str:
        for key in keys:
            for k, text in self.origins.items():
                if key == k or key.startswith(k + "."):  # --set model.kwargs={...}
                    return f"command line ({text})"
        return self.path

    def __str__(self) -> str:
        return self.path


def _check_type(value: Any, types: type | tuple, where: str, src: "_Sources") -> None:
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        ok = False
    else:
        ok = isinstance(value, types)
    if not ok:
        expected = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise InputError(f"For '{where}', the value must be {expected}, but got {value!r}.",
                         source=src.of(where))


INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1
SEED_MAX = 2 ** 32 - 1


def _check_range(value: int, low: int, high: int, where: str, src: "_Sources") -> None:
    if not low <= value <= high:
        raise InputError(f"For '{where}', the value must be in [{low}, {high}], but got {value}.",
                         source=src.of(where))


def _check_path_text(value: str, where: str, src: "_Sources") -> None:
    """A path the OS cannot take (empty, NUL, a name or whole path over its limits) is the user's
    input error, before MindSpore starts, not an OSError deep in a stage."""
    from objdebug.core.paths import path_problem

    problem = path_problem(value) if value else None  # '' means unset, as for a missing key
    if problem:
        raise InputError(f"For '{where}', the value must be a usable path, but {problem}.",
                         source=src.of(where))


def _validate(cfg: Config, src: _Sources) -> None:
    for where, spec in (("model", cfg.model), ("objective", cfg.objective)):
        if spec is None:
            continue
        _check_type(spec.factory, str, f"{where}.factory", src)
        if ":" not in spec.factory:
            raise InputError(f"For '{where}.factory', the value must be 'module:callable', "
                             f"but got '{spec.factory}'.", source=src.of(f"{where}.factory"))
        _check_type(spec.kwargs, dict, f"{where}.kwargs", src)
    calls = CALLS + PREFERENCE_CALLS + POLICY_CALLS + (REWARD_CALL,)
    if cfg.objective.call not in calls:
        raise InputError(f"For 'objective.call', the value must be in {list(calls)}, "
                         f"but got '{cfg.objective.call}'.", source=src.of("objective.call"))
    _validate_preference(cfg, src)
    validate_policy(cfg, src)
    _validate_reward(cfg, src)
    _check_type(cfg.objective.components, list, "objective.components", src)
    if not all(isinstance(c, str) for c in cfg.objective.components):
        raise InputError(f"For 'objective.components', the value must be a list of strings, but got "
                         f"{cfg.objective.components!r}.", source=src.of("objective.components"))
    if cfg.objective.primary is not None:
        _check_type(cfg.objective.primary, str, "objective.primary", src)
        if cfg.objective.primary not in cfg.objective.components:
            raise InputError(f"For 'objective.primary', the value must be one of objective.components "
                             f"{cfg.objective.components}, but got '{cfg.objective.primary}'.", source=src)
    if not cfg.end_to_end and cfg.objective.checkpoint is not None:
        raise InputError("objective.checkpoint is only for the end-to-end form (no [model]); "
                         "put the checkpoint under [model]", source=str(src))
    for section, key in sorted(_PATH_KEYS):  # a number or a list here was an internal error (exit 3)
        spec = getattr(cfg, section)
        if spec is not None and getattr(spec, key) is not None:
            _check_type(getattr(spec, key), str, f"{section}.{key}", src)
            _check_path_text(getattr(spec, key), f"{section}.{key}", src)
    d = cfg.data
    _check_type(d.tokenizer, str, "data.tokenizer", src)
    _check_type(d.pad_id, int, "data.pad_id", src)
    _check_type(d.label_pad_id, int, "data.label_pad_id", src)
    _check_type(d.shift, bool, "data.shift", src)
    for key in ("pad_id", "label_pad_id"):  # ids reach MindSpore as int32: 9999999999 would wrap
        _check_range(getattr(d, key), INT32_MIN, INT32_MAX, f"data.{key}", src)
    if d.vocab_size is not None:
        _check_type(d.vocab_size, int, "data.vocab_size", src)
        _check_range(d.vocab_size, 1, INT32_MAX, "data.vocab_size", src)
    if d.max_length is not None:
        _check_type(d.max_length, int, "data.max_length", src)
        _check_range(d.max_length, 1, INT32_MAX, "data.max_length", src)
    if d.text is not None:
        _check_type(d.text, str, "data.text", src)
    _check_type(d.text_max_tokens, int, "data.text_max_tokens", src)
    for key in ("bos_id", "eos_id"):
        value = getattr(d, key)
        if value is not None:
            _check_type(value, int, f"data.{key}", src)
            if value < 0:
                raise InputError(f"For 'data.{key}', the value must be a token id >= 0, but got "
                                 f"{value}.", source=src.of(f"data.{key}"))
            _check_range(value, 0, INT32_MAX, f"data.{key}", src)
    _validate_model_io(cfg, src)
    _validate_batches(d, src)
    if d.text_max_tokens < 2:
        raise InputError(f"For 'data.text_max_tokens', the value must be >= 2, but got "
                         f"{d.text_max_tokens}.", source=src)
    r = cfg.run
    if r.device not in DEVICES:
        raise InputError(f"For 'run.device', the value must be in {list(DEVICES)}, but got '{r.device}'.",
                         source=src.of("run.device"))
    if r.mode not in MODES:
        raise InputError(f"For 'run.mode', the value must be in {list(MODES)}, but got '{r.mode}'.",
                         source=src.of("run.mode"))
    _check_type(r.seed, int, "run.seed", src)
    _check_range(r.seed, 0, SEED_MAX, "run.seed", src)  # numpy and MindSpore take a uint32 seed
    for key in ("stages", "select", "ignore"):  # a string would be read letter by letter
        value = getattr(r, key)
        if value is not None and (not isinstance(value, list)
                                  or not all(isinstance(v, str) for v in value)):
            raise InputError(f"For 'run.{key}', the value must be a list of strings (e.g. "
                             f"[\"{'align' if key == 'stages' else 'OBJ1'}\"]), but got {value!r}.",
                             source=src.of(f"run.{key}"))
    _check_type(r.profile, str, "run.profile", src)
    if r.compile_cache is not None:
        _check_type(r.compile_cache, str, "run.compile_cache", src)
    _validate_precision(r, src)
    _validate_task(cfg.task, src)
    if cfg.packing is not None:
        validate_packing(cfg, src)
    if cfg.chat is not None:
        validate_chat(cfg.chat, src)


def _validate_task(t: TaskSpec, src: _Sources) -> None:
    """[task]: a known kind, class names as strings, weights as finite positive numbers."""
    if t.kind not in TASK_KINDS:
        raise InputError(f"For 'task.kind', the value must be in {list(TASK_KINDS)}, but got "
                         f"{t.kind!r}.", source=src.of("task.kind"))
    if t.labels is not None and (not isinstance(t.labels, list) or not t.labels
                                 or not all(isinstance(x, str) and x for x in t.labels)
                                 or len(set(t.labels)) != len(t.labels)):
        raise InputError(f"For 'task.labels', the value must be a list of distinct, non-empty "
                         f"names, but got {t.labels!r}.", source=src.of("task.labels"))
    if t.formula is not None and t.formula not in TASK_FORMULAS:
        raise InputError(f"For 'task.formula', the value must be in {list(TASK_FORMULAS)}, but got "
                         f"{t.formula!r}.", source=src.of("task.formula"))
    w = t.class_weight
    if w is None:
        return
    values = list(w.values()) if isinstance(w, dict) else w if isinstance(w, list) else None
    if values is None or not values or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
            for v in values):
        raise InputError(f"For 'task.class_weight', the value must be a list or a table of "
                         f"positive numbers, but got {w!r}.", source=src.of("task.class_weight"))
    if isinstance(w, dict):
        unknown = [k for k in w if t.labels is None or k not in t.labels]
        if unknown:
            raise InputError(f"For 'task.class_weight', each key must be a name in task.labels "
                             f"{t.labels}, but got {unknown[0]!r}.", source=src.of("task.class_weight"))
    elif t.labels is not None and len(w) != len(t.labels):
        raise InputError(f"For 'task.class_weight', the list must have one weight per name in "
                         f"task.labels ({len(t.labels)}), but got {len(w)}.",
                         source=src.of("task.class_weight"))


BATCH_COLUMNS = ("input_ids", "labels", "attention_mask", "position_ids")  # read from a batch by name
# where a row's prompt ends, when the pipeline says: a per-position mask of the trained labels, or
# one number per row (the prompt's length from the first real token, or the answer's first index)
BOUNDARY_COLUMNS = ("loss_mask", "prompt_length", "response_start")
# where a packed row's documents end, MindFormers' convention: cumulative ends, [rows, any width]
SEQ_LEN_COLUMN = "actual_seq_len"
BATCH_FILES = (".jsonl", ".mindrecord")


def batches_file(value: Any) -> bool:
    """Whether `[data] batches` names a file (.jsonl / .mindrecord) rather than a factory."""
    return isinstance(value, str) and value.lower().endswith(BATCH_FILES)


def _validate_batches(d: DataSpec, src: _Sources) -> None:
    """`[data] batches` and the keys that say how to read them (exit 2, one line naming the key)."""
    def bad(key: str, expected: str, got: Any) -> InputError:
        return InputError(f"For 'data.{key}', the value must be {expected}, but got {got!r}.",
                          source=src.of(f"data.{key}"))

    if d.batches is not None:
        _check_type(d.batches, str, "data.batches", src)
        _check_path_text(d.batches, "data.batches", src)
        module, _, attr = d.batches.partition(":")
        if not batches_file(d.batches) and not (module.strip() and attr.strip()):
            raise bad("batches", "'pkg.module:factory', a .mindrecord file or a .jsonl file", d.batches)
    _check_type(d.batches_kwargs, dict, "data.batches_kwargs", src)
    if d.batch_columns is not None and (not isinstance(d.batch_columns, list) or not d.batch_columns
                                        or not all(isinstance(c, str) and c for c in d.batch_columns)
                                        or len(set(d.batch_columns)) != len(d.batch_columns)):
        raise bad("batch_columns", "a list of distinct column names (a tuple batch's elements in "
                  "order)", d.batch_columns)
    if not isinstance(d.columns, dict) or not all(
            k in BATCH_COLUMNS + BOUNDARY_COLUMNS + (SEQ_LEN_COLUMN,) and isinstance(v, str) and v
            for k, v in d.columns.items()):
        raise bad("columns", f"a table from {list(BATCH_COLUMNS + BOUNDARY_COLUMNS + (SEQ_LEN_COLUMN,))} to the pipeline's column names "
                  "(e.g. {input_ids = \"tokens\"})", d.columns)
    if d.batch_size is not None:
        _check_type(d.batch_size, int, "data.batch_size", src)
        _check_range(d.batch_size, 1, INT32_MAX, "data.batch_size", src)
    _check_type(d.max_batches, int, "data.max_batches", src)
    _check_range(d.max_batches, 1, INT32_MAX, "data.max_batches", src)


def _validate_precision(r: RunSpec, src: _Sources) -> None:
    """`[run] amp_level`, `amp_dtype`, `amp_objective`, `loss_scale`, `grad_accumulation_steps`
    (see docs/config.md)."""
    if r.amp_level not in AMP_LEVELS:
        raise InputError(f"For 'run.amp_level', the value must be in {list(AMP_LEVELS)}, but got "
                         f"{r.amp_level!r}.", source=src.of("run.amp_level"))
    if r.amp_dtype not in AMP_DTYPES:
        raise InputError(f"For 'run.amp_dtype', the value must be in {list(AMP_DTYPES)}, but got "
                         f"{r.amp_dtype!r}.", source=src.of("run.amp_dtype"))
    _check_type(r.amp_objective, bool, "run.amp_objective", src)
    if r.loss_scale is not None:
        _check_type(r.loss_scale, (int, float), "run.loss_scale", src)
        if not (math.isfinite(r.loss_scale) and r.loss_scale > 0):
            raise InputError(f"For 'run.loss_scale', the value must be a finite number > 0, but got "
                             f"{r.loss_scale!r}.", source=src.of("run.loss_scale"))
        r.loss_scale = float(r.loss_scale)
    if r.grad_accumulation_steps is not None:
        _check_type(r.grad_accumulation_steps, int, "run.grad_accumulation_steps", src)
        _check_range(r.grad_accumulation_steps, 1, INT32_MAX, "run.grad_accumulation_steps", src)
    if r.micro_batch_size is not None:
        _check_type(r.micro_batch_size, int, "run.micro_batch_size", src)
        _check_range(r.micro_batch_size, 1, INT32_MAX, "run.micro_batch_size", src)
        if r.grad_accumulation_steps is not None:  # two statements of one loop: say it once
            raise InputError("For '[run]', declare the accumulation once: 'grad_accumulation_steps' "
                             "or 'micro_batch_size', but got both.", source=src.of("run.micro_batch_size"))


def _validate_model_io(cfg: Config, src: _Sources) -> None:
    """`[model] inputs / mask_dtype / output` and `[data] padding_side` (objdebug/engine/model_inputs.py)."""
    _check_type(cfg.data.padding_side, str, "data.padding_side", src)
    if cfg.data.padding_side not in PADDING_SIDES:
        raise InputError(f"For 'data.padding_side', the value must be in {list(PADDING_SIDES)}, but "
                         f"got {cfg.data.padding_side!r}.", source=src.of("data.padding_side"))
    m = cfg.model
    if m is None:
        return
    if m.inputs is not None:
        _check_type(m.inputs, list, "model.inputs", src)
        if (not all(isinstance(x, str) and x in INPUTS for x in m.inputs) or len(set(m.inputs)) != len(m.inputs)
                or "input_ids" not in m.inputs):
            raise InputError(f"For 'model.inputs', the value must list construct's arguments in order, "
                             f"each once, from {list(INPUTS)} and with 'input_ids', but got "
                             f"{m.inputs!r}.", source=src.of("model.inputs"))
    _check_type(m.mask_dtype, str, "model.mask_dtype", src)
    if m.mask_dtype not in MASK_DTYPES:
        raise InputError(f"For 'model.mask_dtype', the value must be in {list(MASK_DTYPES)}, but got "
                         f"{m.mask_dtype!r}.", source=src.of("model.mask_dtype"))
    if m.output is not None:
        _check_type(m.output, (int, str), "model.output", src)
        if (isinstance(m.output, int) and m.output < 0) or (isinstance(m.output, str)
                                                              and not m.output):
            raise InputError(f"For 'model.output', the value must be a tuple index >= 0 or the name "
                             f"of a dict key / attribute, but got {m.output!r}.",
                             source=src.of("model.output"))


def _validate_preference(cfg: Config, src: _Sources) -> None:
    """`[preference]` / `[objective] call = "preference..."`, `[reference]`, `[data] preference`."""
    if cfg.preference is not None:
        if cfg.objective.call in PREFERENCE_CALLS:
            raise InputError("[preference] is for a preference objective beside a cross-entropy "
                             "[objective]; this [objective] is already a preference call", source=src)
        _check_type(cfg.preference.factory, str, "preference.factory", src)
        if ":" not in cfg.preference.factory:
            raise InputError(f"For 'preference.factory', the value must be 'module:callable', "
                             f"but got '{cfg.preference.factory}'.", source=src)
        _check_type(cfg.preference.kwargs, dict, "preference.kwargs", src)
        if cfg.preference.call == "flat":  # the dataclass default: [preference] means the logps call
            cfg.preference.call = "preference"
    spec = cfg.preference_objective
    where = "preference" if cfg.preference is not None else "objective"
    if spec is None:
        for section, key in (("objective", "logps"), ("objective", "loss_type")):
            if getattr(cfg.objective, key) is not None:
                raise InputError(f"For '{section}.{key}', the key is only for a preference call "
                                 f"({list(PREFERENCE_CALLS)}), but objective.call is "
                                 f"'{cfg.objective.call}'.", source=src)
        return
    if spec.call not in PREFERENCE_CALLS:
        raise InputError(f"For '{where}.call', the value must be in {list(PREFERENCE_CALLS)}, "
                         f"but got '{spec.call}'.", source=src)
    spec.logps = "sum" if spec.logps is None else spec.logps
    spec.loss_type = "sigmoid" if spec.loss_type is None else spec.loss_type
    if spec.logps not in LOGPS:
        raise InputError(f"For '{where}.logps', the value must be in {list(LOGPS)}, but got "
                         f"{spec.logps!r}.", source=src)
    if spec.loss_type not in LOSS_TYPES:
        raise InputError(f"For '{where}.loss_type', the value must be in {list(LOSS_TYPES)}, but got "
                         f"{spec.loss_type!r}.", source=src)
    if cfg.model is None:
        raise InputError(f"For '{where}.call' = '{spec.call}', a [model] is required: objdebug builds "
                         "the policy and the reference from the model factory", source=src)
    if cfg.reference is not None and cfg.reference.checkpoint is not None:
        _check_type(cfg.reference.checkpoint, str, "reference.checkpoint", src)


def _validate_reward(cfg: Config, src: _Sources) -> None:
    """`[objective] call = "reward"` and `[reward]`: a model, a position word, pairs or scored rows."""
    if cfg.objective.call != REWARD_CALL:
        if cfg.reward is not None:
            raise InputError(f"[reward] is only for [objective] call = \"{REWARD_CALL}\", but "
                             f"objective.call is '{cfg.objective.call}'.", source=src.of("objective.call"))
        return
    if cfg.model is None:
        raise InputError(f"For 'objective.call' = '{REWARD_CALL}', a [model] is required: the reward "
                         "model whose scalar reward per sequence the loss takes", source=str(src))
    if cfg.preference is not None:
        raise InputError(f"[preference] is for a preference objective beside a cross-entropy "
                         f"[objective]; this [objective] is a '{REWARD_CALL}' call", source=str(src))
    cfg.reward = cfg.reward or RewardSpec()
    _check_type(cfg.reward.position, str, "reward.position", src)
    if cfg.reward.position not in REWARD_POSITIONS:
        raise InputError(f"For 'reward.position', the value must be in {list(REWARD_POSITIONS)}, but "
                         f"got {cfg.reward.position!r}.", source=src.of("reward.position"))
    if not cfg.data.preference and not cfg.data.scores:
        raise InputError(f"For 'objective.call' = '{REWARD_CALL}', [data] preference (pairs, for a "
                         "pairwise loss) or [data] scores (scored rows, for a regression loss) is "
                         "required", source=str(src))


# --------------------------------------------------------------------------- [packing]
BOUNDARIES = ("position_ids", "attention_mask", "actual_seq_len", "none")
LABEL_MODES = ("document", "row")
MASK_SHAPES = ("BTT", "B1TT")
MASK_ONES = ("attend", "masked")
PACKED_INPUTS = ("input_ids", "attention_mask", "position_ids", "actual_seq_len")


def packed_inputs(cfg) -> tuple[str, ...]:
    """construct's arguments when packed: `[packing] inputs`, else `[model] inputs` with the
    boundary's own input appended when it is missing."""
    p = cfg.packing
    if p.inputs:
        return tuple(p.inputs)
    base = tuple(cfg.model.inputs) if cfg.model is not None and cfg.model.inputs else ("input_ids",)
    if p.boundary in ("position_ids", "attention_mask", "actual_seq_len") and p.boundary not in base:
        base = base + (p.boundary,)
    return base


def separator_id(cfg) -> int | None:
    """The id put after each document: `[packing] separator` ("eos": `[data] eos_id`), or None."""
    sep = cfg.packing.separator
    return cfg.data.eos_id if sep == "eos" else sep


def validate_packing(cfg, src) -> None:
    """`[packing]` keys (exit 2 on a bad value, one line naming the key)."""
    p = cfg.packing

    def bad(key: str, expected: str, got) -> InputError:
        return InputError(f"For 'packing.{key}', the value must be {expected}, but got {got!r}.",
                          source=src.of(f"packing.{key}"))

    if p.boundary not in BOUNDARIES:
        raise bad("boundary", f"in {list(BOUNDARIES)} (how the model sees document boundaries)",
                  p.boundary or None)
    if p.labels not in LABEL_MODES:
        raise bad("labels", f"in {list(LABEL_MODES)}", p.labels)
    if p.mask_shape not in MASK_SHAPES:
        raise bad("mask_shape", f"in {list(MASK_SHAPES)}", p.mask_shape)
    if p.mask_ones not in MASK_ONES:
        raise bad("mask_ones", f"in {list(MASK_ONES)}", p.mask_ones)
    if isinstance(p.documents, bool) or not isinstance(p.documents, int) or p.documents < 2:
        raise bad("documents", "an integer >= 2 (documents per packed row)", p.documents)
    sep = p.separator
    if sep is not None:
        if sep == "eos":
            if cfg.data.eos_id is None:
                raise InputError("For 'packing.separator' = \"eos\", [data] eos_id must be set, but "
                                 "it is not.", source=src.of("packing.separator"))
        elif isinstance(sep, bool) or not isinstance(sep, int) or sep < 0:
            raise bad("separator", "a token id >= 0 or \"eos\" (leave it out for none)", sep)
        else:  # ids reach MindSpore as int32: 2**40 wrapped to 0, the pad id, and passed untested
            _check_range(sep, 0, INT32_MAX, "packing.separator", src)
    if cfg.model is None:
        raise InputError("[packing] needs a [model]: the packing stage calls the model on packed "
                         "rows (the end-to-end form has no logits)", source=str(src))
    if p.inputs is not None:
        if (not isinstance(p.inputs, list) or not all(isinstance(x, str) and x in PACKED_INPUTS
                                                      for x in p.inputs)
                or len(set(p.inputs)) != len(p.inputs) or "input_ids" not in p.inputs):
            raise bad("inputs", f"construct's arguments (the ids, then the others by name), each once, from "
                      f"{list(PACKED_INPUTS)} and with 'input_ids'", p.inputs)
    names = packed_inputs(cfg)
    if p.boundary != "none" and p.boundary not in names:
        raise InputError(f"For 'packing.inputs', the list must hold the boundary input "
                         f"'{p.boundary}', but got {list(names)}.", source=src.of("packing.inputs"))
    if "actual_seq_len" in names and p.boundary != "actual_seq_len":
        raise InputError(f"For 'packing.inputs', 'actual_seq_len' is only given with boundary = "
                         f"\"actual_seq_len\", but boundary is {p.boundary!r}.",
                         source=src.of("packing.inputs"))


CHAT_ROLES = ("system", "user", "assistant", "tool")
NEXT_ROLE = "next-role"  # [chat] end_of_turn: a turn closes with the next role's header (GLM)


def validate_chat(c: ChatSpec, src) -> None:
    """`[chat]` keys' shapes (exit 2, one line); whether the template renders and the markers are in
    the vocabulary is judged where the tokenizer is (pipeline/chat_template.py)."""
    def bad(key: str, expected: str, got) -> InputError:
        return InputError(f"For 'chat.{key}', the value must be {expected}, but got {got!r}.",
                          source=src.of(f"chat.{key}"))

    def marker_ok(v) -> bool:
        return (isinstance(v, str) and v != "") or (isinstance(v, int) and not isinstance(v, bool) and v >= 0) \
            or (isinstance(v, list) and bool(v) and all(isinstance(x, int) and not isinstance(x, bool)
                                                          and 0 <= x <= INT32_MAX for x in v))

    if (c.template is None) == (c.markers is None):
        raise InputError("For '[chat]', exactly one of 'template' (a tokenizer_config.json with a "
                         "chat_template) and 'markers' (each role's header) must be set, but got "
                         f"{'both' if c.template is not None else 'neither'}.", source=str(src))
    if c.template is not None:
        _check_type(c.template, str, "chat.template", src)
        _check_path_text(c.template, "chat.template", src)
    if c.markers is not None:
        if (not isinstance(c.markers, dict) or not c.markers or set(c.markers) - set(CHAT_ROLES)
                or not all(marker_ok(v) for v in c.markers.values())):
            raise bad("markers", f"a table from {list(CHAT_ROLES)} to each role's header (a string "
                      "or a list of token ids), e.g. {user = \"<|im_start|>user\\n\"}", c.markers)
        if "assistant" not in c.markers:
            raise bad("markers", "a table with an 'assistant' header", c.markers)
        if c.end_of_turn is None:
            raise InputError("For 'chat.end_of_turn', the value must be set with 'markers' (an id, "
                             f"a string, an id list or \"{NEXT_ROLE}\"), but it is not.",
                             source=src.of("chat.markers"))
    if c.end_of_turn is not None and c.end_of_turn != NEXT_ROLE and not marker_ok(c.end_of_turn):
        raise bad("end_of_turn", f"a token id, a string, a list of ids or \"{NEXT_ROLE}\"", c.end_of_turn)
    if (not isinstance(c.train_on, list) or not c.train_on
            or not all(isinstance(r, str) and r in CHAT_ROLES for r in c.train_on)):
        raise bad("train_on", f"a non-empty list of roles from {list(CHAT_ROLES)}", c.train_on)
    _check_type(c.last_turn_only, bool, "chat.last_turn_only", src)
