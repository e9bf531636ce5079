"""Benchmark: `objdebug run` on the demo against a bare MindSpore script doing the same work.

    .venv/bin/python bench/bench_run.py --out /tmp/bench.json            # everything (~5 min)
    .venv/bin/python bench/bench_run.py --out /tmp/b.json --only compare  # objdebug vs bare only

Each measurement runs in a fresh subprocess: MindSpore compiles per process and caches graphs per
Cell, so neither side can reuse the other's graphs, and every number includes its compiles.

- objdebug side: `objdebug.api.run(load_config(demo=True), profile=...)`; `Engine.call` is wrapped
  to count calls per (graph, input shapes) (a dict increment per call).
- bare side: the same model + checkpoint + objective, built directly, and hand-written Cells
  (forward, per-sample loss, value_and_grad w.r.t. the parameters or the logits, loss on logits),
  one Cell per objdebug graph name, called with the same shapes and dtypes the same number of
  times (inputs: random in-vocabulary ids, labels with the padding label at the end).
- scaling: align/score rows replicated from the demo rows (10, 100, 1000) and responses lengthened
  to fill the 64/256/1024 length buckets, in a temp dir, passed with data.align/data.scores.
- compile cache: the objdebug side twice with one fresh `--compile-cache` directory (cold, warm).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_OVERHEAD = 0.25  # the target: objdebug adds at most 25% over the bare computation
SIG = re.compile(r"(\w+)\[([\d, ]*)\]")


# --------------------------------------------------------------------------- profile and data
def bench_profile(name: str, long_lengths: list[int] | None):
    """The named profile, with stress.long_lengths replaced when given (default: [2048])."""
    from objdebug.pipeline.profile import load_profile

    profile = load_profile(name)
    if long_lengths is not None:
        profile.data.setdefault("stress", {})["long_lengths"] = list(long_lengths)
        profile.name = f"{profile.name}+long{'-'.join(map(str, long_lengths))}"
    return profile


def _read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _stretch(text: str, target: int) -> str:
    """`text` repeated (space-separated) up to about `target` bytes, cut at a word boundary."""
    if target <= len(text.encode()):
        return text
    out = text
    while len((out + " " + text).encode()) <= target:
        out += " " + text
    return out


def make_data(folder: Path, n_rows: int, length: int | None = None) -> dict[str, str]:
    """n_rows align and score rows replicated from the demo's (ids made unique, every copy's
    responses lightly perturbed); `length`: prompt+response stretched to ~0.8 x that bucket."""
    demo = ROOT / "objdebug" / "demo"
    align, scores = _read_rows(demo / "align.jsonl"), _read_rows(demo / "scores.jsonl")
    folder.mkdir(parents=True, exist_ok=True)

    def fit(row: dict, fields: tuple[str, ...]) -> dict:
        row = dict(row)
        if length:
            room = int(0.8 * length) - len(row.get("prompt", "").encode())
            for f in fields:
                if f in row:
                    row[f] = _stretch(row[f], room)
        return row

    def replicate(rows: list[dict], fields: tuple[str, ...]) -> list[dict]:
        out = []
        for i in range(n_rows):
            row = fit(rows[i % len(rows)], fields)
            copy = i // len(rows)
            row["id"] = f"{row.get('id', 'r')}-{i}"
            if copy:  # perturb: a copy number at the end of each answer, so rows are not identical
                for f in fields:
                    if f in row:
                        row[f] = row[f][: max(len(row[f]) - 3, 1)] + f" {copy % 100}"
            out.append(row)
        return out

    paths = {"align": folder / "align.jsonl", "scores": folder / "scores.jsonl"}
    for key, rows, fields in (("align", align, ("good", "medium", "bad")),
                              ("scores", scores, ("response",))):
        with open(paths[key], "w", encoding="utf-8") as fh:
            for row in replicate(rows, fields):
                fh.write(json.dumps(row) + "\n")
    return {f"data.{k}": str(v) for k, v in paths.items()}


# --------------------------------------------------------------------------- workers
def worker_objdebug(spec: dict) -> dict:
    """Run objdebug's API once; count engine calls per (graph, shapes)."""
    t0 = time.perf_counter()
    from objdebug import api
    from objdebug.engine.core import Engine

    counts: Counter = Counter()
    seconds: Counter = Counter()
    raised: Counter = Counter()
    original = Engine.call

    def counting(self, name, fn, *args):
        key = (name, ",".join(f"{getattr(a, 'dtype', type(a).__name__)}{list(getattr(a, 'shape', ()))}"
                              for a in args))
        counts[key] += 1
        start = time.perf_counter()
        try:
            return original(self, name, fn, *args)
        except Exception:
            raised[key] += 1  # a probe meant to raise (out-of-range ids): the bare side raises too
            raise
        finally:
            seconds[key] += time.perf_counter() - start

    Engine.call = counting
    cfg = api.load_config(demo=True, overrides=spec.get("overrides") or None)
    profile = bench_profile(spec["profile"], spec.get("long_lengths"))
    t_import = time.perf_counter() - t0
    t = time.perf_counter()
    result = api.run(cfg, profile=profile, stages=spec.get("stages"),
                     compile_cache=spec.get("compile_cache"))
    wall = time.perf_counter() - t
    return {"side": "objdebug", "wall": wall, "import": t_import, "timings": result.timings,
            "compiles": {"count": result.compiles["count"], "seconds": result.compiles["seconds"]},
            "graphs": result.compiles["graphs"], "counts": result.counts(),
            "calls": [{"graph": g, "shapes": s, "calls": n, "seconds": seconds[(g, s)],
                       "raised": raised[(g, s)]}
                      for (g, s), n in counts.items()],
            "compile_cache": result.extra.get("compile_cache")}


