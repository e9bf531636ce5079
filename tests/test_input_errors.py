"""Bad input: exit code 2 and one readable message (file, line or field named), no traceback."""

import json
import os
import subprocess
import sys

import pytest

from .conftest import messages
from typer.testing import CliRunner

from objdebug.cli import app

runner = CliRunner()


def invoke(args, cwd=None, monkeypatch=None):
    if cwd is not None and monkeypatch is not None:
        monkeypatch.chdir(cwd)
    return runner.invoke(app, args)


def assert_input_error(result, *needles):
    out = result.output
    assert result.exit_code == 2, out
    assert "Traceback" not in out
    assert out.count("objdebug: error:") == 1, out
    for needle in needles:
        assert needle in out, out


def _edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_missing_config(tmp_path, monkeypatch):
    assert_input_error(invoke(["align"], tmp_path, monkeypatch), "no objdebug.toml")


def test_config_file_not_found(tmp_path):
    assert_input_error(invoke(["align", "--config", str(tmp_path / "nope.toml")]), "nope.toml",
                       "not found")


def test_malformed_config(tiny_target):
    cfg = tiny_target / "objdebug.toml"
    cfg.write_text(cfg.read_text() + "\n[broken\n")
    assert_input_error(invoke(["align", "-c", str(cfg)]), "objdebug.toml", "not valid TOML")


def test_unknown_key(tiny_target):
    cfg = tiny_target / "objdebug.toml"
    _edit(cfg, "pad_id = 0", "pad_id = 0\npadd_id = 1")
    assert_input_error(invoke(["align", "-c", str(cfg)]), "unknown key(s) ['padd_id'] in [data]")


def test_factory_does_not_import(tiny_target):
    cfg = tiny_target / "objdebug.toml"
    _edit(cfg, "objdebug.losses:MaskedCrossEntropy", "no_such_pkg.losses:Loss")
    assert_input_error(invoke(["align", "-c", str(cfg)]), "objective.factory",
                       "cannot import module 'no_such_pkg.losses'")


def test_factory_attribute_missing(tiny_target):
    cfg = tiny_target / "objdebug.toml"
    _edit(cfg, "objdebug.losses:MaskedCrossEntropy", "objdebug.losses:NoSuchLoss")
    assert_input_error(invoke(["align", "-c", str(cfg)]), "has no attribute 'NoSuchLoss'")


def test_factory_bad_kwargs(tiny_target):
    cfg = tiny_target / "objdebug.toml"
    _edit(cfg, "kwargs = { ignore_index = -100 }", "kwargs = { reduction = 'avg' }")
    assert_input_error(invoke(["align", "-c", str(cfg)]), "objective.factory", "'reduction'")


def test_checkpoint_missing(tiny_target):
    cfg = tiny_target / "objdebug.toml"
    assert_input_error(invoke(["align", "-c", str(cfg), "--set", "model.checkpoint='gone.ckpt'"]),
                       "gone.ckpt", "file not found")


def _save_tiny(path, **kwargs):
    import mindspore as ms

    from objdebug.demo.model import build_model

    args = dict(vocab_size=256, d_model=16, n_layers=1, n_heads=2)
    args.update(kwargs)
    ms.save_checkpoint(build_model(**args), str(path))


def test_checkpoint_truncated(tiny_target):
    good = tiny_target / "good.ckpt"
    _save_tiny(good)
    bad = tiny_target / "cut.ckpt"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 3])
    assert_input_error(invoke(["align", "-c", str(tiny_target / "objdebug.toml"),
                               "--checkpoint", str(bad)]), "cut.ckpt", "cannot read the checkpoint")


def test_checkpoint_not_matching_model(tiny_target):
    other = tiny_target / "other.ckpt"
    _save_tiny(other, d_model=32, n_layers=2)  # wider and deeper than the configured model
    result = invoke(["align", "-c", str(tiny_target / "objdebug.toml"), "--checkpoint", str(other)])
    assert_input_error(result, "does not match the model", "unexpected in checkpoint: blocks.1.",
                       "shape")


def test_checkpoint_matching_loads(tiny_target):
    ckpt = tiny_target / "same.ckpt"
    _save_tiny(ckpt)
    result = invoke(["align", "-c", str(tiny_target / "objdebug.toml"), "--checkpoint", str(ckpt)])
    assert result.exit_code in (0, 1), result.output  # loaded and judged


