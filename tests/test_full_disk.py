"""Issue 35: a full disk while the reports are written is exit 2 with one line naming the report
that could not be written and saying that no report file was half written (before: exit 3
"internal error: OSError: No space left on device").

The ENOSPC is the kernel's own: the temporary a report is written to is created as usual, then its
file descriptor is pointed at /dev/full (dup2), so the write (on flush) fails with a real
ENOSPC from the OS, in this process (`objdebug render`, no MindSpore)."""

import errno
import os
import tempfile
from pathlib import Path

import pytest

from .conftest import cli_exit_2

GOLDEN = Path(__file__).resolve().parent / "golden" / "synthetic.json"


def _disk_full_for(name: str, monkeypatch):
    """Temporaries of the report `name` are written to /dev/full; every other file as usual."""
    real = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        fd, tmp = real(*args, **kwargs)
        if kwargs.get("prefix", "").startswith(f".{name}."):
            full = os.open("/dev/full", os.O_WRONLY)
            os.dup2(full, fd)
            os.close(full)
        return fd, tmp
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_while_writing_reports_is_exit_2_and_leaves_the_old_ones(tmp_path, monkeypatch):
    junit, folder = tmp_path / "r.xml", tmp_path / "md"
    folder.mkdir()
    markdown = folder / "report.md"
    junit.write_text("<old/>\n")
    markdown.write_text("# old\n")
    _disk_full_for("report.md", monkeypatch)
    out = cli_exit_2(["render", GOLDEN, "--junit", junit, "--markdown", folder],
                     f"{markdown}: cannot write this report: No space left on device [ENOSPC]",
                     "no report file was written or half written", unchanged=[junit, markdown])
    assert "internal error" not in out
    # no temporary, no figure, no new file: the junit report written first was not renamed either
    assert sorted(p.name for p in tmp_path.iterdir()) == ["md", "r.xml"]
    assert [p.name for p in folder.iterdir()] == ["report.md"]

def test_the_os_error_itself_is_named(tmp_path):
    """Any OSError of the write (a quota: EDQUOT) is the same one line, with its own reason."""
    from objdebug.core.errors import InputError
    from objdebug.report import not_written

    err = not_written(tmp_path / "r.json", OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)))
    assert isinstance(err, InputError)
    assert str(err) == (f"{tmp_path / 'r.json'}: cannot write this report: Disk quota exceeded "
                        f"[EDQUOT]; no report file was written or half written (the existing ones "
                        f"are unchanged)")