def _bare_cells():
    """Hand-written Cells: what a user would write to compute the same things."""
    import mindspore as ms
    from mindspore import nn, ops

    def on_logits(objective, logits, labels):
        return objective(logits.reshape((-1, logits.shape[-1])), labels.reshape((-1,)))

    class Forward(nn.Cell):
        def __init__(self, model):
            super().__init__(auto_prefix=False)
            self.model = model

        def construct(self, ids):
            return self.model(ids)

    class Loss(nn.Cell):
        def __init__(self, model, objective):
            super().__init__(auto_prefix=False)
            self.model = model
            self.objective = objective

        def construct(self, ids, labels):
            return on_logits(self.objective, self.model(ids), labels)

    class PerSample(nn.Cell):
        def __init__(self, model, objective, batch):
            super().__init__(auto_prefix=False)
            self.model = model
            self.objective = objective
            self.batch = batch

        def construct(self, ids, labels):
            logits = self.model(ids)
            losses = []
            for b in range(self.batch):
                losses.append(self.objective(logits[b], labels[b]))
            return ops.stack(losses)

    class ParamGrad(nn.Cell):
        def __init__(self, model, objective):
            super().__init__(auto_prefix=False)
            self.weights = ms.ParameterTuple(model.trainable_params())
            self.grad = ms.value_and_grad(Loss(model, objective), None, self.weights)

        def construct(self, ids, labels):
            return self.grad(ids, labels)

    class LossOnLogits(nn.Cell):
        def __init__(self, objective):
            super().__init__(auto_prefix=False)
            self.objective = objective

        def construct(self, logits, labels):
            return on_logits(self.objective, logits, labels)

    class LogitGrad(nn.Cell):
        def __init__(self, objective):
            super().__init__(auto_prefix=False)
            self.grad = ms.value_and_grad(LossOnLogits(objective), 0)

        def construct(self, logits, labels):
            return self.grad(logits, labels)

    return Forward, Loss, PerSample, ParamGrad, LossOnLogits, LogitGrad


