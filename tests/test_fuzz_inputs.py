"""Property-based fuzzing of what a user hands objdebug: config files, JSONL rows, checkpoints.

For every generated input: exit code 1 or 2 (never 3, never a traceback without --debug), exactly
one line for exit 2, no input file modified (hash before/after), no temporary directory or file
left. Model-free paths keep it inside the CI budget: generated configs never name an importable
Cell, data files are paired with an objective that does not import (the data is checked before
it), and checkpoints are loaded into the tiny model without compiling anything. `derandomize`
makes every CI run try the same examples.
"""

import hashlib
import json
import os
import string
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from .conftest import messages
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from objdebug.cli import app
from objdebug.core.errors import InputError

from objdebug.engine.runtime import import_mindspore  # noqa: E402

import_mindspore()  # it raises the recursion limit on import: before hypothesis notes the limit
ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "fixtures" / "targets" / "tiny"
runner = CliRunner()

FUZZ = settings(max_examples=30, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A working folder and a private temp folder (tempfile.tempdir) that must stay empty."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_cli(args, inputs, sandbox):
    before = {p: digest(p) for p in inputs}
    result = runner.invoke(app, [str(a) for a in args])
    out = result.output
    assert result.exit_code in (1, 2), (result.exit_code, out, result.exception)
    assert "Traceback" not in out, out
    if result.exit_code == 2:
        assert out.count("objdebug: error:") == 1 and len(messages(out)) == 1, out
    for p, h in before.items():
        assert digest(p) == h, f"{p} was modified"
    assert list((sandbox / "tmp").iterdir()) == [], "a temporary directory was left"
    assert not [p for p in sandbox.rglob(".*") if p.is_file()], "a report temporary was left"
    return result


# --------------------------------------------------------------------------- TOML text
def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def toml_text(sections: dict) -> str:
    lines = []
    for name, table in sections.items():
        lines.append(f"[{json.dumps(name)}]")
        lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


KNOWN_KEYS = ["factory", "kwargs", "checkpoint", "call", "components", "tokenizer", "pad_id",
              "label_pad_id", "shift", "vocab_size", "max_length", "align", "scores", "device",
              "mode", "seed", "profile", "stages", "select", "ignore", "compile_cache"]
# never an importable Cell: these runs must stay model-free
FACTORIES = ["no_such_module_fuzz:Loss", "no colon", "objdebug.losses:NoSuchLoss", "os.path:sep",
             "json:loads", "objdebug.engine.data:BytesTokenizer", ":", "objdebug.losses:"]
names = st.text(string.ascii_letters + "_.", min_size=1, max_size=8)
scalars = st.one_of(st.integers(-300, 300), st.floats(allow_nan=False, allow_infinity=False, width=32),
                    st.text(max_size=10), st.booleans(), st.sampled_from(FACTORIES),
                    st.sampled_from(["CPU", "GPU", "graph", "pynative", "flat", "sequence", "bytes",
                                     "default", "quick", "align", "align.jsonl", "tiny.ckpt"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(names, inner, max_size=3)),
                      max_leaves=5)
tables = st.dictionaries(st.one_of(st.sampled_from(KNOWN_KEYS), names), values, max_size=5)
configs = st.dictionaries(st.sampled_from(["model", "objective", "data", "run", "runn", "tool"]),
                          tables, max_size=4)


@FUZZ
@given(sections=configs, garbage=st.one_of(st.none(), st.binary(max_size=40)))
def test_generated_configs(sandbox, sections, garbage):
    cfg = sandbox / "objdebug.toml"
    if garbage is None:
        cfg.write_text(toml_text(sections), encoding="utf-8")
    else:
        cfg.write_bytes(toml_text(sections).encode("utf-8", "surrogatepass")[:60] + garbage)
    data = sandbox / "align.jsonl"
    data.write_bytes((TINY / "align.jsonl").read_bytes())
    run_cli(["align", "-c", cfg, "--json", sandbox / "out" / "r.json"], [cfg, data], sandbox)


# --------------------------------------------------------------------------- JSONL rows
ROW_KEYS = ["id", "prompt", "prompt_ids", "good", "good_ids", "medium", "medium_ids", "bad",
            "bad_ids", "medum", "response", "response_ids", "score", "scores", "meta"]
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 400), st.text(max_size=12),
                         st.floats(allow_nan=False, allow_infinity=False))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=3)), max_leaves=6)
rows = st.dictionaries(st.sampled_from(ROW_KEYS), json_values, max_size=6)
raw_lines = st.one_of(
    rows.map(lambda r: json.dumps(r).encode()),
    st.binary(max_size=30),
    st.sampled_from([b'{"id": "a", "response": "x", "score": NaN}', b"[1, 2]", b"{", b"",
                     b'{"prompt": "p", "good": "g", "bad": "b", "bad": "c"}',
                     b'{"prompt": "p", "good": "\xff", "bad": "b"}', b"\xef\xbb\xbf{}"]))


def _valid_rows():
    return [line.encode() for line in (TINY / "align.jsonl").read_text().splitlines()]


@FUZZ
@given(lines=st.lists(raw_lines, min_size=1, max_size=5), keep=st.integers(0, 7),
       what=st.sampled_from(["align", "scores"]))
