"""File handling of the compile cache that a planted file cannot turn against the run (issue 23).

A cache folder may be restored from a shared CI cache, so its content is not trusted:
- every graph file's sha256 is recorded in the manifest when the run that compiled it ends, and
  checked before MindSpore may load it: a `compile_cache_0.mindir` copied from another model with
  the same shapes is refused (the cache starts cold), never loaded;
- a symbolic link anywhere inside the cache (the key folder, `rank_0/graph_cache`, a graph file,
  `key.json`, the manifest or its temporary, the lock) is never followed: objdebug's own files are
  created exclusively with O_NOFOLLOW, and a folder that is a link turns the cache off for the run.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def sha256(path: Path) -> str | None:
    """The file's digest, or None when it is not a regular file (a link, a folder, missing)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except OSError:
        return None
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def linked(*paths: Path) -> Path | None:
    """The first of `paths` that is a symbolic link, or None."""
    return next((p for p in paths if p.is_symlink()), None)


def write_exclusive(path: Path, text: str) -> None:
    """Replace `path` with `text` through a temporary created exclusively (O_EXCL | O_NOFOLLOW):
    a link planted at either name is removed, never written through; the rename replaces a link
    at `path` itself, not its target."""
    tmp = path.with_name(path.name + ".tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def read_text(path: Path) -> str:
    """The file's text, refusing a link (OSError)."""
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    with os.fdopen(fd, encoding="utf-8") as fh:
        return fh.read()


def open_lock(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o644)


def untrusted(root: Path, key_dir: Path) -> str:
    """Why a cache folder that no one named (the default `./.objdebug_cache`) must not be used,
    or '' when it may: `root` and, unless `root` is private (no access for group and others),
    everything under `key_dir` must be owned by this user and writable by no one else. A graph
    file there is code that MindSpore runs, and its manifest (the digests that vouch for the
    graphs) can be rewritten by anyone who can write the folder (a restored shared CI cache)."""
    uid = os.getuid()

    def problem(path: Path) -> str:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return ""
        if st.st_uid != uid:
            return f"'{path}' is owned by uid {st.st_uid}, not by this user (uid {uid})"
        if st.st_mode & 0o022 and not os.path.islink(path):
            return f"'{path}' is writable by its group or others (mode {st.st_mode & 0o777:o})"
        return ""

    first = problem(root)
    if first or not root.exists() or not os.lstat(root).st_mode & 0o077:
        return first  # a private root: no one else reaches anything below it
    for folder, dirs, files in os.walk(key_dir):  # links are not followed (and refused later)
        for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
            why = problem(Path(name))
            if why:
                return why
    return ""