def worker_bare(spec: dict) -> dict:
    """The same graphs, shapes and call counts as an objdebug run, without objdebug."""
    t0 = time.perf_counter()
    import mindspore as ms
    import numpy as np

    from objdebug.core.config import load_config
    from objdebug.engine.target import import_factory

    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    cfg = load_config(demo=True)  # only to find the same factories, kwargs and checkpoint
    t_import = time.perf_counter() - t0
    t = time.perf_counter()
    model = import_factory(cfg.model.factory, "model", cfg.base_dir)(**cfg.model.kwargs)
    ms.load_param_into_net(model, ms.load_checkpoint(cfg.model.checkpoint))
    model.set_train(False)
    objective = import_factory(cfg.objective.factory, "objective", cfg.base_dir)(**cfg.objective.kwargs)
    Forward, Loss, PerSample, ParamGrad, LossOnLogits, LogitGrad = _bare_cells()
    vocab = int(cfg.model.kwargs.get("vocab_size", 256))
    rng = np.random.default_rng(0)

    def tensor(dtype: str, shape: list[int], role: str):
        if dtype.startswith("Int"):
            x = rng.integers(1, vocab, shape).astype(np.int32)
            if role == "labels":
                x[..., -max(shape[-1] // 4, 1):] = cfg.data.label_pad_id
            return ms.Tensor(x, ms.int32)
        np_dtype = {"Float16": np.float16, "Float32": np.float32}.get(dtype, np.float32)
        ms_dtype = {"Float16": ms.float16, "BFloat16": ms.bfloat16}.get(dtype, ms.float32)
        return ms.Tensor(rng.standard_normal(shape).astype(np_dtype), ms_dtype)

    cells: dict = {}
    done, skipped, failed = [], [], []
    for item in spec["calls"]:
        name, args = item["graph"], [(d, [int(v) for v in s.split(",") if v.strip()])
                                     for d, s in SIG.findall(item["shapes"])]
        kinds = "".join("i" if d.startswith("Int") else "f" for d, _ in args)
        if name == "model.forward" and kinds == "i":
            build, use = (lambda: Forward(model)), 1
        elif name == "objective.per_sample":
            build, use = (lambda b=args[0][1][0]: PerSample(model, objective, b)), 2
        elif kinds.startswith("ii") and ("grad" in name and "logit" not in name):
            build, use = (lambda: ParamGrad(model, objective)), 2   # param probe, FD, stress, decompose
        elif name.endswith(("logit_probe", "objective_long")) and kinds == "fi":
            build, use = (lambda: LogitGrad(objective)), 2   # value_and_grad w.r.t. the logits
        elif kinds == "fi":
            build, use = (lambda: LossOnLogits(objective)), 2
        elif kinds == "ii":
            build, use = (lambda: Loss(model, objective)), 2        # stress forward probes
        else:
            skipped.append(item)
            continue
        cell = cells.setdefault(name, build())  # one Cell per objdebug graph name
        inputs = [tensor(d, s, "labels" if i == 1 else "ids") for i, (d, s) in enumerate(args[:use])]
        # ids == vocab: the model's Gather raises; on logits (the label probes), labels == vocab
        k = 0 if inputs[0].dtype == ms.int32 else 1
        bad = inputs[:k] + [ms.Tensor(np.full(inputs[k].shape, vocab, np.int32))] + inputs[k + 1:]
        start = time.perf_counter()
        for k in range(item["calls"]):
            try:
                out = cell(*(bad if k >= item["calls"] - item.get("raised", 0) else inputs))
                first = out[0] if isinstance(out, tuple) else out
                first.asnumpy()
            except (RuntimeError, TypeError, ValueError) as exc:  # e.g. bf16 on CPU: objdebug SKIPs
                lines = [ln for ln in str(exc).splitlines() if any(ch.isalpha() for ch in ln)]
                failed.append({**item, "error": (lines or [type(exc).__name__])[0][:200]})
        done.append({**item, "seconds": time.perf_counter() - start})
    wall = time.perf_counter() - t
    return {"side": "bare", "wall": wall, "import": t_import, "calls_done": sum(c["calls"] for c in done),
            "graphs_done": len({c["graph"] for c in done}), "skipped": skipped, "failed": failed,
            "calls": done, "in_calls": sum(c["seconds"] for c in done)}


def _subprocess(kind: str, spec: dict, timeout: float = 1800) -> dict:
    """Run one worker in a fresh interpreter (own MindSpore graphs, own compile counter)."""
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(ROOT))
    for var in ("MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH"):
        env.pop(var, None)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="objdebug-bench-") as cwd:  # MindSpore droppings
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", kind,
                               json.dumps(spec)], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"For 'bench worker {kind}', the process exited {proc.returncode}: "
                           f"{proc.stderr.strip()[-2000:]}")
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
    out = json.loads(line)
    out["process_wall"] = time.perf_counter() - start
    return out


