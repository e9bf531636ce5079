"""bench/bench_align_bare.py (issue 48): its table (fast), and the comparison itself (slow)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("bench_align_bare", ROOT / "bench" / "bench_align_bare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_are_the_issue_s_120_answers(tmp_path):
    path = _bench().make_rows(tmp_path / "d")
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(rows) == 40 and all({"good", "medium", "bad"} <= set(r) for r in rows)
    lengths = [len((r["prompt"] + r[k]).encode()) for r in rows for k in ("good", "medium", "bad")]
    assert len(lengths) == 120 and max(lengths) <= 245 and min(lengths) >= 25


def test_table_lists_every_try_with_its_load():
    bench = _bench()
    od = {"wall_s": 11.0, "load": 0.5, "compiles": 1, "holds_model": 1, "graphs": ["objective.per_sample [8, 240]"],
          "timings": {}, "values": {"a": 1.0},
          "time_profile": {"steps": {"contract": {"wall": 4.0, "compile": 3.9, "calls": 0.0, "host": 0.1}},
                           "total": 8.0}}
    bare = {"wall_s": 10.0, "load": 0.7}
    res = {"repeats": 2, "tries": {"objdebug": [od, dict(od, wall_s=12.0, load=1.5)],
                                   "bare": [bare, dict(bare, wall_s=10.5, load=1.1)]},
           "best": {"objdebug": od, "bare": bare}, "ratio": 1.1}
    text = bench.render(res)
    assert "| objdebug | 11.00 (0.50) | 12.00 (1.50) | 11.00 | 1.10 | 1 (1) |" in text
    assert "| bare | 10.00 (0.70) | 10.50 (1.10) | 10.00 | 1.00 | 1 (1) |" in text
    assert "ratio 1.10x (target <= 1.1x: met)" in text
    assert "contract 4.00 = compile 3.90 + calls 0.00 + host 0.10" in text


@pytest.mark.slow
def test_align_within_1_1x_of_bare(tmp_path):
    """Issue 48's target, one try per side (about 1 min on a quiet machine; the lead's number is
    the best of 3 on a quiet machine: a busy one reads noisier, see the loads in the output)."""
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_align_bare.py"), "--repeats", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    best = res["best"]["objdebug"]
    assert best["holds_model"] <= 3 and best["compiles"] <= 10
    assert best["exit"] in (0, 1)
    assert res["ratio"] <= 1.1, proc.stdout
