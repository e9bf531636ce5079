"""`--workers N` over msrun: sharding and combining (pure, with a fake collective), the launcher's
verdict on worker records, and one real 2-worker run compared with one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from objdebug.engine import distributed
from objdebug.engine.distributed import World, _collect, shard_and_combine

from .conftest import ROOT, messages


class FakeWorld(World):
    """Two workers in one process: the 'other' worker's contribution is given up front."""

    def __init__(self, rank, size, others):
        super().__init__(rank, size)
        self.others = list(others)  # arrays the other workers would contribute, in call order

    def allreduce_sum(self, array):
        return array + self.others.pop(0)


def _run(monkeypatch, rank, size, n_rows, batches, values, fail_batch=None, others=()):
    monkeypatch.setattr(distributed, "_world", FakeWorld(rank, size, others))

    def evaluate_batch(i):
        if i == fail_batch:
            raise RuntimeError("kernel failed\nsecond line")
        return values[batches[i]]

    return shard_and_combine(n_rows, 1, batches, evaluate_batch)


def test_shards_are_whole_batches_and_the_sum_rebuilds_every_row(monkeypatch):
    rng = np.random.default_rng(0)
    values = rng.standard_normal((7, 3)).astype(np.float32)
    batches = [[0, 3, 5], [1, 2], [4, 6]]
    # rank 0 evaluates batches 0 and 2, rank 1 batch 1: each row is non-zero on one rank only
    rank1 = np.zeros((7, 3), np.float32)
    rank1[[1, 2]] = values[[1, 2]]
    out = _run(monkeypatch, 0, 2, 7, batches, values,
               others=[np.array([3, 1, 0], np.float32), rank1])
    np.testing.assert_array_equal(out, values.astype(np.float64))  # exact: x + 0 == x


def test_a_worker_without_batches_learns_the_width_from_the_others(monkeypatch):
    values = np.arange(4, dtype=np.float32).reshape(2, 2)
    full = np.zeros((2, 2), np.float32)
    full[[0, 1]] = values
    out = _run(monkeypatch, 1, 2, 2, [[0, 1]], values,
               others=[np.array([2, 1, 0], np.float32), full])
    np.testing.assert_array_equal(out, values)


def test_a_failure_in_one_worker_makes_every_worker_raise(monkeypatch):
    values = np.ones((4, 1), np.float32)
    # this worker fails; the header sum tells it (and the others) that 1 worker failed
    with pytest.raises(RuntimeError, match=r"evaluation failed in 1 of 2 workers \(rank 0: "
                                           r"RuntimeError: kernel failed\)"):
        _run(monkeypatch, 0, 2, 4, [[0, 1], [2, 3]], values, fail_batch=0,
             others=[np.array([1, 1, 0], np.float32)])
    # the healthy worker raises too, instead of waiting in the next collective
    with pytest.raises(RuntimeError, match=r"evaluation failed in 1 of 2 workers$"):
        _run(monkeypatch, 1, 2, 4, [[0, 1], [2, 3]], values,
             others=[np.array([0, 0, 1], np.float32)])


def test_one_process_is_not_sharded(monkeypatch):
    monkeypatch.setattr(distributed, "_world", World())
    assert shard_and_combine(3, 1, [[0, 1, 2]], lambda i: None) is None


def test_launcher_verdicts_from_worker_records():
    ok = {0: {"rank": 0, "code": 1, "message": ""}, 1: {"rank": 1, "code": 1, "message": ""}}
    res = _collect(ok, 2, 0, "REPORT", "/logs", 60)
    assert (res.code, res.output, res.failed, res.log_dir) == (1, "REPORT", False, None)
    # an input error wins over an internal error, and names its worker and the logs
    bad = {0: {"rank": 0, "code": 3, "message": "boom"}, 1: {"rank": 1, "code": 2, "message": "bad row"}}
    res = _collect(bad, 2, 1, "", "/logs", 60)
    assert (res.code, res.failed) == (2, True)
    assert res.output == "worker 1: bad row (worker logs: /logs)"
    # a worker killed before it could record anything is an internal error
    res = _collect({0: ok[0]}, 2, 1, "", "/logs", 60)
    assert res.code == 3 and "worker(s) 1 ended without a result" in res.output
    # msrun that never returned (hung collective): stopped, exit 3, logs kept
    res = _collect({}, 2, None, "", "/logs", 60)
    assert res.code == 3 and "did not finish within 60 s" in res.output


def test_workers_must_be_positive_and_a_config_error_is_found_before_launching(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "objdebug.cli", "align", "--demo", "--workers", "0"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 2 and "For '--workers', the value must be >= 1, but got 0." in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "objdebug.cli", "align", "--demo", "--workers", "2",
                           "--set", "data.pad_id=oops"], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=120)
    assert proc.returncode == 2 and len(messages(proc.stderr)) == 1, proc.stderr
    assert not list(tmp_path.iterdir())


def _cli(args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "objdebug.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=600)


def test_two_workers_give_the_same_report_as_one_process(tmp_path):
    """The gate of the issue: same per-sample losses and findings with 1 and 2 workers."""
    import tempfile

    before = {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("objdebug-msrun-")}
    args = ["run", "--demo", "--stages", "align,correlate"]
    one = _cli([*args, "--json", "r1.json"], tmp_path)
    two = _cli([*args, "--json", "r2.json", "--workers", "2"], tmp_path)
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    assert two.stdout.splitlines()[-1] == one.stdout.splitlines()[-1]  # the verdict line
    r1, r2 = (json.loads((tmp_path / f).read_text()) for f in ("r1.json", "r2.json"))
    assert r2["extra"]["workers"] == 2
    assert [r["value"] for r in r1["results"]] == [r["value"] for r in r2["results"]]  # every number
    strip = [{k: f[k] for k in ("code", "verdict", "message", "value")}
             for r in r1["results"] for f in r["findings"]]
    assert strip == [{k: f[k] for k in ("code", "verdict", "message", "value")}
                     for r in r2["results"] for f in r["findings"]]
    # nothing left behind: no worker folders, nothing but the two reports in the working directory
    after = {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("objdebug-msrun-")}
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r1.json", "r2.json"]


@pytest.mark.slow  # 45 s on 2 cores; the launcher's verdicts are covered by test_launcher_verdicts_...
def test_an_input_error_inside_the_workers_is_one_line_and_keeps_the_logs(tmp_path):
    """Found after the cluster is up (the vocabulary is measured on the model): exit 2, the
    worker named, its log folder kept and shown."""
    import re
    import shutil

    proc = _cli(["align", "--demo", "--set", "data.vocab_size=10", "--workers", "2"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = messages(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("objdebug: error: worker 0: ")
    # the byte tokenizer says nothing about the model's vocabulary: the text's first id beyond it is named
    assert "outside the vocabulary [0, 10) (data.vocab_size); the text is encoded by the 'bytes' tokenizer" in lines[0]
    logs = re.search(r"\(worker logs: (\S+)\)$", lines[0]).group(1)
    assert os.path.isfile(os.path.join(logs, "worker_1.log"))
    shutil.rmtree(os.path.dirname(logs))
    assert not list(tmp_path.iterdir())
