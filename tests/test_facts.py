"""One source per fact: settings only in checks/default.toml, rule metadata only in the rule pages.

No MindSpore: the code is read, not run (a static scan of the settings each module reads), so a key
that a rarely taken branch reads is covered too.
"""

from __future__ import annotations

import ast
import functools
import tomllib
from pathlib import Path

import pytest

from objdebug.pipeline import baseline
from objdebug import monitor
from objdebug.core.findings import Check, Verdict
from objdebug.pipeline.profile import load_profile
from objdebug.rules import all_rules, codes_of
from objdebug.core.settings import MissingSetting, Settings
from objdebug.pipeline.registry import STAGES
from objdebug.stages import stage_checks

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "objdebug"
DEFAULT = tomllib.loads((ROOT / "checks" / "default.toml").read_text(encoding="utf-8"))

# the profile section a module's settings come from (by file or folder)
SECTIONS = {"stages/align": "align", "stages/grad": "grad", "stages/decompose": "decompose",
            "stages/correlate": "correlate", "model_state.py": "model_state", "baseline.py": "baseline",
            "stages/invariants": "invariants", "stages/stress": "stress",
            "stages/preference": "preference", "stages/packing": "packing"}
SETTINGS_NAMES = {"th", "settings"}                    # what a settings section is called in code
SETTINGS_CALLS = {"_settings", "settings", "section"}  # ... and the calls that return one


def _section_of(path: Path) -> str | None:
    rel = path.as_posix()
    for key, section in SECTIONS.items():
        if rel.endswith("/" + key) or f"/{key}/" in rel:
            return section
    return None


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _is_settings(node: ast.AST, local_names: set[str]) -> tuple[bool, str | None]:
    """Is `node` a settings section, and which one when the code names it (section("x"))?"""
    if isinstance(node, ast.Name):
        return node.id in SETTINGS_NAMES | local_names, None
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in SETTINGS_CALLS:
            arg = node.args[0] if node.args else None
            return True, arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None
    return False, None


