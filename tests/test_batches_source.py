"""[data] batches: the user's real batches read as the pipeline made them (objdebug/pipeline/batches_source.py).

Every bad source is exit 2 with one line naming the source, the batch and the column; a large
dataset is never read whole (a generator counts what was pulled).
"""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest

from objdebug.core.config import DataSpec, load_config
from objdebug.core.errors import InputError
from objdebug.pipeline.batches_source import read_batches

PULLED = {"n": 0}


def _module(**factories):
    """A throwaway module `batchmod_test` holding the factories (importable by spec)."""
    mod = types.ModuleType("batchmod_test")
    for name, fn in factories.items():
        setattr(mod, name, fn)
    sys.modules["batchmod_test"] = mod
    return mod


def _rows(n_rows=2, length=6):
    ids = np.arange(1, n_rows * length + 1).reshape(n_rows, length) % 200 + 1
    return {"input_ids": ids, "labels": ids.copy(), "attention_mask": np.ones_like(ids)}


def counting(rows=100_000):
    """A 100k-batch pipeline that counts what was pulled from it."""
    PULLED["n"] = 0
    for _ in range(rows):
        PULLED["n"] += 1
        yield _rows()


def _spec(name, **kw):
    return DataSpec(batches=f"batchmod_test:{name}", **kw)


@pytest.fixture(autouse=True)
def _factories():
    _module(counting=counting,
            hf=lambda n=3: [_rows() for _ in range(n)],
            tuples=lambda: [(b["input_ids"], b["labels"]) for b in [_rows(), _rows()]],
            renamed=lambda: [{"tokens": _rows()["input_ids"]}],
            raising=_raising, ragged=lambda: [{"input_ids": [[1, 2, 3], [4, 5]]}],
            floats=lambda: [{"input_ids": np.ones((2, 4), np.float32)}],
            mismatched=lambda: [{"input_ids": np.ones((2, 4), np.int64),
                                 "labels": np.ones((2, 5), np.int64)}],
            not_iterable=lambda: 3, generator_dataset=_generator_dataset,
            raising_dataset=_raising_dataset, user_dicts=_user_dicts,
            bad_prompt_length=lambda: [{"input_ids": np.ones((2, 4), np.int64),
                                        "prompt_length": [1, 2, 3]}],
            seq_len=lambda rows=2: [{"input_ids": np.ones((2, 4), np.int64),
                                     "actual_seq_len": np.tile([2, 4, 4], (rows, 1))}])
    yield
    sys.modules.pop("batchmod_test", None)


def _raising():
    yield _rows()
    raise ValueError("tokenizer exploded on row 17")


def _raising_dataset():
    import mindspore.dataset as ds

    def source():
        for i in range(10):
            if i == 5:
                raise ValueError("tokenizer exploded on row 5")
            yield (np.arange(4, dtype=np.int32),)

    return ds.GeneratorDataset(source, ["input_ids"], shuffle=False).batch(2)


def _user_dicts():
    from collections import UserDict

    return [UserDict(_rows())]  # HF's BatchEncoding is a UserDict


def _generator_dataset(rows=100_000):
    import mindspore.dataset as ds

    def source():
        PULLED["n"] = 0
        for i in range(rows):
            PULLED["n"] += 1
            b = _rows(1)
            yield b["input_ids"][0].astype(np.int32), b["labels"][0].astype(np.int32)

    return ds.GeneratorDataset(source, ["input_ids", "labels"], shuffle=False).batch(2)


def test_a_large_generator_is_read_only_up_to_max_batches():
    got = read_batches(_spec("counting", max_batches=3))
    assert len(got.batches) == 3 and PULLED["n"] == 3  # not 100 000
    assert got.batches[0].input_ids.dtype == np.int64 and got.batches[0].input_ids.shape == (2, 6)
    assert [b.number for b in got.batches] == [1, 2, 3]


def test_a_factory_is_called_again_for_every_read():
    assert read_batches(_spec("counting", max_batches=2)).rows == 4
    assert read_batches(_spec("counting", max_batches=2)).rows == 4  # a fresh generator each time


def test_a_mindspore_dataset_is_read_by_column_name_and_not_whole():
    got = read_batches(_spec("generator_dataset", max_batches=2))
    assert [b.input_ids.shape for b in got.batches] == [(2, 6), (2, 6)]
    assert got.batches[0].labels is not None and got.batches[0].attention_mask is None
    assert PULLED["n"] < 1000  # the prefetch is bounded: 100 000 rows are never read