def test_generated_jsonl_through_the_cli(sandbox, lines, keep, what):
    """The data file is read before MindSpore starts; a broken file names file:line (exit 2),
    a good one reaches the objective, which does not import (exit 2 as well, one line)."""
    data = sandbox / f"{what}.jsonl"
    data.write_bytes(b"\n".join(_valid_rows()[:keep] + lines) + b"\n")
    cfg = sandbox / "objdebug.toml"
    cfg.write_text(f'[objective]\nfactory = "no_such_module_fuzz:Loss"\n[data]\n{what} = "{what}.jsonl"\n')
    stage = "align" if what == "align" else "correlate"
    result = run_cli([stage, "-c", cfg], [cfg, data], sandbox)
    assert result.exit_code == 2
    assert f"{what}.jsonl:" in result.output or "no_such_module_fuzz" in result.output, result.output


def _fake_ctx(config_path: Path, max_length):
    """Just enough of a Context for datasets.*_rows: a byte tokenizer and a 256-token model."""
    from objdebug.core.config import load_config
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.profile import load_profile

    cfg = load_config(config_path)
    engine = SimpleNamespace(vocab_size=lambda: 256, vocab_source="data.vocab_size", max_length=max_length)
    return Context(config=cfg, target=None, engine=engine, profile=load_profile("default"),
                   options={"synthesize": False})


@FUZZ
@given(lines=st.lists(st.one_of(rows.map(lambda r: json.dumps(r).encode()), raw_lines),
                      min_size=1, max_size=6),
       max_length=st.sampled_from([None, 16, 64]))
def test_generated_rows_reach_the_stages_only_when_valid(sandbox, lines, max_length):
    """Past the file checks, the rows meet the tokenizer, the vocabulary and the model's length:
    each row either becomes samples or an InputError naming file:line, nothing else."""
    from objdebug.pipeline import datasets

    align, scores = sandbox / "align.jsonl", sandbox / "scores.jsonl"
    align.write_bytes(b"\n".join(lines) + b"\n")
    scores.write_bytes(b"\n".join(lines) + b"\n")
    cfg = sandbox / "objdebug.toml"
    cfg.write_text('[objective]\nfactory = "x:y"\n[data]\nalign = "align.jsonl"\nscores = "scores.jsonl"\n')
    for build, path in ((datasets.align_rows, align), (datasets.score_rows, scores)):
        try:
            out = build(_fake_ctx(cfg, max_length))
        except InputError as exc:
            text = str(exc)
            assert "\n" not in text and text.startswith(str(path)), text
        else:
            assert out and all(r["line"] >= 1 for r in out)


# --------------------------------------------------------------------------- checkpoints
GOOD_CKPT = (TINY / "tiny.ckpt").read_bytes()
garbles = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, len(GOOD_CKPT) - 1)),
    st.tuples(st.just("overwrite"), st.lists(st.tuples(st.integers(0, len(GOOD_CKPT) - 1),
                                                       st.integers(0, 255)), min_size=1, max_size=40)),
    st.tuples(st.just("prefix"), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("random"), st.binary(max_size=256)),
)


def garble(how) -> bytes:
    kind, arg = how
    if kind == "truncate":
        return GOOD_CKPT[:arg]
    if kind == "overwrite":
        data = bytearray(GOOD_CKPT)
        for pos, byte in arg:
            data[pos] = byte
        return bytes(data)
    if kind == "prefix":
        return arg + GOOD_CKPT
    return arg


@pytest.fixture(scope="module")
def tiny_net():
    from objdebug.demo.model import build_model

    return build_model(vocab_size=256, d_model=16, n_layers=1, n_heads=2)


@FUZZ
@given(how=garbles)
def test_garbled_checkpoints(sandbox, tiny_net, how):
    """A damaged checkpoint either loads (a flipped weight is still a checkpoint) or is an
    InputError naming the file, in one line; MindSpore never crashes the process."""
    from objdebug.engine.target import load_checkpoint_strict

    path = sandbox / "w.ckpt"
    path.write_bytes(garble(how))
    h = digest(path)
    try:
        load_checkpoint_strict(tiny_net, str(path), "model")
    except InputError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc), str(exc)
    assert digest(path) == h
    assert list((sandbox / "tmp").iterdir()) == []


def test_garbled_checkpoint_and_data_in_a_real_process(tmp_path):
    """The same promises end to end in a real process: exit 2, one line, inputs unchanged, the
    temp folder clean."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    ckpt = tmp_path / "cut.ckpt"
    ckpt.write_bytes(GOOD_CKPT[: len(GOOD_CKPT) // 2])
    data = tmp_path / "align.jsonl"
    data.write_bytes((TINY / "align.jsonl").read_bytes())
    cfg = tmp_path / "objdebug.toml"
    cfg.write_text((TINY / "objdebug.toml").read_text().replace('"tiny.ckpt"', '"cut.ckpt"'))
    before = {p: digest(p) for p in (ckpt, data, cfg)}
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(ROOT))
    env.pop("GLOG_v", None)  # as a user has it: MindSpore's own log lines stay hidden
    proc = subprocess.run([sys.executable, "-m", "objdebug.cli", "run", "-c", str(cfg), "--json",
                           str(tmp_path / "r.json"), "--junit", str(tmp_path / "r.xml")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stderr
    lines = messages(proc.stderr)
    assert len(lines) == 1 and "cut.ckpt" in lines[0] and "cannot read the checkpoint" in lines[0]
    assert {p: digest(p) for p in before} == before
    assert list(tmp.iterdir()) == [] and not (tmp_path / "r.json").exists()
