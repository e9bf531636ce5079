"""Benchmark for issue 10's and issue 27's "Done when": this tree against the previous release, and
`objdebug align` against a bare MindSpore script, measured side by side in one run. Not run in CI.

    .venv/bin/python bench/bench_release.py                    # everything, ~12-16 min on 2 cores
    .venv/bin/python bench/bench_release.py --only align       # the align comparison, ~1 min
    .venv/bin/python bench/bench_release.py --only demo --repeat 3   # issue 27's demo row, ~7 min
    .venv/bin/python bench/bench_release.py --only release --repeat 2 --out /tmp/release.json

- release: the previous release (git commit `--prev`, default 6abc76d, exported with `git archive`
  from `--repo` into a temp dir) and this tree, one fresh CLI process per side and run, each in its
  own empty working directory (cold: no compile cache, no MindSpore droppings):
  `objdebug run --demo --stages align,grad,decompose,correlate,stress` (default profile) and the
  same without stress; then this tree warm: the no-stress run again with the compile cache of the
  cold run (the cache on by default in `.objdebug_cache/` of the working directory when the CLI
  has `--no-cache`, else `--compile-cache DIR`, found from `run --help`). Targets: with stress
  cold <= 0.6x the previous release, without stress cold <= 0.6x, warm <= 0.25x the previous
  release's cold.
- align: a generated 40-row target (good / medium / bad answers of 20-200 byte tokens, from the
  demo's rows, the demo model and tokenizer: byte tokens, sinusoidal positions, no length limit)
  through `objdebug align` against a bare script that loads the same model, checkpoint and
  objective and computes the same per-answer losses (the 120 answers and the all-masked batch)
  with the fewest graphs: one per-sample graph, at one shape [8, longest row]. Target <= 1.25x.
- demo (issue 27): `objdebug demo` (every stage, default profile), cold (OBJDEBUG_NO_CACHE=1), the
  previous release (`--prev27`, default bc2d9e2: main before issue 27) and this tree, interleaved,
  the fastest of `--repeat` tries per side; each process's max RSS (its tree's largest process,
  from wait4) and this tree's compile count. Targets: wall <= 0.4x, max RSS <= 4 GiB, <= 16 compiles.
- align-llama (issue 27, real-shaped): the same comparison on the Llama fixture
  (fixtures/targets/llama_ce: RoPE, GQA, RMSNorm, SwiGLU, tied embedding) with data shaped like
  real data: 40 prompts of 5-40 tokens, 3 answers of 20-205 tokens each. Target <= 1.2x.

Times are the whole process (interpreter start, imports, loading, compiles): what a user waits.
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
STAGES = "align,grad,decompose,correlate,stress"
NO_STRESS = "align,grad,decompose,correlate"
TARGETS = {"stress_cold": 0.6, "cold": 0.6, "warm": 0.25, "align": 1.25, "align-llama": 1.2,
           "demo": 0.4, "demo_rss_gib": 4.0, "demo_compiles": 16}
LLAMA = ROOT / "fixtures" / "targets" / "llama_ce" / "objdebug.toml"


# --------------------------------------------------------------------------- sides
def export_release(repo: Path, commit: str, into: Path) -> Path:
    """The tree of `commit`, as `git archive` writes it (no .git, no build outputs)."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", commit], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(tree), GLOG_v="3")
    for var in ("MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH"):
        env.pop(var, None)
    return env


def cache_args(tree: Path) -> tuple[list[str], list[str]]:
    """(args for a cold run that fills a cache, args for the warm run) for this CLI: a default cache
    in the working directory when `run --help` offers --no-cache, else --compile-cache DIR
    (DIR relative to the working directory, so cold and warm share it)."""
    help_text = subprocess.run([sys.executable, "-m", "objdebug.cli", "run", "--help"],
                               capture_output=True, text=True, env=dict(_env(tree), COLUMNS="200"),
                               cwd=tempfile.gettempdir()).stdout
    if "--no-cache" in help_text:
        return [], []
    if "--compile-cache" in help_text:
        return ["--compile-cache", "bench-cache"], ["--compile-cache", "bench-cache"]
    raise SystemExit("this objdebug has no compile cache option")