@functools.lru_cache(maxsize=1)
def settings_reads() -> list[tuple[str, int, str | None, str, bool]]:
    """(file, line, section, key, has a fallback default) for every settings read in the package."""
    reads = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("settings.py", "profile.py", "config.py") or "report" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        # `s = _settings(ctx)`: a local short name for a section
        local = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                 and _is_settings(node.value, set())[0] and isinstance(node.value, ast.Call)
                 for t in node.targets if isinstance(t, ast.Name)}
        section = _section_of(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                    and isinstance(node.slice.value, str):
                yes, named = _is_settings(node.value, local)
                if yes:
                    reads.append((_rel(path), node.lineno, named or section, node.slice.value, False))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "get" and node.args and isinstance(node.args[0], ast.Constant):
                yes, named = _is_settings(node.func.value, local)
                if yes:
                    reads.append((_rel(path), node.lineno, named or section, str(node.args[0].value),
                                  len(node.args) > 1))
    return reads


def test_the_scan_sees_the_settings_reads():
    reads = settings_reads()
    assert len(reads) > 120  # ~150 today: a scan that finds nothing proves nothing
    assert ("stages/align/alignment.py", "align", "gap_pass") in {(f, s, k) for f, _, s, k, _ in reads}


def test_every_setting_read_exists_in_default_toml_without_a_code_default():
    missing, fallbacks = [], []
    for file, line, section, key, fallback in settings_reads():
        where = f"{file}:{line} [{section}] {key}"
        if fallback:
            fallbacks.append(where)
        if section is None:
            if not any(isinstance(t, dict) and key in t for t in DEFAULT.values()):
                missing.append(where)
        elif key not in DEFAULT.get(section, {}):
            missing.append(where)
    assert not missing, f"settings read but not in checks/default.toml: {missing}"
    assert not fallbacks, f"defaults written in code (they belong in checks/default.toml): {fallbacks}"


def test_settings_are_strict():
    th = load_profile("default").section("grad")
    assert th["ratio_pass"] == DEFAULT["grad"]["ratio_pass"]
    with pytest.raises(MissingSetting, match=r"\[grad\] vanish_warn missing from checks/default.toml"):
        th["vanish_warn"]
    with pytest.raises(MissingSetting):
        th.get("vanish_warn")
    with pytest.raises(TypeError, match="default is not allowed"):
        th.get("ratio_pass", 10.0)
    assert th.replace(ratio_pass=3.0)["ratio_pass"] == 3.0 and th["ratio_pass"] == 10.0


def test_a_profile_without_extends_stands_on_default(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('name = "mine"\n[align]\ngap_pass = 2.0\n', encoding="utf-8")
    prof = load_profile(str(path))
    assert prof.name == "mine" and prof.section("align")["gap_pass"] == 2.0
    assert prof.section("align")["gap_fail"] == DEFAULT["align"]["gap_fail"]
    assert prof.section("monitor") == Settings("monitor", DEFAULT["monitor"])


def test_monitor_thresholds_come_from_default_toml():
    assert dict(monitor.monitor_thresholds()) == DEFAULT["monitor"]
    assert monitor.monitor_thresholds(overrides={"ratio_warn": 3.0})["ratio_warn"] == 3.0


# --------------------------------------------------------------------------- rule metadata
def _checks() -> list[Check]:
    return [c for stage in STAGES for c in stage_checks(stage)]


def test_every_check_reports_the_codes_its_rules_name():
    names = [c.name for c in _checks()]
    assert len(names) == len(set(names)), "check names must be unique: rule pages name them"
    owners = set(names) | {"monitor", baseline.CHECK, "model-state", "nothing-checked",
                             "logit-coverage"}
    for code, rule in all_rules().items():
        assert rule.checks, f"{code}: no `check:` in the front matter"
        assert set(rule.checks) <= owners, f"{code}: unknown check(s) {set(rule.checks) - owners}"
    for check in _checks():
        assert check.codes, f"check {check.name}: no rule page names it"
        assert all(all_rules()[c].stage == check.stage for c in check.codes), check.name
    assert monitor.CODES == codes_of("monitor") == ("OBJ301", "OBJ303", "OBJ601", "OBJ602", "OBJ603", "OBJ604")


def test_baseline_directions_come_from_the_rule_pages():
    assert baseline.direction("OBJ101") == ("higher", None)
    assert baseline.direction("OBJ206") == ("lower", 0.01)
    assert baseline.direction("OBJ403") == ("abs_lower", None)
    assert baseline.direction("OBJ813") == ("none", None)
    assert baseline.direction("OBJ999") == ("none", None)  # no page: not compared
    # a profile's prefix overrides the page, the longest prefix first
    assert baseline.direction("OBJ403", {"OBJ4": "none"}) == ("none", None)
    assert baseline.direction("OBJ403", {"OBJ4": "none", "OBJ40": "higher"}) == ("higher", None)
    assert not isinstance(getattr(baseline, "DIRECTIONS", None), dict)  # no second table


def test_one_finding_factory_takes_the_fix_from_the_rule():
    from objdebug.core.findings import Finding

    fail = Finding.of("OBJ101", Verdict.FAIL, "m", check="alignment", stage="align", value=1.0)
    assert fail.fix == all_rules()["OBJ101"].fix and fail.value == 1.0
    assert Finding.of("OBJ101", Verdict.INFO, "m", check="c", stage="s").fix  # a note keeps its fix
    assert Finding.of("OBJ101", Verdict.PASS, "m", check="c", stage="s").fix == ""


def test_one_nan_codec_round_trips():
    import json
    import math

    import numpy as np

    from objdebug.core.jsonsafe import encode, number

    data = encode({"a": float("nan"), "b": np.float32(np.inf), "c": [-math.inf, np.int64(3)],
                   "d": Settings("x", {"k": 1.5}), "e": Verdict.WARN})
    assert data == {"a": "NaN", "b": "Infinity", "c": ["-Infinity", 3], "d": {"k": 1.5}, "e": "WARN"}
    json.dumps(data, allow_nan=False)
    assert math.isnan(number("NaN")) and number("Infinity") == math.inf and number("-Infinity") == -math.inf
    assert number(2) == 2.0 and number(True) is None and number("1.5") is None and number(None) is None


def test_a_chain_of_profiles_without_default_stands_on_default(tmp_path):
    (tmp_path / "base.toml").write_text('name = "base"\n[grad]\nratio_pass = 5.0\n', encoding="utf-8")
    (tmp_path / "top.toml").write_text('extends = "base.toml"\nname = "top"\n[grad]\nratio_fail = 9.0\n',
                                       encoding="utf-8")
    th = load_profile(str(tmp_path / "top.toml")).section("grad")
    assert (th["ratio_pass"], th["ratio_fail"], th["fd_pass"]) == (5.0, 9.0, DEFAULT["grad"]["fd_pass"])
