"""Check profiles: TOML files in `checks/` (shipped as `objdebug.checks`) or any path.

A profile may `extends = "default"`; tables are merged key by key, the extending profile winning.
"""

from __future__ import annotations

import copy
import difflib
import functools
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from objdebug.core.errors import InputError
from objdebug.core.settings import Settings
from objdebug.pipeline.setting_ranges import cross_problem, problem


@dataclass
class Profile:
    name: str
    source: str
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def stages(self) -> list[str]:
        return list(self.data.get("stages", []))

    def section(self, name: str) -> Settings:
        """One section, strict: a key missing from checks/default.toml raises (objdebug.core.settings)."""
        return Settings(name, self.data.get(name, {}))

    @property
    def fail_on_warn(self) -> bool:
        return self.data.get("fail_on", "fail") == "warn"

    @property
    def error_fails(self) -> bool:
        return bool(self.data.get("error_fails", True))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "settings": self.data}


def _profiles_dir():
    """The shipped profiles: `objdebug.checks` when installed, `checks/` in a source checkout
    (there the top-level folder is not inside the package)."""
    try:
        return resources.files("objdebug.checks")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "checks"


def builtin_profiles() -> list[str]:
    return sorted(p.name[:-5] for p in _profiles_dir().iterdir() if p.name.endswith(".toml"))


def _read(name_or_path: str) -> tuple[dict[str, Any], str]:
    path = Path(name_or_path)
    if name_or_path.endswith(".toml") or path.is_file():
        if not path.is_file():
            raise InputError("profile file not found", source=str(path))
        try:
            text, source = path.read_text(encoding="utf-8"), str(path.resolve())
        except UnicodeDecodeError as exc:
            raise InputError(f"profile is not valid TOML: not UTF-8 text (byte "
                             f"0x{exc.object[exc.start]:02x} at offset {exc.start})",
                             source=str(path.resolve())) from None
        except OSError as exc:  # a directory, no permission
            raise InputError(f"cannot read the profile: {exc.strerror}", source=str(path)) from None
    else:
        res = _profiles_dir() / f"{name_or_path}.toml"
        if not res.is_file():
            raise InputError(f"For '--profile', the value must be one of {builtin_profiles()} "
                             f"or a .toml path, but got '{name_or_path}'.")
        text, source = res.read_text(encoding="utf-8"), f"builtin:{name_or_path}"
    try:
        return tomllib.loads(text), source
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"profile is not valid TOML: {exc}", source=source) from None


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# Tables whose keys the user chooses (code prefixes, dtype names): only their values are typed.
# A table that is empty in default.toml is open as well.
OPEN_TABLES: dict[str, type | tuple[type, ...]] = {
    "baseline.tolerances": (int, float),   # code prefix -> absolute tolerance
    "baseline.directions": str,            # code prefix -> "higher" | "lower" | ...
    "stress.low_precision_rtol": (int, float),  # dtype name -> relative tolerance
}
_FREE_KEYS = ("name", "description", "extends")  # a profile's own identity, not settings


@functools.lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    """default.toml as read: every profile key and its type (tests/test_config.py keeps it valid)."""
    return _read("default")[0]


def _where(path: list[str]) -> str:
    """['align', 'gap_pas'] -> '[align] gap_pas' (the style of the other profile messages)."""
    return path[0] if len(path) == 1 else f"[{'.'.join(path[:-1])}] {path[-1]}"


def _type_name(example: Any) -> str:
    if isinstance(example, bool):
        return "true or false"
    if isinstance(example, (int, float)):
        return "an integer" if isinstance(example, int) else "a number"
    if isinstance(example, str):
        return "a string"
    if isinstance(example, list):
        return f"a list of {_type_name(example[0]).removeprefix('a ').removeprefix('an ')}s" \
            if example else "a list"
    return "a table" if isinstance(example, dict) else type(example).__name__


def _same_type(value: Any, example: Any) -> bool:
    if isinstance(example, bool) or isinstance(value, bool):
        return isinstance(example, bool) and isinstance(value, bool)
    if isinstance(example, float):
        return isinstance(value, (int, float))  # 2 for 2.0 is fine
    if isinstance(example, list):
        return isinstance(value, list) and (not example or all(_same_type(v, example[0]) for v in value))
    return isinstance(value, type(example))


