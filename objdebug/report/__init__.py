"""Serializers: one module per output format, all from a RunResult (or its saved JSON)."""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

# Inside all_or_nothing(): (temporary, final path) pairs that write_atomic staged, not yet renamed.
_staged: contextvars.ContextVar[list[tuple[str, Path]] | None] = contextvars.ContextVar(
    "objdebug_staged_reports", default=None)


def report_stages(report: dict) -> list[str]:
    """The report's stages in run order, then any stage only its results name (e.g. baseline)."""
    stages = list(report.get("stages", []))
    for r in report.get("results", []):
        if r["stage"] not in stages:
            stages.append(r["stage"])
    return stages


def describe_model_state(v: dict) -> str:
    """'loss 9.012 vs log V 9.011 (ratio 1.00), entropy 9.010 nats (ratio 1.00)'."""
    text = f"loss {v['loss']:.3f} vs log V {v['log_v']:.3f} (ratio {v['loss_ratio']:.2f})"
    if v.get("entropy") is not None:
        text += f", entropy {v['entropy']:.3f} nats (ratio {v['entropy_ratio']:.2f})"
    return text


def model_state_line(report: dict) -> str | None:
    """The header line 'model: untrained (loss ... vs log V ...)' when the run measured the model."""
    v = report.get("target", {}).get("model_state")
    if not v:
        return None
    if not v.get("measured"):
        return f"model state not measured: {v.get('reason')}"
    return f"model: {'untrained' if v['untrained'] else 'trained'} ({describe_model_state(v)})"


def compile_cache_line(report: dict, short: bool = False) -> str | None:
    """'compile cache warm: 12 hits, 0 misses' from the report's extra.compile_cache, or None when
    the run used no cache; it says which cache the run trusted (one the user named, or the default
    folder found private); `short` leaves out why a cache was unavailable."""
    c = report.get("extra", {}).get("compile_cache")
    if not isinstance(c, dict) or c.get("status") in (None, "off"):
        return None
    if c["status"] not in ("warm", "cold"):
        why = "" if short or not c.get("reason") else f" ({c['reason']})"
        return f"compile cache {c['status']}{why}"
    hits, misses = c.get("hits", 0), c.get("misses", 0)
    line = (f"compile cache {c['status']}: {hits} hit{'s' if hits != 1 else ''}, "
            f"{misses} miss{'es' if misses != 1 else ''}")
    if c.get("rejected"):  # a hit whose graph answered unlike the Cell: compiled afresh (issue 46)
        line += "; compile cache entry rejected: its graph answers for another model"
        if not short:
            line += f" ({', '.join(c['rejected'])}: compiled afresh, the cache not kept)"
    if c.get("unprovable") and not short:  # no PyNative answer to prove it by: compiled afresh
        line += f"; not provable by its answer, compiled afresh: {', '.join(c['unprovable'])}"
    if c.get("unsafe") and not short:  # the next run starts cold again: say why (issue 22)
        line += f"; not kept for the next run: {c['unsafe']}"
    if c.get("trust") and short:  # which cache the run trusted (issue 35)
        line += f" ({c['trust']})"
    elif c.get("trust"):
        line += ("; trusted as named (--compile-cache / run.compile_cache)" if c["trust"] == "named"
                 else "; the default folder, trusted as this user's alone")
    return line


def findings_with(report: dict, verdicts: tuple[str, ...]) -> list[tuple[dict, dict]]:
    """(result, finding) pairs whose verdict is one of `verdicts`, in report order."""
    return [(r, f) for r in report.get("results", []) for f in r.get("findings", [])
            if f["verdict"] in verdicts]


# The two lists at the top of a report: what failed the gate, then the notes (INFO: facts about the
# model or MindSpore, not objective bugs, which never fail it). (heading, anchor, verdicts)
TOP_LISTS = (("What did not pass", "problems", ("WARN", "FAIL", "ERROR")), ("Notes", "notes", ("INFO",)))


def summary_counts(s: dict) -> str:
    """'3 pass, 1 warn, 0 fail, 0 error, 2 skipped' (+ ', 1 note' when there are INFO findings)."""
    text = (f"{s.get('PASS', 0)} pass, {s.get('WARN', 0)} warn, {s.get('FAIL', 0)} fail, "
            f"{s.get('ERROR', 0)} error, {s.get('SKIP', 0)} skipped")
    notes = s.get("INFO", 0)
    return text + (f", {notes} note{'s' if notes != 1 else ''}" if notes else "")


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    from objdebug.core.leftovers import clean_report_temporaries

    clean_report_temporaries(path)  # a killed run's `.NAME.XXXXXXXX`
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise not_written(path, exc) from None
    try:
        with os.fdopen(fd, mode, **({} if mode == "wb" else {"encoding": "utf-8"})) as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; reports are shared artefacts
        staged = _staged.get()
        if staged is not None:  # all_or_nothing() renames it with the others
            staged.append((tmp, path))
            return
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise not_written(path, exc) from None
        raise


def not_written(path: Path, exc: OSError) -> Exception:
    """A report the OS would not let us write (a full disk, a quota, no permission): an
    input/output problem of the user's (exit 2), said in one line. Only a temporary was being
    written, and it is gone: every report file is as it was before the run (within
    all_or_nothing() none of the run's reports was renamed into place)."""
    from objdebug.core.errors import InputError

    code = errno.errorcode.get(exc.errno, "")
    reason = f"{exc.strerror or exc}" + (f" [{code}]" if code else "")
    return InputError(f"cannot write this report: {reason}; no report file was written or half "
                      f"written (the existing ones are unchanged)", source=str(path))


class ReportSet:
    """What all_or_nothing() did: `committed` is True once every file was renamed into place."""

    committed: bool = False
    paths: list[Path]
    staged: list[tuple[str, str]]  # all_or_nothing(commit=False): the temporaries, not renamed

    def __init__(self) -> None:
        self.paths = []
        self.staged = []


@contextlib.contextmanager
def all_or_nothing(commit: bool = True) -> Iterator[ReportSet]:
    """The reports of one run replace the old ones all together or not at all.

    Every write_atomic inside the block writes its temporary only; when the block ends normally
    they are renamed in one step with SIGINT/SIGTERM held, and on any exception or interrupt they
    are deleted, so an old r.json never sits beside a new r.xml. With `commit=False` they are left
    as temporaries in `ReportSet.staged` (`--workers`: the launcher commits rank 0's reports once
    the whole run ended well).
    """
    done = ReportSet()
    staged: list[tuple[str, Path]] = []
    token = _staged.set(staged)
    try:
        yield done
    except BaseException:
        _staged.reset(token)
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    _staged.reset(token)
    if not commit:  # another process renames them (commit_staged), or removes them
        done.staged = [(str(tmp), str(path)) for tmp, path in staged]
        return
    commit_staged(staged, done)


def commit_staged(staged, done: ReportSet | None = None) -> ReportSet:
    """Rename a run's report temporaries ((temporary, path) pairs) over their reports in one step,
    with SIGINT/SIGTERM held; `done.committed` is true once they all are."""
    from objdebug.core.interrupts import held

    done = done or ReportSet()
    with held():
        for tmp, path in staged:
            os.replace(tmp, path)
        done.paths = [Path(path) for _, path in staged]
        done.committed = True
    return done
