"""Output paths, checked before any work: nothing an objdebug run reads is ever overwritten.

A run's outputs (`--json`, `--junit`, `--html DIR`, `--markdown DIR`, `--out DIR`,
`--compile-cache DIR`) are resolved first and compared with everything the run reads (config,
checkpoints, data files, tokenizer, profile, baseline, the report being rendered) and with each
other. A clash, or a path that cannot be written (an existing directory where a file is needed, a
file where a directory is needed, a read-only place), is an InputError (exit 2) before the run
pays for loading and compiling. Writing over an earlier *report* stays allowed.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from objdebug.core.config import batches_file
from objdebug.core.errors import InputError
from objdebug.core.paths import path_problem

# the file a directory output writes (figures beside it have their own names)
_DIR_FILES = {"--html": "index.html", "--markdown": "report.md"}


@dataclass(frozen=True)
class Output:
    flag: str            # the command-line option, e.g. '--json'
    path: Path           # absolute, symlinks resolved
    is_dir: bool         # DIR options (--html, --markdown, --out, --compile-cache)

    @property
    def files(self) -> list[Path]:
        """The files this output replaces."""
        if not self.is_dir:
            return [self.path]
        name = _DIR_FILES.get(self.flag)
        return [self.path / name] if name else []


def resolve(path: str | os.PathLike) -> Path:
    return Path(os.path.abspath(os.path.expanduser(str(path)))).resolve()


def outputs(*, json=None, junit=None, html=None, markdown=None, out=None,
            compile_cache=None, gitlab=None) -> list[Output]:
    """The outputs of one command line, resolved; options that are not given are left out."""
    given = [("--json", json, False), ("--junit", junit, False), ("--html", html, True),
             ("--markdown", markdown, True), ("--out", out, True),
             ("--compile-cache", compile_cache, True), ("--gitlab-report", gitlab, False)]
    for flag, p, is_dir in given:  # too long for the OS (the report's temporary included)
        problem = None if p is None else path_problem(str(p), temporary=not is_dir)
        if problem:
            raise InputError(f"For '{flag}', the path must be usable, but {problem}.")
    return [Output(flag, resolve(p), is_dir) for flag, p, is_dir in given if p is not None]


def config_inputs(cfg, profile_source: str | None = None, baseline=None) -> list[tuple[str, Path]]:
    """(what, path) for every file a run of `cfg` reads."""
    found: list[tuple[str, object]] = [("the config", cfg.source)]
    if cfg.model is not None:
        found.append(("model.checkpoint", cfg.model.checkpoint))
    found.append(("objective.checkpoint", cfg.objective.checkpoint))
    found += [("data.align", cfg.data.align), ("data.scores", cfg.data.scores),
              ("data.text", getattr(cfg.data, "text", None)),
              ("data.preference", getattr(cfg.data, "preference", None))]
    if batches_file(getattr(cfg.data, "batches", None)):  # a factory spec is not a file
        found.append(("data.batches", cfg.data.batches))
    reference = getattr(cfg, "reference", None)
    if reference is not None:
        found.append(("reference.checkpoint", reference.checkpoint))
    if cfg.data.tokenizer and cfg.data.tokenizer != "bytes":
        tok = Path(cfg.data.tokenizer)
        found.append(("data.tokenizer", tok if tok.is_absolute() else Path(cfg.base_dir) / tok))
    if profile_source and not profile_source.startswith("builtin:"):
        found.append(("the profile", profile_source))
    if baseline is not None:
        found.append(("--baseline", baseline))
    return [(what, resolve(p)) for what, p in found if p and str(p) != "<memory>"]


def _same(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:  # hard links and bind mounts name one file twice
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check(outs: list[Output], inputs: list[tuple[str, Path]]) -> None:
    """InputError unless every output is writable and none replaces an input or another output."""
    for o in outs:
        for what, src in inputs:
            for f in o.files:
                if _same(f, src):
                    raise InputError(f"For '{o.flag}', the output must not replace an input of this "
                                     f"run, but '{f}' is {what}; choose another path.")
            if o.is_dir and o.flag in ("--out", "--compile-cache") and _same(o.path, src):
                raise InputError(f"For '{o.flag}', the directory must not be an input of this run, "
                                 f"but '{o.path}' is {what}.")
    for i, a in enumerate(outs):
        for b in outs[i + 1:]:
            clash = any(_same(fa, fb) for fa in a.files for fb in b.files)
            clash = clash or (a.is_dir != b.is_dir and _same(a.path, b.path))
            clash = clash or (not a.is_dir and b.is_dir and _inside(a.path, b.path)
                              and b.flag == "--compile-cache")
            if clash:
                raise InputError(f"For '{b.flag}', the path must differ from '{a.flag}', but both "
                                 f"name '{b.path}'; one report would silently replace the other.")
    for o in outs:
        _check_writable(o)


def _check_writable(o: Output) -> None:
    p = o.path
    if p.exists():
        if o.is_dir and not p.is_dir():
            raise InputError(f"For '{o.flag}', the path must be a directory, but '{p}' is a file.")
        if not o.is_dir and p.is_dir():
            raise InputError(f"For '{o.flag}', the path must be a file, but '{p}' is a directory.")
    for f in o.files if o.is_dir else []:  # DIR/index.html a directory: the rename would fail
        if f.is_dir():
            raise InputError(f"For '{o.flag}', '{f}' must be a file (the report is written "
                             f"there), but it is a directory.")
    folder = p if o.is_dir else p.parent
    existing = folder
    while not existing.exists():  # the folders write_atomic would create
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"For '{o.flag}', '{existing}' must be a directory to hold '{p}', but it "
                         f"is a file.")
    try:  # the real test: permission bits say nothing for root or on a read-only file system
        fd, probe = tempfile.mkstemp(prefix=".objdebug-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise InputError(f"For '{o.flag}', cannot write in '{existing}': "
                         f"{exc.strerror or type(exc).__name__}.") from None


def check_step_summary(path: str | None) -> None:
    """$GITHUB_STEP_SUMMARY (`--output-format github`) is appended to after the run: a path that
    cannot be opened for appending is an InputError now, not an internal error after all the work.
    Opening it creates the (empty) file GitHub would have created; nothing is written yet."""
    if not path:
        return
    problem = path_problem(path)
    if problem is None:
        try:
            with open(path, "a", encoding="utf-8"):
                pass
        except OSError as exc:
            problem = exc.strerror or type(exc).__name__
    if problem:
        raise InputError(f"For '$GITHUB_STEP_SUMMARY' (--output-format github), the job summary "
                         f"must be a file objdebug can append to, but '{path}': {problem}.")
