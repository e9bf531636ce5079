"""Issue 48: `objdebug align` against a bare MindSpore script doing the same per-row work.

    python bench/bench_align_bare.py                          # this tree, best of 3, prints the table
    python bench/bench_align_bare.py --previous /tmp/prev     # + an older checkout, interleaved
    python bench/bench_align_bare.py --repeats 1 --out /tmp/align_bare.json

The target is the Llama fixture (fixtures/targets/llama_ce: RoPE, GQA, RMSNorm, SwiGLU, tied
embedding, ~0.25M parameters, trained on the demo corpus) with its masked mean cross-entropy, and
120 scored rows: 40 good / medium / bad triples, prompts of 5-40 byte tokens and answers of 20-205
(`bench_release.make_align`, the rows of issue 27's align-llama comparison).

The bare side (bench/bare_align.py, shared with bench_release.py) is what a user would write
without objdebug: build the model, load the checkpoint,
build the objective, then one static graph that runs the model on [8, T] and calls the objective on
each row (`objective(logits[b], labels[b])`, the flat call the config names), T the longest row,
called on the 15 batches of 8 and once on an all-masked batch (what align's OBJ105 probe scores).

Each side runs in a fresh process and a fresh working directory (cold: `--no-cache`, nothing
compiled before), the sides alternate (objdebug, bare, [previous], objdebug, ...), and the fastest
try of each side counts. The machine may be shared: every try is printed with the load average
read just before it (`/proc/loadavg`, 1 minute), and `wall` is the whole process (interpreter,
imports, compiles): what a user waits. For this tree's best try the report's `time_profile` says
where the time went (load, contract probe, align; compile, graph calls, host).
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
LLAMA = ROOT / "fixtures" / "targets" / "llama_ce" / "objdebug.toml"
TARGET_RATIO = 1.1



def _child_cpu() -> float:
    """User + system CPU seconds of finished children: steadier than the wall on a busy machine
    (but blind to waits), printed beside it."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def loadavg() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return float("nan")


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(tree), GLOG_v="3")
    for var in ("MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH", "OBJDEBUG_GRAPH_HEADROOM_BYTES"):
        env.pop(var, None)
    return env


def make_rows(folder: Path) -> Path:
    """The 120 rows (40 triples): issue 27's align-llama data."""
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_release import make_align

    return make_align(folder, rows=40, longest=205, prompts=(5, 40))


def run_objdebug(tree: Path, data: Path, cwd: Path, timeout: float) -> dict:
    """One cold `objdebug align` process (`tree`'s code) in a fresh working directory."""
    cwd.mkdir(parents=True, exist_ok=True)
    report = cwd / "align.json"
    cmd = [sys.executable, "-m", "objdebug.cli", "align", "-c", str(LLAMA), "--set",
           f"data.align='{data}'", "--no-cache", "-q", "--json", str(report)]
    load, cpu0 = loadavg(), _child_cpu()
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=_env(tree), capture_output=True, text=True, timeout=timeout)
    wall, cpu = time.perf_counter() - start, _child_cpu() - cpu0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"objdebug align ({tree}): exit {proc.returncode}: "
                         f"{(proc.stderr or proc.stdout).strip()[-1500:]}")
    r = json.loads(report.read_text())
    graphs = r["compiles"]["graphs"]
    align = next(res for res in r["results"] if res["check"] == "alignment")
    values = {f"{res['check']}/{f['code']}": f["value"] for res in r["results"] for f in res["findings"]}
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load": load, "exit": proc.returncode,
            "compiles": len(graphs), "holds_model": sum(bool(g.get("holds_model")) for g in graphs),
            "compile_s": round(r["compiles"]["seconds"], 2),
            "graphs": [f"{g['graph']} {g['shapes']}".strip() for g in graphs],
            "timings": r["timings"], "time_profile": (r.get("extra") or {}).get("time_profile"),
            "mean_loss": align["value"]["mean_loss"] if isinstance(align.get("value"), dict) else None,
            "values": values}


def run_bare(spec: Path, data: Path, cwd: Path, timeout: float) -> dict:
    """One bare script (bench/bare_align.py) on the Llama fixture, in a fresh process."""
    cwd.mkdir(parents=True, exist_ok=True)
    load, cpu0 = loadavg(), _child_cpu()
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bare_align.py"), str(data), str(spec)],
                          cwd=cwd, env=_env(ROOT), capture_output=True, text=True, timeout=timeout)
    wall, cpu = time.perf_counter() - start, _child_cpu() - cpu0
    if proc.returncode:
        raise SystemExit(f"bare align: exit {proc.returncode}: {proc.stderr.strip()[-1500:]}")
    out = json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load": load, "compiles": 1, **out}