def _child_cpu() -> float:
    """User + system CPU seconds of the finished child processes: less sensitive than the wall
    time to other jobs on a shared machine (but blind to waits, e.g. the 3 s of a raising call)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_cli(tree: Path, cwd: Path, args: list[str], name: str, timeout: float = 3600) -> dict:
    """One `python -m objdebug.cli ...` process in `cwd`; wall time of the whole process."""
    cwd.mkdir(parents=True, exist_ok=True)
    report = cwd / f"{name}.json"
    cmd = [sys.executable, "-m", "objdebug.cli", *args, "-q", "--json", str(report)]
    start, cpu0 = time.perf_counter(), _child_cpu()
    proc = subprocess.run(cmd, cwd=cwd, env=_env(tree), capture_output=True, text=True,
                          timeout=timeout)
    wall, cpu = time.perf_counter() - start, _child_cpu() - cpu0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{name}: exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-1500:]}")
    data = json.loads(report.read_text())
    cache = (data.get("extra") or {}).get("compile_cache") or {}
    return {"name": name, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "exit_code": proc.returncode,
            "compiles": data["compiles"]["count"], "compile_s": round(data["compiles"]["seconds"], 2),
            "timings": {k: round(v, 2) for k, v in data["timings"].items()},
            "cache": cache.get("status", "off"), "hits": cache.get("hits"),
            "summary": data.get("summary")}


def release(repo: Path, commit: str, work: Path, repeat: int = 1) -> dict:
    prev = export_release(repo, commit, work / "prev")
    cold_args, warm_args = cache_args(ROOT)
    tries: dict[str, list[dict]] = {}
    for k in range(repeat):
        # interleaved, so a load change on the shared machine hits both sides alike
        for stages, tag in ((STAGES, "stress"), (NO_STRESS, "nostress")):
            for side, tree, extra in (("prev", prev, []),
                                      ("cur", ROOT, cold_args if tag == "nostress" else [])):
                name = f"{side}_{tag}"
                r = run_cli(tree, work / f"{name}.{k}", ["run", "--demo", "--stages", stages, *extra],
                            name)
                tries.setdefault(name, []).append(r)
                print(_row(r), flush=True)
        # warm: the same working directory (and cache) as this round's cold no-stress run
        r = run_cli(ROOT, work / f"cur_nostress.{k}", ["run", "--demo", "--stages", NO_STRESS,
                                                        *warm_args], "cur_nostress_warm")
        tries.setdefault("cur_nostress_warm", []).append(r)
        print(_row(r), flush=True)
    runs = {name: min(rs, key=lambda r: r["wall_s"]) for name, rs in tries.items()}  # least disturbed
    pairs = {"stress_cold": ("prev_stress", "cur_stress"), "cold": ("prev_nostress", "cur_nostress"),
             "warm": ("prev_nostress", "cur_nostress_warm")}
    ratios = {k: runs[c]["wall_s"] / runs[p]["wall_s"] for k, (p, c) in pairs.items()}
    cpu_ratios = {k: runs[c]["cpu_s"] / runs[p]["cpu_s"] for k, (p, c) in pairs.items()}
    return {"prev": commit, "repeat": repeat, "runs": runs, "ratios": ratios,
            "cpu_ratios": cpu_ratios, "tries": tries}


def run_demo(tree: Path, cwd: Path, name: str, timeout: float = 3600) -> dict:
    """One cold `objdebug demo` process in `cwd`: its wall time and max RSS (wait4: the largest
    process of its tree, as time(1) reports it, per process rather than over all children)."""
    cwd.mkdir(parents=True, exist_ok=True)
    report = cwd / f"{name}.json"
    cmd = [sys.executable, "-m", "objdebug.cli", "demo", "-q", "--json", str(report)]
    start = time.perf_counter()
    err = (cwd / f"{name}.stderr").open("w+b")  # a file, not a pipe nobody reads until the exit
    proc = subprocess.Popen(cmd, cwd=cwd, env=dict(_env(tree), OBJDEBUG_NO_CACHE="1"),
                            stdout=subprocess.DEVNULL, stderr=err)
    deadline = start + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            raise SystemExit(f"{name}: over {timeout} s")
        time.sleep(0.05)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    err.seek(0)
    tail = err.read().decode(errors="replace")[-1500:]
    err.close()
    if code != 0:
        raise SystemExit(f"{name}: exit {code}: {tail}")
    data = json.loads(report.read_text())
    return {"name": name, "wall_s": round(wall, 2), "max_rss_gib": round(usage.ru_maxrss / 2**20, 2),
            "compiles": data["compiles"]["count"], "summary": data.get("summary")}


def demo_compare(repo: Path, commit: str, work: Path, repeat: int = 1) -> dict:
    """Issue 27's demo row: the previous release and this tree, interleaved, fastest of `repeat`."""
    prev = export_release(repo, commit, work / "prev27")
    tries: dict[str, list[dict]] = {"prev": [], "cur": []}
    for k in range(repeat):
        for side, tree in (("prev", prev), ("cur", ROOT)):
            r = run_demo(tree, work / f"demo_{side}.{k}", f"demo_{side}")
            tries[side].append(r)
            print(f"  {side} try {k + 1}: {r['wall_s']:.1f} s, max RSS {r['max_rss_gib']:.2f} GiB, "
                  f"{r['compiles']} compiles", flush=True)
    best = {side: min(rs, key=lambda r: r["wall_s"]) for side, rs in tries.items()}
    return {"prev": commit, "repeat": repeat, "best": best, "tries": tries,
            "ratio": best["cur"]["wall_s"] / best["prev"]["wall_s"]}


