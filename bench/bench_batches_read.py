"""Issue 34: a pipeline source of 100k rows is not read whole; the audit costs what 8 rows cost.

    python bench/bench_batches_read.py --rows 100000 --repeats 3

Writes two pre-tokenized JSONL sources (`[data] batches`, each row a batch of one) in a temp
folder: the same first 8 rows, then for the large one 100k rows in all. Each runs `objdebug
batches` (the audit stage, `[data] max_batches` = 8, the default) on the demo-sized tiny model of
`fixtures/targets/batches_healthy`, cold (`--no-cache`), in a fresh process, small and large
interleaved; the fastest wall of each and their ratio are printed (the issue's bound: 1.2x), and the
exit codes, which must agree.
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

import numpy as np

HERE = Path(__file__).resolve().parents[1]
TARGET = HERE / "fixtures" / "targets" / "batches_healthy"


def write_rows(path: Path, n: int, length: int = 48, seed: int = 0) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            rng_i = np.random.default_rng(seed + (i % 8))  # the first 8 rows repeat: same audit
            real = int(rng_i.integers(length // 2, length))
            ids = rng_i.integers(32, 127, real).tolist() + [0] * (length - real)
            prompt = int(rng_i.integers(2, 8))
            labels = [-100] * prompt + ids[prompt + 1:real] + [-100] * (length - real + 1)
            mask = [1] * real + [0] * (length - real)
            fh.write(json.dumps({"input_ids": ids, "labels": labels[:length], "attention_mask": mask}) + "\n")


def config(folder: Path, source: Path) -> Path:
    text = (TARGET / "objdebug.toml").read_text()
    text = text.replace('batches = "fixtures.batch_pipelines:healthy_collator"', f'batches = "{source}"')
    text = text.replace("batches_kwargs = { batch_size = 4, batches = 4 }\n", "")
    text = text.replace('"../tiny/', f'"{TARGET.parent / "tiny"}/')
    cfg = folder / f"{source.stem}.toml"
    cfg.write_text(text)
    return cfg


def run(cfg: Path) -> tuple[float, int]:
    env = dict(os.environ, PYTHONPATH=str(HERE))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "objdebug.cli", "batches", "-c", str(cfg), "--no-cache", "-q"],
                          cwd=cfg.parent, env=env, capture_output=True, text=True)
    return time.perf_counter() - start, done.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="batches-read-") as tmp:
        folder = Path(tmp)
        small, large = folder / "small.jsonl", folder / "large.jsonl"
        write_rows(small, 8)
        write_rows(large, a.rows)
        cfgs = {"8 rows": config(folder, small), f"{a.rows} rows": config(folder, large)}
        walls: dict[str, list[float]] = {k: [] for k in cfgs}
        codes: dict[str, set[int]] = {k: set() for k in cfgs}
        for _ in range(a.repeats):
            for name, cfg in cfgs.items():
                wall, code = run(cfg)
                walls[name].append(round(wall, 2))
                codes[name].add(code)
        size = large.stat().st_size / 2 ** 20
    best = {k: min(v) for k, v in walls.items()}
    small_name, large_name = list(cfgs)
    print(f"{large_name} ({size:.0f} MiB) vs {small_name}: {best[large_name]:.2f} s vs {best[small_name]:.2f} s "
          f"(x{best[large_name] / best[small_name]:.3f}); tries {walls}; exit codes {codes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
