"""Benchmark: `objdebug run --workers N` (msrun) against one process, on the demo target.

    .venv/bin/python bench/bench_workers.py --rows 24,400 --workers 2 --out /tmp/workers.json

For each data size (align and score rows replicated from the demo's, see bench_run.make_data) the
same command runs once in one process and once with N workers, each as a real CLI subprocess in a
fresh temp directory. Reported: wall time of the whole command (interpreter start, msrun cluster
set-up and every compile included), the per-stage timings and compiles of rank 0 (every worker
compiles the graphs of its own batches), and whether the two JSON reports agree in every number
and finding. Stages: align and correlate (the per-sample evaluations that are sharded); the
gradient and stress checks run whole in every worker and gain nothing from more workers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from bench_run import make_data  # noqa: E402


def one_run(folder: Path, overrides: dict[str, str], workers: int, stages: str) -> dict:
    out = folder / f"r{workers}.json"
    cmd = [sys.executable, "-m", "objdebug.cli", "run", "--demo", "--stages", stages, "--json", str(out)]
    for key, value in overrides.items():
        cmd += ["--set", f"{key}='{value}'"]
    if workers > 1:
        cmd += ["--workers", str(workers)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=folder, env=env, timeout=3600)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"workers={workers}: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
    report = json.loads(out.read_text())
    return {"workers": workers, "wall_s": round(wall, 2), "exit_code": proc.returncode,
            "timings": {k: round(v, 2) for k, v in report["timings"].items()},
            "compiles": report["compiles"]["count"], "compile_s": report["compiles"]["seconds"],
            "report": report}


def same(a: dict, b: dict) -> bool:
    def key(r):
        return ([x["value"] for x in r["results"]],
                [(f["code"], f["verdict"], f["message"]) for x in r["results"] for f in x["findings"]])
    return key(a) == key(b)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="24,400", help="align/score rows per run (comma-separated)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--stages", default="align,correlate")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rows_out = []
    for n in (int(x) for x in args.rows.split(",")):
        with tempfile.TemporaryDirectory(prefix="objdebug-bench-workers-") as tmp:
            folder = Path(tmp)
            overrides = make_data(folder / "data", n)
            single = one_run(folder, overrides, 1, args.stages)
            multi = one_run(folder, overrides, args.workers, args.stages)
            row = {"rows": n, "single": {k: v for k, v in single.items() if k != "report"},
                   "multi": {k: v for k, v in multi.items() if k != "report"},
                   "speedup": round(single["wall_s"] / multi["wall_s"], 3),
                   "identical": same(single["report"], multi["report"])}
            rows_out.append(row)
            print(f"rows={n}: 1 process {single['wall_s']} s ({single['compiles']} compiles), "
                  f"{args.workers} workers {multi['wall_s']} s (rank 0: {multi['compiles']} compiles); "
                  f"speedup x{row['speedup']}; identical reports: {row['identical']}", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"nproc": os.cpu_count(), "runs": rows_out}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