# --------------------------------------------------------------------------- experiments
def compare(spec: dict) -> dict:
    """objdebug then bare, each in its own process, same shapes and call counts."""
    od = _subprocess("objdebug", spec)
    bare = _subprocess("bare", {"calls": od["calls"]})
    return {"objdebug": od, "bare": bare, "ratio": od["wall"] / bare["wall"],
            "overhead": od["wall"] / bare["wall"] - 1.0,
            "process_ratio": od["process_wall"] / bare["process_wall"]}


def scaling(base: dict, points: list[tuple[str, int]], with_bare: bool) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="objdebug-bench-data-") as tmp:
        for axis, n in points:
            n_rows, length = (n, None) if axis == "rows" else (base["length_rows"], n)
            overrides = make_data(Path(tmp) / f"{axis}{n}", n_rows, length)
            spec = dict(base, overrides=overrides)
            res = compare(spec) if with_bare else {"objdebug": _subprocess("objdebug", spec)}
            od = res["objdebug"]
            rows.append({"axis": axis, "value": n, "rows": n_rows, "wall": od["wall"],
                         "compile_s": od["compiles"]["seconds"], "compiles": od["compiles"]["count"],
                         "calls": sum(c["calls"] for c in od["calls"]),
                         "stage_s": {k: round(v, 2) for k, v in od["timings"].items()},
                         "bare_wall": res.get("bare", {}).get("wall"), "ratio": res.get("ratio")})
    return rows


def cache_runs(spec: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="objdebug-bench-cache-") as tmp:
        plain = _subprocess("objdebug", spec)
        cold = _subprocess("objdebug", dict(spec, compile_cache=tmp))
        warm = _subprocess("objdebug", dict(spec, compile_cache=tmp))
    return {"plain": plain, "cold": cold, "warm": warm,
            "speedup_wall": cold["wall"] / warm["wall"],
            "compile_s": [plain["compiles"]["seconds"], cold["compiles"]["seconds"],
                          warm["compiles"]["seconds"]]}


# --------------------------------------------------------------------------- report
def _table(headers: list[str], rows: list[list]) -> str:
    cells = [[f"{v:.3g}" if isinstance(v, float) else ("" if v is None else str(v)) for v in r]
             for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])


