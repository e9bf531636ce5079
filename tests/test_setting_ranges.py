"""Issue 35: profile thresholds are checked for finiteness, sign and range (and verdict words) when
the profile is read, before any MindSpore work: a `nan` floor turned the dropped-last-token fixture
(must fail OBJ209) into exit 0, `contract_rows = -5` / `[packing] rows = 0` were accepted."""

import re
import tomllib
from pathlib import Path

import pytest

from objdebug.core.errors import InputError
from objdebug.pipeline.profile import OPEN_TABLES, builtin_profiles, load_profile
from objdebug.pipeline.setting_ranges import ORDERED, RANGES, VERDICT, cross_problem, interval

from .conftest import cli_exit_2

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = tomllib.loads((ROOT / "checks" / "default.toml").read_text(encoding="utf-8"))
SUP_LAST_DROPPED = ROOT / "fixtures" / "targets" / "sup_last_dropped" / "objdebug.toml"


def _keys(table, prefix=""):
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and dotted not in OPEN_TABLES:
            yield from _keys(value, dotted + ".")
        else:
            yield dotted, value


def _numeric(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, list):  # an empty list of lengths is still a list of numbers
        return not value or _numeric(value[0])
    return isinstance(value, (int, float))


def test_every_numeric_key_of_default_toml_has_a_range():
    numeric = [k for k, v in _keys(DEFAULT) if _numeric(v) and k not in ("select", "ignore", "stages")]
    numeric += [k for k, types in OPEN_TABLES.items() if types is not str]
    assert len(numeric) > 140  # 147 in December 2026
    missing = [k for k in numeric if k not in RANGES]
    assert not missing, f"keys of checks/default.toml without a range in setting_ranges.RANGES: {missing}"
    stale = [k for k in RANGES if k not in dict(_keys(DEFAULT)) and k not in OPEN_TABLES]
    assert not stale, f"RANGES names keys default.toml lacks: {stale}"


def test_every_float_range_is_finite_unless_its_default_is_infinite():
    for key, value in _keys(DEFAULT):
        rule = RANGES.get(key)
        if isinstance(rule, str):
            span = interval(rule)
            infinite_default = isinstance(value, float) and abs(value) == float("inf")
            assert infinite_default or not (span.high_closed and span.high == float("inf")), key
            assert infinite_default or not (span.low_closed and span.low == float("-inf")), key


def test_every_verdict_setting_the_code_reads_has_its_words():
    """Verdict.from_setting(th["x"], "[section] x") in the code: the key is checked at load."""
    read = set()
    for path in (ROOT / "objdebug").rglob("*.py"):
        read |= set(re.findall(r"from_setting\(th\[\"?'?(\w+)[\"']?\],\s*f?\"\[(\w+)\]",
                               path.read_text(encoding="utf-8")))
    assert len(read) >= 12
    for key, section in read:
        if key == "setting":  # garbage_ids.py reads two keys through a variable
            continue
        assert RANGES.get(f"{section}.{key}") == VERDICT, f"{section}.{key}"
    assert RANGES["stress.label_out_of_range"] == RANGES["stress.input_out_of_range"] == VERDICT


@pytest.mark.parametrize("name", builtin_profiles())
def test_every_shipped_profile_lies_inside_the_ranges(name):
    load_profile(name)


@pytest.mark.parametrize("section, key, value, needle", [
    ("grad", "coverage_zero_floor", "nan", "finite number in [0, 1], but got nan"),
    ("grad", "coverage_resolve_floor", "nan", "but got nan"),
    ("grad", "coverage_drop_ratio", "-1.0", "in [0, 1], but got -1.0"),
    ("grad", "coverage_zero_floor", "1e30", "but got 1e+30"),
    ("grad", "contract_rows", "-5", "an integer >= 1, but got -5"),
    ("grad", "coverage_empty_rows", '"fial"', "in ['info', 'warn', 'fail'], but got 'fial'"),
    ("grad", "fd_rel_steps", "[3e-4, inf]", "each value must be a finite number > 0, but got inf"),
    ("packing", "isolation_tolerance", "nan", "but got nan"),
    ("packing", "gradient_rtol", "nan", "but got nan"),
    ("packing", "unpacked_tolerance", "nan", "but got nan"),
    ("packing", "normalisation_rtol", "-inf", "but got -inf"),
    ("packing", "rows", "-2", "an integer >= 1, but got -2"),
    ("packing", "rows", "0", "an integer >= 1, but got 0"),
    ("baseline.tolerances", "OBJ2", "nan", "but got nan"),
    ("stress", "low_precision_forecast", '"never"', "but got 'never'"),
])
def test_a_value_outside_its_range_is_an_input_error_naming_file_and_key(tmp_path, section, key,
                                                                         value, needle):
    prof = tmp_path / "hostile.toml"
    prof.write_text(f'extends = "default"\n[{section}]\n{key} = {value}\n')
    with pytest.raises(InputError) as exc:
        load_profile(str(prof))
    text = str(exc.value)
    assert text.startswith(f"{prof.resolve()}: For '[{section}] {key}', the value must be") or \
        text.startswith(f"{prof.resolve()}: For '[{section}] {key}', each value must be"), text
    assert needle in text, text


def test_the_extending_file_is_named_not_the_one_that_extends_it(tmp_path):
    (tmp_path / "base.toml").write_text("[packing]\nrows = 0\n")
    (tmp_path / "top.toml").write_text('extends = "base.toml"\n')
    with pytest.raises(InputError, match=re.escape(f"{(tmp_path / 'base.toml').resolve()}: For "
                                                   f"'[packing] rows'")):
        load_profile(str(tmp_path / "top.toml"))


