"""Issue 23, the compile cache: a cached graph is used only when it is the very file this cache
wrote for this target, and nothing planted in the cache folder is ever followed.

Real files in a real cache folder, with test_compile_cache's stand-in for MindSpore's index-keyed
loading (the guard is what is under test; the real runs live in test_compile_cache.py).
"""

import json
import os

import pytest

from objdebug.engine import compile_cache
from objdebug.engine.compile_cache import MANIFEST, CompileCache, cache_key, key_parts
from objdebug.core.config import load_config
from objdebug.pipeline.profile import load_profile

from .test_compile_cache import CACHE_TINY, SEQ, run_sequence

EXPECTED = [f"{n}@{t}" for n, t in SEQ]


def _graphs(cache):
    return cache.dir / "rank_0" / "graph_cache"


def test_a_graph_copied_in_from_elsewhere_is_never_loaded(tmp_path, monkeypatch):
    """The issue's poisoning: same name, same shapes, other content -> refused, compiled fresh."""
    cold, _ = run_sequence(tmp_path, monkeypatch, SEQ)
    poisoned = _graphs(cold) / "compile_cache_1.mindir"
    poisoned.write_text("per_sample@64 of another model (logits negated)")
    warm, ran = run_sequence(tmp_path, monkeypatch, SEQ)
    assert ran == EXPECTED  # before: the planted graph ran as the per-sample graph
    assert warm.hits == 0 and warm.status == "cold" and "differs" in warm.reason
    again, ran = run_sequence(tmp_path, monkeypatch, SEQ)  # the fresh files are trusted again
    assert ran == EXPECTED and again.hits == 4


def test_a_manifest_without_digests_starts_cold(tmp_path, monkeypatch):
    cold, _ = run_sequence(tmp_path, monkeypatch, SEQ)
    manifest = json.loads((cold.dir / MANIFEST).read_text())
    assert all(len(e["sha256"]) == 64 for e in manifest["events"])
    for e in manifest["events"]:
        del e["sha256"]
    (cold.dir / MANIFEST).write_text(json.dumps(manifest))
    warm, ran = run_sequence(tmp_path, monkeypatch, SEQ)
    assert ran == EXPECTED and warm.hits == 0


@pytest.mark.parametrize("name", ["key.json", MANIFEST + ".tmp", MANIFEST, "objdebug.lock"])
def test_a_planted_link_is_never_written_through(tmp_path, monkeypatch, name):
    cold, _ = run_sequence(tmp_path, monkeypatch, SEQ)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = cold.dir / name
    link.unlink(missing_ok=True)
    link.symlink_to(victim)
    cache, ran = run_sequence(tmp_path, monkeypatch, SEQ)
    assert victim.read_text() == "precious\n"
    assert ran == EXPECTED
    if name != "objdebug.lock":  # the lock link is refused (O_NOFOLLOW): the cache turns off
        assert not (cache.dir / name).is_symlink()


def test_a_linked_graph_folder_turns_the_cache_off(tmp_path, monkeypatch):
    cold, _ = run_sequence(tmp_path, monkeypatch, SEQ)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("x")
    rank = cold.dir / "rank_0"
    import shutil

    shutil.rmtree(rank)
    rank.symlink_to(outside)
    cache, ran = run_sequence(tmp_path, monkeypatch, SEQ)
    assert cache.status == "unavailable" and "symbolic link" in cache.reason
    # MindSpore is never pointed there (the stand-in writes anyway), objdebug writes nothing there
    assert os.environ["MS_COMPILER_CACHE_ENABLE"] == "0"
    assert ran == EXPECTED and not {"key.json", "objdebug.lock"} & set(os.listdir(outside))


def test_a_linked_graph_file_is_removed_not_loaded(tmp_path, monkeypatch):
    cold, _ = run_sequence(tmp_path, monkeypatch, SEQ)
    evil = tmp_path / "evil.mindir"
    evil.write_text("forward@32 from elsewhere")
    target = _graphs(cold) / "compile_cache_0.mindir"
    target.unlink()
    target.symlink_to(evil)
    cache, ran = run_sequence(tmp_path, monkeypatch, SEQ)
    assert ran == EXPECTED and evil.read_text() == "forward@32 from elsewhere"


def test_the_key_covers_the_parameter_shapes():
    cfg, profile = load_config(CACHE_TINY), load_profile("quick")
    a = cache_key(key_parts(cfg, profile, ["align"], {}, 8, ["w:Float32[256, 16]"]))
    b = cache_key(key_parts(cfg, profile, ["align"], {}, 8, ["w:Float32[256, 32]"]))
    assert a != b


FALLBACK_MODEL = '''from objdebug.demo.model import TinyCausalLM


class FallbackLM(TinyCausalLM):
    def construct(self, input_ids):
        # .asnumpy() in construct: graph-mode fallback, a PyExecute node MindSpore cannot save
        scale = float(input_ids.asnumpy().shape[0]) / float(input_ids.shape[0])
        return super().construct(input_ids) * scale


def build(**kwargs):
    return FallbackLM(**kwargs)
'''


def test_a_graph_the_cache_cannot_save_runs_without_the_cache(tiny_target, tmp_path):
    """Was exit 2 ("Cannot export a PyExecute CNode in MindIR"); --no-cache passed. The cache may
    only cost compiles: the same command runs again with it off, and passes."""
    import subprocess
    import sys
    from pathlib import Path

    (tiny_target / "fallback_model.py").write_text(FALLBACK_MODEL)
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-m", "objdebug.cli", "run", "--stages", "align", "-q",
                           "--set", "model.factory=fallback_model:build", "--compile-cache",
                           str(tmp_path / "cache")], cwd=tiny_target, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(root)), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("PASSED"), proc.stdout
    assert "running again without the cache" in proc.stderr and "error" not in proc.stderr
    leftovers = list((tmp_path / "cache").rglob("*.mindir"))
    assert leftovers == []  # the failed process left nothing loadable


@pytest.mark.slow  # 30 s of real runs; test_a_graph_copied_in_from_elsewhere_is_never_loaded is its CI twin
def test_real_graphs_of_another_objective_copied_in_change_no_verdict(tiny_target, tmp_path):
    """The issue's poisoning with real MindSpore graphs: the healthy target's warm cache gets the
    graph files of a broken objective (same shapes). Was exit 1 (FAIL from the planted graphs);
    now the digests differ, the cache starts cold and the healthy target passes."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "OBJDEBUG_NO_CACHE"}
    env["PYTHONPATH"] = str(root)
    cache = tmp_path / "cache"

    def run(*extra):
        return subprocess.run([sys.executable, "-m", "objdebug.cli", "run", "--stages", "align", "-q",
                               "--compile-cache", str(cache), *extra], cwd=tiny_target, env=env,
                              capture_output=True, text=True, timeout=600)

    assert run().returncode == 0
    assert run("--set", "objective.kwargs={ignore_index=0}").returncode == 1
    by_kwargs = {json.loads((d / "key.json").read_text())["target"]["objective"]["kwargs"]["ignore_index"]: d
                 for d in cache.iterdir() if (d / "key.json").is_file()}
    good, bad = by_kwargs[-100] / "rank_0" / "graph_cache", by_kwargs[0] / "rank_0" / "graph_cache"
    planted = sorted(bad.glob("*.mindir"))
    assert planted
    for f in planted:
        shutil.copy(f, good / f.name)
    proc = run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("PASSED"), proc.stdout