def test_tuples_are_named_by_batch_columns_and_columns_rename():
    got = read_batches(_spec("tuples", batch_columns=["ids", "lab"],
                             columns={"input_ids": "ids", "labels": "lab"}))
    assert len(got.batches) == 2 and got.batches[1].labels.shape == (2, 6)
    got = read_batches(_spec("renamed", columns={"input_ids": "tokens"}))
    assert got.batches[0].labels is None  # no labels column is a valid (pre-training) pipeline


def test_a_mapping_batch_is_read_like_a_dict():
    assert read_batches(_spec("user_dicts")).batches[0].labels.shape == (2, 6)


def test_jsonl_rows_are_batches_of_one_as_written(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps({"input_ids": [5, 6, 7], "labels": [-100, 6, 7]})
                              for _ in range(20)) + "\n")
    got = read_batches(DataSpec(batches=str(path), max_batches=4))
    assert len(got.batches) == 4 and got.batches[0].labels.tolist() == [[-100, 6, 7]]


def test_mindrecord_in_file_order_batched_or_row_by_row(tmp_path):
    from mindspore.mindrecord import FileWriter

    path = str(tmp_path / "rows.mindrecord")
    writer = FileWriter(path, shard_num=1, overwrite=True)
    writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]},
                       "labels": {"type": "int32", "shape": [-1]}}, "rows")
    writer.write_raw_data([{"input_ids": np.full(4, i + 1, np.int32),
                            "labels": np.full(4, i + 1, np.int32)} for i in range(5)])
    writer.commit()
    rows = read_batches(DataSpec(batches=path))
    assert [b.input_ids[0, 0] for b in rows.batches] == [1, 2, 3, 4, 5]  # the file's order
    batched = read_batches(DataSpec(batches=path, batch_size=2, max_batches=2))
    assert [b.input_ids[:, 0].tolist() for b in batched.batches] == [[1, 2], [3, 4]]


@pytest.mark.parametrize("name, kw, words", [
    ("raising", {}, ["batch 2 of 'batchmod_test:raising'", "ValueError", "row 17"]),
    ("raising_dataset", {}, ["of 'batchmod_test:raising_dataset' raised ValueError: tokenizer "
                             "exploded on row 5"]),
    ("ragged", {}, ["batch 1", "column 'input_ids'", "ragged", "[3, 2]"]),
    ("floats", {}, ["batch 1", "column 'input_ids'", "integer ids", "float32"]),
    ("renamed", {}, ["batch 1", "no column 'input_ids'", "['tokens']"]),
    ("hf", {"columns": {"labels": "targets"}}, ["batch 1", "no column 'targets'", "data.columns.labels"]),
    ("mismatched", {}, ["batch 1", "column 'labels'", "[2, 5]", "[2, 4]"]),
    ("tuples", {}, ["data.batch_columns", "batch 1", "2 elements"]),
    ("not_iterable", {}, ["must return a mindspore.dataset.Dataset", "int"]),
    ("bad_prompt_length", {}, ["batch 1", "column 'prompt_length'", "one number per row (2)", "[1, 3]"]),
    ("hf", {"columns": {"loss_mask": "lm"}}, ["batch 1", "no column 'lm'", "data.columns.loss_mask"]),
    ("seq_len", {"batches_kwargs": {"rows": 3}},
     ["batch 1", "column 'actual_seq_len'", "one row of document ends per row (2)", "[3, 3]"]),
    ("hf", {"columns": {"actual_seq_len": "ends"}}, ["batch 1", "no column 'ends'",
                                                     "data.columns.actual_seq_len"]),
])
def test_a_bad_source_is_one_line_naming_source_batch_and_column(name, kw, words):
    with pytest.raises(InputError) as err:
        read_batches(_spec(name, **kw))
    text = str(err.value)
    assert "\n" not in text and ("data.batches" in text or "data.batch_columns" in text)
    for word in words:
        assert word in text, (word, text)


def test_an_actual_seq_len_column_is_read_at_its_own_width():
    got = read_batches(_spec("seq_len"))
    assert got.batches[0].columns["actual_seq_len"].tolist() == [[2, 4, 4], [2, 4, 4]]


def test_a_bad_jsonl_row_names_its_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"input_ids": [1, 2]}\n{"input_ids": [1.5, 2]}\n')
    with pytest.raises(InputError, match=r"batch 2 of 'rows.jsonl', column 'input_ids' must hold integer"):
        read_batches(DataSpec(batches=str(path)))