# --------------------------------------------------------------------------- align comparison
def _stretch(text: str, n: int) -> str:
    """`text` repeated (space-separated) and cut to exactly n bytes (byte tokenizer: n tokens)."""
    out = text
    while len(out.encode()) < n:
        out += " " + text
    return out.encode()[:n].decode("utf-8", "ignore")


def make_align(folder: Path, rows: int = 40, longest: int = 200, prompts: tuple[int, int] | None = None) -> Path:
    """`rows` align rows from the demo's, answers stretched to 20..longest tokens (varied lengths);
    `prompts` (shortest, longest): prompts stretched or cut to that many tokens too."""
    demo = [json.loads(x) for x in (ROOT / "objdebug" / "demo" / "align.jsonl").read_text().splitlines()
            if x.strip()]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "align.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(rows):
            src = demo[i % len(demo)]
            n = 20 + (i * 37) % (longest - 19)  # 20..longest, spread over the rows
            if i == 0:
                n = longest
            prompt = src["prompt"]
            if prompts:  # 5..40 tokens, spread over the rows differently from the answers
                lo, hi = prompts
                prompt = _stretch(prompt, lo + (i * 13) % (hi - lo + 1))
            row = {"id": f"b{i:03d}", "prompt": prompt}
            for kind in ("good", "medium", "bad"):
                row[kind] = _stretch(src[kind], n)
            fh.write(json.dumps(row) + "\n")
    return path


def bare_spec(config: Path | None, path: Path) -> Path:
    """What bench/bare_align.py builds, read from `config` (the demo's when None) here, so the bare
    script itself imports nothing of objdebug: the factories, their kwargs, the checkpoint and the
    pad ids, and the folders the factories import from (as the engine resolves them)."""
    from objdebug.core.config import load_config
    from objdebug.engine.target import _package_root

    cfg = load_config(config) if config else load_config(demo=True)
    roots = [_package_root(spec.partition(":")[0].split(".")[0], cfg.base_dir)
             for spec in (cfg.model.factory, cfg.objective.factory)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "model": cfg.model.factory, "model_kwargs": cfg.model.kwargs, "checkpoint": str(cfg.model.checkpoint),
        "objective": cfg.objective.factory, "objective_kwargs": cfg.objective.kwargs,
        "pad_id": cfg.data.pad_id, "label_pad_id": cfg.data.label_pad_id, "paths": sorted(set(roots))}))
    return path


