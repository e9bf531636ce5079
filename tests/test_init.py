"""`objdebug init` (issue 14): the demo's factories give back a config equivalent to the shipped one,
with the vocabulary, calling form, label_pad_id and pad_id detected; never overwrites a config."""

import pytest
from typer.testing import CliRunner

from objdebug.cli import app
from objdebug.core.config import DEMO_CONFIG, load_config
from objdebug.core.errors import InputError

from .conftest import FIXTURES, cli_exit_2, messages

DEMO = DEMO_CONFIG.parent


def _init(*args):
    return CliRunner().invoke(app, ["init", "--model", "objdebug.demo.model:build_model",
                                    "--objective", "objdebug.losses:MaskedCrossEntropy", *map(str, args)])


def test_init_on_the_demo_factories_reproduces_the_shipped_config(tmp_path):
    out = tmp_path / "objdebug.toml"
    res = _init("--checkpoint", DEMO / "demo.ckpt", "--data", DEMO / "align.jsonl", "--data",
                DEMO / "scores.jsonl", "--data", DEMO / "preference.jsonl", "--max-probe-length", "128",
                "--output", out)
    assert res.exit_code == 0, res.output
    for needle in ("detected vocabulary: 256", "detected calling form: flat",
                   "detected label_pad_id (objective's ignore_index): -100", "detected pad_id: 0",
                   "takes a mask: no", "detected shift: true (the objective scores logits[t] "
                   "against labels[t] (measured: 32 of 32 positions with a logit gradient))"):
        assert needle in res.output, res.output
    text = out.read_text()
    assert text.count("# ") > 5  # commented: where each value came from
    made, shipped = load_config(out), load_config(DEMO_CONFIG)
    for section, keys in {"model": ("factory", "kwargs", "checkpoint"),
                          "objective": ("factory", "kwargs", "call"),
                          "data": ("tokenizer", "pad_id", "label_pad_id", "shift", "align", "scores",
                                   "preference", "max_length", "bos_id", "eos_id"),
                          "run": ("device", "mode", "seed")}.items():
        for key in keys:
            assert getattr(getattr(made, section), key) == getattr(getattr(shipped, section), key), (section, key)
    assert made.data.vocab_size == 256  # measured, where the shipped config lets the engine measure it


def test_init_measures_a_loss_that_shifts_inside(tmp_path):
    """Issue 33: the objective's label pairing is measured, so init writes shift = false for HF's
    causal-LM loss (logits[:, :-1] against labels[:, 1:]) instead of assuming true."""
    out = tmp_path / "o.toml"
    res = CliRunner().invoke(app, ["init", "--model", "objdebug.demo.model:build_model", "--objective",
                                   "fixtures.shift_losses:HFShiftingCE", "--checkpoint", str(DEMO / "demo.ckpt"),
                                   "--max-probe-length", "128", "--output", str(out)])
    assert res.exit_code == 0, res.output
    assert "detected shift: false (the objective scores logits[t] against labels[t+1] (measured" in res.output
    assert "not decided: data.shift" not in res.output
    made = load_config(out)
    assert (made.data.shift, made.objective.call) == (False, "sequence")
    assert "measured: the objective scores logits[t] against labels[t+1]" in out.read_text()


def test_init_reads_bos_and_eos_from_a_tokenizer(tmp_path):
    out = tmp_path / "o.toml"
    res = _init("--checkpoint", FIXTURES / "tokenizer" / "bos_model.ckpt", "--model-kwargs",
                "{ vocab_size = 192, d_model = 32, n_layers = 1, n_heads = 2 }", "--tokenizer",
                FIXTURES / "tokenizer" / "tokenizer.json", "--max-probe-length", "128", "--output", out)
    assert res.exit_code == 0, res.output
    cfg = load_config(out)
    assert (cfg.data.bos_id, cfg.data.eos_id, cfg.data.pad_id, cfg.data.vocab_size) == (2, 3, 0, 192)
    assert "not decided: data.align / scores / text: no --data file" in res.output


def test_init_never_overwrites_a_config(tmp_path):
    out = tmp_path / "objdebug.toml"
    out.write_text("# mine\n")
    cli_exit_2(["init", "--model", "objdebug.demo.model:build_model", "--objective",
                "objdebug.losses:MaskedCrossEntropy", "--output", out],
               "already exists", "never overwrites", unchanged=[out])


