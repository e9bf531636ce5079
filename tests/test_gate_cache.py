"""Issue 23, the compile cache: a cached graph is used only when it is the very file this cache
wrote for this target, and nothing planted in the cache folder is ever followed.

Real files in a real cache folder, with test_compile_cache's stand-in for MindSpore's index-keyed
loading (the guard is what is under test; the real runs live in test_compile_cache.py).
"""

import json
import os

import pytest

from objdebug.engine import compile_cache, row_scoring
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


# --------------------------------------------------------------------------- whose cache (issue 35)
def _rewrite(cache, index=1, text="per_sample@64 of another model (logits negated)"):
    """Whoever can write the folder: another graph in place, and the manifest's digest rewritten to
    vouch for it (the digests alone stop a swapped file, not a writer of the manifest)."""
    from objdebug.engine.cache_files import sha256

    poisoned = _graphs(cache) / f"compile_cache_{index}.mindir"
    poisoned.write_text(text)
    manifest = json.loads((cache.dir / MANIFEST).read_text())
    for e in manifest["events"]:
        if e["file"] == poisoned.name:
            e["sha256"] = sha256(poisoned)
    (cache.dir / MANIFEST).write_text(json.dumps(manifest))


# --------------------------------------------------------------------------- proof by behaviour (issue 46)
@pytest.mark.parametrize("named", [True, False])
def test_a_named_cache_with_a_rewritten_manifest_is_caught_by_the_graphs_answer(tmp_path, monkeypatch, named):
    """A cache the user named is trusted as their choice, and its manifest can vouch for another
    model's graph: the hit's first answer (against the Cell without the graph) rejects it. The
    default cache the same (a CI cache restored into ./.objdebug_cache is this user's own folder)."""
    from objdebug.report import compile_cache_line

    cold, _ = run_sequence(tmp_path, monkeypatch, SEQ, named=named)
    _rewrite(cold)
    warm, ran = run_sequence(tmp_path, monkeypatch, SEQ, named=named)
    assert ran == EXPECTED  # before: "per_sample@64 of another model (logits negated)" ran
    assert warm.status == "warm" and warm.rejected == ["per_sample"]
    assert (warm.hits, warm.proved_hits, warm.misses) == (1, 1, 3)  # forward proved; the rest fresh
    line = compile_cache_line({"extra": {"compile_cache": warm.summary()}}, short=True)
    assert "compile cache entry rejected: its graph answers for another model" in line
    assert not (warm.dir / MANIFEST).exists() and not list(_graphs(warm).glob("*.mindir"))
    cold2, ran = run_sequence(tmp_path, monkeypatch, SEQ, named=named)  # starts cold, writes a true manifest
    again, ran = run_sequence(tmp_path, monkeypatch, SEQ, named=named)
    assert cold2.status == "cold" and ran == EXPECTED and again.hits == again.proved_hits == 4
    assert not again.rejected


def test_a_hit_that_cannot_run_eagerly_is_proved_by_a_fresh_compile(tmp_path, monkeypatch):
    cold, _ = run_sequence(tmp_path, monkeypatch, SEQ)
    clean, ran = run_sequence(tmp_path, monkeypatch, SEQ, eager=False)
    assert ran == EXPECTED and not clean.rejected and clean.unprovable[0].startswith("forward (not eager: RuntimeError: this Cell cannot run in PyNative mode")
    assert clean.hits == 0 and clean.misses == 4  # right, but the fresh compile turned it cold
    run_sequence(tmp_path, monkeypatch, SEQ)  # cold again: a true manifest
    _rewrite(cold, index=0, text="forward@32 of another model")
    poisoned, ran = run_sequence(tmp_path, monkeypatch, SEQ, eager=False)
    assert ran == EXPECTED and poisoned.rejected == ["forward"] and not poisoned.unprovable


