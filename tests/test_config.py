"""The target contract: discovery, overrides, validation, path resolution."""

from pathlib import Path

import pytest

from objdebug.core.config import find_config, load_config, parse_override
from objdebug.core.errors import InputError
from objdebug.pipeline.profile import builtin_profiles, code_selected, load_profile

from .conftest import TARGETS
from .doc_snippets import ecosystem_snippets, section_blocks


def test_demo_config_resolves_paths():
    cfg = load_config(demo=True)
    assert Path(cfg.model.checkpoint).is_absolute() and Path(cfg.model.checkpoint).is_file()
    assert Path(cfg.data.align).is_file() and Path(cfg.data.scores).is_file()
    assert cfg.objective.call == "flat" and not cfg.end_to_end


def test_overrides_parse_toml_values():
    assert parse_override("data.label_pad_id=0") == ("data.label_pad_id", 0)
    assert parse_override("objective.kwargs={ignore_index = 3}") == ("objective.kwargs", {"ignore_index": 3})
    assert parse_override("run.device=GPU") == ("run.device", "GPU")  # bare words stay strings
    cfg = load_config(TARGETS / "tiny" / "objdebug.toml", overrides=dict([parse_override("data.shift=false")]))
    assert cfg.data.shift is False
    with pytest.raises(InputError, match="section.key=value"):
        parse_override("nonsense")
    with pytest.raises(InputError, match="section"):
        load_config(TARGETS / "tiny" / "objdebug.toml", overrides={"label_pad_id": 0})


def test_pyproject_tool_table_is_found(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[tool.objdebug.objective]\nfactory = "mindspore.nn:CrossEntropyLoss"\n')
    assert find_config(tmp_path) == tmp_path / "pyproject.toml"
    cfg = load_config(tmp_path / "pyproject.toml")
    assert cfg.end_to_end and cfg.objective.factory == "mindspore.nn:CrossEntropyLoss"


def test_pyproject_without_tool_table_is_not_a_config(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert find_config(tmp_path) is None


@pytest.mark.parametrize("text, message", [
    ('[model]\nfactory = "a:b"\n', "missing [objective]"),
    ('[objective]\nfactory = "no_colon"\n', "'module:callable'"),
    ('[objective]\nfactory = "a:b"\ncall = "weird"\n', "objective.call"),
    ('[objective]\nfactory = "a:b"\n[run]\nmode = "eager"\n', "run.mode"),
    ('[objective]\nfactory = "a:b"\n[data]\npad_id = "zero"\n', "data.pad_id"),
    ('[objective]\nfactory = "a:b"\n[data]\nshift = 1\n', "data.shift"),
    ('[objective]\nfactory = "a:b"\n[extra]\nx = 1\n', "unknown section"),
    ('[objective]\nkwargs = {}\n', "[objective]"),
])
def test_invalid_configs(tmp_path, text, message):
    path = tmp_path / "objdebug.toml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        load_config(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_profiles_ship_and_extend():
    assert "default" in builtin_profiles()
    prof = load_profile("default")
    assert prof.section("align")["gap_pass"] == 1.5 and prof.section("align")["gap_fail"] == 0.1
    assert prof.stages == ["align", "grad", "invariants", "decompose", "correlate", "preference", "stress"]


def test_profile_path_extends_default(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('extends = "default"\nname = "mine"\n[align]\ngap_pass = 3.0\n')
    prof = load_profile(str(path))
    assert prof.name == "mine"
    assert prof.section("align")["gap_pass"] == 3.0
    assert prof.section("align")["gap_fail"] == 0.1  # inherited


def test_code_selection_more_specific_wins():
    assert code_selected("OBJ101", [], [])
    assert not code_selected("OBJ101", [], ["OBJ1"])
    assert code_selected("OBJ101", ["OBJ101"], ["OBJ1"])
    assert not code_selected("OBJ102", ["OBJ1"], ["OBJ102"])
    assert not code_selected("OBJ201", ["OBJ1"], [])


def test_factory_package_found_in_a_parent_folder(tmp_path):
    """A config in configs/ names mypkg.models:build with mypkg/ at the repository root."""
    from objdebug.engine.target import import_factory

    pkg = tmp_path / "odbg_parentpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "models.py").write_text("def build():\n    return 'built'\n")
    configs = tmp_path / "configs" / "deep"
    configs.mkdir(parents=True)
    fn = import_factory("odbg_parentpkg.models:build", "model", str(configs))
    assert fn() == "built"


def test_profile_paths_are_relative_to_the_file_that_names_them(tmp_path):
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "base.toml").write_text('extends = "default"\n[align]\ngap_pass = 2.5\n')
    (tmp_path / "profiles" / "team.toml").write_text('extends = "base.toml"\nname = "team"\n')
    (tmp_path / "objdebug.toml").write_text(
        '[objective]\nfactory = "a:b"\n[run]\nprofile = "profiles/team.toml"\n')
    cfg = load_config(tmp_path / "objdebug.toml")
    assert cfg.run.profile == str(tmp_path / "profiles" / "team.toml")
    prof = load_profile(cfg.run.profile)
    assert prof.name == "team" and prof.section("align")["gap_pass"] == 2.5


@pytest.mark.parametrize("text, message", [
    ('fail_on = "warning"\n', "'fail_on'"),
    ('error_fails = "yes"\n', "'error_fails'"),
    ('stages = ["align", "gradient"]\n', "'stages'"),
    ('ignore = "OBJ1"\n', "'ignore'"),
    ('[engine]\nbatch_size = 0\n', "batch_size"),
])
def test_profile_gate_keys_are_validated(tmp_path, text, message):
    path = tmp_path / "p.toml"
    path.write_text('extends = "default"\n' + text)
    with pytest.raises(InputError) as err:
        load_profile(str(path))
    assert message in str(err.value) and str(path) in str(err.value)


# --------------------------------------------------------------------------- docs/config.md's library snippets
LIBRARY_SECTION = "### Models from MindFormers and HF-style ports"


def test_every_library_snippet_of_the_docs_is_marked_and_loads_as_a_config(tmp_path):
    """docs/config.md's MindFormers / HF-style snippets: each marked (the ecosystem test runs it on
    the real library, tests/test_ecosystem_real.py) and each a valid config whose factories exist."""
    import importlib.util

    snippets = ecosystem_snippets()
    assert sorted(snippets.values()) == sorted(section_blocks(LIBRARY_SECTION)), \
        "every ```toml block of the section carries an `<!-- ecosystem snippet: NAME -->` marker"
    assert {"mindone-model", "mindformers-model", "mindone-own-loss", "mindformers-own-loss"} <= set(snippets)
    for name, text in snippets.items():
        path = tmp_path / name / "objdebug.toml"
        path.parent.mkdir()
        path.write_text(text, encoding="utf-8")
        cfg = load_config(path)
        assert Path(cfg.data.align) == path.parent / "align.jsonl", name
        for spec in (cfg.model, cfg.objective):
            if spec is not None:
                module, attr = spec.factory.split(":")
                found = importlib.util.find_spec(module)  # not imported: the libraries are optional
                assert found is not None and f"def {attr}" in Path(found.origin).read_text() \
                    or module.startswith("fixtures.llama"), (name, spec.factory)
