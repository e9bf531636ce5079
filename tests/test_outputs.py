"""Nothing lost: an output that would replace an input of the run, or another output, or that
cannot be written, is exit 2 before any work (no model is loaded for these cases)."""

import os
import shutil
from pathlib import Path

import pytest

from .conftest import cli_exit_2
from typer.testing import CliRunner

from objdebug.cli import app

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "synthetic.json"
runner = CliRunner()




@pytest.fixture
def report(tmp_path):
    path = tmp_path / "r.json"
    shutil.copy(GOLDEN, path)
    return path


def test_json_over_the_checkpoint(tiny_target):
    ckpt = tiny_target / "tiny.ckpt"
    cli_exit_2(["align", "-c", tiny_target / "objdebug.toml", "--json", ckpt],
                  "For '--json'", "is model.checkpoint", unchanged=[ckpt])


def test_json_over_the_data(tiny_target):
    data = tiny_target / "align.jsonl"
    cli_exit_2(["align", "-c", tiny_target / "objdebug.toml", "--json", data], "is data.align",
                  unchanged=[data])


def test_junit_over_the_config(tiny_target):
    cfg = tiny_target / "objdebug.toml"
    cli_exit_2(["align", "-c", cfg, "--junit", cfg], "For '--junit'", "is the config",
                  unchanged=[cfg])


def test_json_over_the_config_through_a_relative_path(tiny_target, monkeypatch):
    monkeypatch.chdir(tiny_target)
    cfg = tiny_target / "objdebug.toml"
    cli_exit_2(["align", "--json", "./sub/../objdebug.toml"], "is the config", unchanged=[cfg])


def test_json_over_the_profile_and_the_baseline(tiny_target, tmp_path, report):
    profile = tmp_path / "p.toml"
    profile.write_text('extends = "default"\n')
    cfg = tiny_target / "objdebug.toml"
    cli_exit_2(["align", "-c", cfg, "-p", profile, "--junit", profile], "is the profile",
                  unchanged=[profile])
    cli_exit_2(["align", "-c", cfg, "--baseline", report, "--json", report], "is --baseline",
                  unchanged=[report])


def test_markdown_dir_over_an_input(tiny_target):
    """--markdown DIR writes DIR/report.md: an input of that name is refused."""
    data = tiny_target / "report.md"
    shutil.copy(tiny_target / "align.jsonl", data)
    cli_exit_2(["align", "-c", tiny_target / "objdebug.toml", "--set", "data.align='report.md'",
                   "--markdown", tiny_target], "For '--markdown'", unchanged=[data])


def test_render_over_the_report_it_renders(report):
    cli_exit_2(["render", report, "--junit", report], "is the report being rendered",
                  unchanged=[report])


def test_two_outputs_one_path(tiny_target, tmp_path):
    out = tmp_path / "same.out"
    cli_exit_2(["align", "-c", tiny_target / "objdebug.toml", "--json", out, "--junit", out],
                  "For '--junit'", "must differ from '--json'")
    assert not out.exists()
    cli_exit_2(["align", "-c", tiny_target / "objdebug.toml", "--json", tmp_path / "x",
                   "--html", tmp_path / "x"], "must differ")


def test_output_is_an_existing_directory(tiny_target, tmp_path):
    cli_exit_2(["align", "-c", tiny_target / "objdebug.toml", "--json", tmp_path],
                  "For '--json'", "is a directory")


def test_empty_output_path(tiny_target, monkeypatch, tmp_path):
    """'' is the working directory to the shell's Path: a directory where a file is needed."""
    monkeypatch.chdir(tmp_path)
    cli_exit_2(["align", "-c", tiny_target / "objdebug.toml", "--junit", ""], "For '--junit'",
                  "is a directory")


def test_file_where_a_directory_is_needed(tiny_target, tmp_path):
    afile = tmp_path / "plain.txt"
    afile.write_text("x")
    cfg = tiny_target / "objdebug.toml"
    cli_exit_2(["align", "-c", cfg, "--html", afile], "For '--html'", "is a file")
    cli_exit_2(["align", "-c", cfg, "--json", afile / "r.json"], "For '--json'", "is a file")
    cli_exit_2(["align", "-c", cfg, "--compile-cache", afile], "For '--compile-cache'",
                  "is a file")
    cli_exit_2(["render", GOLDEN, "--markdown", afile], "For '--markdown'", "is a file")
    assert afile.read_text() == "x"


def test_read_only_place(tiny_target, tmp_path):
    """Permission bits do not stop root: a read-only file system does (/proc), so test both."""
    cfg = tiny_target / "objdebug.toml"
    cli_exit_2(["align", "-c", cfg, "--json", "/proc/objdebug-report.json"], "For '--json'",
                  "cannot write in '/proc'")
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        try:
            cli_exit_2(["align", "-c", cfg, "--junit", ro / "r.xml"], "cannot write in")
        finally:
            ro.chmod(0o755)


def test_writing_over_an_earlier_report_is_allowed(report, tmp_path):
    old = tmp_path / "old.xml"
    old.write_text("<old/>")
    result = runner.invoke(app, ["render", str(report), "--junit", str(old)])
    assert result.exit_code == 0, result.output
    assert old.read_text().startswith("<?xml")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left