def align_compare(work: Path, repeat: int = 1, config: Path | None = None) -> dict:
    """objdebug align vs the bare script: on the demo, or (config) on a real-shaped target."""
    if config is None:
        data = make_align(work / "align-data")
        args = ["align", "--demo", "--set", f"data.align='{data}'"]
    else:
        data = make_align(work / "align-data-real", longest=205, prompts=(5, 40))
        args = ["align", "-c", str(config), "--set", f"data.align='{data}'"]
    if "--no-cache" in _help(ROOT):
        args.append("--no-cache")  # cold, like the bare script
    cwd = work / ("align-bare" if config is None else "align-bare-real")
    cwd.mkdir(parents=True, exist_ok=True)
    spec = bare_spec(config, cwd / "bare_spec.json")
    ods, bares = [], []
    for k in range(repeat):  # interleaved; the fastest try of each side counts
        ods.append(run_cli(ROOT, work / f"align-objdebug{'' if config is None else '-real'}.{k}", args, "align"))
        start, cpu0 = time.perf_counter(), _child_cpu()
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bare_align.py"), str(data), str(spec)],
                              cwd=cwd, env=_env(ROOT),
                              capture_output=True, text=True, timeout=1800)
        wall, cpu = time.perf_counter() - start, _child_cpu() - cpu0
        if proc.returncode:
            raise SystemExit(f"bare align: exit {proc.returncode}: {proc.stderr.strip()[-1500:]}")
        bare = json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])
        bare.update(name="bare align", wall_s=round(wall, 2), cpu_s=round(cpu, 2), compiles=1)
        bares.append(bare)
    od, bare = min(ods, key=lambda r: r["wall_s"]), min(bares, key=lambda r: r["wall_s"])
    return {"objdebug": od, "bare": bare, "ratio": od["wall_s"] / bare["wall_s"],
            "cpu_ratio": od["cpu_s"] / bare["cpu_s"], "repeat": repeat}


def _help(tree: Path) -> str:
    return subprocess.run([sys.executable, "-m", "objdebug.cli", "align", "--help"], capture_output=True,
                          text=True, env=dict(_env(tree), COLUMNS="200")).stdout


# --------------------------------------------------------------------------- report
def _row(r: dict) -> str:
    return (f"  {r['name']:<20} {r['wall_s']:>8.1f} s  compiles {r['compiles']:>3} "
            f"({r['compile_s']:.1f} s)  cache {r['cache']}"
            + (f" ({r['hits']} hits)" if r.get("hits") is not None else ""))


