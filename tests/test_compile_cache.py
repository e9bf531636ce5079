"""The compile cache (on by default in ./.objdebug_cache): keys, the manifest guard (against a
simulated MindSpore), real runs.

MindSpore's own cache loads the n-th compile of a process from `compile_cache_<n>.mindir`
whatever graph that is. `FakeMindSpore` reproduces exactly that (measured in docs/performance.md)
so the guard can be tested for every sequence change in milliseconds; the real runs (subprocesses:
the cache is per process) check the CLI default, cold -> warm, --no-cache, and that another model
size gets another directory.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from objdebug.engine import compile_cache
from objdebug.engine.compile_cache import MANIFEST, CompileCache, cache_key, key_parts
from objdebug.core.config import load_config
from objdebug.pipeline.profile import load_profile

pytestmark = pytest.mark.mindspore_range  # what differs between releases: CI runs it on the oldest too

ROOT = Path(__file__).resolve().parent.parent
CACHE_TINY = ROOT / "fixtures" / "targets" / "cache_tiny" / "objdebug.toml"


# --------------------------------------------------------------------------- keys
def _key(cfg, profile=None, stages=("align",)):
    return cache_key(key_parts(cfg, profile or load_profile("quick"), list(stages), {}, 8))


def test_key_changes_with_model_size_data_and_profile(tmp_path):
    base = _key(load_config(CACHE_TINY))
    assert base == _key(load_config(CACHE_TINY))  # deterministic
    bigger = load_config(CACHE_TINY, overrides={"model.kwargs": {"vocab_size": 256, "d_model": 32,
                                                                 "n_layers": 1, "n_heads": 2}})
    assert _key(bigger) != base
    longer = tmp_path / "align.jsonl"  # longer responses: other length buckets
    longer.write_text(json.dumps({"id": "x", "prompt": "p", "good": "g" * 300, "bad": "b" * 300}) + "\n")
    assert _key(load_config(CACHE_TINY, overrides={"data.align": str(longer)})) != base
    profile = load_profile("quick")
    profile.data["stress"]["long_lengths"] = [4096]
    assert _key(load_config(CACHE_TINY), profile) != base
    assert _key(load_config(CACHE_TINY), stages=("align", "grad")) != base


def test_key_ignores_the_checkpoint_values():
    # parameters are bound at run time (measured): a retrained checkpoint may reuse the graphs
    cfg = load_config(CACHE_TINY)
    other = load_config(CACHE_TINY, overrides={"model.checkpoint": "elsewhere.ckpt"})
    assert _key(cfg) == _key(other)


# --------------------------------------------------------------------------- the guard
class FakeMindSpore:
    """MindSpore 2.10's compile cache as measured: index-keyed files, no check of the graph, and
    no more loading once one index misses. `compile(graph)` returns the graph it really ran."""

    def __init__(self, folder: Path):
        self.folder = folder / "rank_0" / "graph_cache"
        self.n = 0
        self.missed = False

    def compile(self, graph: str) -> str:
        if os.environ.get("MS_COMPILER_CACHE_ENABLE") != "1":  # no cache: nothing loaded or saved
            return graph
        path = self.folder / f"compile_cache_{self.n}.mindir"
        self.n += 1
        if path.is_file() and not self.missed:
            return path.read_text()  # whatever is there: possibly another graph
        self.missed = True
        self.folder.mkdir(parents=True, exist_ok=True)
        path.write_text(graph)
        return graph


def FakeEngine(ms: FakeMindSpore):
    """The real Engine (its compile hook is what the cache listens to) over a stand-in target."""
    from types import SimpleNamespace

    from objdebug.engine.core import Engine

    data = SimpleNamespace(pad_id=0, label_pad_id=-100, shift=True, vocab_size=256)
    engine = Engine(SimpleNamespace(config=SimpleNamespace(data=data)))
    engine.ms, engine.compiled = ms, set()
    return engine


class Shape:
    def __init__(self, *shape):
        self.shape = shape
        self.dtype = "Int32"


def run_sequence(tmp_path, monkeypatch, graphs, *, hidden_after=None, crash_after=None, retire_before=(),
                 named=True, eager=True, deterministic=True):
    """One simulated process: open, compile `graphs` (name, length) through the engine, close."""
    monkeypatch.setattr(compile_cache, "_process", {"dir": None})
    monkeypatch.setattr(compile_cache, "_any_graph_compiled", lambda: False)
    monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", "0")  # restored after the test
    monkeypatch.setenv("MS_COMPILER_CACHE_PATH", "")
    cache = CompileCache(str(tmp_path / "cache"), named=named)
    monkeypatch.setattr(compile_cache, "key_parts", lambda *a: {"fixed": 1})
    cache.open(None, None, [], {}, 8)
    ms = FakeMindSpore(cache.dir)
    engine = FakeEngine(ms)
    cache.attach(engine)
    ran, asked = [], [None]
    # the graph's answer without the graph (PyNative in a real run): the graph asked for
    draws = iter(range(1 << 30))

    def reference(fn, args):
        if not eager:
            raise RuntimeError("this Cell cannot run in PyNative mode")
        return asked[0] if deterministic else f"{asked[0]} (dropout draw {next(draws)})"

    engine.reference = reference
    try:
        with cache:
            for i, (name, length) in enumerate(graphs):
                asked[0] = f"{name}@{length}"
                if i in retire_before:  # the graph raised: it compiles again when called again
                    engine.retire(name)
                    engine.compiled.discard((name, length))
                seen = (name, length) in engine.compiled
                engine.compiled.add((name, length))
                ran.append(engine.call(name, (lambda *_, g=f"{name}@{length}", s=seen: None if s
                                              else ms.compile(g)), Shape(8, length)))
                if hidden_after == i:
                    ms.compile("hidden@0")  # a graph compiled outside the engine
                if crash_after == i:
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    return cache, [r for r in ran if r is not None]


SEQ = [("forward", 32), ("per_sample", 64), ("grad", 64), ("per_sample", 128)]


def test_cold_then_warm_hits_every_graph(tmp_path, monkeypatch):
    cold, ran = run_sequence(tmp_path, monkeypatch, SEQ)
    assert cold.status == "cold" and cold.misses == 4 and (cold.dir / MANIFEST).is_file()
    warm, ran = run_sequence(tmp_path, monkeypatch, SEQ)
    assert warm.status == "warm" and (warm.hits, warm.misses) == (4, 0)
    assert ran == [f"{n}@{t}" for n, t in SEQ]
    assert os.environ["MS_COMPILER_CACHE_PATH"] == str(warm.dir)


def test_a_graph_compiled_again_after_it_was_retired_is_the_next_file(tmp_path, monkeypatch):
    """A graph the engine retired (it raised) or let go (memory) compiles again: the next file of
    the sequence, in the manifest like any compile, so the cache stays safe and the next run
    hits every one."""
    seq = SEQ + [("per_sample", 64)]
    cold, ran = run_sequence(tmp_path, monkeypatch, seq, retire_before={4})
    assert cold.status == "cold" and not cold.unsafe and (cold.dir / MANIFEST).is_file()
    assert cold.misses == 5
    warm, ran = run_sequence(tmp_path, monkeypatch, seq, retire_before={4})
    assert (warm.hits, warm.misses) == (5, 0) and ran == [f"{n}@{t}" for n, t in seq]


@pytest.mark.parametrize("changed", [
    [("forward", 32), ("grad", 64), ("per_sample", 64), ("per_sample", 128)],   # another order
    [("forward", 32), ("per_sample", 256), ("grad", 256), ("per_sample", 128)],  # another length
    [("forward", 32), ("per_sample", 64), ("grad", 64), ("per_sample", 128), ("long", 2048)],
])
def test_a_changed_sequence_never_loads_a_stale_graph(tmp_path, monkeypatch, changed):
    run_sequence(tmp_path, monkeypatch, SEQ)
    cache, ran = run_sequence(tmp_path, monkeypatch, changed)
    assert ran == [f"{n}@{t}" for n, t in changed]  # every graph is the one asked for
    assert cache.diverged_at is not None
    again, ran = run_sequence(tmp_path, monkeypatch, changed)  # the new sequence is cached now
    assert ran == [f"{n}@{t}" for n, t in changed] and again.misses == 0


def test_without_the_guard_mindspore_loads_stale_graphs(tmp_path, monkeypatch):
    # the failure the guard exists for, in the simulation: the 2nd compile gets the old 2nd graph
    monkeypatch.setenv("MS_COMPILER_CACHE_ENABLE", "1")
    ms = FakeMindSpore(tmp_path)
    [ms.compile(f"{n}@{t}") for n, t in SEQ]
    ms2 = FakeMindSpore(tmp_path)
    assert ms2.compile("forward@32") == "forward@32"
    assert ms2.compile("grad@64") == "per_sample@64"


def test_a_shorter_run_keeps_the_manifest(tmp_path, monkeypatch):
    run_sequence(tmp_path, monkeypatch, SEQ)
    short, ran = run_sequence(tmp_path, monkeypatch, SEQ[:2])
    assert short.hits == 2 and short.diverged_at is None
    full, ran = run_sequence(tmp_path, monkeypatch, SEQ)
    assert full.hits == 4


def test_a_hidden_compile_or_a_crash_leaves_no_manifest(tmp_path, monkeypatch):
    cache, _ = run_sequence(tmp_path, monkeypatch, SEQ, hidden_after=1)
    assert cache.unsafe and not (cache.dir / MANIFEST).exists()
    assert not list(cache.dir.rglob("*.mindir"))
    run_sequence(tmp_path, monkeypatch, SEQ)
    crashed, _ = run_sequence(tmp_path, monkeypatch, SEQ[:1] + [("other", 99)] + SEQ[2:], crash_after=1)
    assert not (crashed.dir / MANIFEST).exists()
    after, ran = run_sequence(tmp_path, monkeypatch, SEQ)  # starts cold, correct graphs
    assert after.status == "cold" and ran == [f"{n}@{t}" for n, t in SEQ]


def test_a_second_run_in_one_process_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(compile_cache, "_process", {"dir": "/somewhere"})
    monkeypatch.setattr(compile_cache, "key_parts", lambda *a: {"fixed": 1})
    cache = CompileCache(str(tmp_path)).open(None, None, [], {}, 8)
    assert cache.status == "unavailable" and "first run" in cache.reason


def test_no_entry_script_turns_the_cache_off(tmp_path, monkeypatch):
    # under `python -c` MindSpore's cache raises FileNotFoundError on every compile (measured)
    from objdebug.engine.ms_versions import graph_api

    monkeypatch.setattr(graph_api(), "entry_script_path", str(tmp_path / "-c"))
    monkeypatch.setattr(compile_cache, "_process", {"dir": None})
    monkeypatch.setattr(compile_cache, "_any_graph_compiled", lambda: False)
    monkeypatch.setattr(compile_cache, "key_parts", lambda *a: {"fixed": 1})
    cache = CompileCache(str(tmp_path / "c")).open(None, None, [], {}, 8)
    assert cache.status == "unavailable" and "entry script" in cache.reason
    assert os.environ.get("MS_COMPILER_CACHE_ENABLE") != "1"


def test_bookkeeping_errors_turn_the_cache_off(tmp_path, monkeypatch):
    def broken(*a):
        raise OSError("disk full")
    monkeypatch.setattr(compile_cache, "key_parts", broken)
    cache = CompileCache(str(tmp_path)).open(None, None, [], {}, 8)
    assert cache.status == "unavailable" and "disk full" in cache.reason
    assert cache.summary()["status"] == "unavailable"


# --------------------------------------------------------------------------- real runs
RUNNER = """
import json, sys
from objdebug import api
cfg = api.load_config(sys.argv[1], overrides=json.loads(sys.argv[3]))
r = api.run(cfg, stages=["align"], profile="quick", compile_cache=sys.argv[2])
print(json.dumps({"cache": r.extra.get("compile_cache"), "compile_s": r.compiles["seconds"],
                  "values": [f.value for f in r.findings]}))
