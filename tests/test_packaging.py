"""The non-editable install must carry every subpackage and data file the tool reads at run time."""

import tomllib

from .conftest import ROOT


def test_every_subpackage_is_listed_in_pyproject():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(meta["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "objdebug").rglob("__init__.py")}
    assert found - listed == set()
    assert "objdebug.checks" in listed  # the top-level checks/ folder, shipped as objdebug.checks


def test_package_data_covers_demo_rules_and_profiles():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = meta["tool"]["setuptools"]["package-data"]
    assert {"demo/*.ckpt", "demo/*.jsonl", "demo/*.toml", "rules/*.md"} <= set(data["objdebug"])
    assert data["objdebug.checks"] == ["*.toml"]
    for pattern in data["objdebug"]:
        assert list((ROOT / "objdebug").glob(pattern)), pattern