def render(res: dict) -> str:
    out = []
    rel = res.get("release")
    if rel:
        runs, ratios = rel["runs"], rel["ratios"]
        out.append(f"previous release {rel['prev']} vs this tree (demo, default profile; whole process, s)")
        cpu = rel.get("cpu_ratios", {})
        out.append("| run | previous (cold) | this tree | ratio | target | CPU-time ratio |")
        out.append("|---|---|---|---|---|---|")
        for label, prev, cur, key in (
                (f"--stages {STAGES}, cold", "prev_stress", "cur_stress", "stress_cold"),
                (f"--stages {NO_STRESS}, cold", "prev_nostress", "cur_nostress", "cold"),
                (f"--stages {NO_STRESS}, warm cache", "prev_nostress", "cur_nostress_warm", "warm")):
            ok = "ok" if ratios[key] <= TARGETS[key] else "MISSED"
            cpu_ratio = f"{cpu[key]:.2f}x" if key in cpu else ""
            out.append(f"| {label} | {runs[prev]['wall_s']:.1f} | {runs[cur]['wall_s']:.1f} | "
                       f"{ratios[key]:.2f}x | <= {TARGETS[key]}x {ok} | {cpu_ratio} |")
        out.append("")
        out.append(f"(fastest of {rel.get('repeat', 1)} interleaved tries per run; whole process)")
        out.append("| run | wall s | CPU s | compiles | compile s | cache | stage seconds |")
        out.append("|---|---|---|---|---|---|---|")
        for r in runs.values():
            stages = ", ".join(f"{k} {v:.1f}" for k, v in r["timings"].items())
            out.append(f"| {r['name']} | {r['wall_s']:.1f} | {r.get('cpu_s', float('nan')):.1f} | "
                       f"{r['compiles']} | {r['compile_s']:.1f} | {r['cache']} | {stages} |")
        out.append("")
    demo = res.get("demo")
    if demo:
        p, c = demo["best"]["prev"], demo["best"]["cur"]
        ok = lambda good: "ok" if good else "MISSED"  # noqa: E731
        out.append(f"objdebug demo, cold: previous release {demo['prev']} vs this tree "
                   f"(fastest of {demo['repeat']} interleaved tries; whole process)")
        out.append("| | previous | this tree | target |")
        out.append("|---|---|---|---|")
        out.append(f"| wall s | {p['wall_s']:.1f} | {c['wall_s']:.1f} ({demo['ratio']:.2f}x) | "
                   f"<= {TARGETS['demo']}x {ok(demo['ratio'] <= TARGETS['demo'])} |")
        rss = max(r["max_rss_gib"] for r in demo["tries"]["cur"])
        out.append(f"| max RSS GiB (largest try) | {max(r['max_rss_gib'] for r in demo['tries']['prev']):.2f} | "
                   f"{rss:.2f} | <= {TARGETS['demo_rss_gib']} {ok(rss <= TARGETS['demo_rss_gib'])} |")
        out.append(f"| compiles | {p['compiles']} | {c['compiles']} | <= {TARGETS['demo_compiles']} "
                   f"{ok(c['compiles'] <= TARGETS['demo_compiles'])} |")
        out.append("tries, wall s: previous " + ", ".join(f"{r['wall_s']:.1f}" for r in demo["tries"]["prev"])
                   + "; this tree " + ", ".join(f"{r['wall_s']:.1f}" for r in demo["tries"]["cur"]))
        out.append("")
    for key, title in (("align", "demo, 40 rows x 3 answers, up to 200 tokens"),
                       ("align-llama", "Llama fixture, 40 prompts of 5-40 tokens x 3 answers of 20-205")):
        al = res.get(key)
        if not al:
            continue
        od, bare = al["objdebug"], al["bare"]
        ok = "ok" if al["ratio"] <= TARGETS[key] else "MISSED"
        out.append(f"objdebug align vs bare MindSpore ({title}; whole process, s)")
        out.append("| side | wall s | CPU s | compiles |")
        out.append("|---|---|---|---|")
        out.append(f"| objdebug align | {od['wall_s']:.1f} | {od.get('cpu_s', float('nan')):.1f} | "
                   f"{od['compiles']} ({od['compile_s']:.1f} s) |")
        out.append(f"| bare script ({bare['answers']} answers + masked batch, one [8,{bare['length']}] "
                   f"graph) | {bare['wall_s']:.1f} | {bare.get('cpu_s', float('nan')):.1f} | 1 |")
        cpu_ratio = f"; CPU-time ratio {al['cpu_ratio']:.2f}x" if "cpu_ratio" in al else ""
        out.append(f"ratio {al['ratio']:.2f}x (target <= {TARGETS[key]}x: {ok}){cpu_ratio}")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="release,align,align-llama,demo",
                    help="parts: release,align,align-llama,demo")
    ap.add_argument("--prev", default="6abc76d", help="the previous release's git commit (issue 10)")
    ap.add_argument("--prev27", default="bc2d9e2", help="the previous release for the demo part (issue 27)")
    ap.add_argument("--repo", type=Path, default=ROOT, help="a git repository that has --prev")
    ap.add_argument("--repeat", type=int, default=1,
                    help="interleaved tries per run, the fastest counts (a shared machine)")
    ap.add_argument("--out", type=Path, help="write the results JSON here")
    args = ap.parse_args(argv)
    parts = set(args.only.split(","))
    res: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="objdebug-bench-release-") as tmp:
        if "align" in parts:
            res["align"] = align_compare(Path(tmp), args.repeat)
            print(render({"align": res["align"]}), flush=True)
        if "align-llama" in parts:
            res["align-llama"] = align_compare(Path(tmp), args.repeat, LLAMA)
            print(render({"align-llama": res["align-llama"]}), flush=True)
        if "release" in parts:
            res["release"] = release(args.repo, args.prev, Path(tmp), args.repeat)
        if "demo" in parts:
            res["demo"] = demo_compare(args.repo, args.prev27, Path(tmp), args.repeat)
            print(render({"demo": res["demo"]}), flush=True)
    print()
    print(render(res))
    if args.out:
        args.out.write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