def test_init_bad_factory_spec_is_exit_2(tmp_path):
    cli_exit_2(["init", "--model", "objdebug.demo.model.build_model", "--objective",
                "objdebug.losses:MaskedCrossEntropy", "--output", tmp_path / "x.toml"],
               "For '--model', the value must be 'module:callable'")
    assert not (tmp_path / "x.toml").exists() and messages("") == []


def test_init_never_overwrites_a_config_created_while_it_ran(tmp_path, monkeypatch):
    """Issue 35: the output was checked before the probe only; a file created meanwhile (here by
    the probe step, patched) was overwritten. Now it is created exclusively (hard link into place):
    exit 2, the other file untouched, no temporary left."""
    import objdebug.init as init

    out = tmp_path / "new.toml"

    def probe_that_races(cfg, target):
        out.write_text("# written by someone else while init ran\n")
        return None, "the probe was replaced by the test"
    monkeypatch.setattr(init, "_probe_contract", probe_that_races)
    cli_exit_2(["init", "--model", "objdebug.demo.model:build_model", "--objective",
                "objdebug.losses:MaskedCrossEntropy", "--output", out],
               "'--output'", "was created while objdebug init ran", "never overwrites")
    assert out.read_text() == "# written by someone else while init ran\n"
    assert [p.name for p in tmp_path.iterdir()] == ["new.toml"]


def test_init_without_hard_links_creates_the_config_exclusively(tmp_path, monkeypatch):
    from objdebug.init import create_exclusively

    def no_links(src, dst):
        raise OSError(1, "Operation not permitted")
    monkeypatch.setattr("os.link", no_links)
    create_exclusively(tmp_path / "a.toml", "x = 1\n", "a.toml")
    assert (tmp_path / "a.toml").read_text() == "x = 1\n"
    with pytest.raises(InputError, match="was created while objdebug init ran"):
        create_exclusively(tmp_path / "a.toml", "x = 2\n", "a.toml")
    assert (tmp_path / "a.toml").read_text() == "x = 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.toml"]


def test_init_on_a_mask_objdebug_cannot_build_says_so(tmp_path):
    """construct(input_ids, input_mask=None): a mask under a name objdebug does not build (the
    `elif masks:` branch once raised AttributeError, exit 3)."""
    out = tmp_path / "o.toml"
    res = CliRunner().invoke(app, ["init", "--model", "fixtures.masked_models:input_mask_model",
                                   "--objective", "objdebug.losses:MaskedCrossEntropy", "--checkpoint",
                                   str(DEMO / "demo.ckpt"), "--max-probe-length", "128", "--output",
                                   str(out)])
    assert res.exit_code == 0, (res.output, res.exception)
    assert ("not decided: model inputs: the model's construct takes ['input_ids', 'input_mask']; "
            "objdebug builds only ['input_ids', 'attention_mask', 'position_ids']") in res.output
    assert load_config(out).model.inputs is None


def test_init_batches_reads_one_batch_and_writes_the_data_keys_it_shows(tmp_path):
    """The seed bug's collator: labels padded with 0, the objective ignores -100. init writes what
    the batch shows (label_pad_id = 0, pre-shifted: shift = true) and says it disagrees."""
    out = tmp_path / "objdebug.toml"
    res = _init("--max-probe-length", "128", "--batches",
                "fixtures.batch_pipelines:labels_padded_with_zero", "--output", out)
    assert res.exit_code == 0, res.output
    assert "the batch puts 0 on padding but the objective ignores -100" in res.output
    assert "not decided: data.shift" not in res.output
    made = load_config(out)
    d = made.data
    assert (d.batches, d.pad_id, d.padding_side, d.label_pad_id, d.shift) == (
        "fixtures.batch_pipelines:labels_padded_with_zero", 0, "right", 0, True)
    assert "read from one batch of 'fixtures.batch_pipelines:labels_padded_with_zero'" in out.read_text()


def test_init_batches_on_a_mindrecord_file_writes_unshifted_labels(tmp_path):
    out = tmp_path / "objdebug.toml"
    record = FIXTURES / "targets" / "batches_mindrecord" / "healthy.mindrecord"
    res = _init("--max-probe-length", "128", "--batches", record, "--output", out)
    assert res.exit_code == 0, res.output
    d = load_config(out).data
    assert (d.batches, d.label_pad_id, d.shift) == (str(record.resolve()), -100, False)
    assert 'batches = "' in out.read_text() and "healthy.mindrecord" in out.read_text()