def test_jsonl_line_not_json(tiny_target):
    path = tiny_target / "align.jsonl"
    lines = path.read_text().splitlines()
    lines.insert(2, '{"id": "x", "prompt": "p", "good": ')
    path.write_text("\n".join(lines) + "\n")
    assert_input_error(invoke(["align", "-c", str(tiny_target / "objdebug.toml")]),
                       "align.jsonl:3:", "not valid JSON")


def test_jsonl_missing_field(tiny_target):
    path = tiny_target / "align.jsonl"
    with open(path, "a") as fh:
        fh.write(json.dumps({"id": "y", "good": "a", "bad": "b"}) + "\n")
    assert_input_error(invoke(["align", "-c", str(tiny_target / "objdebug.toml")]),
                       "align.jsonl:8:", "missing field 'prompt'")


def test_only_good_needs_synthesize(tiny_target):
    path = tiny_target / "align.jsonl"
    with open(path, "a") as fh:
        fh.write(json.dumps({"id": "z", "prompt": "p", "good": "a b c"}) + "\n")
    assert_input_error(invoke(["align", "-c", str(tiny_target / "objdebug.toml")]),
                       "align.jsonl:8:", "--synthesize")


def test_token_id_outside_vocabulary(tiny_target):
    path = tiny_target / "align.jsonl"
    with open(path, "a") as fh:
        fh.write(json.dumps({"id": "v", "prompt_ids": [1, 2], "good_ids": [3, 300],
                             "bad_ids": [4, 5]}) + "\n")
    assert_input_error(invoke(["align", "-c", str(tiny_target / "objdebug.toml")]),
                       "align.jsonl:8:", "token id 300 outside the vocabulary [0, 256)")


def test_unknown_device_name(tiny_target):
    assert_input_error(invoke(["align", "-c", str(tiny_target / "objdebug.toml"), "--device", "TPU"]),
                       "run.device", "'TPU'")


def test_unknown_profile(tiny_target):
    assert_input_error(invoke(["align", "-c", str(tiny_target / "objdebug.toml"), "-p", "nope"]),
                       "--profile", "'nope'")


def test_unavailable_device_in_a_real_process(tiny_target):
    """GPU on a CPU-only MindSpore build: MindSpore's RuntimeError becomes exit 2, one line."""
    import mindspore as ms  # noqa: F401  - only to skip where a GPU build is installed

    env = dict(os.environ)
    env.pop("GLOG_v", None)  # MindSpore's default level, as a user has it
    proc = subprocess.run([sys.executable, "-m", "objdebug.cli", "align", "-c",
                           str(tiny_target / "objdebug.toml"), "--device", "GPU"],
                          capture_output=True, text=True, timeout=300, env=env)
    if proc.returncode == 0:
        pytest.skip("this MindSpore build has a GPU backend")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "[ERROR]" not in proc.stderr and len(messages(proc.stderr)) == 1, proc.stderr
    assert "For 'run.device', 'GPU' is not available here" in proc.stderr


def test_internal_error_is_exit_3(tiny_target, monkeypatch):
    import objdebug.api

    def boom(*a, **k):
        raise ZeroDivisionError("simulated bug")

    monkeypatch.setattr(objdebug.api, "run", boom)
    result = invoke(["align", "-c", str(tiny_target / "objdebug.toml")])
    assert result.exit_code == 3
    assert "internal error: ZeroDivisionError: simulated bug" in result.output
    assert "Traceback" not in result.output


def test_checkpoint_dtype_mismatch_is_listed(tiny_target):
    """MindSpore would convert an fp16 checkpoint into the fp32 model silently; objdebug refuses."""
    import mindspore as ms

    from objdebug.demo.model import build_model

    net = build_model(vocab_size=256, d_model=16, n_layers=1, n_heads=2)
    half = [{"name": n, "data": ms.Tensor(p.asnumpy().astype("float16"))}
            for n, p in net.parameters_and_names()]
    path = tiny_target / "half.ckpt"
    ms.save_checkpoint(half, str(path))
    assert_input_error(invoke(["align", "-c", str(tiny_target / "objdebug.toml"), "--checkpoint",
                               str(path)]), "dtype Float16 != model Float32")


def test_safetensors_checkpoint_loads(tiny_target):
    import mindspore as ms

    from objdebug.demo.model import build_model

    path = tiny_target / "w.safetensors"
    ms.save_checkpoint(build_model(vocab_size=256, d_model=16, n_layers=1, n_heads=2), str(path),
                       format="safetensors")
    result = invoke(["align", "-c", str(tiny_target / "objdebug.toml"), "--checkpoint", str(path)])
    assert result.exit_code in (0, 1), result.output
