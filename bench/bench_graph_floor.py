"""Issue 36: graphs that hold the model, this tree against the previous release, side by side.

    python bench/bench_graph_floor.py --previous /path/to/previous/checkout --out /tmp/floor.json
    python bench/bench_graph_floor.py --previous ../prev --targets demo --repeats 3
    python bench/bench_graph_floor.py --previous ../prev --targets pref_healthy,pref_swapped --repeats 1

A target is one of TARGETS below or the name of a fixture target (`fixtures/targets/<name>`, run
with `objdebug run -c` on its config).

For each target and repeat, the previous release and this tree run one after the other (interleaved,
so a machine that gets busier slows both), each in a fresh process and a fresh working directory,
with no compile cache (`--no-cache`: cold). Per run: the wall of the process, the compiles and how
many hold the model (this tree's JSON report says `holds_model`; the previous release's does not,
so for it the same rule is applied here to the graph names it reports: `model.*`, `*.param_grad*`,
`preference.gradient`, `preference.*_forward`, `decompose.component_grad`, `invariants.model_train`,
`packing.model`), and every finding's value against the previous release's (relative 1e-5).
Prints a table; `--out` writes every number as JSON. Fastest of the repeats is the wall reported.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
TARGETS = {
    "demo": ["demo"],
    "llama": ["run", "-c", str(HERE / "fixtures/targets/llama_ce/objdebug.toml")],
    "pretrain32k": ["run", "-c", str(HERE / "fixtures/targets/pretrain_llama32k/objdebug.toml"),
                    "--profile", "pretrain"],  # issue 27's memory target, as its config says it runs
}
MODEL_GRAPHS = ("model.", "preference.gradient", "preference.reference_forward", "preference.policy_forward",
                "decompose.component_grad", "invariants.model_train", "packing.model")


def target_args(name: str) -> list[str]:
    if name in TARGETS:
        return TARGETS[name]
    config = HERE / "fixtures/targets" / name / "objdebug.toml"
    if not config.is_file():
        raise SystemExit(f"For 'bench_graph_floor', the target must be one of {sorted(TARGETS)} or a "
                         f"fixture target under fixtures/targets/, but got {name!r}")
    return ["run", "-c", str(config)]


def holds_model(graph: dict) -> bool:
    if "holds_model" in graph:
        return bool(graph["holds_model"])
    name = graph["graph"]
    return name.startswith(MODEL_GRAPHS) or ".param_grad" in name


def run_once(tree: Path, args: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="floor-") as work:
        report = Path(work) / "r.json"
        env = dict(os.environ, PYTHONPATH=str(tree))
        cmd = [sys.executable, "-m", "objdebug.cli", *args, "--no-cache", "-q", "--json", str(report)]
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - start
        if not report.exists():
            return {"wall_s": wall, "exit": done.returncode, "error": done.stderr[-2000:]}
        r = json.loads(report.read_text())
    graphs = r["compiles"]["graphs"]
    return {"wall_s": round(wall, 2), "exit": done.returncode, "compiles": len(graphs),
            "holds_model": sum(holds_model(g) for g in graphs),
            "graphs": [f"{g['graph']} {g['shapes']}".strip() for g in graphs],
            "findings": {f"{res['stage']}/{res['check']}/{f['code']}/{i}": f["value"]
                         for res in r["results"] for i, f in enumerate(res["findings"])}}


def differences(prev: dict, new: dict, rtol: float = 1e-5) -> list[str]:
    out = []
    for key in sorted(set(prev) | set(new)):
        a, b = prev.get(key), new.get(key)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            same = a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= rtol * max(abs(a), abs(b))
        else:
            same = a == b
        if not same:
            out.append(f"{key}: {a} -> {b}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--previous", required=True, type=Path, help="a checkout of the previous release")
    ap.add_argument("--targets", default="demo,llama,pretrain32k")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    results: dict = {}
    for name in a.targets.split(","):
        args = target_args(name)
        runs = {"previous": [], "this": []}
        for _ in range(a.repeats):
            for side, tree in (("previous", a.previous.resolve()), ("this", HERE)):
                runs[side].append(run_once(tree, args, a.timeout))
        best = {side: min(rs, key=lambda r: r["wall_s"]) for side, rs in runs.items()}
        diff = differences(best["previous"].get("findings", {}), best["this"].get("findings", {}))
        results[name] = {"runs": runs, "differences": diff,
                         "ratio": round(best["this"]["wall_s"] / best["previous"]["wall_s"], 3)}
        print(f"{name}: wall {best['previous']['wall_s']:.1f} s -> {best['this']['wall_s']:.1f} s "
              f"(x{results[name]['ratio']}); compiles {best['previous'].get('compiles')} -> "
              f"{best['this'].get('compiles')}; holding the model {best['previous'].get('holds_model')} -> "
              f"{best['this'].get('holds_model')}; exit {best['previous']['exit']} -> {best['this']['exit']}; "
              f"{len(diff)} finding values differ beyond 1e-5")
        for d in diff:
            print(f"    {d}")
    if a.out:
        a.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