"""


def _run(root: Path, overrides: dict | None = None) -> dict:
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(ROOT))
    env.pop("MS_COMPILER_CACHE_ENABLE", None)
    env.pop("MS_COMPILER_CACHE_PATH", None)
    runner = root.parent / "runner.py"  # a file: MindSpore's cache hashes the entry script
    runner.write_text(RUNNER)
    proc = subprocess.run([sys.executable, str(runner), str(CACHE_TINY), str(root),
                           json.dumps(overrides or {})], capture_output=True, text=True,
                          env=env, cwd=str(root.parent), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_real_runs_another_model_size_gets_another_directory(tmp_path):
    # cold -> warm with the same numbers: test_cli_cache_on_by_default_no_cache_writes_nothing
    root = tmp_path / "cache"
    cold = _run(root)
    # an align-only run on CPU: one fused static graph (engine/row_scoring.py)
    assert cold["cache"]["status"] == "cold" and cold["cache"]["misses"] == cold["cache"]["compiles"] >= 1
    bigger = _run(root, {"model.kwargs": {"vocab_size": 256, "d_model": 32, "n_layers": 1,
                                          "n_heads": 2}})
    assert bigger["cache"]["dir"] != cold["cache"]["dir"]  # another directory, never the stale one
    assert bigger["cache"]["status"] == "cold" and bigger["cache"]["hits"] == 0
    assert len([p for p in root.iterdir() if p.is_dir()]) == 2


# --------------------------------------------------------------------------- the default location
def test_default_root_is_dot_objdebug_cache_unless_switched_off(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(compile_cache.NO_CACHE_ENV, raising=False)
    assert compile_cache.default_root() == str(tmp_path / ".objdebug_cache")
    monkeypatch.setenv(compile_cache.NO_CACHE_ENV, "0")  # "0" keeps it on
    assert compile_cache.default_root() == str(tmp_path / ".objdebug_cache")
    monkeypatch.setenv(compile_cache.NO_CACHE_ENV, "1")
    assert compile_cache.default_root() is None


def test_a_created_cache_root_gets_a_gitignore_an_existing_one_not(tmp_path, monkeypatch):
    cache, _ = run_sequence(tmp_path, monkeypatch, SEQ[:1])  # creates tmp_path/cache
    assert (tmp_path / "cache" / ".gitignore").read_text().splitlines()[-1] == "*"
    mine = tmp_path / "mine"
    mine.mkdir()
    monkeypatch.setattr(compile_cache, "_process", {"dir": None})
    monkeypatch.setattr(compile_cache, "_any_graph_compiled", lambda: False)
    assert CompileCache(str(mine)).open(None, None, [], {}, 8).status == "cold"
    assert not (mine / ".gitignore").exists()  # the user's own directory is left as it was


def test_a_refused_cache_is_unavailable_and_creates_nothing(tmp_path):
    cache = compile_cache.open_cache(str(tmp_path / "c"), None, None, [], {}, 8,
                                     refuse="not with --workers (one cache per process)")
    assert cache.summary()["status"] == "unavailable" and "workers" in cache.summary()["reason"]
    assert not (tmp_path / "c").exists()


def _cli(cwd: Path, *extra: str) -> tuple[dict, str]:
    """`objdebug align` on the tiny target as a real process in `cwd`, the cache at its default."""
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(ROOT))
    for name in (compile_cache.NO_CACHE_ENV, "MS_COMPILER_CACHE_ENABLE", "MS_COMPILER_CACHE_PATH"):
        env.pop(name, None)
    report = cwd / "r.json"
    proc = subprocess.run([sys.executable, "-m", "objdebug.cli", "align", "-c", str(CACHE_TINY),
                           "--profile", "quick", "--json", str(report), *extra],
                          capture_output=True, text=True, env=env, cwd=str(cwd), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(report.read_text()), proc.stdout


def _findings(report: dict) -> list:
    return [(f["code"], f["verdict"], f["value"], f["message"]) for r in report["results"]
            for f in r["findings"]]


def test_cli_cache_on_by_default_no_cache_writes_nothing(tmp_path):
    off, _ = _cli(tmp_path, "--no-cache")
    assert not (tmp_path / ".objdebug_cache").exists() and "compile_cache" not in off["extra"]
    cold, _ = _cli(tmp_path)
    root = tmp_path / ".objdebug_cache"
    assert (root / ".gitignore").read_text().splitlines()[-1] == "*"
    c = cold["extra"]["compile_cache"]
    assert c["status"] == "cold" and c["misses"] == c["compiles"] >= 1  # align alone: one fused graph
    assert Path(c["dir"]).parent == root
    warm, text = _cli(tmp_path)
    w = warm["extra"]["compile_cache"]
    assert w["status"] == "warm" and w["hits"] == c["compiles"] > 0 and w["misses"] == 0
    # every hit proves itself by its answer, the default cache's too (issue 46)
    assert w["proof"]["proved"] == w["hits"] and "rejected" not in w and "unprovable" not in w
    plural = "s" if w["hits"] != 1 else ""
    assert f"compile cache warm: {w['hits']} hit{plural}, 0 misses" in text
    assert warm["compiles"]["seconds"] < cold["compiles"]["seconds"]
    assert _findings(warm) == _findings(cold) == _findings(off)  # the same numbers, cached or not