def test_a_cell_that_answers_differently_each_time_is_recompiled_not_called_another_models(
        tmp_path, monkeypatch):
    """Dropout in training mode: PyNative disagrees with itself, so a mismatch proves nothing
    about the cached graph. It is recompiled (the cache cold from there), never reported as
    another model's graph."""
    run_sequence(tmp_path, monkeypatch, SEQ)
    warm, ran = run_sequence(tmp_path, monkeypatch, SEQ, deterministic=False)
    assert ran == EXPECTED and warm.rejected == [] and warm.unprovable == ["forward (not deterministic)"]
    assert "rejected" not in warm.summary() and warm.summary()["unprovable"]


def _open_to_others(root):
    for folder, dirs, files in os.walk(root):
        for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
            os.chmod(name, os.stat(name).st_mode | 0o022)


def test_the_default_cache_is_trusted_only_when_no_one_else_can_write_it(tmp_path, monkeypatch):
    cold, _ = run_sequence(tmp_path, monkeypatch, SEQ, named=False)
    root = cold.dir.parent
    assert cold.status == "cold" and cold.summary()["trust"] == "default"
    assert os.stat(root).st_mode & 0o077 == 0  # made private
    again, _ = run_sequence(tmp_path, monkeypatch, SEQ, named=False)
    assert again.hits == 4  # private and ours: used
    _rewrite(cold)
    _open_to_others(root)  # a restored shared CI cache: anyone could have written it
    warm, ran = run_sequence(tmp_path, monkeypatch, SEQ, named=False)
    assert ran == EXPECTED  # nothing loaded from it
    assert warm.status == "untrusted" and "writable by its group or others" in warm.reason
    assert "--compile-cache" in warm.reason and warm.summary()["trust"] == "default"
    # a folder the user names is their choice: trusted, and the report says so
    named, ran = run_sequence(tmp_path, monkeypatch, SEQ, named=True)
    assert named.status == "warm" and named.summary()["trust"] == "named"


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_the_default_cache_of_another_user_is_not_trusted(tmp_path, monkeypatch):
    cold, _ = run_sequence(tmp_path, monkeypatch, SEQ, named=False)
    for folder, dirs, files in os.walk(cold.dir.parent):
        for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
            os.chown(name, 12345, 12345)
    warm, ran = run_sequence(tmp_path, monkeypatch, SEQ, named=False)
    assert ran == EXPECTED and warm.status == "untrusted" and "owned by uid 12345" in warm.reason


def test_the_cache_line_says_which_cache_was_trusted():
    from objdebug.report import compile_cache_line

    def line(trust, short, status="warm"):
        return compile_cache_line({"extra": {"compile_cache": {
            "status": status, "hits": 2, "misses": 0, "trust": trust,
            "reason": "'x' is writable by its group or others (mode 777)"}}}, short=short)

    assert line("default", True) == "compile cache warm: 2 hits, 0 misses (default)"
    assert line("named", False).endswith("; trusted as named (--compile-cache / run.compile_cache)")
    assert line("default", True, "untrusted") == "compile cache untrusted"
    assert line("default", False, "untrusted") == ("compile cache untrusted ('x' is writable by its "
                                                   "group or others (mode 777))")


