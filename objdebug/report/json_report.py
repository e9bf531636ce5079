"""The JSON report: self-describing, re-renderable, schema-versioned."""

from __future__ import annotations

import json
from typing import Any

from objdebug.core import jsonsafe
from objdebug.core.jsonsafe import encode as _clean
from objdebug.report import write_atomic

# The report layout's version, written in every report and checked on read (render, --baseline).
# Raise it when a reader of the old layout would misread a new report (a key renamed, moved or
# given another meaning); adding a key does not need it. A reader refuses newer versions only.
SCHEMA_VERSION = 1


def to_dict(result) -> dict[str, Any]:
    return _clean({
        "schema_version": SCHEMA_VERSION,
        "tool": "objdebug",
        "created": result.created,
        "passed": result.passed,
        "exit_code": result.exit_code,
        "strict": result.strict,
        "summary": result.counts(),
        "stages": result.stages,
        "device": result.config.run.device,
        "mode": result.config.run.mode,
        "seed": result.config.run.seed,
        "config": result.config.to_dict(),
        "profile": result.profile.to_dict(),
        "options": result.options,
        "target": result.target,
        "versions": result.versions,
        "timings": {k: round(v, 3) for k, v in result.timings.items()},
        "compiles": result.compiles,
        "results": [r.to_dict() for r in result.results],
        "extra": result.extra,
    })


def dumps(result) -> str:
    return dumps_dict(to_dict(result))


def dumps_dict(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=False) + "\n"


def write(result, path: str) -> None:
    write_atomic(path, dumps(result))


def write_dict(report: dict[str, Any], path: str) -> None:
    write_atomic(path, dumps_dict(report))


def load(path: str, renderable: bool = False) -> dict[str, Any]:
    """A saved report; `renderable`: also everything the renderers read (structure_problem)."""
    from objdebug.core.errors import InputError

    try:
        with open(path, encoding="utf-8") as fh:
            data = jsonsafe.load(fh)
    except FileNotFoundError:
        raise InputError("report not found", source=path) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"not a JSON report: {exc.msg} (line {exc.lineno})", source=path) from None
    except UnicodeDecodeError:
        raise InputError("not a JSON report (not UTF-8 text)", source=path) from None
    except OSError as exc:  # a directory, no permission
        raise InputError(f"cannot read the report: {exc.strerror}", source=path) from None
    if not isinstance(data, dict) or data.get("tool") != "objdebug" or "schema_version" not in data:
        raise InputError("not an objdebug JSON report (no 'schema_version')", source=path)
    problem = schema_problem(data["schema_version"])
    if problem:
        raise InputError(problem, source=path)
    problem = structure_problem(data) if renderable else None
    if problem:
        raise InputError(f"not a well-formed objdebug report: {problem}", source=path)
    return data


def schema_problem(version: Any) -> str | None:
    """Why a report of this schema version cannot be read here, or None."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        return f"For 'schema_version', the value must be an integer >= 1, but got {version!r}."
    if version > SCHEMA_VERSION:
        from objdebug import __version__

        return (f"the report has schema_version {version}, newer than this objdebug "
                f"{__version__} reads (<= {SCHEMA_VERSION}): upgrade objdebug to read it")
    return None


_TABLES = ("config", "profile", "target", "versions", "timings", "compiles", "extra", "options")
_VERDICTS = ("PASS", "INFO", "WARN", "FAIL", "ERROR", "SKIP")


def structure_problem(data: dict[str, Any]) -> str | None:
    """What the renderers rely on, checked once: 'results[2].findings[0]: no 'verdict'' or None."""
    def kind(x):
        return "null" if x is None else type(x).__name__

    if not isinstance(data.get("summary"), dict) or not all(
            isinstance(v, int) for v in data["summary"].values()):
        return f"'summary' must be an object of counts, but got {kind(data.get('summary'))}"
    stages = data.get("stages", [])
    if not isinstance(stages, list) or not all(isinstance(s, str) for s in stages):
        return f"'stages' must be a list of stage names, but got {kind(stages)}"
    for key in _TABLES:
        if key in data and not isinstance(data[key], dict):
            return f"'{key}' must be an object, but got {kind(data[key])}"
    results = data.get("results")
    if not isinstance(results, list):
        return f"'results' must be a list, but got {kind(results)}"
    for i, res in enumerate(results):
        where = f"results[{i}]"
        if not isinstance(res, dict):
            return f"'{where}' must be an object, but got {kind(res)}"
        for key in ("stage", "check"):
            if not isinstance(res.get(key), str):
                return f"'{where}.{key}' must be a string, but got {kind(res.get(key))}"
        if not isinstance(res.get("findings"), list):
            return f"'{where}.findings' must be a list, but got {kind(res.get('findings'))}"
        if res.get("seconds") is not None and (isinstance(res["seconds"], bool)
                                               or not isinstance(res["seconds"], (int, float))):
            return f"'{where}.seconds' must be a number, but got {kind(res['seconds'])}"
        for j, f in enumerate(res["findings"]):
            here = f"{where}.findings[{j}]"
            if not isinstance(f, dict):
                return f"'{here}' must be an object, but got {kind(f)}"
            for key in ("code", "message"):
                if not isinstance(f.get(key), str):
                    return f"'{here}.{key}' must be a string, but got {kind(f.get(key))}"
            if f.get("verdict") not in _VERDICTS:
                return f"'{here}.verdict' must be one of {list(_VERDICTS)}, but got {f.get('verdict')!r}"
            for key in ("fix", "condition"):
                if f.get(key) is not None and not isinstance(f[key], str):
                    return f"'{here}.{key}' must be a string, but got {kind(f[key])}"
    return None
