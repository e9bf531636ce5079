"""The JSON report: self-describing, re-renderable, schema-versioned."""

from __future__ import annotations

import json
from typing import Any

from objdebug.findings import _clean
from objdebug.report import write_atomic


def to_dict(result) -> dict[str, Any]:
    from objdebug.api import SCHEMA_VERSION

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
    return json.dumps(to_dict(result), indent=2, sort_keys=False) + "\n"


def write(result, path: str) -> None:
    write_atomic(path, dumps(result))


def load(path: str) -> dict[str, Any]:
    from objdebug.errors import InputError

    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
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
    return data