@pytest.mark.parametrize("text, message", [
    ("batches = 'nocolon'", "For 'data.batches', the value must be 'pkg.module:factory'"),
    ("batches = 3", "For 'data.batches', the value must be str"),
    ("max_batches = 0", "For 'data.max_batches', the value must be in [1,"),
    ("batch_size = 0", "For 'data.batch_size', the value must be in [1,"),
    ("columns = { tokens = 'input_ids' }", "For 'data.columns', the value must be a table from"),
    ("batch_columns = 'input_ids'", "For 'data.batch_columns', the value must be a list"),
    ("batches_kwargs = 3", "For 'data.batches_kwargs', the value must be dict"),
])
def test_batches_keys_are_validated(tmp_path, text, message):
    cfg = tmp_path / "objdebug.toml"
    cfg.write_text(f"[objective]\nfactory = 'a:b'\n[data]\n{text}\n")
    with pytest.raises(InputError) as err:
        load_config(cfg)
    assert message in str(err.value)


def test_a_batches_file_is_relative_to_the_config_and_quiet_when_unset(tmp_path):
    cfg = tmp_path / "objdebug.toml"
    cfg.write_text("[objective]\nfactory = 'a:b'\n[data]\nbatches = 'data/rows.jsonl'\n")
    loaded = load_config(cfg)
    assert loaded.data.batches == str(tmp_path / "data" / "rows.jsonl")
    assert loaded.to_dict()["data"]["batches"] == loaded.data.batches
    cfg.write_text("[objective]\nfactory = 'a:b'\n[data]\nbatches = 'pkg.mod:make'\n")
    assert load_config(cfg).data.batches == "pkg.mod:make"  # a factory is not a path
    cfg.write_text("[objective]\nfactory = 'a:b'\n")
    assert not {"batches", "max_batches", "columns"} & set(load_config(cfg).to_dict()["data"])


def test_relative_paths_in_batches_kwargs_resolve_against_the_config_file(tmp_path, monkeypatch):
    """`batches_kwargs = { path = "ids.txt" }` next to the config, objdebug run from elsewhere:
    the file beside the config is read, as every other path of the file resolves (issue 53)."""
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.pipeline_batches import real_batches

    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "ids.txt").write_text("4 5 6\n7 8 9\n")
    (tmp_path / "ids.txt").write_text("1 1 1\n")  # the working directory's: never read

    def from_file(path):
        with open(path) as fh:  # relative, as the user wrote it in the config
            return [{"input_ids": [[int(x) for x in line.split()]]} for line in fh]

    _module(from_file=from_file)
    (folder / "objdebug.toml").write_text('[objective]\nfactory = "objdebug.losses:MaskedCrossEntropy"\n\n'
                                          '[data]\nbatches = "batchmod_test:from_file"\n'
                                          'batches_kwargs = { path = "ids.txt" }\nalign = "ids.txt"\n')
    monkeypatch.chdir(tmp_path)
    ctx = Context(config=load_config(folder / "objdebug.toml"), target=None, engine=None, profile=None)
    assert [b.input_ids.tolist() for b in real_batches(ctx).batches] == [[[4, 5, 6]], [[7, 8, 9]]]


def _jsonl_target(tmp_path, text):
    from .conftest import TARGETS

    (tmp_path / "rows.jsonl").write_text(text)
    cfg = (TARGETS / "batches_healthy" / "objdebug.toml").read_text()
    cfg = cfg.replace('"../tiny/', f'"{TARGETS}/tiny/').replace(
        'batches = "fixtures.batch_pipelines:healthy_collator"', 'batches = "rows.jsonl"')
    (tmp_path / "objdebug.toml").write_text(cfg.replace("batches_kwargs = { batch_size = 4, batches = 4 }\n", ""))
    return tmp_path / "objdebug.toml"


def test_a_report_never_replaces_the_batches_file(tmp_path):
    from .conftest import cli_exit_2

    cfg = _jsonl_target(tmp_path, '{"input_ids": [1, 2]}\n')
    cli_exit_2(["batches", "-c", cfg, "--json", tmp_path / "rows.jsonl"], "is data.batches",
               unchanged=[tmp_path / "rows.jsonl"])


def test_a_bad_batch_is_exit_2_with_one_line_from_the_command(tmp_path):
    from .conftest import cli_exit_2

    cfg = _jsonl_target(tmp_path, '{"input_ids": [1, 2]}\n{"input_ids": [1, 2], "labels": [0.5, 2]}\n')
    cli_exit_2(["batches", "-c", cfg],
               "For 'data.batches', batch 2 of 'rows.jsonl', column 'labels' must hold integer ids, "
               "but has dtype float64.")