def render(results: dict) -> str:
    out = []
    c = results.get("compare")
    if c:
        od, bare = c["objdebug"], c["bare"]
        out.append(f"objdebug vs bare MindSpore ({results['profile']}; stages {results['stages'] or 'profile'})")
        out.append(_table(["side", "wall_s", "process_s", "compiles", "compile_s", "calls"], [
            ["objdebug", od["wall"], od["process_wall"], od["compiles"]["count"],
             od["compiles"]["seconds"], sum(x["calls"] for x in od["calls"])],
            ["bare", bare["wall"], bare["process_wall"], od["compiles"]["count"], None,
             bare["calls_done"]]]))
        verdict = "within" if c["overhead"] <= TARGET_OVERHEAD else "OVER"
        out.append(f"ratio {c['ratio']:.3f} (overhead {c['overhead']:+.1%}, {verdict} the "
                   f"{TARGET_OVERHEAD:.0%} target); process ratio {c['process_ratio']:.3f}")
        in_calls = sum(x["seconds"] for x in od["calls"])
        out.append(f"time inside engine calls: objdebug {in_calls:.1f} s of {od['wall']:.1f} s "
                   f"(host work outside calls {od['wall'] - in_calls:.1f} s); bare {bare['in_calls']:.1f} s "
                   f"of {bare['wall']:.1f} s")
        bare_by = {(x["graph"], x["shapes"]): x["seconds"] for x in bare["calls"]}
        out.append(_table(["graph", "shapes", "calls", "objdebug_s", "bare_s"], [
            [x["graph"], x["shapes"][:40], x["calls"], x["seconds"], bare_by.get((x["graph"], x["shapes"]))]
            for x in od["calls"]]))
        if bare["skipped"]:
            out.append(f"bare side skipped graphs it has no equivalent for: {bare['skipped']}")
        out.append("per stage (objdebug, s): " + ", ".join(
            f"{k} {v:.2f}" for k, v in od["timings"].items()))
        out.append("")
    for axis in ("rows", "length"):
        rows = [r for r in results.get("scaling", []) if r["axis"] == axis]
        if rows:
            out.append(f"scaling with {axis} (stages {results['scaling_stages']})")
            out.append(_table([axis, "rows", "wall_s", "compile_s", "compiles", "calls", "bare_s", "ratio"],
                              [[r["value"], r["rows"], r["wall"], r["compile_s"], r["compiles"],
                                r["calls"], r["bare_wall"], r["ratio"]] for r in rows]))
            out.append("")
    cc = results.get("cache")
    if cc:
        out.append("compile cache (--compile-cache, one fresh directory)")
        out.append(_table(["run", "wall_s", "compile_s", "status", "hits", "misses"], [
            [name, cc[name]["wall"], cc[name]["compiles"]["seconds"],
             (cc[name]["compile_cache"] or {}).get("status", "off"),
             (cc[name]["compile_cache"] or {}).get("hits"), (cc[name]["compile_cache"] or {}).get("misses")]
            for name in ("plain", "cold", "warm")]))
        out.append(f"second-run speed-up {cc['speedup_wall']:.2f}x")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the results JSON here")
    ap.add_argument("--profile", default="default", help="profile name (default: default)")
    ap.add_argument("--long", default="2048", help="stress.long_lengths, comma-separated ('' keeps the profile's)")
    ap.add_argument("--stages", default="", help="comma-separated stages for the comparison (default: the profile's)")
    ap.add_argument("--only", default="compare,scaling,cache", help="which parts: compare,scaling,cache")
    ap.add_argument("--rows", default="10,100,1000")
    ap.add_argument("--lengths", default="64,256,1024")
    ap.add_argument("--length-rows", type=int, default=24, help="rows per file in the length scaling")
    ap.add_argument("--scaling-stages", default="align,grad,decompose,correlate",
                    help="stages for the scaling runs (stress does not depend on the data size)")
    ap.add_argument("--no-scaling-bare", action="store_true", help="scaling: objdebug side only")
    ap.add_argument("--worker", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        kind, spec = args.worker[0], json.loads(args.worker[1])
        out = worker_objdebug(spec) if kind == "objdebug" else worker_bare(spec)
        print(json.dumps(out, default=str))
        return 0

    long_lengths = [int(x) for x in args.long.split(",") if x.strip()] or None
    stages = [s for s in args.stages.split(",") if s] or None
    parts = set(args.only.split(","))
    spec = {"profile": args.profile, "long_lengths": long_lengths, "stages": stages}
    results: dict = {"profile": bench_profile(args.profile, long_lengths).name, "stages": stages,
                     "python": sys.version.split()[0], "cpus": os.cpu_count(),
                     "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    t0 = time.perf_counter()
    if "compare" in parts:
        results["compare"] = compare(spec)
        print(render({k: v for k, v in results.items() if k != "scaling"}), flush=True)
    if "scaling" in parts:
        sc_stages = [s for s in args.scaling_stages.split(",") if s]
        results["scaling_stages"] = sc_stages
        base = dict(spec, stages=sc_stages, length_rows=args.length_rows)
        points = [("rows", int(n)) for n in args.rows.split(",") if n] + \
                 [("length", int(n)) for n in args.lengths.split(",") if n]
        results["scaling"] = scaling(base, points, with_bare=not args.no_scaling_bare)
    if "cache" in parts:
        results["cache"] = cache_runs(spec)
    results["bench_seconds"] = time.perf_counter() - t0
    print(render(results))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
