"""The user's real batches (`[data] batches`), read as the pipeline made them.

Three sources:
- `"pkg.module:factory"` (kwargs `[data] batches_kwargs`): the user's own pipeline. The factory
  returns a `mindspore.dataset.Dataset` (iterated by column name), or an iterable of dicts of
  arrays / lists (an HF-style collator's output), or of tuples named by `[data] batch_columns`.
  The factory is called for every read: a generator is never assumed to be re-iterable.
- a `.mindrecord` file: `mindspore.dataset.MindDataset` in the file's order, batched as
  `[data] batch_size` says, else row by row.
- a pre-tokenized `.jsonl` of `{"input_ids", "labels"?, "attention_mask"?, "position_ids"?}` rows:
  each row a batch of one, exactly as written.

An `actual_seq_len` column (a packed row's cumulative document ends, MindFormers' convention) is
read too, `[rows, any width]`, and an `attention_mask` of `[rows, (1,) length, length]` is a packed
row's block mask (`block_mask`, 1 = attend, read from its diagonal): the packing stage finds the
documents of packed rows from them.

Columns are found by name (`[data] columns` maps our name to the pipeline's), at most
`[data] max_batches` batches are pulled, and the batches are kept as they are: no re-padding,
no re-labelling, no re-shifting. A source that raises, a missing column, ragged rows inside a
batch, a column of non-integer ids: InputError (exit 2) naming the source, the batch and the column.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from objdebug.core.config import (BATCH_COLUMNS, BOUNDARY_COLUMNS, SEQ_LEN_COLUMN, DataSpec,
                                  batches_file)
from objdebug.core.errors import InputError

ROW_COLUMNS = ("prompt_length", "response_start")  # one number per row
_KEY = "data.batches"


@dataclass
class RealBatch:
    """One batch as the pipeline made it: our column names -> int64 [rows, length]."""

    number: int  # 1-based, as the messages count
    columns: dict[str, np.ndarray]

    @property
    def input_ids(self) -> np.ndarray:
        return self.columns["input_ids"]

    @property
    def labels(self) -> np.ndarray | None:
        return self.columns.get("labels")

    @property
    def attention_mask(self) -> np.ndarray | None:
        return self.columns.get("attention_mask")


@dataclass
class Batches:
    source: str             # what messages name: the factory spec or the file's name
    batches: list[RealBatch]

    @property
    def rows(self) -> int:
        return sum(len(b.input_ids) for b in self.batches)


def read_batches(data: DataSpec, base_dir: str = ".", user_dir: str | None = None) -> Batches:
    """At most `data.max_batches` batches of `data.batches`; InputError on a bad source.

    `user_dir`: the directory the user's factory runs in (a run: the config file's folder, so
    relative paths in `batches_kwargs` resolve against it like the file's other paths; `objdebug
    init`: the working directory); `base_dir`: where the config is (the factory's package is
    importable from there, as the model's is)."""
    if data.batches is None:
        raise InputError("For 'data.batches', the value must name the pipeline's batches, but it is "
                         "not set.")
    source = data.batches if not batches_file(data.batches) else Path(data.batches).name
    with contextlib.chdir(user_dir) if user_dir else contextlib.nullcontext():
        if data.batches.lower().endswith(".jsonl"):
            raw = _jsonl_rows(data.batches)
        elif data.batches.lower().endswith(".mindrecord"):
            raw = _mindrecord(data.batches, data.batch_size)
        else:
            raw = _factory(data, base_dir)
        batches = [_batch(element, k, data, source)
                   for k, element in _pulled(raw, data.max_batches, source)]
    if not batches:
        raise InputError(f"For '{_KEY}', the source must yield at least one batch, but "
                         f"'{source}' yielded none.")
    return Batches(source, batches)


def _pulled(raw: Iterator[Any], most: int, source: str) -> Iterator[tuple[int, Any]]:
    """(1-based number, element) for the first `most` elements; an exception of the user's
    pipeline is an InputError naming the batch it was making."""
    for k in range(1, most + 1):
        try:
            element = next(raw)
        except StopIteration:
            return
        except InputError:
            raise
        except Exception as exc:  # the user's pipeline raised: their input, one line
            raise InputError(f"For '{_KEY}', reading batch {k} of '{source}' raised "
                             f"{_cause(exc)}") from None
        yield k, element
    close = getattr(raw, "close", None)  # a generator's finally blocks run now, not at exit
    if close is not None:
        close()


_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")


def _cause(exc: Exception) -> str:
    """`Type: message` of what the user's code raised: inside a MindSpore dataset, the last
    exception line of the Python call stack MindSpore wraps it in; else the first meaningful line."""
    from objdebug.core import crash

    text = str(exc).split("Dataset Pipeline Error Message")[0]
    raised = [m for m in map(_RAISED.match, text.splitlines()) if m]
    return f"{raised[-1].group(1)}: {raised[-1].group(2).strip()}" if raised else crash.summary(exc)


def _factory(data: DataSpec, base_dir: str) -> Iterator[Any]:
    from objdebug.engine.exit_guard import user_exits
    from objdebug.engine.target import import_factory

    factory = import_factory(data.batches, "data", base_dir, key=_KEY)
    with user_exits(f"For '{_KEY}', '{data.batches}'"):
        try:
            made = factory(**data.batches_kwargs)
        except Exception as exc:
            raise InputError(f"For '{_KEY}', calling '{data.batches}' with kwargs "
                             f"{data.batches_kwargs} failed: {type(exc).__name__}: {exc}") from None
    if _is_dataset(made):
        return _dataset_rows(made)
    try:
        return iter(made)
    except TypeError:
        raise InputError(f"For '{_KEY}', '{data.batches}' must return a mindspore.dataset.Dataset "
                         f"or an iterable of batches, but got {type(made).__name__}.") from None


def _is_dataset(obj: Any) -> bool:
    try:
        import mindspore.dataset as ds
    except ImportError:  # pragma: no cover - mindspore is a hard dependency
        return False
    return isinstance(obj, ds.Dataset)


def _dataset_rows(dataset: Any) -> Iterator[dict[str, Any]]:
    """A MindSpore Dataset by column name, one epoch, stopped as soon as the reading is done."""
    it = dataset.create_dict_iterator(num_epochs=1, output_numpy=True)
    try:
        yield from it
    finally:
        stop = getattr(it, "stop", None)
        if stop is not None:
            stop()


def _mindrecord(path: str, batch_size: int | None) -> Iterator[dict[str, Any]]:
    import mindspore.dataset as ds

    if not Path(path).is_file():
        raise InputError(f"For '{_KEY}', the MindRecord file must exist, but '{path}' does not.")
    dataset = ds.MindDataset(path, shuffle=False, num_parallel_workers=1)  # the file's order
    if batch_size:
        dataset = dataset.batch(batch_size)
    return _dataset_rows(dataset)


def _jsonl_rows(path: str) -> Iterator[dict[str, Any]]:
    """Each non-empty line a batch of one (read lazily: only what is pulled)."""
    if not Path(path).is_file():
        raise InputError(f"For '{_KEY}', the JSONL file must exist, but '{path}' does not.")

    def rows():
        with open(path, encoding="utf-8-sig") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InputError(f"not valid JSON ({exc.msg})", source=path, line=lineno) from None
                if not isinstance(row, dict):
                    raise InputError(f"a row must be a JSON object, but got {type(row).__name__}",
                                     source=path, line=lineno)
                yield {k: ([v] if isinstance(v, list) else v) for k, v in row.items()}
    return rows()


def _batch(element: Any, k: int, data: DataSpec, source: str) -> RealBatch:
    """One element of the source -> a RealBatch with our column names (InputError naming the
    source, batch k and the column on anything that is not a batch of integer rows)."""
    where = f"batch {k} of '{source}'"
    if isinstance(element, (tuple, list)):
        if not data.batch_columns:
            raise InputError(f"For 'data.batch_columns', the value must name the elements of the "
                             f"tuple batches of '{source}' in order, but it is not set ({where} has "
                             f"{len(element)} elements).")
        if len(element) != len(data.batch_columns):
            raise InputError(f"For 'data.batch_columns', the value must name each of the "
                             f"{len(element)} elements of {where}, but got {data.batch_columns}.")
        element = dict(zip(data.batch_columns, element))
    if not isinstance(element, Mapping):  # a dict, or an HF BatchEncoding (a UserDict)
        raise InputError(f"For '{_KEY}', each batch must be a dict of columns or a tuple, but "
                         f"{where} is {type(element).__name__}.")
    from objdebug.pipeline.preference_columns import is_preference, preference_columns

    if is_preference(element):  # chosen_* / rejected_* columns: a preference batch (TRL, MindFormers DPO)
        return RealBatch(k, preference_columns(element, k, data, source, _column))
    columns = {}
    for ours in BATCH_COLUMNS:
        theirs = data.columns.get(ours, ours)
        if theirs not in element:
            if ours == "input_ids" or ours in data.columns:  # a renamed column must be there
                how = f"data.columns.{ours}" if ours in data.columns else "the input ids"
                raise InputError(f"For '{_KEY}', {where} has no column '{theirs}' ({how}); its "
                                 f"columns are {sorted(map(str, element))}.")
            continue
        if ours == "attention_mask":
            block = _block_mask(element[theirs], theirs, where)
            if block is not None:  # a packed row's block-diagonal mask: the packing stage reads it
                columns[BLOCK_MASK] = block
                continue
        columns[ours] = _column(element[theirs], ours, theirs, where)
    rows, length = columns["input_ids"].shape
    for ours in BOUNDARY_COLUMNS:  # optional: where each row's prompt ends, when the pipeline says
        theirs = data.columns.get(ours, ours)
        if theirs not in element and ours in data.columns:
            raise InputError(f"For '{_KEY}', {where} has no column '{theirs}' (data.columns.{ours}); "
                             f"its columns are {sorted(map(str, element))}.")
        if theirs in element:
            value = _column(element[theirs], ours, theirs, where)
            columns[ours] = value.reshape(-1) if ours in ROW_COLUMNS and value.size == rows else value
    theirs = data.columns.get(SEQ_LEN_COLUMN, SEQ_LEN_COLUMN)
    if theirs in element:  # optional: a packed row's cumulative document ends, any number of them
        columns[SEQ_LEN_COLUMN] = _column(element[theirs], SEQ_LEN_COLUMN, theirs, where)
    elif SEQ_LEN_COLUMN in data.columns:
        raise InputError(f"For '{_KEY}', {where} has no column '{theirs}' (data.columns."
                         f"{SEQ_LEN_COLUMN}); its columns are {sorted(map(str, element))}.")
    for ours, value in columns.items():
        if ours == BLOCK_MASK:
            if value.shape[0] != rows or value.shape[-2:] != (length, length):
                raise InputError(f"For '{_KEY}', {where}, column '{data.columns.get('attention_mask', 'attention_mask')}' "
                                 f"is a block mask of shape {list(value.shape)}, but the input ids "
                                 f"have {[rows, length]}: it must be [{rows}, (1,) {length}, {length}].")
        elif ours == SEQ_LEN_COLUMN:
            if value.shape[0] != rows:
                raise InputError(f"For '{_KEY}', {where}, column '{theirs}' must hold one row of "
                                 f"document ends per row ({rows}), but has shape {list(value.shape)}.")
        elif ours in ROW_COLUMNS:
            if value.shape != (rows,):
                raise InputError(f"For '{_KEY}', {where}, column '{data.columns.get(ours, ours)}' "
                                 f"must hold one number per row ({rows}), but has shape "
                                 f"{list(value.shape)}.")
        elif value.shape != (rows, length):
            raise InputError(f"For '{_KEY}', {where}, column '{data.columns.get(ours, ours)}' has "
                             f"shape {list(value.shape)}, but the input ids have {[rows, length]}.")
    return RealBatch(k, columns)


# a 3-D / 4-D attention mask ([B, T, T] / [B, 1, T, T]: which key each query sees) is a packed
# row's block-diagonal mask, kept under this name (the padding is then read from the pad run)
BLOCK_MASK = "block_mask"


def _block_mask(value: Any, theirs: str, where: str) -> np.ndarray | None:
    """The mask as int64 with 1 = attend when it is [B, T, T] or [B, 1, T, T] (what a 1 means
    read from the diagonal: a position always sees itself), else None (a 2-D padding mask)."""
    if hasattr(value, "asnumpy"):
        value = value.asnumpy()
    array = np.asarray(value) if not isinstance(value, np.ndarray) else value
    if array.dtype == object or array.ndim not in (3, 4):
        return None
    if array.ndim == 4 and array.shape[1] != 1 or array.dtype.kind not in "biuf":
        raise InputError(f"For '{_KEY}', {where}, column '{theirs}' must be [batch, length] or a "
                         f"block mask [batch, (1,) length, length] of 0/1, but has shape "
                         f"{list(array.shape)} and dtype {array.dtype}.")
    ones = array != 0
    diagonal = np.diagonal(ones.reshape((ones.shape[0], *ones.shape[-2:])), axis1=1, axis2=2)
    attend = ones if diagonal.mean() >= 0.5 else ~ones
    return attend.astype(np.int64)


def _column(value: Any, ours: str, theirs: str, where: str) -> np.ndarray:
    """A column as int64 [rows, length]; a 1-D column is one row."""
    if hasattr(value, "asnumpy"):  # a MindSpore Tensor
        value = value.asnumpy()
    try:
        array = np.asarray(value)
    except ValueError:  # numpy refuses lists of different lengths
        array = np.asarray(list(value), dtype=object)
    if array.dtype == object:
        lengths = [len(r) if hasattr(r, "__len__") else 1 for r in array.reshape(-1)[:8]]
        raise InputError(f"For '{_KEY}', {where}, column '{theirs}' has ragged rows (lengths "
                         f"{lengths}): rows inside one batch must have one length (pad them).")
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2:
        raise InputError(f"For '{_KEY}', {where}, column '{theirs}' must be [batch, length], but has "
                         f"shape {list(array.shape)}.")
    masks = ("attention_mask", "loss_mask")
    if array.dtype.kind == "b" and ours in masks:
        return array.astype(np.int64)
    if array.dtype.kind == "f" and ours in masks and np.isin(array, (0.0, 1.0)).all():
        return array.astype(np.int64)  # a float 0/1 mask is a mask
    if array.dtype.kind not in "iu":
        raise InputError(f"For '{_KEY}', {where}, column '{theirs}' must hold integer ids, but has "
                         f"dtype {array.dtype}.")
    return array.astype(np.int64)