@pytest.mark.slow  # four real runs (~40 s on 2 cores); the three tests above are its CI twins
def test_a_shared_default_cache_with_a_rewritten_manifest_changes_no_verdict(tiny_target, tmp_path):
    """The issue's attack with real graphs: the healthy target's default cache gets a broken
    objective's graphs AND a manifest whose digests vouch for them, in a folder others can write
    (a restored shared CI cache). Was exit 1 ("cache warm", the planted graphs' FAIL); now the
    default cache is not trusted, the run compiles fresh and passes, and says why."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from objdebug.engine.cache_files import sha256

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "OBJDEBUG_NO_CACHE"}
    env["PYTHONPATH"] = str(root)
    cache = tiny_target / ".objdebug_cache"

    def run(*extra):
        return subprocess.run([sys.executable, "-m", "objdebug.cli", "run", "--stages", "align",
                               "--json", str(tmp_path / "r.json"), *extra], cwd=tiny_target,
                              env=env, capture_output=True, text=True, timeout=600)

    assert run().returncode == 0
    assert run("--set", "objective.kwargs={ignore_index=0}").returncode == 1
    by_kwargs = {json.loads((d / "key.json").read_text())["target"]["objective"]["kwargs"]["ignore_index"]: d
                 for d in cache.iterdir() if (d / "key.json").is_file()}
    good, bad = by_kwargs[-100], by_kwargs[0]
    for f in (bad / "rank_0" / "graph_cache").glob("*.mindir"):
        shutil.copy(f, good / "rank_0" / "graph_cache" / f.name)
    manifest = json.loads((good / MANIFEST).read_text())
    for e in manifest["events"]:
        if e.get("file"):
            e["sha256"] = sha256(good / "rank_0" / "graph_cache" / e["file"])
    (good / MANIFEST).write_text(json.dumps(manifest))
    _open_to_others(cache)
    proc = run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "compile cache untrusted" in proc.stdout, proc.stdout
    c = json.loads((tmp_path / "r.json").read_text())["extra"]["compile_cache"]
    assert c["status"] == "untrusted" and "writable by its group or others" in c["reason"]


@pytest.mark.slow  # four real runs (~40 s on 2 cores); its CI twin: test_a_named_cache_with_a_rewritten_manifest_is_caught_by_the_graphs_answer
@pytest.mark.parametrize("named", [True, False])
def test_real_graphs_of_another_objective_with_a_rewritten_manifest_change_no_verdict(tiny_target, tmp_path, named):
    """Issue 46 with real MindSpore graphs: a named cache (trusted as the user's choice) or the
    default one (a CI cache restored into ./.objdebug_cache) holds a broken objective's graphs AND a
    manifest rewritten to vouch for them. Was exit 1 (the planted graph's answer, 2 warm hits); now
    the hit's answer is checked against PyNative, the planted graph is rejected and compiled afresh,
    the healthy target passes and the report says so."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from objdebug.engine.cache_files import sha256

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "OBJDEBUG_NO_CACHE"}
    env["PYTHONPATH"] = str(root)
    cache = tmp_path / "cache" if named else tiny_target / compile_cache.DEFAULT_DIR
    where = ["--compile-cache", str(cache)] if named else []

    def run(*extra):
        return subprocess.run([sys.executable, "-m", "objdebug.cli", "run", "--stages", "align",
                               *where, "--json", str(tmp_path / "r.json"),
                               *extra], cwd=tiny_target, env=env, capture_output=True, text=True,
                              timeout=600)

    assert run().returncode == 0
    assert run("--set", "objective.kwargs={ignore_index=0}").returncode == 1
    by_kwargs = {json.loads((d / "key.json").read_text())["target"]["objective"]["kwargs"]["ignore_index"]: d
                 for d in cache.iterdir() if (d / "key.json").is_file()}
    good, bad = by_kwargs[-100], by_kwargs[0]
    for f in (bad / "rank_0" / "graph_cache").glob("*.mindir"):
        shutil.copy(f, good / "rank_0" / "graph_cache" / f.name)
    manifest = json.loads((good / MANIFEST).read_text())
    for e in manifest["events"]:
        if e.get("file"):
            e["sha256"] = sha256(good / "rank_0" / "graph_cache" / e["file"])
    (good / MANIFEST).write_text(json.dumps(manifest))
    proc = run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "compile cache entry rejected: its graph answers for another model" in proc.stdout
    c = json.loads((tmp_path / "r.json").read_text())["extra"]["compile_cache"]
    # the graph that holds the objective: the fused row graph of an align-only run (row_scoring.NAME)
    assert c["rejected"] == [row_scoring.NAME] and c["proof"]["proved"] == c["hits"]  # the one graph: 0 hits
    assert c["trust"] == ("named" if named else "default")
    run()  # cold: a true manifest
    proc = run()
    c = json.loads((tmp_path / "r.json").read_text())["extra"]["compile_cache"]
    assert proc.returncode == 0 and c["status"] == "warm" and c["misses"] == 0 and "rejected" not in c
