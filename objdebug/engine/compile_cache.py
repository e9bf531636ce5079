"""MindSpore's compile cache, made safe for objdebug's many-graph runs.

On by default for the CLI, in `.objdebug_cache/` of the working directory (the convention of
`.pytest_cache`, `.ruff_cache`; a `.gitignore` of `*` is written inside when it is created);
`--compile-cache DIR` (or `run.compile_cache`) chooses another directory, `--no-cache` or
`OBJDEBUG_NO_CACHE=1` turns the default off. The library (`api.run`) uses it only when asked.

What MindSpore 2.10 does (measured, see docs/performance.md): with `MS_COMPILER_CACHE_ENABLE=1`
and `MS_COMPILER_CACHE_PATH=D`, the n-th graph compiled in a process is saved as
`D/rank_0/graph_cache/compile_cache_<n>.mindir` and, in a later process, the n-th compile loads
that file whatever its Cell or input shapes are. The only validity check is a hash of the entry
script's source. A different compile order, model size or sequence length therefore loads a stale
graph: it crashes, or worse returns the old graph's numbers silently. The path and the switch are
read once per process (later changes are ignored). After the first miss (no file for index n),
MindSpore stops loading for the rest of the process and writes fresh files. Parameter values are
bound at run time, so a new checkpoint with the same shapes is safe.

How objdebug makes it safe:
- one directory per key: a hash of the model and objective config, the data files, the profile,
  stages and options (they decide the shape set), the objdebug and user sources, and the
  MindSpore / objdebug / Python versions;
- a manifest of the compile sequence (graph name + input shapes -> the file each compile wrote).
  Every new (graph, shapes) call of the engine is checked against it BEFORE it compiles; at the
  first difference every file the verified prefix does not own is removed, so MindSpore misses
  and compiles fresh from there on;
- the manifest is removed while a run is in progress and written back only after a clean run
  whose every file is accounted for (a compile outside the engine, a crash or an interrupted run
  leaves no manifest, and the next run starts from an empty directory);
- only the first run of a process can use it (MindSpore's counter is per process), and one
  process at a time per directory (a lock);
- any error in this bookkeeping turns the cache off for the run; it never fails a run;
- a hit counts only once its first answer matched the Cell's without the graph (every hit, in any
  folder: engine/cache_proof.py); a mismatch rejects it and compiles afresh.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from objdebug.core import jsonsafe
from objdebug.engine import cache_files

MANIFEST = "objdebug-manifest.json"
LOCK = "objdebug.lock"
SCHEMA = 2  # 2: each graph file's sha256 in the manifest (a schema-1 manifest starts cold)
DEFAULT_DIR = ".objdebug_cache"  # in the working directory, like .pytest_cache
NO_CACHE_ENV = "OBJDEBUG_NO_CACHE"  # set (not "0"/""): no default cache, e.g. in the test suite
GITIGNORE = "# Created by objdebug: a local compile cache, never committed.\n*\n"


def default_root() -> str | None:
    """The cache directory of a run that names none: ./.objdebug_cache, or None when
    OBJDEBUG_NO_CACHE is set."""
    if os.environ.get(NO_CACHE_ENV, "") not in ("", "0"):
        return None
    return str(Path(DEFAULT_DIR).resolve())

_process: dict[str, Any] = {"dir": None}  # the directory MindSpore was pointed at in this process


# --------------------------------------------------------------------------- key
def _file_digest(path: str | None) -> str | None:
    if not path or not os.path.isfile(path):
        return None
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _installed_roots() -> tuple[str, ...]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return tuple(os.path.realpath(r) + os.sep for r in roots)


def source_files() -> list[str]:
    """Python sources that can shape a graph: the objdebug package, every loaded module that is not
    installed (the user's model and objective, fixtures) and the entry script MindSpore hashes."""
    import objdebug

    files = {str(p) for p in Path(objdebug.__file__).parent.rglob("*.py")}
    installed = _installed_roots()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and path.endswith(".py"):
            real = os.path.realpath(path)
            if not real.startswith(installed):
                files.add(real)
    if sys.argv and os.path.isfile(sys.argv[0]):
        files.add(os.path.realpath(sys.argv[0]))
    return sorted(files)


def sources_digest(files: list[str]) -> str:
    h = hashlib.sha256()
    for path in files:
        h.update(path.encode())
        h.update((_file_digest(path) or "-").encode())
    return h.hexdigest()


def parameter_shapes(target: Any) -> list[str]:
    """'name:dtype[shape]' of every parameter of the target's networks: a model from an installed
    package (whose source is not hashed) that changed its layers changes the key."""
    out = []
    for net in (getattr(target, "model", None), getattr(target, "objective", None)):
        if net is not None and hasattr(net, "parameters_and_names"):
            out += [f"{n}:{p.dtype}{list(p.shape)}" for n, p in net.parameters_and_names()]
    return out


def key_parts(cfg: Any, profile: Any, stages: list[str], options: dict[str, Any],
              batch_size: int, params: list[str] | None = None) -> dict[str, Any]:
    """Everything that decides which graphs a run compiles and what they contain."""
    from objdebug.engine.runtime import versions

    v = versions()
    spec = {}
    for name in ("model", "objective", "preference"):
        section = getattr(cfg, name)
        if section is not None:  # the checkpoint is left out: parameters are bound at run time
            spec[name] = {k: val for k, val in dataclasses.asdict(section).items() if k != "checkpoint"}
    data = dataclasses.asdict(cfg.data)
    for name in ("align", "scores", "preference"):  # their rows decide the length buckets and batch counts
        data[name] = _file_digest(data[name])
    return {
        "schema": SCHEMA,
        "versions": {k: v.get(k) for k in ("mindspore", "objdebug", "python")},
        "target": spec,
        "data": data,
        "run": {"device": cfg.run.device, "mode": cfg.run.mode},
        "profile": profile.data,
        "stages": list(stages),
        "options": {k: val for k, val in sorted(options.items()) if val is not None},
        "batch_size": int(batch_size),
        "sources": sources_digest(source_files()),
        "params": hashlib.sha256("\n".join(params or []).encode()).hexdigest(),
    }


def cache_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


# --------------------------------------------------------------------------- session
def _signature(args: tuple) -> str:
    return ",".join(f"{getattr(a, 'dtype', type(a).__name__)}{list(getattr(a, 'shape', ()))}"
                    for a in args)


def _any_graph_compiled() -> bool:
    """True when this process already compiled a graph (MindSpore's counter is past 0)."""
    try:
        from objdebug.engine.ms_versions import graph_api

        api = graph_api()
        return bool(api.ms_compile_cache) or any(api.cells_compile_cache.values())
    except Exception:  # an internal that moved: assume the worst
        return True


def _entry_script_problem() -> str:
    """Why MindSpore's cache would crash this process, or ''. It parses the entry script to hash
    it: under `python -c` or in a notebook there is none and every compile raises FileNotFoundError."""
    import ast

    try:
        from objdebug.engine.ms_versions import graph_api

        path = graph_api().entry_script_path
    except Exception:  # an internal that moved: do not risk it
        return "cannot find MindSpore's entry script"
    try:
        with open(path, encoding="utf-8") as fh:
            ast.parse(fh.read(), path)
    except (OSError, TypeError, ValueError, SyntaxError):
        return (f"MindSpore's compile cache hashes the entry script, and '{path}' is not a readable "
                "Python file (python -c, a notebook?); run objdebug from a script or the CLI")
    return ""


class CompileCache:
    """One run's use of a cache directory; `summary()` goes into the report.

    `named`: the directory was chosen by the user (`--compile-cache`, `run.compile_cache`) and is
    trusted as their choice; the default `./.objdebug_cache` is used only when this user owns it
    and no one else can write it (`cache_files.untrusted`), else the run goes without a cache
    (status "untrusted", the reason in the report). Either way each hit proves itself by its
    answer before it counts (`wants_proof`)."""

    def __init__(self, root: str | None, named: bool = True):
        self.root = root
        self.named = named
        self.dir: Path | None = None
        self.key = ""
        self.status = "off" if not root else "pending"
        self.reason = ""
        self.events: list[dict[str, Any]] = []
        self.expected: list[dict[str, Any]] | None = None  # the manifest's sequence, when valid
        self.verified = 0         # leading events that matched the manifest
        self.diverged_at: int | None = None
        self.hits = 0
        self.misses = 0
        self.unsafe = ""
        self._pending: tuple[str, str] | None = None  # the first call under way (before -> after)
        self._unproved: tuple[str, str] | None = None  # the hit whose answer is not proved yet
        self.proved_hits = 0      # hits whose first answer matched the Cell's without the graph
        self.proof_seconds = 0.0  # what the proofs cost (PyNative calls)
        self.proof_by_graph: dict[str, float] = {}  # the proved graphs' proof seconds, by name
        self.saved_seconds = 0.0  # what the proved hits cost to compile when the cache was written
        self.rejected: list[str] = []  # graphs whose cached file answered unlike the Cell
        self.unprovable: list[str] = []  # proved by a fresh compile (the Cell cannot run eagerly)
        self._lock_fd: int | None = None
        self._last: dict[str, tuple[int, int]] = {}

    # ------------------------------------------------------------------ set-up
    def open(self, cfg: Any, profile: Any, stages: list[str], options: dict[str, Any],
             batch_size: int, params: list[str] | None = None) -> CompileCache:
        """Point MindSpore at this key's directory; must run before the run's first compile."""
        if not self.root:
            return self
        try:
            self._open(cfg, profile, stages, options, batch_size, params)
        except Exception as exc:  # never let the cache fail a run
            self._disable(f"{type(exc).__name__}: {exc}")
        return self

    def _open(self, cfg, profile, stages, options, batch_size, params=None) -> None:
        parts = key_parts(cfg, profile, stages, options, batch_size, params)
        self.key = cache_key(parts)
        self.dir = Path(self.root).expanduser().resolve() / self.key[:24]
        if _process["dir"] is not None or _any_graph_compiled():
            # MindSpore reads the path once per process and numbers compiles per process
            self._disable("this process already compiled graphs; the cache works for the first "
                          "run of a process only")
            return
        script = _entry_script_problem()
        if script:
            self._disable(script)
            return
        root = self.dir.parent
        why = "" if self.named else cache_files.untrusted(root, self.dir)
        if why:
            self._disable(f"{why}; the default cache is used only from a folder this user owns and "
                          f"no one else can write (name a folder with --compile-cache to trust it)")
            self.status = "untrusted"
            return
        if not root.exists():  # ours: keep it out of the user's git, and others out of it
            root.mkdir(parents=True, mode=0o700)
            cache_files.write_exclusive(root / ".gitignore", GITIGNORE)
        graphs = self.dir / "rank_0" / "graph_cache"
        link = cache_files.linked(self.dir, self.dir / "rank_0", graphs)
        if link is not None:  # MindSpore would write (and read) through it
            self._disable(f"'{link}' is a symbolic link; objdebug never follows links in its cache")
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self._lock():
            self._disable(f"'{self.dir}' is in use by another objdebug process")
            return
        manifest = self._read_manifest()
        (self.dir / MANIFEST).unlink(missing_ok=True)  # restored only by a clean close()
        files = self._files()
        if manifest is not None and not self._digests_match(manifest["events"]):
            self.reason = "a graph file differs from the one this cache recorded: started cold"
            manifest = None
        if manifest is None:
            self._remove(set(files))
        else:
            self.expected = manifest["events"]
            owned = {e["file"] for e in self.expected if e.get("file")}
            self._remove(set(files) - owned)
        os.environ["MS_COMPILER_CACHE_ENABLE"] = "1"
        os.environ["MS_COMPILER_CACHE_PATH"] = str(self.dir)
        _process["dir"] = str(self.dir)
        cache_files.write_exclusive(self.dir / "key.json",
                                    json.dumps(parts, indent=1, sort_keys=True, default=str))
        self._last = self._files()
        self.status = "warm" if self.expected else "cold"

    def _lock(self) -> bool:
        import fcntl

        fd = cache_files.open_lock(self.dir / LOCK)  # never through a planted link
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def _read_manifest(self) -> dict[str, Any] | None:
        try:
            data = jsonsafe.loads(cache_files.read_text(self.dir / MANIFEST))
        except (OSError, ValueError):
            return None
        if data.get("schema") != SCHEMA or data.get("key") != self.key or not isinstance(
                data.get("events"), list):
            return None
        return data

    def _files(self) -> dict[str, tuple[int, int]]:
        folder = self.dir / "rank_0" / "graph_cache" if self.dir else None
        if folder is None or not folder.is_dir():
            return {}
        out = {}
        for p in folder.glob("*.mindir"):
            if p.is_symlink():  # never loaded, never written through
                p.unlink()
                continue
            st = p.stat()
            out[p.name] = (st.st_mtime_ns, st.st_size)
        return out

    def _digests_match(self, events: list[dict[str, Any]]) -> bool:
        """Every graph file the manifest owns is the very file this cache recorded."""
        folder = self.dir / "rank_0" / "graph_cache"
        return all(isinstance(e, dict) and (not e.get("file") or (
            isinstance(e.get("sha256"), str)
            and cache_files.sha256(folder / str(e["file"])) == e["sha256"])) for e in events)

    def _remove(self, names: set[str]) -> None:
        for name in names:
            (self.dir / "rank_0" / "graph_cache" / name).unlink(missing_ok=True)

    def _disable(self, reason: str) -> None:
        if self.status in ("warm", "cold"):
            # MindSpore is already pointed here: leave it nothing to load
            try:
                self._remove(set(self._files()))
            except Exception:
                pass
        self.status = "unavailable"
        self.reason = reason
        self._unlock()

    # ------------------------------------------------------------------ during the run
    @property
    def active(self) -> bool:
        return self.status in ("warm", "cold")

    def attach(self, engine: Any) -> None:
        """Check every first (graph, shapes) call of `engine` against the manifest before it
        compiles: the cache listens to the engine's compiles (`Engine.add_compile_listener`)."""
        if self.active:
            engine.add_compile_listener(self)

    def before_compile(self, graph: str, signature: str) -> None:
        key = (graph, signature)
        self._pending = None
        # a key seen before compiles again when the engine let its graph go (memory) or retired
        # it (it raised): a compile like any other, the next file of the sequence
        if not self.active:
            return
        try:
            self._before(key)
        except Exception as exc:
            self._disable(f"{type(exc).__name__}: {exc}")
            return
        self._pending = key

    def after_compile(self, graph: str, signature: str, seconds: float) -> None:
        key, self._pending = self._pending, None
        if key != (graph, signature) or not self.active:
            return
        try:
            self._after(key, seconds)
        except Exception as exc:
            self._disable(f"{type(exc).__name__}: {exc}")

    def _before(self, key: tuple[str, str]) -> None:
        now = self._files()
        if now != self._last:
            self.unsafe = "a graph was compiled outside the engine"
            self._remove(set(now))  # nothing stale may be loaded from here on
            self.expected = None
        i = len(self.events)
        if self.expected is not None and self.diverged_at is None:
            want = self.expected[i] if i < len(self.expected) else None
            if want is None or (want["graph"], want["shapes"]) != key:
                # MindSpore would load the manifest's i-th graph for this different one
                self.diverged_at = i
                owned = {e["file"] for e in self.expected[:i] if e.get("file")}
                self._remove(set(now) - owned)
        self._before_files = self._files()

    def _after(self, key: tuple[str, str], seconds: float) -> None:
        now = self._files()
        new = sorted(n for n in now if self._before_files.get(n) != now[n])
        i = len(self.events)
        event = {"graph": key[0], "shapes": key[1], "file": new[0] if len(new) == 1 else None,
                 "seconds": round(seconds, 3)}
        if len(new) > 1:
            self.unsafe = f"one call of '{key[0]}' wrote {len(new)} graph files"
        verified = (self.expected is not None and self.diverged_at is None
                    and i < len(self.expected))
        if new:
            self.misses += 1
            if verified:  # a miss: MindSpore compiles fresh from here on; keep it that way
                self.diverged_at = i
                owned = {e["file"] for e in self.events if e.get("file")} | set(new)
                self._remove(set(now) - owned)
                now = self._files()
        elif verified and self.expected[i].get("file"):
            self.hits += 1
            event["file"] = self.expected[i]["file"]
            event["seconds"] = self.expected[i].get("seconds") or event["seconds"]  # the cold compile's
            self.verified = i + 1
            self._unproved = key  # its answer must prove it before it counts (cache_proof.py)
        self.events.append(event)
        self._last = now

    # ------------------------------------------------------------------ proof by behaviour
    def wants_proof(self, graph: str, signature: str) -> bool:
        """Whether the first call that just ran loaded its graph from the cache (a hit): the engine
        then checks its answer (`Engine._prove`, engine/cache_proof.py) before it counts.

        Every hit, the default `./.objdebug_cache` included: a CI job that restores a shared cache
        into the working directory owns that folder, so ownership (`cache_files.untrusted`) says
        nothing about who wrote its graphs. The proof compiles nothing the cache numbers (gradient
        graphs by forward calls only, every PyNative reference with the cache paused) and costs a
        few percent of the compile a hit saves (docs/performance.md)."""
        return self.active and self._unproved == (graph, signature)

    def proved(self, graph: str, signature: str, seconds: float) -> None:
        """The hit answered like the Cell without its graph: it counts."""
        self._unproved = None
        self.proved_hits += 1
        self.proof_seconds += seconds
        self.proof_by_graph[graph] = self.proof_by_graph.get(graph, 0.0) + seconds
        event = self.events[-1] if self.events else {}
        if (event.get("graph"), event.get("shapes")) == (graph, signature):
            self.saved_seconds += float(event.get("seconds") or 0.0)

    def reject(self, graph: str, signature: str, seconds: float, how: str = "eager") -> None:
        """The hit answered unlike the Cell (`how` "eager": another model's graph), or cannot be
        proved ("not eager": PyNative cannot run it, a fresh compile decides; "not deterministic":
        dropout): every graph file the proved prefix does not own goes, so MindSpore misses from
        the graph's recompile on (it stops loading at its first miss), and this run leaves no
        manifest (the next starts cold). Called again with "eager" once a fresh compile answered
        otherwise."""
        if how == "eager":
            self.rejected.append(graph)
            self.unprovable = [u for u in self.unprovable if u.split(" (")[0] != graph]
        else:
            self.unprovable.append(f"{graph} ({how})")
        self.proof_seconds += seconds
        if self._unproved is None:  # the files went already (a fresh compile's verdict)
            return
        self._unproved = None
        try:
            i = len(self.events) - 1  # the rejected hit's event
            self.diverged_at = i if self.diverged_at is None else min(self.diverged_at, i)
            owned = {e["file"] for e in self.events[:i] if e.get("file")}
            self._remove(set(self._files()) - owned)
            self.events[i]["file"] = None
            self.expected = None
            self.hits -= 1
            self.verified = min(self.verified, i)
            self._last = self._files()
        except Exception as exc:
            self._disable(f"{type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ end
    def close(self, ok: bool = True) -> None:
        """Write the manifest back after a clean run; otherwise leave an empty directory."""
        if not self.active:
            return
        try:
            now = self._files()
            if now != self._last:
                self.unsafe = self.unsafe or "a graph was compiled outside the engine"
            if (self.expected is not None and self.diverged_at is None and not self.misses
                    and not self.unsafe):
                events = self.expected  # every compile hit a prefix of the manifest: keep it all
            else:
                events = self.events
            owned = {e["file"] for e in events if e.get("file")}
            if not ok or self.unsafe or self.rejected or self.unprovable or set(now) != owned:
                self._remove(set(now))
            else:
                folder = self.dir / "rank_0" / "graph_cache"
                body = {"schema": SCHEMA, "key": self.key,
                        "events": [{**{k: e[k] for k in ("graph", "shapes", "file")},
                                    "seconds": e.get("seconds"),  # the cold compile (proof cost vs it)
                                    "sha256": cache_files.sha256(folder / e["file"])
                                    if e.get("file") else None} for e in events]}
                cache_files.write_exclusive(self.dir / MANIFEST, json.dumps(body, indent=1))
        except Exception as exc:
            self._disable(f"{type(exc).__name__}: {exc}")
        finally:
            self._unlock()

    def __enter__(self) -> CompileCache:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(ok=exc_type is None)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status}
        if self.status == "off":
            return out
        # which cache the run trusted: one the user named, or the default one found private
        out["trust"] = "named" if self.named else "default"
        out.update({"dir": str(self.dir) if self.dir else None, "key": self.key[:24],
                    "compiles": len(self.events), "hits": self.hits, "misses": self.misses})
        if self.diverged_at is not None:
            out["diverged_at"] = self.diverged_at
        if self.unsafe:
            out["unsafe"] = self.unsafe
        if self.hits or self.rejected or self.unprovable:  # each hit proved by its answer (cache_proof.py)
            out["proof"] = {"proved": self.proved_hits, "seconds": round(self.proof_seconds, 3),
                            "cold_compile_seconds": round(self.saved_seconds, 3),
                            "by_graph": {g: round(s, 3) for g, s in self.proof_by_graph.items()}}
        if self.rejected:
            out["rejected"] = list(self.rejected)
        if self.unprovable:
            out["unprovable"] = list(self.unprovable)
        if self.reason:
            out["reason"] = self.reason
        return out


def open_cache(root: str | None, cfg: Any, profile: Any, stages: list[str],
               options: dict[str, Any], batch_size: int, refuse: str = "",
               params: list[str] | None = None, named: bool = True) -> CompileCache:
    """A cache session for one run (a no-op when `root` is None); never raises. `refuse`: why
    this run must not use it (the cache is then 'unavailable' with that reason). `named`: the
    user chose `root` (else it is the default, used only when private: `CompileCache`)."""
    if root and refuse:
        cache = CompileCache(root, named)
        cache._disable(refuse)
        return cache
    return CompileCache(root, named).open(cfg, profile, stages, options, batch_size, params)