def _check_schema(data: dict[str, Any], schema: dict[str, Any], source: str,
                  path: list[str] | None = None) -> None:
    """Every key of a profile file must exist in default.toml, with a value of the same type: a
    typo (`gap_pas`) or a string for a number would otherwise be ignored silently."""
    path = path or []
    for key, value in data.items():
        here = path + [key]
        dotted = ".".join(here)
        if not path and key in _FREE_KEYS:
            continue
        if dotted in OPEN_TABLES or (isinstance(schema.get(key), dict) and not schema[key]):
            types = OPEN_TABLES.get(dotted)
            if not isinstance(value, dict):
                raise InputError(f"For '{_where(here)}', the value must be a table, but got {value!r}.",
                                 source=source)
            for k, v in value.items():
                if types is not None and (isinstance(v, bool) or not isinstance(v, types)):
                    want = "a string" if types is str else "a number"
                    raise InputError(f"For '{_where(here + [k])}', the value must be {want}, but got "
                                     f"{v!r}.", source=source)
                _check_range(here + [k], dotted, v, None, source)
            continue
        if key not in schema:
            close = difflib.get_close_matches(key, [k for k in schema if k not in _FREE_KEYS], n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            table = f"[{'.'.join(path)}]" if path else "the top level"
            raise InputError(f"For '{_where(here)}', unknown profile key{hint}; the keys of {table} "
                             f"are those of checks/default.toml", source=source)
        example = schema[key]
        if isinstance(example, dict):
            if not isinstance(value, dict):
                raise InputError(f"For '{_where(here)}', the value must be a table ([{dotted}]), but "
                                 f"got {value!r}.", source=source)
            _check_schema(value, example, source, here)
        elif not _same_type(value, example):
            raise InputError(f"For '{_where(here)}', the value must be {_type_name(example)} (as in "
                             f"checks/default.toml), but got {value!r}.", source=source)
        else:
            _check_range(here, dotted, value, example, source)


def _check_range(here: list[str], dotted: str, value: Any, example: Any, source: str) -> None:
    """The value within its key's range (setting_ranges.RANGES): checked in the file that sets it,
    so the message names that file, before any MindSpore work."""
    first = example[0] if isinstance(example, list) and example else example
    integer = isinstance(first, int) and not isinstance(first, bool)
    wrong = problem(dotted, value, integer)
    if wrong is not None:
        raise InputError(f"For '{_where(here)}', {wrong}", source=source)


def load_profile(name_or_path: str = "default", _depth: int = 0) -> Profile:
    data, source = _read(name_or_path)
    _check_schema(data, _schema(), source)
    parent = data.pop("extends", None)
    if parent is not None and (not isinstance(parent, str) or not parent):
        raise InputError(f"For 'extends', the value must be a profile name ({builtin_profiles()}) or "
                         f"a .toml path, but got {parent!r}.", source=source)
    if parent:
        if _depth > 5:
            raise InputError("profile 'extends' chain is too deep", source=source)
        if str(parent).endswith(".toml") and not Path(parent).is_absolute() and not source.startswith("builtin:"):
            parent = str(Path(source).parent / parent)  # relative to the extending profile
        elif not parent.endswith(".toml") and not Path(parent).is_file() \
                and not (_profiles_dir() / f"{parent}.toml").is_file():
            # the profile that names it is to blame, not '--profile'
            raise InputError(f"For 'extends', the value must be one of {builtin_profiles()} or a "
                             f".toml path, but got {parent!r}.", source=source)
        data = _merge(load_profile(parent, _depth + 1).data, data)
    elif source != "builtin:default":
        # every profile stands on default.toml: the one place a setting's default is written
        base = {k: v for k, v in _read("default")[0].items() if k not in _FREE_KEYS}
        data = _merge(base, data)
    if _depth == 0:
        _validate(data, source)
    return Profile(name=str(data.get("name", Path(name_or_path).stem)), source=source, data=data)


def _validate(data: dict[str, Any], source: str) -> None:
    """The gate policy keys: a typo here would silently change what fails a CI run."""
    from objdebug.pipeline.registry import pipeline_order

    if data.get("fail_on", "fail") not in ("fail", "warn"):
        raise InputError(f"For 'fail_on', the value must be in ['fail', 'warn'], but got "
                         f"{data.get('fail_on')!r}.", source=source)
    if not isinstance(data.get("error_fails", True), bool):
        raise InputError(f"For 'error_fails', the value must be true or false, but got "
                         f"{data.get('error_fails')!r}.", source=source)
    pipeline_order(data["stages"], "stages", source)
    for key in ("select", "ignore"):
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InputError(f"For '{key}', the value must be a list of code prefixes, but got "
                             f"{value!r}.", source=source)
    # numbers, their ranges and the verdict words: each file's own values, in _check_schema
    contradiction = cross_problem(data)  # pairs of keys that must be ordered (issue 46)
    if contradiction:
        raise InputError(contradiction, source=source)


def code_selected(code: str, select: list[str], ignore: list[str]) -> bool:
    """ruff-style selection by code prefix: the longest matching prefix decides; ties keep the code."""
    best_sel = max((len(p) for p in select if code.startswith(p)), default=-1 if select else 0)
    best_ign = max((len(p) for p in ignore if code.startswith(p)), default=-1)
    return best_sel >= best_ign and best_sel >= 0