def test_the_nan_profile_no_longer_passes_the_dropped_last_token(tmp_path):
    """Before: `objdebug grad` on sup_last_dropped with these two floors nan was exit 0 ("OBJ209
    PASS ... >= nan ... at the 0 resolvable positions"); now exit 2 before the run."""
    prof = tmp_path / "nan.toml"
    prof.write_text("[grad]\ncoverage_zero_floor = nan\ncoverage_resolve_floor = nan\n")
    cli_exit_2(["grad", "-c", SUP_LAST_DROPPED, "--profile", prof, "--no-cache"], str(prof.resolve()),
               "'[grad] coverage_zero_floor'", "[0, 1]", "but got nan")


def test_a_verdict_typo_is_exit_2_before_the_grad_stage(tmp_path):
    prof = tmp_path / "typo.toml"
    prof.write_text('[grad]\ncoverage_empty_rows = "fial"\n')
    out = cli_exit_2(["grad", "-c", SUP_LAST_DROPPED, "--profile", prof, "--no-cache"],
                     "'[grad] coverage_empty_rows'", "'fial'")
    assert "compiling" not in out and "stage" not in out.lower().replace("stages", "")


# --------------------------------------------------------------------------- cross-key rules (issue 46)
def _toml(value) -> str:
    return "[" + ", ".join(_toml(v) for v in value) + "]" if isinstance(value, list) else repr(value)


def _violating(a, op, b):
    """Values of (a, b) that break `a op b`: the defaults swapped, or a list's largest element
    moved above the scalar (or a scalar above every element)."""
    sa, ka = a.split(".", 1)
    sb, kb = b.split(".", 1)
    va, vb = DEFAULT[sa][ka], DEFAULT[sb][kb]
    if isinstance(vb, list):
        return max(vb) + 1, vb
    return vb, va


@pytest.mark.parametrize("a, op, b", [(a, op, b) for a, op, b, _ in ORDERED])
def test_every_declared_pair_is_refused_in_the_wrong_order_and_kept_in_the_right_one(tmp_path, a, op, b):
    sa, ka = a.split(".", 1)
    sb, kb = b.split(".", 1)
    bad_a, bad_b = _violating(a, op, b)
    good = tmp_path / "good.toml"  # the defaults themselves hold the order: both set explicitly
    good.write_text(f'[{sa}]\n{ka} = {_toml(DEFAULT[sa][ka])}\n' + (f'[{sb}]\n' if sb != sa else "")
                    + f'{kb} = {_toml(DEFAULT[sb][kb])}\n')
    load_profile(str(good))
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[{sa}]\n{ka} = {_toml(bad_a)}\n' + (f'[{sb}]\n' if sb != sa else "")
                   + f'{kb} = {_toml(bad_b)}\n')
    with pytest.raises(InputError) as exc:
        load_profile(str(bad))
    text = str(exc.value)
    assert text.startswith(f"{bad.resolve()}: For '[{sa}] {ka}' = {bad_a!r} and '[{sb}] {kb}' = "
                           f"{bad_b!r}, the first must be {op} the second"), text
    assert "\n" not in text


def test_every_pair_names_keys_of_default_toml_with_ranges():
    assert len(ORDERED) >= 20
    for a, op, b, why in ORDERED:
        assert a in RANGES and b in RANGES and op in ("<=", "<", ">=") and why, (a, b)
    assert cross_problem(DEFAULT) is None  # the defaults hold every rule


def test_a_contradiction_split_over_two_files_names_the_profile_run(tmp_path):
    (tmp_path / "base.toml").write_text("[grad]\nratio_pass = 20.0\n")
    (tmp_path / "top.toml").write_text('extends = "base.toml"\n')
    with pytest.raises(InputError, match=re.escape("'[grad] ratio_pass' = 20.0 and '[grad] ratio_fail' = 15.0")):
        load_profile(str(tmp_path / "top.toml"))


def test_a_warn_beyond_fail_is_exit_2_in_one_line_before_any_work(tmp_path):
    prof = tmp_path / "swapped.toml"
    prof.write_text("[decompose]\nscale_warn = 5000.0\n")
    out = cli_exit_2(["grad", "-c", SUP_LAST_DROPPED, "--profile", prof, "--no-cache"],
                     "'[decompose] scale_warn' = 5000.0", "'[decompose] scale_fail' = 1000.0")
    assert "compiling" not in out


PACKING = ROOT / "fixtures" / "targets" / "packing_position_ids" / "objdebug.toml"
PREFERENCE = ROOT / "fixtures" / "targets" / "pref_healthy" / "objdebug.toml"


@pytest.mark.slow  # ~15-40 s (the packing model's contract probe); the profile pairs above are its CI twins
def test_packed_rows_longer_than_the_model_positions_are_exit_2_before_any_stage():
    """Was 4 ERRORs (exit 1) after the stage's work: 3 documents of the demo's rows make 135
    tokens, the model takes 60."""
    out = cli_exit_2(["run", "-c", PACKING, "--no-cache", "-q", "--set", "data.max_length=60"],
                     "For 'packing.documents' = 3 and the model's positions = 60", "135 tokens")
    assert "compiling" not in out


def test_a_preference_max_length_below_every_prompt_is_exit_2_before_any_stage(tmp_path):
    """Was exit 1 after the work: every pair cut to its prompt, OBJ805 FAIL "no usable gradient"."""
    prof = tmp_path / "short.toml"
    prof.write_text("[preference]\nmax_length = 3\n")
    cli_exit_2(["run", "-c", PREFERENCE, "--stages", "preference", "--no-cache", "-q", "--profile", prof],
               "For '[preference] max_length' = 3 and the shortest prompt of [data] preference = 19 tokens",
               "preference.jsonl:25")