def measure(repeats: int, previous: Path | None, work: Path, timeout: float = 1800) -> dict:
    data = make_rows(work / "data")
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_release import bare_spec

    spec = bare_spec(LLAMA, work / "bare_spec.json")
    sides = [("objdebug", ROOT), ("bare", None)] + ([("previous", previous)] if previous else [])
    tries: dict[str, list[dict]] = {name: [] for name, _ in sides}
    for k in range(repeats):
        for name, tree in sides:  # interleaved: a machine that gets busier slows every side
            cwd = work / f"{name}.{k}"
            r = run_bare(spec, data, cwd, timeout) if tree is None else run_objdebug(tree, data, cwd, timeout)
            tries[name].append(r)
            print(f"  try {k + 1} {name:<9} {r['wall_s']:6.2f} s  CPU {r.get('cpu_s', float('nan')):6.2f} s  "
                  f"(load {r['load']:.2f})", flush=True)
    best = {name: min(rs, key=lambda r: r["wall_s"]) for name, rs in tries.items()}
    out = {"repeats": repeats, "rows": 120, "tries": tries, "best": best,
           "ratio": round(best["objdebug"]["wall_s"] / best["bare"]["wall_s"], 3)}
    if previous:
        out["previous_ratio"] = round(best["previous"]["wall_s"] / best["bare"]["wall_s"], 3)
        out["previous_tree"] = str(previous)
    return out


def render(res: dict) -> str:
    lines = ["objdebug align vs bare MindSpore (Llama fixture, 120 rows: 40 good/medium/bad triples, "
             "prompts 5-40 + answers 20-205 tokens; cold, whole process, best of "
             f"{res['repeats']}, interleaved)", "",
             "| side | " + " | ".join(f"try {k + 1} s (load)" for k in range(res["repeats"]))
             + " | best s | x bare | compiles (holding the model) |",
             "|---|" + "---|" * res["repeats"] + "---|---|---|"]
    bare = res["best"]["bare"]["wall_s"]
    for name, rs in res["tries"].items():
        b = res["best"][name]
        held = f"{b['compiles']} ({b['holds_model']})" if "holds_model" in b else "1 (1)"
        lines.append(f"| {name} | " + " | ".join(f"{r['wall_s']:.2f} ({r['load']:.2f})" for r in rs)
                     + f" | {b['wall_s']:.2f} | {b['wall_s'] / bare:.2f} | {held} |")
    verdict = "met" if res["ratio"] <= TARGET_RATIO else "MISSED"
    lines += ["", f"ratio {res['ratio']:.2f}x (target <= {TARGET_RATIO}x: {verdict})"]
    cpu = {name: min((r["cpu_s"] for r in rs if "cpu_s" in r), default=None) for name, rs in res["tries"].items()}
    if cpu.get("bare") and cpu.get("objdebug"):
        lines.append("least CPU seconds per side (steadier than the wall on a busy machine): "
                     + ", ".join(f"{n} {c:.2f}" for n, c in cpu.items() if c)
                     + f"; objdebug / bare {cpu['objdebug'] / cpu['bare']:.2f}x")
    if "previous_ratio" in res:
        lines.append(f"previous tree ({res['previous_tree']}): {res['previous_ratio']:.2f}x")
    for name in ("objdebug", "previous"):
        b = res["best"].get(name)
        if not b:
            continue
        lines.append(f"{name} graphs: {', '.join(b['graphs'])}")
        prof = b.get("time_profile")
        if prof:
            lines.append(f"{name} time profile (best try; s): " + "; ".join(
                f"{step} {e['wall']:.2f} = compile {e['compile']:.2f} + calls {e['calls']:.2f} + "
                f"host {e['host']:.2f}" for step, e in prof["steps"].items())
                + f"; in-process total {prof.get('total', float('nan')):.2f}")
        else:
            lines.append(f"{name} timings (s): {b['timings']}")
    if "previous" in res["best"]:
        a, b = res["best"]["previous"]["values"], res["best"]["objdebug"]["values"]
        diff = [k for k in set(a) | set(b) if not _close(a.get(k), b.get(k))]
        lines.append(f"finding values: {len(diff)} differ beyond 1e-5" + (f" ({', '.join(sorted(diff))})" if diff else ""))
    return "\n".join(lines)


def _close(a, b, rtol: float = 1e-5) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(_close(a[k], b[k], rtol) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y, rtol) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if a == b or (a != a and b != b):
            return True
        return abs(a - b) <= rtol * max(abs(a), abs(b))
    return a == b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--previous", type=Path, help="a checkout of an older tree, measured alongside")
    ap.add_argument("--out", type=Path, help="every number as JSON")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="align-bare-") as tmp:
        res = measure(a.repeats, a.previous.resolve() if a.previous else None, Path(tmp))
    print(render(res), flush=True)
    if a.out:
        a.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
