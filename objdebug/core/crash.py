"""What a crash says, in one line, and advice about the crash itself.

MindSpore's error texts often open with a newline or a ruler of dashes (`RuntimeError: \\n----`),
so the first line of `str(exc)` is empty and a message built from it ends with nothing after the
colon. `first_line` skips those to the first line that says something; `advice` recognizes the
crashes that are about the device or MindSpore rather than the objective (an operator the device
lacks, a kernel not registered) and names the operator.
"""

from __future__ import annotations

import re

_OP_MISSING = (
    re.compile(r"Unsupported op \[(?P<op>\w+)\] on (?P<dev>\w+)"),
    re.compile(r"[Tt]he kernel (?P<op>\w+) unregistered"),
    re.compile(r"[Kk]ernel (?:for |type )?\[?(?P<op>\w+)\]? (?:is )?not (?:supported|registered|found)"),
)


def first_line(exc: BaseException | str) -> str:
    """The first line with a letter in it, without rulers; the exception's type when none."""
    text = str(exc)
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("- "):  # MindSpore's "- C++ Call Stack:" headings (not "-1 is ...")
            line = line[2:].strip()
        if any(c.isalpha() for c in line):
            return line
    return type(exc).__name__ if isinstance(exc, BaseException) else ""


def summary(exc: BaseException) -> str:
    """`TypeName: first meaningful line`."""
    return f"{type(exc).__name__}: {first_line(exc)}"


def missing_operator(text: str) -> tuple[str, str | None] | None:
    """(operator, device or None) when the error is an operator the device lacks."""
    for pattern in _OP_MISSING:
        m = pattern.search(text)
        if m:
            return m.group("op"), m.groupdict().get("dev")
    return None


def advice(exc: BaseException, device: str | None = None) -> str:
    """Fix advice about the crash itself (not the check's usual advice about the objective)."""
    missing = missing_operator(str(exc))
    if missing:
        op, dev = missing
        dev = dev or device or "this device"
        return (f"MindSpore has no {op} kernel on {dev}: the model (or objective) uses an operator this "
                f"device lacks, so the check could not run; this is not a finding about the objective. "
                f"Run on a device that has {op} (Ascend/GPU), or replace the operation that needs it "
                f"(a library port: the CPU patch its documentation names).")
    return ("The check crashed before it could judge anything; the message above is the error's "
            "first line. Run with --debug for the full MindSpore message and traceback.")
