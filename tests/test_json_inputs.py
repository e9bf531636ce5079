"""Issue 35: JSON objdebug is given is exit 2 with one line whatever it holds. Before: 100 000-deep
nesting in `--baseline`, `render` or `monitor-log` input was exit 3 (RecursionError: Python's JSON
parser raises it, not a ValueError), as were `init --data` rows that are not UTF-8 or nested that
deep, and a monitor log's `"step": Infinity` / `1e400` (OverflowError from int(inf)). Every reader
goes through `objdebug.core.jsonsafe.loads`. All of these stop before MindSpore starts: in-process."""

import json

import pytest

from objdebug.core import jsonsafe
from objdebug.core.errors import InputError

from .conftest import cli_exit_2

DEEP = "[" * 100_000 + "]" * 100_000
DEEP_ROW = '{"good": ' + DEEP + ', "bad": "x"}'


def test_the_one_reader_turns_deep_nesting_into_a_decode_error():
    with pytest.raises(json.JSONDecodeError, match="nested too deeply"):
        jsonsafe.loads(DEEP)
    assert jsonsafe.loads('{"a": [1, 2]}') == {"a": [1, 2]}


def test_deep_json_as_baseline_is_exit_2_before_the_run(tiny_target, tmp_path):
    bad = tmp_path / "deep.json"
    bad.write_text(DEEP)
    cli_exit_2(["run", "-c", tiny_target / "objdebug.toml", "--stages", "align", "--baseline", bad],
               str(bad), "nested too deeply")


def test_deep_json_to_render_is_exit_2(tmp_path):
    bad = tmp_path / "deep.json"
    bad.write_text('{"tool": "objdebug", "x": ' + DEEP + "}")
    cli_exit_2(["render", bad, "--markdown", tmp_path / "r.md"], str(bad), "nested too deeply")
    assert not (tmp_path / "r.md").exists()


def _header():
    from objdebug.monitor.log import SCHEMA

    return json.dumps({"type": "header", "schema": SCHEMA, "components": [], "every": 1,
                       "thresholds": {"dead_steps": 10}}) + "\n"


@pytest.mark.parametrize("line, needle", [
    (DEEP, "nested too deeply"),
    ('{"type": "step", "step": ' + DEEP + ', "loss": 1.0}', "nested too deeply"),
    ('{"type": "step", "step": Infinity, "loss": 1.0}', "malformed value"),
    ('{"type": "step", "step": 1e400, "loss": 1.0}', "malformed value"),
    ('{"type": "step", "step": -Infinity, "loss": 1.0}', "malformed value"),
], ids=["deep line", "deep step", "step Infinity", "step 1e400", "step -Infinity"])
def test_monitor_log_lines_that_crashed_are_exit_2_naming_the_line(tmp_path, line, needle):
    path = tmp_path / "m.jsonl"
    path.write_text(_header() + line + "\n")
    cli_exit_2(["monitor-log", path], f"{path}:2:", needle)


def test_a_deep_first_line_of_a_monitor_log_is_exit_2(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(DEEP + "\n")
    cli_exit_2(["monitor-log", path], f"{path}:1:", "nested too deeply")


def _init(tmp_path, data):
    return ["init", "--model", "objdebug.demo.model:build_model", "--objective",
            "objdebug.losses:MaskedCrossEntropy", "--data", data, "--output", tmp_path / "new.toml"]


@pytest.mark.parametrize("content, needle", [
    (b'{"good": "a\xff", "bad": "b"}\n', "not UTF-8 text: byte 0xff at column 12"),
    (DEEP_ROW.encode() + b"\n", "nested too deeply"),
    (b"[1, 2]\n", "must be a JSON object, but got list"),
], ids=["not utf-8", "deep", "not an object"])
def test_init_data_that_crashed_is_exit_2_before_the_probe(tmp_path, content, needle):
    data = tmp_path / "rows.jsonl"
    data.write_bytes(content)
    cli_exit_2(_init(tmp_path, data), f"{data}:1:", "--data", needle)
    assert not (tmp_path / "new.toml").exists()


@pytest.mark.parametrize("content, needle", [
    (b'{"good": "a", "bad": "b"}\n{"good": "\xc3", "bad": "b"}\n', "not UTF-8 text"),
    (b'{"good": "a", "bad": "b"}\n' + DEEP_ROW.encode() + b"\n", "nested too deeply"),
], ids=["not utf-8", "deep"])
def test_init_data_read_after_the_probe_is_an_input_error_too(tmp_path, content, needle):
    """A later row is read once the probe ran (its ids for the padding id): the same reader."""
    from objdebug.engine.data import make_tokenizer
    from objdebug.init import _data_ids, data_kind

    data = tmp_path / "rows.jsonl"
    data.write_bytes(content)
    assert data_kind(data) == "align"
    with pytest.raises(InputError, match=f"{data}:2: For '--data', .*{needle}"):
        _data_ids({"align": data}, make_tokenizer("bytes", str(tmp_path)))


def test_init_plain_text_data_that_is_not_utf8_is_an_input_error(tmp_path):
    from objdebug.engine.data import make_tokenizer
    from objdebug.init import _data_ids

    data = tmp_path / "corpus.txt"
    data.write_bytes(b"fine\n\xfe bad\n")
    with pytest.raises(InputError, match=f"{data}:2: For '--data', not UTF-8 text: byte 0xfe"):
        _data_ids({"text": data}, make_tokenizer("bytes", str(tmp_path)))
    data.write_bytes(b"one\ntwo\n")
    assert _data_ids({"text": data}, make_tokenizer("bytes", str(tmp_path)))[0] == [[111, 110, 101],
                                                                                   [116, 119, 111]]
